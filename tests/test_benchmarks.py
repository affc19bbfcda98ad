"""The benchmark scripts run at tiny size, so they cannot rot (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_kernel_benchmark_runs() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "kernel.py"),
            "--rows",
            "2000",
            "--dim",
            "8",
            "--repeat",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ours: kernels.pairwise_cosine" in proc.stdout and "x floor" in proc.stdout


def test_pairwise_runner_runs(tmp_path: Path) -> None:
    """The full runner on a real LocalCluster; its peers are tested in test_peers.py."""
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "pairwise.py"),
            "--rows",
            "3000",
            "--dim",
            "8",
            "--repeat",
            "1",
            "--no-peers",
            "--quiet",
            "--name",
            "smoke",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ours: our Parquet -> sum" in proc.stdout and "targets" in proc.stdout
    result = json.loads((tmp_path / "smoke.json").read_text())
    cases = {c["case"]: c for c in result["cases"]}
    assert cases["ours: kernel"]["max_error"] < 1e-6
    assert cases["ours: our Parquet -> Parquet"]["max_error"] < 1e-6
    assert (tmp_path / "smoke.png").stat().st_size > 0


def test_layouts_benchmark_runs() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "layouts.py"),
            "--rows",
            "2000",
            "--dim",
            "8",
            "--files",
            "2",
            "--repeat",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "binary (FLBA), none [to_parquet]" in proc.stdout
