"""What the benchmark scripts share.

- ``median_seconds``: the timing rule (median of repeats after an untimed warm-up);
- ``Row``, ``time_rows``, ``check``: cases timed in rounds (one run of each case per round,
  so drift in the machine hits every case alike), each result checked against a float64
  reference;
- ``summarize``, ``print_table``: the table of medians and ratios (x floor, ours x faster);
- ``write_results``: the JSON results file, with the command, the machine (``machine``) and
  its load average when the run started and ended (``load_average``);
- ``plot``: the bar chart.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import sys
import textwrap
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from benchmarks.peers import Case

RESULTS = Path(__file__).resolve().parent / "results"


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
    rows: list[Row],
    repeat: int,
    ref: np.ndarray,
    log: Callable[[str], None],
    *,
    drop_failed: bool = False,
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


def summarize(rows: list[Row], total_rows: int, nbytes: int) -> list[dict[str, Any]]:
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


def print_table(table: list[dict[str, Any]], header: str) -> None:
    print(header)
    print(
        f"{'case':46} {'s':>8} {'Mpairs/s':>9} {'GB/s':>6} {'x floor':>8} "
        f"{'ours x faster':>13} {'max err':>8}  note"
    )
    for r in table:
        x_floor = f"{r['x_floor']:.2f}" if r["x_floor"] is not None else ""
        faster = f"{r['ours_x_faster']:.1f}" if r["ours_x_faster"] is not None else ""
        err = f"{r['max_error']:.0e}" if r["max_error"] is not None else ""
        print(
            f"{r['case']:46} {r['seconds']:8.3f} {r['pairs_per_s'] / 1e6:9.2f} "
            f"{r['gb_per_s']:6.2f} {x_floor:>8} {faster:>13} {err:>8}  {r['note']}"
        )


def plot(table: list[dict[str, Any]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"floor": "#999999", "ours": "#1f77b4", "peer": "#ff7f0e"}
    fig, ax = plt.subplots(figsize=(9, 0.38 * len(table) + 1.2))
    names = [r["case"] for r in table][::-1]
    values = [r["pairs_per_s"] / 1e6 for r in table][::-1]
    ax.barh(names, values, color=[colors[r["kind"]] for r in table][::-1])
    ax.set_xscale("log")
    ax.set_xlabel("million pairs per second (log scale; higher is better)")
    ax.set_title(textwrap.fill(title, 90), fontsize=9)
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:.2g}", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine() -> dict[str, Any]:
    """Versions, cores and GPUs: what the timings were taken with."""
    import dask
    import distributed
    import pandas as pd
    import pyarrow as pa
    import torch

    import dask_cosim

    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numpy": np.__version__,
        "pandas": pd.__version__,
        "pyarrow": pa.__version__,
        "dask": dask.__version__,
        "distributed": distributed.__version__,
        "dask_cosim": dask_cosim.__version__,
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["torch_cuda"] = torch.version.cuda
        # The GPU stack, where it imports (none of it is needed on a CPU machine).
        for module in ("cupy", "cudf", "dask_cudf", "dask_cuda", "rmm", "triton"):
            try:
                info[module] = __import__(module).__version__
            except Exception:
                continue
    return info


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (as in /proc/loadavg); None where unknown."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def load_text() -> str:
    """:func:`load_average` as text, "5.2 5.9 6.1" (or "n/a"), for printed tables."""
    load = load_average()
    return " ".join(str(x) for x in load) if load else "n/a"


# When a script starts (it imports this module before timing anything): what else ran.
LOAD_AT_START = load_average()


def command_line() -> str:
    """How this process was started, as a user would type it."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    program = f"python -m {spec.name}" if spec is not None else f"python {sys.argv[0]}"
    return " ".join([program, *sys.argv[1:]])


def write_results(path: Path, record: dict[str, Any]) -> None:
    """``record`` as JSON at ``path``, after the command, the time, the machine and its
    load average at the start and the end of the run."""
    full = {
        "command": command_line(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "load_average": {"start": LOAD_AT_START, "end": load_average()},
        **record,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(full, indent=1))
