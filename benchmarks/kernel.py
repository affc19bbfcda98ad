"""The kernels against this machine's streaming floors, one process, one run.

    python -m benchmarks.kernel --rows 1000000 --dim 300

Cases, timed in rounds (each round runs every case once, so drift in the machine hits
every case alike); the table shows the best and the median round:

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
shared machine are only comparable within one run.
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

from benchmarks.harness import load_text
from dask_cosim import kernels, options

# The kernels take their options as arguments: the configured ones, as the accessor.
EPS, CHUNK_BYTES = options.eps(), options.chunk_bytes()

BUSY = "import time\nend = time.time() + 600\nwhile time.time() < end: pass\n"


def rounds(cases: dict[str, Callable[[], object]], repeat: int) -> dict[str, list[float]]:
    """One untimed warm-up call per case, then ``repeat`` rounds of one call per case."""
    for fn in cases.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


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

        from dask_cosim import kernels, options

        rng = np.random.default_rng(0)
        a = torch.from_numpy(rng.standard_normal((rows, dim), dtype=np.float32))
        args = {"eps": options.eps(), "chunk_bytes": options.chunk_bytes()}
        t0 = time.perf_counter()
        kernels.pairwise_cosine(a, a, **args)
        t1 = time.perf_counter()
        kernels.pairwise_cosine(a, a, **args)
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


@click.command()
@click.option("--rows", default=1_000_000, show_default=True)
@click.option("--dim", default=300, show_default=True)
@click.option("--repeat", default=5, show_default=True)
@click.option("--contention/--no-contention", "with_contention", default=True, show_default=True)
@click.option("--first-call/--no-first-call", default=True, show_default=True)
def main(rows: int, dim: int, repeat: int, with_contention: bool, first_call: bool) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((rows, dim), dtype=np.float32)
    b = rng.standard_normal((rows, dim), dtype=np.float32)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    nbytes = a.nbytes + b.nbytes
    fused = kernels.fused_kernel_for(ta, tb)
    cases: dict[str, Callable[[], object]] = {
        "floor: numpy sum of a and b (1 core)": lambda: (a.sum(), b.sum()),
        "floor: torch sum of a and b (all cores)": lambda: (ta.sum(), tb.sum()),
        f"ours: pairwise_cosine, fused ({fused})": lambda: kernels.pairwise_cosine(
            ta, tb, eps=EPS, chunk_bytes=CHUNK_BYTES
        ),
        "ours: pairwise_cosine, torch kernel": lambda: kernels.pairwise_cosine(
            ta, tb, fused=False, eps=EPS, chunk_bytes=CHUNK_BYTES
        ),
        "peer: F.cosine_similarity": lambda: torch.nn.functional.cosine_similarity(ta, tb),
        "peer: numpy einsum / norms": lambda: (
            np.einsum("ij,ij->i", a, b) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        ),
    }
    times = rounds(cases, repeat)
    floor = min(times["floor: torch sum of a and b (all cores)"])
    print(
        f"N={rows:,} D={dim} float32, torch threads={torch.get_num_threads()}, "
        f"{os.cpu_count()} cores, best and median of {repeat} rounds"
    )
    print(f"load average before: {load_text()}")
    print(f"{'case':42} {'best s':>7} {'median':>7} {'GB/s':>6} {'x torch floor':>14}")
    for name, ts in times.items():
        best = min(ts)
        print(
            f"{name:42} {best:7.3f} {statistics.median(ts):7.3f} {nbytes / best / 1e9:6.1f} "
            f"{floor / best:14.2f}"
        )

    if with_contention:
        kernel_cases = {
            f"fused ({fused})": lambda: kernels.pairwise_cosine(
                ta, tb, eps=EPS, chunk_bytes=CHUNK_BYTES
            ),
            "torch kernel": lambda: kernels.pairwise_cosine(
                ta, tb, fused=False, eps=EPS, chunk_bytes=CHUNK_BYTES
            ),
            "torch floor": lambda: (ta.sum(), tb.sum()),
        }
        print("\ncontention: a second process spinning on one core (best of each, same rounds)")
        print(f"{'case':42} {'alone s':>7} {'busy s':>7} {'busy / alone':>13}")
        for name, (alone, busy) in contention(kernel_cases, repeat).items():
            print(f"{name:42} {alone:7.3f} {busy:7.3f} {busy / alone:13.2f}")

    if first_call:
        print("\nfirst call in a fresh LocalCluster worker (50,000 rows; compile or cache load)")
        for cold in (False, True):
            r = first_call_in_fresh_worker(dim, cold)
            label = "empty numba cache" if cold else "numba cache filled"
            print(f"  {label:20} first {r['first']:.3f} s, second {r['second']:.3f} s")
    print(f"load average after: {load_text()}")


if __name__ == "__main__":
    main()
