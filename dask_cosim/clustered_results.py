"""The clustered search's pairs back in frame order, one output partition at a time:
dask-free, pandas in, pandas/cudf out.

:func:`dask_cosim.clustered_partition.search_blocks` finds the pairs of each block,
named by their rows' frame-order keys; :mod:`dask_cosim.clustered` gathers them into
the input partition a key names, where these make the result: the pairs sorted
(:func:`finish_pairs`), dedup's removed rows (:func:`removed_rows`) and kept rows
(:func:`drop_keys`), with the columns a search carries taken from the rows' own
partitions (:func:`with_carried`).  Each holds the pairs gathered into one partition,
and counts them against the search's budget (:func:`held`) before it sorts or widens
them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from dask_cosim import search_dedup as sd
from dask_cosim import search_partition as sp
from dask_cosim import search_results as sr
from dask_cosim.clustered_partition import POS_BITS, key_positions
from dask_cosim.search_budget import MORE_FRAME_PARTITIONS, Budget

__all__ = ["best_earlier", "drop_keys", "finish_pairs", "held", "removed_rows", "with_carried"]


def held(found: pd.DataFrame, budget: Budget | None) -> None:
    """Raise ``budget``'s error where ``found``, the pairs gathered into one partition of
    the frame (indexed by the keys of its rows), are more than one task may hold."""
    if budget is not None and len(found):
        part = int(found.index[0]) >> POS_BITS
        where = f"the pairs gathered into partition {part} of the frame"
        budget.check(len(found), where, MORE_FRAME_PARTITIONS)


def finish_pairs(
    pairs: pd.DataFrame, meta: pd.DataFrame, like: Any = None,
    carried: dict[str, str] | None = None, budget: Budget | None = None,
) -> Any:  # fmt: skip
    """Pairs of one output partition in frame order (left row, then right row), each
    once: the ``neighbors(threshold=...)`` result partition, in the library of ``like``;
    ``carried`` as :func:`dask_cosim.search_results.pairs_result` takes it; ``budget``
    as :func:`held`."""
    held(pairs, budget)
    lkey = pairs.index.to_numpy() if "_lkey" not in pairs else pairs["_lkey"].to_numpy()
    rkey = pairs["_rkey"].to_numpy()
    taken = np.lexsort([rkey, lkey])
    lkey, rkey = lkey[taken], rkey[taken]
    # A pair found from both of its clusters (n_probe mode) is reported once.
    again = np.r_[False, (lkey[1:] == lkey[:-1]) & (rkey[1:] == rkey[:-1])]
    del lkey, rkey
    taken = taken[~again[: len(taken)]]
    return sr.pairs_result(pairs, meta, False, like, carried, taken)


def best_earlier(pairs: pd.DataFrame, budget: Budget | None = None) -> pd.DataFrame:
    """From pairs indexed by the later row's key: per later row ("_key") its best earlier
    match (the exact method's choice: :func:`dask_cosim.search_dedup.best_matches`).  A
    pair found from both of its clusters counts once, as it should.  ``budget`` as
    :func:`held`."""
    held(pairs, budget)
    return sd.best_matches(pairs.rename_axis("_key").reset_index())


def removed_rows(
    pairs: pd.DataFrame, meta: pd.DataFrame, like: Any = None,
    carried: dict[str, str] | None = None, budget: Budget | None = None,
) -> Any:  # fmt: skip
    """dedup's removed rows of one output partition, from its pairs indexed by the later
    row's key: :func:`best_earlier`, in frame order, in the library of ``like``;
    ``carried`` as :func:`dask_cosim.search_results.pairs_result` takes it; ``budget``
    as :func:`held`."""
    return sd.finish_removed(best_earlier(pairs, budget), meta, carried or {}, like)


def with_carried(
    found: pd.DataFrame, payload: Any, prefix: str, budget: Budget | None = None
) -> pd.DataFrame:
    """``found``, indexed by keys of rows of one input partition, with those rows'
    carried columns: ``payload`` is that partition's columns to carry (pandas or cudf),
    named "{prefix}0", ... (:func:`dask_cosim.search_partition.carried_rows`);
    ``budget`` as :func:`held`."""
    held(found, budget)
    rows = key_positions(found.index.to_numpy(np.int64))
    extra = sp.carried_rows(payload, rows, prefix).set_axis(found.index, axis=0)
    return pd.concat([found, extra], axis=1)


def drop_keys(df: Any, drops: pd.DataFrame, budget: Budget | None = None) -> Any:
    """``df`` (one partition of the input) without the rows whose keys are in ``drops``
    (its index or its "_key" column: keys of this partition's rows); ``budget`` (where
    ``drops`` are pairs indexed by their later row's key) as :func:`held`."""
    held(drops, budget)
    keys = drops["_key"].to_numpy() if "_key" in drops else drops.index.to_numpy()
    pos = key_positions(keys)
    if len(pos) == 0:
        return df
    keep = np.ones(len(df), dtype=bool)
    keep[pos] = False
    return df.iloc[np.flatnonzero(keep)]
