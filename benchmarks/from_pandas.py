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
(``dd.from_pandas``, what every compute then ships to the scheduler).
"""

from __future__ import annotations

import argparse
import time

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import torch

import dask_cosim
from benchmarks.harness import load_text, median_seconds


def tensor_frame(rows: int, dim: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    a = torch.from_numpy(rng.standard_normal((rows, dim, 1), dtype=np.float32))
    b = torch.from_numpy(rng.standard_normal((rows, dim, 1), dtype=np.float32))
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


def on_cluster(pdf: pd.DataFrame, workers: int, repeat: int) -> None:
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
        print(f"dask_cosim.from_pandas with the client: {made:.2f} s (convert and scatter)")
        print(f"{'':10} {'in the graph':>14} {'scattered':>12}")
        for name, compute in (
            ("mean", lambda s: s.mean().compute()),
            ("describe", lambda s: s.describe().compute()),
            ("nlargest", lambda s: s.nlargest(5).compute()),
        ):
            times = []
            for df in (in_graph, scattered):
                cos = df.cosim.pairwise("embeds_a", "embeds_b")
                times.append(median_seconds(lambda cos=cos, compute=compute: compute(cos), repeat))
            print(f"{name:10} {times[0]:12.3f} s {times[1]:10.3f} s  ({times[0] / times[1]:.1f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--client", type=int, default=0, help="worker processes")
    args = parser.parse_args()
    pdf = tensor_frame(args.rows, args.dim)
    if args.client:
        on_cluster(pdf, args.client, args.repeat)
        print(f"{args.rows:,} rows of ({args.dim}, 1) float32 tensors; load average {load_text()}")
        return
    with dask.config.set(scheduler="threads"):
        assert abs(ours(pdf) - object_columns(pdf)) < 1e-6  # the same numbers both ways
        fast = median_seconds(lambda: ours(pdf), args.repeat)
        slow = median_seconds(lambda: object_columns(pdf), args.repeat)
    print(f"{args.rows:,} rows of ({args.dim}, 1) float32 tensors; load average {load_text()}")
    print(f"  dask_cosim.from_pandas                         {fast:8.3f} s")
    print(f"  dd.from_pandas, dataframe.convert-string False {slow:8.3f} s  ({slow / fast:.1f}x)")


if __name__ == "__main__":
    main()
