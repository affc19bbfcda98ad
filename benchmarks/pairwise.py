"""One run, one table: our pipeline against this machine's floor and the tools people use.

    python -m benchmarks.pairwise --rows 1000000 --dim 300        # make bench

Generates N pairs of D-vectors once, writes them as list<float> Parquet (what pandas,
dask and Spark write) and in ``dask_cosim.to_parquet``'s layout, starts a LocalCluster
(worker processes, one per core), then times every case on the same data: a warm-up run,
then --repeat rounds in which each case runs once (so drift in the machine hits every
case alike), and reports the median.  Each result is checked against a float64 reference.
Last, the peak memory of ``pairwise`` on one partition (``benchmarks.memory``).

Ratios: "x floor" is floor time / case time (1.00 = as fast as merely reading the input;
in-memory cases against the streaming floor, Parquet cases against pyarrow reading the
same files); "ours is x faster" is case time / our comparable time (in-memory peers
against our kernel, file-based peers against our end-to-end run from our layout).

Writes ``benchmarks/results/<name>.json`` (with the machine and its load average) and
``<name>.png`` (bar chart).  ``benchmarks.pairwise_gpu`` runs the same table and adds the
GPU rows: ``measure`` takes its phase (``Phase``) and targets.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import dask.dataframe as dd
import numpy as np
import pyarrow.parquet as pq
import torch

import dask_cosim
from benchmarks import harness
from benchmarks.harness import A, B, Case, Row
from benchmarks.memory import fresh_process_memory, memory_text
from benchmarks.peers import file_peers, in_memory_peers
from dask_cosim import kernels

TORCH_FLOOR = "floor: torch sum (all cores)"
NUMPY_FLOOR = "floor: numpy sum (1 core)"
LIST_FLOOR = "floor: pyarrow read, list files"
OURS_FLOOR = "floor: pyarrow read, our files"


@dataclasses.dataclass
class Pairs:
    """The run's data: N pairs, their float64 cosines and the folders holding them."""

    a: np.ndarray
    b: np.ndarray
    ref: np.ndarray
    list_dir: Path  # list<float> Parquet (``harness.write_list_layout``)
    ours_dir: Path  # our layout (``harness.write_our_layout``)
    tmp: Path  # scratch space, removed after the run


@dataclasses.dataclass
class Phase:
    """Rows timed after the CPU rows, once the CPU cluster is closed (the GPU rows).
    ``run(pairs, repeat, log)`` returns (timed rows, failures {"case", "error"}, more
    entries of the results record, such as "host_round_trips", and "interrupted" where
    an interrupt cut it short: its rows so far are kept); ``targets`` join the
    table's targets; ``report(record)`` prints what the phase added, after the table."""

    run: Callable[[Pairs, int, harness.Log], tuple[list[Row], list[dict[str, str]], dict[str, Any]]]
    targets: list[tuple[str, str, str, float]]
    report: Callable[[harness.Record], None] | None = None
    # More entries of the results record, read off the summarised table.
    from_table: Callable[[list[harness.Record]], dict[str, Any]] | None = None


def _row(name: str, run: Callable[[], Any], n: int, note: str = "", **how: Any) -> Row:
    """A Row of a Case: ``how`` holds Row's fields (kind first)."""
    return Row(Case(name, run, n, note), **how)


def floor_rows(pairs: Pairs) -> list[Row]:
    a, b, n = pairs.a, pairs.b, len(pairs.a)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    mapped = "read_table, memory-mapped, all cores"

    def read(folder: Path) -> Callable[[], object]:
        return lambda: pq.read_table(folder, columns=[A, B], memory_map=True)

    return [
        _row(NUMPY_FLOOR, lambda: (a.sum(), b.sum()), n, "streams both arrays once",
             kind="floor", expect="none"),
        _row(TORCH_FLOOR, lambda: (ta.sum(), tb.sum()), n,
             f"{torch.get_num_threads()} threads", kind="floor", expect="none"),
        _row(LIST_FLOOR, read(pairs.list_dir), n, mapped, kind="floor", expect="none"),
        _row(OURS_FLOOR, read(pairs.ours_dir), n, mapped, kind="floor", expect="none"),
    ]  # fmt: skip


def sum_cos(df: dd.DataFrame) -> float:
    return float(df.cosim.pairwise(A, B).sum().compute())


