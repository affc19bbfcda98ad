"""Timing in rounds: cases (``Case``) run once per round, so drift in the machine hits every
case alike, each result checked against the float64 reference, and summarised as the
records of a results file (``summarize``)."""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

Log = Callable[[str], None]  # where progress lines go
Record = dict[str, Any]  # a results file's record, or a part of one


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``repeat`` calls of ``fn`` after one untimed warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@dataclasses.dataclass
class Case:
    """One timed thing: ``run()`` returns what its row's ``expect`` says (cos per row, 1-D,
    ``rows`` long, in row order; a number for a sum; anything for a floor)."""

    name: str
    run: Callable[[], Any]
    rows: int
    note: str = ""
    repeat: int | None = None  # cap on timed repeats for slow cases (None: the run's)
    cleanup: Callable[[], None] | None = None


@dataclasses.dataclass
class Row:
    """A timed case and how to read it: which floor and which of ours it is compared with."""

    case: Case
    kind: str  # "floor", "ours" or "peer"
    floor: str | None = None  # name of the floor row
    versus: str | None = None  # name of our row a peer is compared with
    expect: str = "rows"  # "rows": per-row results; "sum": their sum; "none": a floor
    times: list[float] = dataclasses.field(default_factory=list)
    error: float | None = None
    # A case on data of its own (not the run's N pairs): its float64 reference (checks use
    # it instead of the run's) and the bytes it reads.  With ``nbytes`` set, the table
    # shows its own time, pairs and GB/s, not ones scaled to the run's N.
    ref: np.ndarray | None = None
    nbytes: int | None = None


def time_rows(
    rows: list[Row], repeat: int, ref: np.ndarray, log: Log, *, drop_failed: bool = False
) -> list[dict[str, str]]:
    """A checked warm-up run of each case, then ``repeat`` rounds of one run per case.

    Slow cases that cap their repeats (process start-up included anyway) skip the warm-up:
    their first run is checked and timed.  ``drop_failed``: a case that raises is logged
    (traceback on stderr), removed from ``rows`` and listed in the result as
    {"case", "error"}, and the others go on; without it the exception propagates.
    """
    failed: list[dict[str, str]] = []
    dropped: set[int] = set()  # ids: a Row holding arrays cannot be compared with ==

    def run(row: Row, timed: bool) -> None:
        try:
            t0 = time.perf_counter()
            result = row.case.run()
            elapsed = time.perf_counter() - t0
            if timed:
                row.times.append(elapsed)
            if not timed or row.error is None:
                row.error = check(row, result, row.ref if row.ref is not None else ref)
        except Exception as exc:
            if not drop_failed:
                raise
            log(f"dropped {row.case.name}: {type(exc).__name__}: {exc}")
            traceback.print_exc(file=sys.stderr)
            failed.append({"case": row.case.name, "error": f"{type(exc).__name__}: {exc}"})
            dropped.add(id(row))

    for row in rows:
        if row.case.repeat is None:
            log(f"warm-up: {row.case.name}")
            run(row, timed=False)
    for r in range(repeat):
        log(f"round {r + 1}/{repeat}")
        for row in rows:
            if id(row) in dropped:
                continue
            if row.case.repeat is not None and len(row.times) >= row.case.repeat:
                continue
            run(row, timed=True)
    rows[:] = [row for row in rows if id(row) not in dropped]
    return failed


def check(row: Row, result: Any, ref: np.ndarray) -> float | None:
    """Max |error| against the float64 reference (for a sum: relative error).  A torch
    tensor result (on any device) is brought to the host here, outside the timing."""
    if row.expect == "none":
        return None
    if hasattr(result, "detach"):
        result = result.detach().cpu().numpy()
    if row.expect == "sum":
        total = float(ref.sum())
        return abs(float(result) - total) / max(1.0, abs(total))
    values = np.asarray(result, dtype=np.float64).reshape(-1)
    want = ref[: len(values)]
    if len(values) != len(want) or (row.case.rows == len(ref) and len(values) != len(ref)):
        raise AssertionError(f"{row.case.name}: {len(values)} results for {row.case.rows} rows")
    return float(np.max(np.abs(values - want))) if len(values) else 0.0


def summarize(rows: list[Row], total_rows: int, nbytes: int) -> list[Record]:
    """One record per row: median seconds, pairs/s, GB/s and the ratios to its floor and
    to our row it is compared with (the keys of the results files' "cases")."""
    seconds = {}
    for row in rows:
        # Sample cases (row by row) are scaled to the full size, and say so; cases on data
        # of their own (``nbytes`` set) keep their own time.
        scale = 1.0 if row.nbytes is not None else total_rows / row.case.rows
        seconds[row.case.name] = statistics.median(row.times) * scale
    out = []
    for row in rows:
        s = seconds[row.case.name]
        pairs = row.case.rows if row.nbytes is not None else total_rows
        out.append(
            {
                "case": row.case.name,
                "kind": row.kind,
                "seconds": s,
                "times": row.times,
                "rows_timed": row.case.rows,
                "pairs_per_s": pairs / s,
                "gb_per_s": (row.nbytes if row.nbytes is not None else nbytes) / s / 1e9,
                "floor": row.floor,
                "x_floor": seconds[row.floor] / s if row.floor in seconds else None,
                "versus": row.versus,
                "ours_x_faster": s / seconds[row.versus] if row.versus in seconds else None,
                "max_error": row.error,
                "note": row.case.note,
            }
        )
    return out
