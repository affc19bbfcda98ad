"""The benchmark scripts run at tiny size, so they cannot rot (no timing asserted)."""

from __future__ import annotations

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
