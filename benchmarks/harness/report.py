"""What a run shows and keeps: tables (``Column``, ``print_table``, ``CASE_TABLE``), the
bar chart (``plot``) and the results file (``write_results``: the command, the machine and
its load average when the run started and ended)."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import dask
import distributed
import numpy as np
import pandas as pd
import pyarrow as pa
import torch

import dask_cosim
from benchmarks.harness.timing import Record

RESULTS = Path(__file__).resolve().parent.parent / "results"


@dataclasses.dataclass(frozen=True)
class Column:
    """A column of a printed table: its title, the record's key (or a function of the
    record), the value's format spec (``None`` prints as a blank cell), its least width
    and its alignment ("<" for text)."""

    title: str
    value: str | Callable[[Mapping[str, Any]], Any]
    spec: str = ""
    width: int = 0
    align: str = ">"

    def text(self, record: Mapping[str, Any]) -> str:
        value = self.value(record) if callable(self.value) else record[self.value]
        return "" if value is None else format(value, self.spec)


def print_table(
    columns: Sequence[Column], records: Sequence[Mapping[str, Any]], title: str | None = None
) -> None:
    """``title`` (if any), a line of column titles, then a line per record; each column
    as wide as its widest cell."""
    if title is not None:
        print(title)
    lines = [[c.title for c in columns], *([c.text(r) for c in columns] for r in records)]
    widths = [max(c.width, *(len(line[i]) for line in lines)) for i, c in enumerate(columns)]
    for line in lines:
        cells = (f"{t:{c.align}{w}}" for t, c, w in zip(line, columns, widths))
        print(" ".join(cells).rstrip())


# The table of ``summarize``'s records.
CASE_TABLE = [
    Column("case", "case", align="<"),
    Column("s", "seconds", ".3f", 8),
    Column("Mpairs/s", lambda r: r["pairs_per_s"] / 1e6, ".2f", 9),
    Column("GB/s", "gb_per_s", ".2f", 6),
    Column("x floor", "x_floor", ".2f", 8),
    Column("ours x faster", "ours_x_faster", ".1f"),
    Column("max err", "max_error", ".0e", 8),
    Column("note", "note", align="<"),
]


def plot(table: list[Record], title: str, path: Path) -> None:
    """``summarize``'s records as horizontal bars of million pairs per second."""
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


def machine() -> Record:
    """Versions, cores and GPUs: what the timings were taken with."""
    info: Record = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    for module in (torch, np, pd, pa, dask, distributed, dask_cosim):
        info[module.__name__] = module.__version__
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["torch_cuda"] = torch.version.cuda
        # The GPU stack, where it imports (none of it is needed on a CPU machine).
        for name in ("cupy", "cudf", "dask_cudf", "dask_cuda", "rmm", "triton"):
            try:
                info[name] = __import__(name).__version__
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


def write_results(path: Path, record: Record) -> None:
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
