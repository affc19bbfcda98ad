"""Exact means exact: topk, join, neighbors, dedup and the clustered method's provable
mode against a plain float64 brute force on adversarial rows, through the accessor on
eager and dask frames, for every precision that claims the float64 answer and every CPU
kernel (numba, torch, bfloat16 tiles); then the minimal cases that once broke it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.helpers import as_column, hide_numba, search_frame, split_frame


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


def test_a_pair_scores_the_same_both_ways_on_the_torch_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The torch re-score (GPUs, installs without numba) multiplied its sum by the two
    rows' scales one after the other, so cos(a, b) and cos(b, a) could differ in the last
    bit: row a listed b at a threshold that row b's list did not reach."""
    hide_numba(monkeypatch)
    x = np.random.default_rng(0).standard_normal((40, 7))
    got = search_frame(x).cosim.neighbors("emb", k=39)
    score = dict(zip(zip(got["left"], got["right"]), got["score"]))
    assert len(score) == 40 * 39
    differ = [(a, b) for a, b in score if score[a, b] != score[b, a]]
    assert not differ, f"{len(differ)} pairs score differently both ways, e.g. {differ[0]}"