def our_rows(pairs: Pairs, persisted: dd.DataFrame) -> list[Row]:
    ta, tb, n = torch.from_numpy(pairs.a), torch.from_numpy(pairs.b), len(pairs.a)
    out_dir = pairs.tmp / "result"

    def end_to_end_write() -> np.ndarray:
        df = dask_cosim.read_parquet(pairs.ours_dir)
        df["cos"] = df.cosim.pairwise(A, B)
        dask_cosim.to_parquet(df[["id", "cos"]], out_dir, overwrite=True)
        return pq.read_table(out_dir, columns=["cos"])["cos"].to_numpy()

    fused = f"fused: {kernels.fused_kernel_for(ta, tb) or 'none, torch kernel'}"
    return [
        _row("ours: kernel", lambda: dask_cosim.pairwise_cosine(ta, tb).numpy(), n, fused,
             kind="ours", floor=TORCH_FLOOR),
        _row("ours: kernel, torch fallback",
             lambda: dask_cosim.pairwise_cosine(ta, tb, fused=False).numpy(), n,
             "fused=False: the chunked torch kernel", kind="ours", floor=TORCH_FLOOR),
        _row("ours: dask, persisted", lambda: sum_cos(persisted), n,
             "partitions in worker memory", kind="ours", floor=TORCH_FLOOR, expect="sum"),
        _row("ours: list Parquet -> sum", lambda: sum_cos(dask_cosim.read_parquet(pairs.list_dir)),
             n, kind="ours", floor=LIST_FLOOR, expect="sum"),
        _row("ours: our Parquet -> sum", lambda: sum_cos(dask_cosim.read_parquet(pairs.ours_dir)),
             n, kind="ours", floor=OURS_FLOOR, expect="sum"),
        _row("ours: our Parquet -> Parquet", end_to_end_write, n, "writes id, cos",
             kind="ours", floor=OURS_FLOOR),
    ]  # fmt: skip


def peer_rows(pairs: Pairs, workers: int) -> list[Row]:
    """The tools people use instead (``benchmarks.peers``), in memory and from files."""
    rows = [
        Row(case, "peer", floor=NUMPY_FLOOR, versus="ours: kernel")
        for case in in_memory_peers(pairs.a, pairs.b)
    ]
    peers = file_peers(pairs.list_dir, pairs.a, pairs.b, pairs.tmp / "peers", processes=workers)
    return rows + [Row(case, "peer", versus="ours: our Parquet -> sum") for case in peers]


TARGETS = [
    # (what, row, compared with, bar): the targets, as ratios of this run's times.
    ("kernel >= 0.9 x all-core floor", "ours: kernel", TORCH_FLOOR, 0.9),
    ("dask persisted >= 0.8 x all-core floor", "ours: dask, persisted", TORCH_FLOOR, 0.8),
    (
        "list Parquet end to end >= 0.9 x pyarrow read",
        "ours: list Parquet -> sum",
        LIST_FLOOR,
        0.9,
    ),
    (
        "our layout end to end >= 5 x plain dask",
        "ours: our Parquet -> sum",
        "peer: dask read_parquet + F.cosine_similarity",
        5.0,
    ),
]


def target_lines(
    table: list[harness.Record], targets: list[tuple[str, str, str, float]]
) -> list[harness.Record]:
    """Each target whose two rows ran: the ratio of their times, the bar, met or not."""
    seconds = {r["case"]: r["seconds"] for r in table}
    lines = []
    for what, ours, base, bar in targets:
        if ours in seconds and base in seconds:
            ratio = seconds[base] / seconds[ours]
            lines.append({"target": what, "ratio": ratio, "bar": bar, "met": ratio >= bar})
    return lines


def measure(
    params: dict[str, Any], peers: bool, log: harness.Log, phase: Phase | None = None
) -> harness.Record:
    """The run: data, the CPU rows on a LocalCluster, the memory probe, then ``phase``."""
    rows, dim, dtype = params["rows"], params["dim"], params["dtype"]
    partitions, workers, repeat = params["partitions"], params["workers"], params["repeat"]
    log(f"generating {rows:,} pairs x {dim} {dtype} ({nbytes(params) / 1e9:.2f} GB)")
    a, b = harness.generate_pairs(rows, dim, dtype)
    tmp = Path(tempfile.mkdtemp(prefix="cosim-bench-"))
    pairs = Pairs(a, b, harness.reference(a, b), tmp / "list", tmp / "ours", tmp)
    client = None
    failed: list[dict[str, str]] = []
    extras: dict[str, Any] = {"host_round_trips": None}
    try:
        log(f"writing {partitions} list<float> files and our layout")
        harness.write_list_layout(a, b, pairs.list_dir, partitions)
        harness.write_our_layout(a, b, pairs.ours_dir, partitions)

        log(f"starting a LocalCluster: {workers} worker processes x 1 thread")
        client = dask_cosim.local_cluster(n_workers=workers, gpus=False, dashboard_address=None)
        persisted = dask_cosim.read_parquet(pairs.ours_dir).persist()
        from distributed import wait

        wait(persisted)
        table_rows = floor_rows(pairs) + our_rows(pairs, persisted)
        if peers:
            log("building peer cases")
            table_rows += peer_rows(pairs, workers)
        harness.time_rows(table_rows, repeat, pairs.ref, log)
        log("measuring the peak memory of pairwise on one partition, in a fresh process")
        memory = fresh_process_memory(pairs.ours_dir)
        for row in table_rows:
            if row.case.cleanup is not None:
                row.case.cleanup()
        if phase is not None:
            # One cluster at a time: the CPU workers would compete with the GPU worker's
            # host side (Parquet decoding, the copies to the device).
            del persisted
            client.close()
            client = None
            more, failed, added = phase.run(pairs, repeat, log)
            extras.update(added)
            table_rows += more
    finally:
        if client is not None:
            client.close()
            if client.cluster is not None:
                client.cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)

    table = harness.summarize(table_rows, rows, nbytes(params))
    if phase is not None and phase.from_table is not None:
        extras.update(phase.from_table(table))
    targets = TARGETS + (phase.targets if phase is not None else [])
    return {
        "params": params,
        "cases": table,
        "targets": target_lines(table, targets),
        "memory": memory,
        "failed": failed,
        **extras,
    }


