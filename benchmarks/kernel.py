"""The kernels against this machine's streaming floors, one process, one run.

    python -m benchmarks.kernel --rows 1000000 --dim 300

Cases, timed in rounds (each round runs every case once, so drift in the machine hits
every case alike), each result checked against float64; the table shows the best and the
median round and the largest error:

- floors: numpy ``a.sum(); b.sum()`` (one core) and torch's (all cores);
- ours: ``pairwise_cosine`` with its fused kernel (numba on a CPU) and with the torch
  kernel (``fused=False``, the fallback);
- peers: ``F.cosine_similarity``, numpy einsum / norms;
- contention: both kernels again while a second process keeps one core busy, as a
  ratio to the same kernel alone in the same round;
- first call: ``pairwise_cosine`` in a fresh LocalCluster worker process (compiled kernel
  loaded from numba's on-disk cache, or compiled from scratch with an empty cache).

"x torch floor" = torch floor time / case time (1.00 = as fast as reading both inputs
with every core).  The machine's load average is printed with the table: timings on a
shared machine are only comparable within one run.  ``--out DIR`` also writes
``DIR/<name>.json``.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import click
import numpy as np
import torch

import dask_cosim
from benchmarks import harness
from benchmarks.harness import Case, Row
from dask_cosim import kernels

BUSY = "import time\nend = time.time() + 600\nwhile time.time() < end: pass\n"


def contention(
    cases: dict[str, Callable[[], object]], repeat: int
) -> dict[str, tuple[float, float]]:
    """(best alone, best with a second process spinning) per case, interleaved by round."""
    alone: dict[str, list[float]] = {name: [] for name in cases}
    busy: dict[str, list[float]] = {name: [] for name in cases}
    for fn in cases.values():
        fn()
    for _ in range(repeat):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            alone[name].append(time.perf_counter() - t0)
        spinner = subprocess.Popen([sys.executable, "-c", BUSY])
        try:
            time.sleep(0.2)  # let it take its core
            for name, fn in cases.items():
                t0 = time.perf_counter()
                fn()
                busy[name].append(time.perf_counter() - t0)
        finally:
            spinner.kill()
            spinner.wait()
    return {name: (min(alone[name]), min(busy[name])) for name in cases}


def first_call_in_fresh_worker(dim: int, cold: bool) -> dict[str, float]:
    """Seconds of the first and second ``pairwise_cosine`` in a new worker process."""
    from distributed import Client, LocalCluster

    from dask_cosim.cluster import TorchThreads, torch_threads

    def task(rows: int, dim: int) -> dict[str, float]:
        import time

        import numpy as np
        import torch

        rng = np.random.default_rng(0)
        a = torch.from_numpy(rng.standard_normal((rows, dim), dtype=np.float32))
        t0 = time.perf_counter()
        dask_cosim.pairwise_cosine(a, a)
        t1 = time.perf_counter()
        dask_cosim.pairwise_cosine(a, a)
        t2 = time.perf_counter()
        return {"first": t1 - t0, "second": t2 - t1}

    env = {}
    with tempfile.TemporaryDirectory() as cache:
        if cold:  # an empty cache: what the very first worker on a machine pays
            env["NUMBA_CACHE_DIR"] = cache
        with (
            LocalCluster(
                n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                env=env,
            ) as cluster,
            Client(cluster) as client,
        ):  # fmt: skip
            client.register_plugin(TorchThreads(torch_threads(1, 1)))
            return client.submit(task, 50_000, dim, pure=False).result()


NUMPY_FLOOR = "floor: numpy sum of a and b (1 core)"
TORCH_FLOOR = "floor: torch sum of a and b (all cores)"
TABLE = [
    harness.Column("case", "case", align="<"),
    harness.Column("best s", "best", ".3f"),
    harness.Column("median", "median", ".3f"),
    harness.Column("GB/s", "gb_per_s", ".1f"),
    harness.Column("x torch floor", "x_torch_floor", ".2f"),
    harness.Column("max err", "max_error", ".0e", 8),
]
CONTENTION_TABLE = [
    harness.Column("case", "case", align="<"),
    harness.Column("alone s", "alone", ".3f"),
    harness.Column("busy s", "busy", ".3f"),
    harness.Column("busy / alone", lambda r: r["busy"] / r["alone"], ".2f"),
]
FIRST_CALL_TABLE = [
    harness.Column("numba cache", "cache", align="<"),
    harness.Column("first s", "first", ".3f"),
    harness.Column("second s", "second", ".3f"),
]


def kernel_rows(a: np.ndarray, b: np.ndarray) -> list[Row]:
    """The floors, our kernel both ways and two peers."""
    ta, tb, n = torch.from_numpy(a), torch.from_numpy(b), len(a)
    fused = kernels.fused_kernel_for(ta, tb)

    def einsum() -> np.ndarray:
        return np.einsum("ij,ij->i", a, b) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))

    cases = [
        (NUMPY_FLOOR, lambda: (a.sum(), b.sum()), "floor"),
        (TORCH_FLOOR, lambda: (ta.sum(), tb.sum()), "floor"),
        (
            f"ours: pairwise_cosine, fused ({fused})",
            lambda: dask_cosim.pairwise_cosine(ta, tb),
            "ours",
        ),
        (
            "ours: pairwise_cosine, torch kernel",
            lambda: dask_cosim.pairwise_cosine(ta, tb, fused=False),
            "ours",
        ),
        (
            "peer: F.cosine_similarity",
            lambda: torch.nn.functional.cosine_similarity(ta, tb),
            "peer",
        ),
        ("peer: numpy einsum / norms", einsum, "peer"),
    ]
    return [
        Row(Case(name, fn, n), kind, expect="none" if kind == "floor" else "rows")
        for name, fn, kind in cases
    ]


@click.command()
@click.option("--rows", default=1_000_000, show_default=True)
@click.option("--dim", default=300, show_default=True)
@click.option("--repeat", default=5, show_default=True)
@click.option("--contention/--no-contention", "with_contention", default=True, show_default=True)
@click.option("--first-call/--no-first-call", default=True, show_default=True)
@harness.results_options(out=None)
def main(
    rows: int,
    dim: int,
    repeat: int,
    with_contention: bool,
    first_call: bool,
    output: harness.Output,
) -> None:
    """The kernels against this machine's streaming floors, one process, one run."""

    def run(log: harness.Log) -> harness.Record:
        a, b = harness.normal_pairs(rows, dim)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        record: harness.Record = {
            "params": {"rows": rows, "dim": dim, "repeat": repeat},
            "load_before": harness.load_text(),
        }
        cases = kernel_rows(a, b)
        harness.time_rows(cases, repeat, harness.reference(a, b), log)
        floor = min(next(r for r in cases if r.case.name == TORCH_FLOOR).times)
        record["cases"] = [
            {
                "case": r.case.name,
                "best": min(r.times),
                "median": statistics.median(r.times),
                "gb_per_s": (a.nbytes + b.nbytes) / min(r.times) / 1e9,
                "x_torch_floor": floor / min(r.times),
                "max_error": r.error,
            }
            for r in cases
        ]
        if with_contention:
            log("contention: a second process spinning on one core")
            kernel_cases = {
                f"fused ({kernels.fused_kernel_for(ta, tb)})": lambda: dask_cosim.pairwise_cosine(
                    ta, tb
                ),
                "torch kernel": lambda: dask_cosim.pairwise_cosine(ta, tb, fused=False),
                "torch floor": lambda: (ta.sum(), tb.sum()),
            }
            record["contention"] = [
                {"case": case, "alone": alone, "busy": busy}
                for case, (alone, busy) in contention(kernel_cases, repeat).items()
            ]
        if first_call:
            log("first call in fresh LocalCluster workers")
            record["first_call"] = [
                {"cache": "numba cache filled", **first_call_in_fresh_worker(dim, cold=False)},
                {"cache": "empty numba cache", **first_call_in_fresh_worker(dim, cold=True)},
            ]
        record["load_after"] = harness.load_text()
        return record

    def report(record: harness.Record) -> None:
        print(
            f"N={rows:,} D={dim} float32, torch threads={torch.get_num_threads()}, "
            f"{os.cpu_count()} cores, best and median of {repeat} rounds"
        )
        print(f"load average before: {record['load_before']}")
        harness.print_table(TABLE, record["cases"])
        if "contention" in record:
            title = (
                "\ncontention: a second process spinning on one core (best of each, same rounds)"
            )
            harness.print_table(CONTENTION_TABLE, record["contention"], title)
        if "first_call" in record:
            title = (
                "\nfirst call in a fresh LocalCluster worker (50,000 rows; compile or cache load)"
            )
            harness.print_table(FIRST_CALL_TABLE, record["first_call"], title)
        print(f"load average after: {record['load_after']}")

    name = output.name or f"kernel-cpu{os.cpu_count()}-{rows}x{dim}"
    harness.execute_benchmark(harness.Config(output, name, run, report))


if __name__ == "__main__":
    main()
