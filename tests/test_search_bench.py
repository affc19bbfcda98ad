"""python -m benchmarks.search runs at tiny size, so it cannot rot (no timing asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_search_benchmark_runs(tmp_path: Path) -> None:
    for module in ("faiss", "sklearn", "sentence_transformers"):
        pytest.importorskip(module)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.search", "--quick", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=280, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # A file of its own: the quick run replaced the full run's, which the docs quote.
    result = json.loads((tmp_path / f"search-cpu{os.cpu_count()}-quick.json").read_text())
    # Correctness is checked inside the run; these are its verdicts.
    for shape in result["topk"]["shapes"]:
        for verdict in shape["sets_vs_faiss"].values():
            assert verdict["differ"] == verdict["differ_only_at_near_ties"], shape
        assert set(shape["seconds"]) == set(shape["x_faiss"])
    assert all(r["pair_sets_differ_beyond_near_ties"] == 0 for r in result["range"])
    for join in result["join"]:
        verdict = join["sets_vs_float64_first_200"]
        assert verdict["differ"] == verdict["differ_only_at_near_ties"]
    assert result["dedup"]["mismatches_vs_float64"] == 0
    assert result["cluster"]["same_result_as_eager"] is True
    assert "prepared x faiss" in proc.stdout