def nbytes(params: dict[str, Any]) -> int:
    """Bytes of both inputs."""
    return 2 * params["rows"] * params["dim"] * np.dtype(params["dtype"]).itemsize


def header(params: dict[str, Any]) -> str:
    return (
        f"N={params['rows']:,} D={params['dim']} {params['dtype']}, "
        f"{params['partitions']} partitions, {params['workers']} workers, "
        f"{os.cpu_count()} cores, median of {params['repeat']} "
        "(row by row: a sample, scaled to N)"
    )


def report(record: harness.Record) -> None:
    harness.print_table(harness.CASE_TABLE, record["cases"], header(record["params"]))
    print("\ntargets (ratios from this run):")
    for t in record["targets"]:
        where = "at or above" if t["met"] else "below"
        print(f"  {t['target']:50} {t['ratio']:.2f}, {where} the bar ({t['bar']})")
    if record["failed"]:
        print("\nleft out (raised; tracebacks above):")
        for f in record["failed"]:
            print(f"  {f['case']}: {f['error']}")
    if record["memory"] is not None:
        print("\n" + memory_text(record["memory"]))


def chart(record: harness.Record, path: Path) -> None:
    harness.plot(record["cases"], header(record["params"]), path)


F = TypeVar("F", bound=Callable[..., Any])


def options(fn: F) -> F:
    """The sizes and choices of a run, for this script and ``benchmarks.pairwise_gpu``."""
    for option in reversed(
        [
            click.option("--rows", default=1_000_000, show_default=True, help="Pairs N."),
            click.option("--dim", default=300, show_default=True, help="Vector length D."),
            click.option(
                "--dtype",
                type=click.Choice(["float32", "float16", "float64"]),
                default="float32",
                show_default=True,
            ),
            click.option(
                "--partitions",
                type=int,
                default=None,
                help="Files/partitions; default about 128 MiB of vectors each, at least 2 per "
                "worker.",
            ),
            click.option("--workers", type=int, help="Dask workers; default one per core."),
            click.option("--repeat", default=5, show_default=True, help="Timed rounds."),
            click.option(
                "--peers/--no-peers",
                default=True,
                show_default=True,
                help="The CPU peers (in memory and from files); the spawn peer's set-up "
                "takes minutes.",
            ),
            harness.results_options(),
        ]
    ):
        fn = option(fn)
    return fn


def execute(given: dict[str, Any], kind: str, phase: Phase | None = None) -> harness.Record:
    """Settle the sizes ``given`` (the values of ``options``), then measure, print and
    write the run: ``<kind><cores>-<N>x<D>-<dtype>.json`` unless --name says otherwise.
    Returns the results record."""
    params = {k: given[k] for k in ("rows", "dim", "dtype", "partitions", "workers", "repeat")}
    params["workers"] = params["workers"] or os.cpu_count() or 1
    partitions = params["partitions"] or max(
        2 * params["workers"], -(-nbytes(params) // (128 * 2**20))
    )
    params["partitions"] = min(partitions, params["rows"])
    output = given["output"]
    name = output.name or (
        f"{kind}{os.cpu_count()}-{params['rows']}x{params['dim']}-{params['dtype']}"
    )

    def run(log: harness.Log) -> harness.Record:
        return {"name": name, **measure(params, given["peers"], log, phase)}

    def report_all(record: harness.Record) -> None:
        report(record)
        if phase is not None and phase.report is not None:
            phase.report(record)

    return harness.execute_benchmark(harness.Config(output, name, run, report_all, chart))


@click.command()
@options
def main(**given: Any) -> None:
    """Our pipeline against this machine's floors and the tools people use (the CPU rows)."""
    execute(given, "cpu")


if __name__ == "__main__":
    main()
