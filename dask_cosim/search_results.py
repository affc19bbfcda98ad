"""Search results: partial frames of candidate pairs merged and finished into the rows a
user gets.

Knows no dask graphs (only dask's placeholder for unknown categories in a meta).  The
per-partition functions of :mod:`dask_cosim.search_partition` give
pandas frames of pairs (``left``, ``right``, ``score``, the ordering key ``_key``, the left
row's number ``_l`` and carried columns ``_q0``, ``_p0``, ...); here they are merged
(:func:`merge_topk`, :func:`concat_pairs`, :func:`union_positions`) and finished
(:func:`finish_pairs`, :func:`finish_topk`, :func:`drop_rows`) in the library of the input.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from dask.dataframe.utils import UNKNOWN_CATEGORIES

from dask_cosim import backends

__all__ = [
    "castable",
    "concat_frames",
    "concat_pairs",
    "drop_rows",
    "finish_pairs",
    "finish_topk",
    "merge_topk",
    "pairs_result",
    "union_positions",
]


def union_positions(*parts: np.ndarray) -> np.ndarray:
    return np.unique(np.concatenate(parts))


def drop_rows(df: Any, positions: np.ndarray, *before: int) -> Any:
    """``df`` without the rows at ``positions``; ``before``: the lengths of the partitions
    ahead of ``df`` in its block (``positions`` count from the block's first row)."""
    start = sum(before)
    positions = positions[(positions >= start) & (positions < start + len(df))] - start
    if len(positions) == 0:
        return df
    keep = np.ones(len(df), dtype=bool)
    keep[positions] = False
    return backends.boolean_mask(df, keep)


def concat_frames(*parts: Any, columns: list[Any] | None = None) -> Any:
    """Consecutive partitions as one frame (a block of a search), only their ``columns``
    when given."""
    return backends.concat_frames([p if columns is None else p[columns] for p in parts])


def _sorted_pairs(df: pd.DataFrame, by_score: bool = True) -> pd.DataFrame:
    """By left row, then score descending (``by_score``), then right row."""
    order = _pair_order(df, by_score)
    return df if order is None else df.take(order)


def _pair_order(df: pd.DataFrame, by_score: bool = True) -> np.ndarray | None:
    """The positions of ``df``'s rows in :func:`_sorted_pairs`' order, None where they are
    in it already."""
    keys = [df["_key"].to_numpy(), df["_l"].to_numpy()]
    if by_score:
        keys.insert(1, -df["score"].to_numpy())
    # One part's pairs come sorted (a top-k's rows are): a check costs less than a sort.
    return None if _in_order(keys) else np.lexsort(keys)


def _in_order(keys: list[np.ndarray]) -> bool:
    """Whether rows are already in the order np.lexsort(keys) gives (last key first)."""
    if len(keys[0]) < 2:
        return True
    before = np.zeros(len(keys[0]) - 1, dtype=bool)  # decided: row i comes first
    tied = np.ones_like(before)
    for key in reversed(keys):
        a, b = key[:-1], key[1:]
        before |= tied & (a < b)
        tied &= a == b
    return bool((before | tied).all())


def concat_pairs(*parts: pd.DataFrame) -> pd.DataFrame:
    non_empty = [p for p in parts if len(p)]
    return pd.concat(non_empty, ignore_index=True) if non_empty else parts[0]


def merge_topk(k: int, *parts: pd.DataFrame) -> pd.DataFrame:
    """The ``k`` best pairs of each left row among ``parts`` (score desc, then key)."""
    df = _sorted_pairs(concat_pairs(*parts))
    rank = _ranks(df["_l"].to_numpy())
    return df[rank < k].reset_index(drop=True)


def _ranks(groups: np.ndarray) -> np.ndarray:
    """0, 1, 2, ... within each run of equal values of a sorted array."""
    starts = np.searchsorted(groups, groups, side="left")
    return np.arange(len(groups)) - starts


def castable(dtype: Any) -> Any:
    """The dtype to cast result values to for the meta's ``dtype``: itself, except for a
    categorical of unknown categories (dask's meta of a categorical read from Parquet)
    or of none (its meta of a dictionary column read from plain Parquet, as pyarrow and
    polars write it, which says "known" but lists no category), which stands for
    whatever categories the values have; cast to it, every value would become null."""
    if isinstance(dtype, pd.CategoricalDtype) and dtype.categories is not None:
        if UNKNOWN_CATEGORIES in dtype.categories or len(dtype.categories) == 0:
            return pd.CategoricalDtype(ordered=dtype.ordered)
    return dtype


def finish_pairs(
    merged: pd.DataFrame,
    meta: pd.DataFrame,
    rank: bool,
    like: Any = None,
    carried: dict[str, str] | None = None,
) -> Any:
    """The result partition: sorted by left row, then rank (score descending, ties by
    right row) with ``rank``, else by right row; in the library of ``like`` (cudf for a
    cudf input), else pandas; ``carried`` maps the carried columns' names in ``merged``
    ("_q0", "_p0", ...) to theirs in the result."""
    order = _pair_order(merged, by_score=rank)
    return pairs_result(merged, meta, rank, like, carried, order)


def pairs_result(
    df: pd.DataFrame,
    meta: pd.DataFrame,
    rank: bool,
    like: Any = None,
    carried: dict[str, str] | None = None,
    rows: np.ndarray | None = None,
) -> Any:
    """The sorted partial frame ``df`` as result rows (see :func:`finish_pairs`), or
    its ``rows`` (positions, in the result's order) where given: each column taken
    once, into the result, not the whole frame sorted first."""

    def column(name: str) -> Any:
        values = df[name].array
        return values if rows is None else values.take(rows)

    out = pd.DataFrame(
        {
            "left": np.asarray(column("left")),
            "right": np.asarray(column("right")),
            "score": np.asarray(column("score")).astype(meta["score"].dtype, copy=False),
        },
        copy=False,
    )
    if rank:
        out["rank"] = _ranks(np.asarray(column("_l"))).astype(np.int64)
    for inner, name in (carried or {}).items():
        out[name] = column(inner)
    out = out.astype({c: castable(dtype) for c, dtype in meta.dtypes.items()})
    return out if like is None else backends.frame_like(out, like)


def finish_topk(merged: pd.DataFrame, like: Any, columns: list[Any], score: np.dtype) -> Any:
    """The ``topk`` result, in the library of ``like``: query, rank, match, score and the
    carried columns."""
    df = _sorted_pairs(merged)
    out = pd.DataFrame(
        {
            "query": df["left"].to_numpy(),
            "rank": _ranks(df["_l"].to_numpy()).astype(np.int64),
            "match": df["right"].to_numpy(),
            "score": df["score"].to_numpy().astype(score),
        }
    )
    for n, c in enumerate(columns):
        # The carried values as they are (Int64 with nulls, categories, strings): their
        # own dtype, not numpy's (float64 for Int64, objects for categories).
        carried = df[f"_p{n}"] if f"_p{n}" in df else pd.Series([], dtype=object)
        if isinstance(like, pd.DataFrame):  # (cudf's own dtypes: frame_like's job)
            carried = carried.astype(castable(like[c].dtype))
        out[c] = carried.reset_index(drop=True)
    if isinstance(like, pd.DataFrame):  # labels as the frame's index has them (categories)
        out["match"] = out["match"].astype(castable(like.index.dtype))
    return backends.frame_like(out, like)
