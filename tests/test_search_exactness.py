"""Exact means exact: topk, join, neighbors, dedup and the clustered method's provable
mode against a plain float64 brute force on adversarial rows, through the accessor on
eager and dask frames, for every precision that claims the float64 answer and every CPU
kernel (numba, torch, bfloat16 tiles); then the minimal cases that once broke it."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tests.helpers import as_column, split_frame


def test_float16_partitions_with_and_without_nulls_keep_the_tie_rule() -> None:
    """An Arrow float16 partition holding a null row comes out of the reader as float32,
    one without as float16; the float64 re-score summed the two dtypes in different
    orders, so copies of a row in two partitions scored a last bit apart and the later
    one could rank first."""
    for seed in range(8):
        rng = np.random.default_rng(seed)
        a = rng.standard_normal(64).astype(np.float16)
        q = rng.standard_normal((1, 64))
        null = np.array([False, True, False])
        pdf = pd.DataFrame({"emb": as_column(np.stack([a, a, a]), "fixed_size_list", null)})
        got = split_frame(pdf.assign(id=[0, 1, 2]), [1, 2]).cosim.topk(q, "emb", k=2, columns="id")
        assert got["id"].tolist() == [0, 2], seed
