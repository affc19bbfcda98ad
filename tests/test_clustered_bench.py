"""python -m benchmarks.clustered runs at tiny size, so it cannot rot (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_clustered_benchmark_runs(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.clustered", "--quick", "--name", "smoke",
         "--out", str(tmp_path), "--quiet", "--max-copies", "1000", "--dtype", "float16"],
        capture_output=True, text=True, timeout=280, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "smoke.json").read_text())
    assert len(result["exact"]) == 3 and result["exact_extrapolated_seconds"] > 0
    assert result["params"]["dtype"] == "float16"
    cases = result["cases"]
    assert {(c["op"], c["threshold"], c["n_probe"]) for c in cases} == {
        (op, t, m)
        for op in ("neighbors", "dedup")
        for t in (0.9, 0.95)
        for m in ("exact", "2", "0")
    }
    for case in cases:
        assert case["clusters"] == 77  # the library's default for 6,000 rows: about sqrt
        assert case["extra"] == 0  # every pair reported is an exact one
        assert case["expected"] > 0
        if case["n_probe"] == "exact":
            assert case["recall"] == 1.0  # the provable mode finds every pair
    assert "clustered, N=6,000 D=32 on cpu" in proc.stdout
