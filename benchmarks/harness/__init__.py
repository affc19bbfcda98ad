"""The benchmark harness: what every script shares; a script owns only its cases and tables.

- ``harness.data``: ``generate_pairs`` (the demo's pairs, cosines spread over [-1, 1], in
  any dtype), ``normal_pairs`` (independent normal rows), ``write_list_layout`` /
  ``write_our_layout`` (pairs as the list<float> Parquet users hold and as
  ``dask_cosim.to_parquet`` writes them), ``embeddings`` / ``vector_frame`` (unit vectors
  around centres, in one column), and ``reference``, the float64 cosine;
- ``harness.timing``: ``median_seconds`` (median of repeats after an untimed warm-up), and
  ``Case``, ``Row``, ``time_rows``: cases timed in rounds (one run of each case per round,
  so drift in the machine hits every case alike), each result checked against the float64
  reference; ``summarize``: medians, pairs/s, GB/s, x floor, ours x faster;
- ``harness.report``: ``Column`` and ``print_table`` (the one table printer), ``CASE_TABLE``
  (the columns of ``summarize``'s records), ``plot`` (the bar chart), ``write_results``
  (JSON after the command, the time, the ``machine`` and its ``load_average`` when the run
  started and ended), ``load_text`` for printed tables;
- here, the entry: ``results_options`` (click: --name, --out, --quiet, given to the command
  as one ``output``) and ``execute_benchmark(Config)``: ``Config.run(log)`` measures and
  returns the results record, ``Config.report(record)`` prints it, then the harness writes
  ``<out>/<name>.json`` and, with ``Config.chart``, ``<out>/<name>.png``; with
  ``Config.partial`` (the record ``run`` fills in as it goes), an interrupted run writes
  what it measured before the interrupt.

Everything is importable from ``benchmarks.harness``.  A new script,
``python -m benchmarks.mine``, is this much::

    import click
    import torch

    from benchmarks import harness as h
    import dask_cosim

    FLOOR = "floor: torch sum (all cores)"


    @click.command()
    @click.option("--rows", default=1_000_000, show_default=True, help="Pairs N.")
    @click.option("--dim", default=300, show_default=True, help="Vector length D.")
    @click.option("--repeat", default=5, show_default=True, help="Timed rounds.")
    @h.results_options()
    def main(rows: int, dim: int, repeat: int, output: h.Output) -> None:
        "Our kernel against the all-core streaming floor."

        def run(log: h.Log) -> h.Record:
            a, b = h.generate_pairs(rows, dim)
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            floor = h.Case(FLOOR, lambda: (ta.sum(), tb.sum()), rows)
            ours = h.Case("ours: kernel", lambda: dask_cosim.pairwise_cosine(ta, tb), rows)
            cases = [h.Row(floor, "floor", expect="none"), h.Row(ours, "ours", floor=FLOOR)]
            h.time_rows(cases, repeat, h.reference(a, b), log)  # checks each result too
            table = h.summarize(cases, rows, a.nbytes + b.nbytes)
            return {"params": {"rows": rows, "dim": dim}, "cases": table}

        def report(record: h.Record) -> None:
            h.print_table(h.CASE_TABLE, record["cases"], f"N={rows:,} D={dim}")

        name = output.name or f"mine-{rows}x{dim}"
        h.execute_benchmark(h.Config(output, name, run, report))


    if __name__ == "__main__":
        main()

Run from the repository root (``python -m benchmarks.NAME``): the root is then on
``sys.path`` and the processes dask and multiprocessing spawn inherit it.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import click

from benchmarks.harness.data import (
    A,
    B,
    embeddings,
    generate_pairs,
    normal_pairs,
    reference,
    vector_frame,
    write_list_layout,
    write_our_layout,
)
from benchmarks.harness.report import (
    CASE_TABLE,
    RESULTS,
    Column,
    load_text,
    plot,
    print_table,
    write_results,
)
from benchmarks.harness.timing import (
    Case,
    Log,
    Record,
    Row,
    median_seconds,
    summarize,
    time_rows,
)

__all__ = [
    "CASE_TABLE",
    "RESULTS",
    "A",
    "B",
    "Case",
    "Column",
    "Config",
    "Log",
    "Output",
    "Record",
    "Row",
    "embeddings",
    "execute_benchmark",
    "generate_pairs",
    "load_text",
    "median_seconds",
    "normal_pairs",
    "plot",
    "print_table",
    "reference",
    "results_options",
    "summarize",
    "time_rows",
    "vector_frame",
    "write_list_layout",
    "write_our_layout",
    "write_results",
]


@dataclasses.dataclass(frozen=True)
class Output:
    """Where a run's results go: --name, --out (None: print only) and --quiet."""

    name: str | None
    out_dir: Path | None
    quiet: bool


@dataclasses.dataclass
class Config:
    """What a script hands :func:`execute_benchmark`."""

    output: Output
    name: str  # the results file: <out_dir>/<name>.json (and .png with a chart)
    run: Callable[[Log], Record]  # measures and checks; returns the results record
    report: Callable[[Record], None]  # prints the record's tables
    chart: Callable[[Record, Path], None] | None = None  # draws the record into a .png
    # The record ``run`` fills in as it goes (and returns), for a run that may be cut
    # short: on an interrupt (SIGINT, as ``.ci/gpu-check`` sends at its budget) what it
    # holds is reported and written, marked ``"interrupted"``, instead of nothing.
    partial: Record | None = None


def execute_benchmark(config: Config) -> Record:
    """Run, report, and write the results (and the chart) of one benchmark script."""
    quiet = config.output.quiet

    def log(msg: str) -> None:
        if not quiet:
            print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    try:
        record = config.run(log)
    except KeyboardInterrupt:
        if not config.partial:
            raise
        record = config.partial
        record["interrupted"] = time.strftime("%H:%M:%S")
        log("interrupted: reporting and writing the cases measured so far")
        _finish(config, record, log)
        raise SystemExit(130) from None
    _finish(config, record, log)
    return record


def _finish(config: Config, record: Record, log: Log) -> None:
    config.report(record)
    if config.output.out_dir is not None:
        path = config.output.out_dir / f"{config.name}.json"
        write_results(path, record)
        if config.chart is not None:
            config.chart(record, path.with_suffix(".png"))
        log(f"wrote {path}" + (" and .png" if config.chart is not None else ""))


F = TypeVar("F", bound=Callable[..., Any])


def results_options(out: Path | None = RESULTS) -> Callable[[F], F]:
    """click options --name, --out (default ``out``; None: print only) and --quiet, given
    to the command as one argument, ``output`` (an :class:`Output`)."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def command(*args: Any, name: str | None, out_dir: Path | None, quiet: bool, **kw: Any):
            return fn(*args, output=Output(name, out_dir, quiet), **kw)

        for option in (
            click.option("--quiet", is_flag=True, help="No progress lines."),
            click.option(
                "--out",
                "out_dir",
                type=click.Path(path_type=Path),
                default=out,
                show_default="benchmarks/results" if out == RESULTS else False,
                help="Folder of the results file" + ("." if out else "; default: none."),
            ),
            click.option("--name", default=None, help="Results file name; default per script."),
        ):
            command = option(command)
        return cast(F, command)

    return decorate
