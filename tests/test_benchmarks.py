"""The benchmark scripts run at tiny size, so they cannot rot (no timing asserted)."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def run_script(name: str, *args: str) -> str:
    """Run ``python -m benchmarks.<name>`` from the root, as users do; its stdout (fails with
    its stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def run_here(name: str, *args: str) -> str:
    """``benchmarks.<name>``'s command with ``args`` in this process, for what needs no
    run of its own (``--help``, the exit without CUDA): a new interpreter spends seconds
    importing torch, pandas and dask.  Its output (fails with it)."""
    from click.testing import CliRunner

    module = importlib.import_module(f"benchmarks.{name}")
    result = CliRunner().invoke(module.main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_kernel_benchmark_runs() -> None:
    out = run_script("kernel", "--rows", "2000", "--dim", "8", "--repeat", "1")
    assert "ours: pairwise_cosine, fused (numba)" in out and "x torch floor" in out
    assert "busy / alone" in out and "empty numba cache" in out


def test_duplicates_benchmark_runs() -> None:
    """A budget of 2,500 pairs against 1,124,250 among the copies: the search by blocks,
    and the known answers."""
    out = run_here("duplicates", "--rows", "3000", "--copies", "1500",
                   "--max-result-bytes", "100000")  # fmt: skip
    for name in ("dedup", "dedup, removed rows", "groups", "dedup, clustered"):
        assert re.search(rf"^{name} +[\d.]+ +1 +[\d,]+ +yes$", out, re.M), out


def test_pairwise_runner_runs(tmp_path: Path) -> None:
    """The full runner on a real LocalCluster; its peers are tested in test_peers.py."""
    out = run_script(
        "pairwise", "--rows", "3000", "--dim", "8", "--repeat", "1", "--no-peers",
        "--quiet", "--name", "smoke", "--out", str(tmp_path),
    )  # fmt: skip
    assert "ours: our Parquet -> sum" in out and "targets" in out
    result = json.loads((tmp_path / "smoke.json").read_text())
    cases = {c["case"]: c for c in result["cases"]}
    assert cases["ours: kernel"]["max_error"] < 1e-6
    assert cases["ours: our Parquet -> Parquet"]["max_error"] < 1e-6
    assert (tmp_path / "smoke.png").stat().st_size > 0
    assert list(result)[4:] == [
        "name", "params", "cases", "targets", "memory", "failed", "host_round_trips"
    ]  # fmt: skip


def test_pairwise_gpu_script_answers_help() -> None:
    out = run_here("pairwise_gpu", "--help")
    assert "--no-peers" in out and "--rows" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA it runs the whole benchmark")
def test_pairwise_gpu_script_without_cuda_says_so() -> None:
    assert "no CUDA device: nothing run" in run_here("pairwise_gpu", "--rows", "10")


def test_dask_gpu_script_answers_help() -> None:
    out = run_here("dask_gpu", "--help")
    assert "--sizes" in out and "--workers-rows" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA it runs the whole benchmark")
def test_dask_gpu_script_without_cuda_says_so() -> None:
    assert "no CUDA device: nothing run" in run_here("dask_gpu", "--sizes", "10")


def test_placement_rates_are_read_off_the_table() -> None:
    """The GPU benchmark prints the placement rule's rates as cosim.yaml lines: the CPU
    kernels' rates, the best staged copy, the one-row call's time."""
    from benchmarks.gpu_host import FIXED, STAGED, placement_rates

    def row(case: str, gb: float, seconds: float = 0.0) -> dict[str, object]:
        return {"case": case, "gb_per_s": gb, "seconds": seconds}

    table = [
        row("ours: kernel", 77.51),
        row("ours: kernel, torch fallback", 2.14),
        row(f"{STAGED}, 4 MiB buffers", 30.0),
        row(f"{STAGED}, 32 MiB buffers", 41.26),
        row(FIXED, 0.0, 0.00042),
    ]
    assert placement_rates(table) == {
        "cpu-fused": "77.5GB", "cpu-torch": "2.1GB", "host-to-gpu": "41.3GB", "gpu-fixed": "0.42ms"
    }  # fmt: skip
    assert placement_rates(table[:1]) == {"cpu-fused": "77.5GB"}


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak RSS needs Linux")
def test_memory_benchmark_runs(tmp_path: Path) -> None:
    out = run_script(
        "memory", "--rows", "2000", "--dim", "8", "--quiet", "--name", "smoke",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert "peak RSS of pairwise beyond its input partition (2,000 rows" in out
    memory = json.loads((tmp_path / "smoke.json").read_text())["memory"]
    assert memory["rows"] == 2000 and memory["input_bytes"] == 2 * 2000 * 8 * 4


def test_from_pandas_benchmark_runs() -> None:
    out = run_script("from_pandas", "--rows", "200", "--dim", "8", "--repeat", "1")
    assert "dask_cosim.from_pandas" in out and "convert-string False" in out


def test_layouts_benchmark_runs() -> None:
    out = run_script("layouts", "--rows", "2000", "--dim", "8", "--files", "2", "--repeat", "1")
    assert "binary (FLBA), none [to_parquet]" in out


def test_scaling_benchmark_runs(tmp_path: Path) -> None:
    out = run_script(
        "scaling", "--rows", "2000,4000", "--dim", "8", "--dims", "4,8", "--dim-rows",
        "2000", "--repeat", "1", "--out", str(tmp_path),
    )  # fmt: skip
    assert "ns per pair per 100 dims" in out
    # Sizes of its own, a file of its own (not the default run's, which the docs quote).
    written = tmp_path / f"scaling-cpu{os.cpu_count()}-custom.json"
    assert json.loads(written.read_text())["rows"][0]["rows"] == 2000


def test_search_gpu_benchmark_smoke(tmp_path: Path) -> None:
    """The GPU search benchmark's tiny mode (on the CPU here: the torch engine): every
    case runs, every exact contender gives the float64 answer, the file is written."""
    out = run_script(
        "search_gpu", "--smoke", "--repeat", "1", "--quiet", "--name", "smoke",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert "ours: exact (float16 pass + float64)" in out and "NeMo-style" in out
    result = json.loads((tmp_path / "smoke.json").read_text())
    rows = [r for part in ("topk", "threshold") for case in result[part] for r in case["rows"]]
    assert all(r["identical_to_float64"] for r in rows if r["exact"])
    assert result["scale"]["dedup 0.95"]["result_rows"] > 0
    assert (tmp_path / "smoke.png").stat().st_size > 0


def test_an_interrupted_run_writes_what_it_measured(tmp_path: Path) -> None:
    """A run cut short (SIGINT: .ci/gpu-check's budget) with ``Config.partial`` reports
    and writes the cases it finished, marked interrupted, and exits 130; without it the
    interrupt goes on as before."""
    from benchmarks import harness as h

    record: h.Record = {}
    shown: list[h.Record] = []

    def run(log: h.Log) -> h.Record:
        record["cases"] = [{"case": "first"}]
        raise KeyboardInterrupt

    output = h.Output("cut", tmp_path, quiet=True)
    with pytest.raises(SystemExit) as stop:
        h.execute_benchmark(h.Config(output, "cut", run, shown.append, partial=record))
    assert stop.value.code == 130
    written = json.loads((tmp_path / "cut.json").read_text())
    assert written["cases"] == [{"case": "first"}] and written["interrupted"]
    assert shown and shown[0]["interrupted"]
    with pytest.raises(KeyboardInterrupt):
        h.execute_benchmark(h.Config(output, "none", run, shown.append))
    assert not (tmp_path / "none.json").exists()


def test_an_interrupted_gpu_phase_keeps_the_sections_it_finished(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The GPU rows of ``benchmarks.pairwise_gpu`` cut by the budget's SIGINT: the
    sections timed before it stay, the run says it was interrupted (no GPU needed: the
    sections are stand-ins)."""
    from benchmarks import pairwise_gpu

    calls: list[str] = []

    def sections(pairs, repeat, log, rows, failed, extras) -> None:  # type: ignore[no-untyped-def]
        rows.append("the tensor rows")
        calls.append("tensor")
        raise KeyboardInterrupt

    monkeypatch.setattr(pairwise_gpu, "_gpu_sections", sections)
    rows, failed, extras = pairwise_gpu.run_gpu(None, 1, lambda msg: None)  # type: ignore[arg-type]
    assert rows == ["the tensor rows"] and calls == ["tensor"]
    assert extras["interrupted"] and failed[-1]["case"] == "interrupted"
