"""A pandas frame of per-row tensors into dask, two ways, timed side by side in one run.

- ``dask_cosim.from_pandas(pdf)``: vectors become one Arrow fixed_size_list column.
- ``dd.from_pandas(pdf)`` with ``dataframe.convert-string: False``: the tensors stay an
  object column (without that setting dask turns them into truncated strings).

Each way is timed from the pandas frame to ``df.cosim.pairwise(...).mean().compute()``
(threaded scheduler), on the same frame of (D, 1) float32 tensors per row, as users hold
them.  Run: ``python -m benchmarks.from_pandas [--rows 20000] [--dim 300]``.

``--client N``: on a local cluster of N worker processes instead, three computations
(``mean``, ``describe``, ``nlargest``) on ``dask_cosim.from_pandas``'s frame (partitions
scattered to the workers once) and on the same converted frame kept inside the graph
(``dd.from_pandas``, what every compute then ships to the scheduler).  ``--out DIR`` also
writes ``DIR/<name>.json``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import click
import dask
import dask.dataframe as dd
import pandas as pd
import torch

import dask_cosim
from benchmarks import harness
from benchmarks.harness import load_text, median_seconds, normal_pairs


def tensor_frame(rows: int, dim: int) -> pd.DataFrame:
    a, b = (torch.from_numpy(x).unsqueeze(-1) for x in normal_pairs(rows, dim))
    # One storage per row, as a model's outputs collected row by row are: views of one
    # big tensor would each pickle (and tokenize) the whole storage.
    return pd.DataFrame({"embeds_a": [t.clone() for t in a], "embeds_b": [t.clone() for t in b]})


def ours(pdf: pd.DataFrame) -> float:
    df = dask_cosim.from_pandas(pdf)
    return float(df.cosim.pairwise("embeds_a", "embeds_b").mean().compute())


def object_columns(pdf: pd.DataFrame) -> float:
    with dask.config.set({"dataframe.convert-string": False}):
        df = dd.from_pandas(pdf, npartitions=max(1, len(pdf) // 20_000))
    return float(df.cosim.pairwise("embeds_a", "embeds_b").mean().compute())


def on_cluster(pdf: pd.DataFrame, workers: int, repeat: int, log: harness.Log) -> harness.Record:
    """``dask_cosim.from_pandas`` with a client (convert and scatter), then three
    computations on its frame and on the same frame kept inside the graph."""
    import warnings

    from distributed import Client, LocalCluster

    warnings.filterwarnings("ignore", message="Sending large graph")
    with LocalCluster(n_workers=workers, threads_per_worker=1) as cluster, Client(cluster):
        t0 = time.perf_counter()
        scattered = dask_cosim.from_pandas(pdf)
        made = time.perf_counter() - t0
        with dask.config.set({"dataframe.convert-string": False}):
            in_graph = dd.from_pandas(
                scattered.compute(), npartitions=scattered.npartitions, sort=False
            )
        computations: dict[str, Callable[[dd.Series], object]] = {
            "mean": lambda s: s.mean().compute(),
            "describe": lambda s: s.describe().compute(),
            "nlargest": lambda s: s.nlargest(5).compute(),
        }
        times = []
        for name, compute in computations.items():
            log(name)
            seconds = {}
            for where, df in (("in_graph", in_graph), ("scattered", scattered)):
                cos = df.cosim.pairwise("embeds_a", "embeds_b")
                seconds[where] = median_seconds(partial(compute, cos), repeat)
            times.append({"computation": name, **seconds})
    return {"from_pandas_with_client": made, "computations": times}


CLUSTER_TABLE = [
    harness.Column("", "computation", align="<"),
    harness.Column("in the graph", lambda r: f"{r['in_graph']:.3f} s"),
    harness.Column("scattered", lambda r: f"{r['scattered']:.3f} s"),
    harness.Column("", lambda r: f"({r['in_graph'] / r['scattered']:.1f}x)", align="<"),
]


@click.command()
@click.option("--rows", default=20_000, show_default=True)
@click.option("--dim", default=300, show_default=True)
@click.option("--repeat", default=3, show_default=True)
@click.option("--client", default=0, show_default=True, help="Worker processes (0: no cluster).")
@harness.results_options(out=None)
def main(rows: int, dim: int, repeat: int, client: int, output: harness.Output) -> None:
    """A pandas frame of per-row tensors into dask, two ways, timed side by side."""

    def run(log: harness.Log) -> harness.Record:
        pdf = tensor_frame(rows, dim)
        record: harness.Record = {"params": {"rows": rows, "dim": dim, "client": client}}
        if client:
            return {**record, **on_cluster(pdf, client, repeat, log)}
        with dask.config.set(scheduler="threads"):
            assert abs(ours(pdf) - object_columns(pdf)) < 1e-6  # the same numbers both ways
            record["from_pandas"] = median_seconds(lambda: ours(pdf), repeat)
            record["dd_from_pandas"] = median_seconds(lambda: object_columns(pdf), repeat)
        return record

    def report(record: harness.Record) -> None:
        if client:
            took = record["from_pandas_with_client"]
            print(f"dask_cosim.from_pandas with the client: {took:.2f} s (convert and scatter)")
            harness.print_table(CLUSTER_TABLE, record["computations"])
        print(f"{rows:,} rows of ({dim}, 1) float32 tensors; load average {load_text()}")
        if not client:
            fast, slow = record["from_pandas"], record["dd_from_pandas"]
            print(f"  dask_cosim.from_pandas                         {fast:8.3f} s")
            print(
                f"  dd.from_pandas, dataframe.convert-string False {slow:8.3f} s  "
                f"({slow / fast:.1f}x)"
            )

    name = output.name or f"from_pandas-{rows}x{dim}" + (f"-client{client}" if client else "")
    harness.execute_benchmark(harness.Config(output, name, run, report))


if __name__ == "__main__":
    main()
