"""Peak memory per pair of the tasks of a threshold search that hold its pairs.

    python -m benchmarks.pair_memory                   # 5,000 x 64 rows at 0.05, 3 runs

Each step (a function a threshold search's graph maps, called directly, no dask) runs
in a fresh worker-like process (dask's worker environment: MALLOC_TRIM_THRESHOLD_, one
thread) on inputs made there first: the exact search's pair task
(``search_partition.pair_threshold``), the merge of two such frames
(``search_results.concat_pairs``), the finish (``search_results.finish_pairs``),
dedup's pair task and merge (``search_dedup.earlier_matches``, ``best_matches``), and
the clustered search's block task (``clustered_partition.search_blocks``) and the
tasks holding the pairs gathered into a partition (``clustered_results``).  Its peak
is the growth of the resident set above what the process held once its inputs were
made (Linux: /proc/self/clear_refs resets the peak, VmHWM reads it; RSS counts
torch's allocations too), over the pairs the step holds.  Prints, per step, the
pairs, the median of the runs' bytes a pair (and their range), the same counting the
step's inputs ("held": what its worker holds at the step's peak) and seconds.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import numpy as np
import pandas as pd

STEPS = (
    "pair_threshold",
    "concat_pairs",
    "finish_pairs",
    "earlier_matches",
    "best_matches",
    "search_blocks",
    "clustered.finish_pairs",
    "clustered.best_earlier",
    "clustered.removed_rows",
    "clustered.with_carried",
)
EPS = 1e-12
TILES = {"cpu": 1 << 24, "cuda": 1 << 28}


def _status(field: str) -> int:
    """A field of /proc/self/status, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _frame(rows: int, dim: int) -> pd.DataFrame:
    from dask_cosim.io.layouts import vectors_to_arrow

    x = np.random.default_rng(0).standard_normal((rows, dim)).astype(np.float32)
    return pd.DataFrame({"id": np.arange(rows, dtype=np.int64), "emb": vectors_to_arrow(x)})


def _setup(step: str, rows: int, dim: int, threshold: float) -> tuple[Callable[[], Any], int]:
    """The call to measure and the pairs it holds."""
    from dask_cosim import clustered_partition as cp
    from dask_cosim import clustered_results as cr
    from dask_cosim import search_dedup as sd
    from dask_cosim import search_partition as sp
    from dask_cosim import search_results as sr
    from dask_cosim.clustered_plan import plan

    df = _frame(rows, dim)
    meta = sp.result_meta(df.index, df.index, np.dtype("float32"), False)
    if not step.startswith(("clustered", "search_blocks")):
        side = sp.prepare_side(df, "emb", 0, eps=EPS, device="cpu")
        if step == "pair_threshold":
            return lambda: sp.pair_threshold(side, None, threshold, TILES), 0
        pairs = sp.pair_threshold(side, None, threshold, TILES)
        n = len(pairs)
        if step == "earlier_matches":  # returns a pair per row: counted here
            del pairs
            return lambda: sd.earlier_matches(side, None, threshold, TILES), n
        if step == "concat_pairs":
            a, b = pairs.iloc[: n // 2].copy(), pairs.iloc[n // 2 :].copy()
            del pairs
            return lambda: sr.concat_pairs(a, b), n
        if step == "finish_pairs":
            return lambda: sr.finish_pairs(pairs, meta, False), n
        pairs["_lkey"] = pairs["_l"].to_numpy()  # partition 0
        return lambda: sd.best_matches(pairs), n
    p = plan(df, "emb", threshold)
    routed = cp.route_partition(df, "emb", p.layout, eps=EPS, device="cpu", chunk_bytes=1 << 24)
    search = {"eps": EPS, "device": "cpu", "tile_bytes": TILES["cpu"]}
    if step == "search_blocks":
        args = (routed, p.threshold, p.layout.dtype, p.layout.dim)
        return lambda: cp.search_blocks(*args, drops=False, **search), 0
    found = cp.search_blocks(
        routed, p.threshold, p.layout.dtype, p.layout.dim, drops=False, **search
    )
    del routed
    n = len(found)
    if step == "clustered.finish_pairs":
        by_left = found.set_index("_lkey")
        del found
        return lambda: cr.finish_pairs(by_left, meta), n
    by_right = found.set_index("_rkey")
    del found
    if step == "clustered.best_earlier":
        return lambda: cr.best_earlier(by_right), n
    if step == "clustered.removed_rows":
        return lambda: cr.removed_rows(by_right, meta), n
    payload = df[["id"]]
    return lambda: cr.with_carried(by_right, payload, "_p"), n


def probe(step: str, rows: int, dim: int, threshold: float) -> None:
    """Run ``step`` once here and print its pairs, peak growth (and peak over what the
    process held before its inputs were made) and seconds as JSON."""
    import dask_cosim.clustered  # noqa: F401  (imports: not the step's)

    _trim()
    start_rss = _status("VmRSS")
    fn, n = _setup(step, rows, dim, threshold)
    _trim()
    base = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    start = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - start
    peak = _status("VmHWM")
    if not n:  # a task that finds its pairs: those it returns
        n = len(out)
    print(json.dumps({"pairs": n, "growth": peak - base, "held": peak - start_rss,
                      "seconds": seconds}))  # fmt: skip


def _trim() -> None:
    """Free what is garbage, and hand freed heap back, before a resident set is read."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def run_step(step: str, rows: int, dim: int, threshold: float) -> dict[str, Any]:
    """:func:`probe` of ``step`` in a fresh worker-like process: its JSON."""
    env = dict(os.environ, MALLOC_TRIM_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    code = (
        "import sys; from benchmarks.pair_memory import probe; "
        "probe(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, step, str(rows), str(dim), str(threshold)],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


@click.command()
@click.option("--rows", default=5000, show_default=True)
@click.option("--dim", default=64, show_default=True)
@click.option("--threshold", default=0.05, show_default=True)
@click.option("--runs", default=3, show_default=True)
@click.option("--step", "steps", multiple=True, help="Only these steps (default: all).")
def main(rows: int, dim: int, threshold: float, runs: int, steps: tuple[str, ...]) -> None:
    print(f"{rows:,} x {dim} float32 rows, threshold {threshold}, {runs} runs (median)")
    print(f"{'step':<24} {'pairs':>10} {'bytes/pair':>11} {'range':>12} {'held':>6} {'seconds':>8}")
    for step in steps or STEPS:
        got = [run_step(step, rows, dim, threshold) for _ in range(runs)]
        per = [g["growth"] / max(1, g["pairs"]) for g in got]
        low, high = min(per), max(per)
        seconds = statistics.median(g["seconds"] for g in got)
        held = statistics.median(g["held"] / max(1, g["pairs"]) for g in got)
        print(
            f"{step:<24} {got[0]['pairs']:>10,} {statistics.median(per):>11.0f} "
            f"{f'{low:.0f}-{high:.0f}':>12} {held:>6.0f} {seconds:>8.2f}"
        )


if __name__ == "__main__":
    main()
