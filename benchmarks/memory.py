"""Peak memory of ``pairwise`` on one partition, beyond the partition itself.

    python -m benchmarks.memory --rows 55556 --dim 300      # one 128 MiB partition

Writes the pairs in ``dask_cosim.to_parquet``'s layout (one partition), then runs
``pairwise`` on that partition twice in a fresh worker-like process and reads its peak
RSS (Linux only).  Prints the line ``benchmarks.pairwise`` also prints, and writes
``benchmarks/results/<name>.json`` (default ``memory-cpu<cores>-<rows>x<dim>``).
``benchmarks.pairwise`` runs the same probe on a partition of its own files
(``fresh_process_memory``): the "memory" of its results.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
import dask

import dask_cosim
from benchmarks import harness


def fresh_process_memory(folder: Path) -> dict[str, Any] | None:
    """Peak RSS a fresh worker-like process gains while ``pairwise`` runs on one partition.

    A fresh process, so freed memory left over from earlier work cannot hide allocations;
    with dask's worker environment (MALLOC_TRIM_THRESHOLD_, one OpenMP thread).  Linux
    only (None elsewhere): /proc/self/clear_refs resets the peak, VmHWM reads it.  RSS
    counts torch's allocations, which tracemalloc would not see.
    """
    if not Path("/proc/self/clear_refs").exists():
        return None
    env = dict(os.environ, MALLOC_TRIM_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    # From the repository root, where ``-c`` finds the benchmarks package.
    code = "import sys; from benchmarks.memory import memory_probe; memory_probe(sys.argv[1])"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(folder)],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    measured: dict[str, Any] = json.loads(proc.stdout)
    return memory_budget(measured)


def memory_budget(measured: dict[str, Any]) -> dict[str, Any]:
    """The documented budget for ``pairwise`` on one partition, beyond its input: the
    chunk temporaries, 16 bytes per row (dot, two norms, overflow masks; the dot becomes
    the result) and 256 KiB for the interpreter and allocator."""
    chunk = dask.config.get("cosim.chunk-bytes")["cpu"]
    budget = dask.utils.parse_bytes(chunk) + 16 * measured["rows"] + 256 * 2**10
    return dict(
        measured,
        budget_bytes=budget,
        budget=f"cosim.chunk-bytes.cpu ({chunk}) + 16 bytes per row + 256 KiB",
    )


def memory_probe(folder: str) -> None:
    """In the fresh process: one partition of ``folder``, ``pairwise`` twice, peak RSS."""
    import gc

    def status_kib(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise KeyError(field)

    partition = dask_cosim.read_parquet(folder).partitions[0].compute(scheduler="sync")
    extra = []
    for _ in range(2):  # the first call allocates; the second shows the steady state
        gc.collect()
        Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
        before = status_kib("VmRSS")
        result = partition.cosim.pairwise(harness.A, harness.B)  # the eager accessor
        extra.append((status_kib("VmHWM") - before) * 1024)
        del result
    vectors = sum(partition[c].array.nbytes for c in (harness.A, harness.B))
    # The first call also faults in torch's code and thread pools (once per process); the
    # second is what every later partition costs.
    measured = {
        "rows": len(partition),
        "input_bytes": int(vectors),
        "first_call_extra_bytes": extra[0],
        "extra_bytes": extra[1],
    }
    print(json.dumps(measured))


def memory_text(memory: dict[str, Any]) -> str:
    """The measurement and its budget in one line."""
    return (
        f"memory: peak RSS of pairwise beyond its input partition ({memory['rows']:,} rows,"
        f" {memory['input_bytes'] / 2**20:.0f} MiB of vectors): "
        f"{memory['extra_bytes'] / 2**20:.2f} MiB (first call in the process "
        f"{memory['first_call_extra_bytes'] / 2**20:.2f} MiB); budget "
        f"{memory['budget_bytes'] / 2**20:.2f} MiB = {memory['budget']}"
    )


@click.command()
@click.option("--rows", default=55_556, show_default=True, help="Rows of the partition.")
@click.option("--dim", default=300, show_default=True, help="Vector length D.")
@harness.results_options()
def main(rows: int, dim: int, output: harness.Output) -> None:
    """Peak memory of pairwise on one partition, beyond the partition itself."""

    def run(log: harness.Log) -> harness.Record:
        tmp = Path(tempfile.mkdtemp(prefix="cosim-memory-"))
        try:
            a, b = harness.generate_pairs(rows, dim)
            log(f"writing {rows:,} pairs x {dim} as one partition of our layout")
            harness.write_our_layout(a, b, tmp / "ours", files=1)
            log("pairwise on the partition, in a fresh process")
            memory = fresh_process_memory(tmp / "ours")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return {"params": {"rows": rows, "dim": dim}, "memory": memory}

    def report(record: harness.Record) -> None:
        memory = record["memory"]
        print(memory_text(memory) if memory else "memory: not measured (needs Linux's /proc)")

    name = output.name or f"memory-cpu{os.cpu_count()}-{rows}x{dim}"
    harness.execute_benchmark(harness.Config(output, name, run, report))


if __name__ == "__main__":
    main()
