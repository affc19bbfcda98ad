"""A pandas frame of per-row tensors into dask, two ways, timed side by side in one run.

- ``dask_cosim.from_pandas(pdf)``: vectors become one Arrow fixed_size_list column.
- ``dd.from_pandas(pdf)`` with ``dataframe.convert-string: False``: the tensors stay an
  object column (without that setting dask turns them into truncated strings).

Each way is timed from the pandas frame to ``df.cosim.pairwise(...).mean().compute()``
(threaded scheduler), on the same frame of (D, 1) float32 tensors per row, as users hold
them.  Run: ``python benchmarks/from_pandas.py [--rows 20000] [--dim 300]``.
"""

from __future__ import annotations

import argparse
import os

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import torch

import dask_cosim
from benchmarks.timing import median_seconds


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    pdf = tensor_frame(args.rows, args.dim)
    with dask.config.set(scheduler="threads"):
        assert abs(ours(pdf) - object_columns(pdf)) < 1e-6  # the same numbers both ways
        fast = median_seconds(lambda: ours(pdf), args.repeat)
        slow = median_seconds(lambda: object_columns(pdf), args.repeat)
    load = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else "?"
    print(f"{args.rows:,} rows of ({args.dim}, 1) float32 tensors; load average {load}")
    print(f"  dask_cosim.from_pandas                         {fast:8.3f} s")
    print(f"  dd.from_pandas, dataframe.convert-string False {slow:8.3f} s  ({slow / fast:.1f}x)")


if __name__ == "__main__":
    main()
