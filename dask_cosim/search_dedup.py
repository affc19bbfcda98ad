"""What dedup removed, and groups of near-duplicates, one partition (or pair) at a time.

Knows no dask: :mod:`dask_cosim.search` maps these functions, one call per block of
consecutive partitions (a partition, unless there are many).  Rows are named by their
ordering key (block number above :data:`~dask_cosim.search_partition.POS_BITS` bits of
position: frame order), never by index labels, which may repeat.

- :func:`earlier_matches`: for each row of one partition, its best earlier row in another
  (or the same) partition, among those scoring at least the threshold;
  :func:`best_matches` keeps the best over several such frames; :func:`finish_removed`
  turns them into the rows of ``dedup(..., return_removed=True)``'s second frame, and
  :func:`drop_matched` removes the matched rows from the partition.
- :func:`earlier_matches` with ``edges`` and :func:`components`: the threshold graph's
  edges (a spanning forest's per pair task) as pairs of keys, merged by
  :func:`merged_forest` (a forest again: at most a row each), then its connected
  components (scipy, in one task), one array of group ids per block; :func:`with_group`
  puts a partition's share beside its rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from typing import Any

import numpy as np
import pandas as pd

from dask_cosim import search_partition as sp
from dask_cosim import search_results as sr
from dask_cosim.search_budget import Budget

__all__ = [
    "best_matches",
    "components",
    "drop_matched",
    "earlier_matches",
    "finish_removed",
    "merged_forest",
    "side_rows",
    "with_group",
]

_POSITION_MASK = (1 << sp.POS_BITS) - 1


def earlier_matches(
    q: sp.Side,
    r: sp.Side | None,
    threshold: float,
    tile_bytes: dict[str, int],
    precision: str = "fp32",
    *,
    edges: bool = False,
    budget: Budget | None = None,
) -> Any:
    """For each row of ``r`` (of ``q`` when ``r`` is None: then only earlier rows of
    ``q`` count) with a row of ``q`` scoring at least ``threshold``: the best such row
    (float64 score, ties to the earlier row), one pair per right row; with ``edges``
    instead edges that connect the rows as every such pair does (at most one per row:
    :func:`~dask_cosim.search_reduced.spanning`), as an (E, 2) array of the two rows'
    ordering keys.
    ``budget``: as :func:`~dask_cosim.search_partition.pair_threshold` takes it."""
    if edges:
        return sp.pair_threshold(q, r, threshold, tile_bytes, keep="forest",
                                 precision=precision, budget=budget)  # fmt: skip
    pairs = sp.pair_threshold(q, r, threshold, tile_bytes, exact_scores=True, keep="best",
                              precision=precision, budget=budget)  # fmt: skip
    pairs["_lkey"] = (np.int64(q.part) << sp.POS_BITS) + pairs["_l"].to_numpy(np.int64)
    return best_matches(pairs)


def best_matches(*parts: pd.DataFrame) -> pd.DataFrame:
    """Per right row (``_key``), the pair of highest score, ties to the smallest
    ``_lkey`` (the earliest left row)."""
    df = sr.concat_pairs(*parts)
    order = np.lexsort((df["_lkey"].to_numpy(), -df["score"].to_numpy(), df["_key"].to_numpy()))
    # Only the pairs kept are taken, not every pair sorted first (a copy of the frame).
    keys = df["_key"].to_numpy()[order]
    first = np.ones(len(df), dtype=bool)
    first[1:] = keys[1:] != keys[:-1]
    del keys
    return df.take(order[first]).reset_index(drop=True)


def finish_removed(
    best: pd.DataFrame, meta: pd.DataFrame, carried: dict[str, str], like: Any = None
) -> Any:
    """The removed rows of one block, in frame order: ``left`` (the earlier row),
    ``right`` (the removed row), ``score`` and the carried columns; in the library of
    ``like`` (cudf for a cudf input), else pandas."""
    return sr.pairs_result(best.sort_values("_key"), meta, False, like, carried)


def drop_matched(df: Any, best: pd.DataFrame, *before: int) -> Any:
    """``df`` without its rows that have an earlier match in ``best``; ``before``: the
    lengths of the partitions ahead of ``df`` in its block."""
    return sr.drop_rows(df, np.sort(best["_key"].to_numpy() & _POSITION_MASK), *before)


def merged_forest(*parts: np.ndarray) -> np.ndarray:
    """The edges (pairs of keys) of ``parts`` reduced to a forest that connects the rows
    as they do: a star around the smallest key of each connected set, one edge fewer
    than its rows, so that a merge gives at most a row's worth whatever it receives
    (groups checks what each merge receives before it moves:
    :func:`~dask_cosim.search_budget.check_tree`)."""
    from dask_cosim.search_reduced import spanning

    edges = np.concatenate(parts)
    if len(edges) == 0:
        return edges
    keys, ends = np.unique(edges, return_inverse=True)
    ends = ends.reshape(edges.shape)
    # Keys ascend with their positions in ``keys``: each star's centre is its smallest.
    fi, fj = spanning(ends[:, 0], ends[:, 1], len(keys), 0, upper=True)
    return np.stack([keys[fi], keys[fj]], axis=1)


def side_rows(side: sp.Side) -> int:
    return len(side.labels)


def components(rows: list[int], edges: np.ndarray) -> list[np.ndarray]:
    """Connected components of the graph of ``edges`` over blocks of ``rows`` rows: for
    each block, each row's group id, the frame position (0-based, over all blocks) of
    the group's first row.  A row without edges is its own group."""
    from dask_cosim.search_reduced import labels

    offsets = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    total = int(offsets[-1])
    ends = offsets[edges >> sp.POS_BITS] + (edges & _POSITION_MASK)
    label = labels(ends[:, 0], ends[:, 1], total, 0, upper=True)
    # Positions ascend: the first row with each label is its group's first row.
    _, first = np.unique(label, return_index=True)
    group = first[label].astype(np.int64)
    return [group[a:b] for a, b in itertools.pairwise(offsets)]


def with_group(df: Any, group: np.ndarray, name: Hashable, *before: int) -> Any:
    """``df`` (pandas or cudf) with the column ``name`` (any label: ``assign`` takes
    strings alone) holding its rows of ``group`` (its block's group ids; ``before``: the
    lengths of the partitions ahead of ``df`` in the block), by position (index labels
    may repeat)."""
    start = sum(before)
    out = df.copy(deep=False)
    out[name] = group[start : start + len(df)]
    return out
