"""Similarity search on dataframes: top-k, joins, neighbours and dedup.

The upper half builds the work: one task per partition normalises its vectors once
(:func:`prepare_side`), one task per pair of partitions reduces their tiles
(:mod:`dask_cosim.search_kernels`), and the results of one left partition are merged by a
tree of tasks (``cosim.search.split-every`` at a time), never by a groupby over lists.
The same functions run directly, without dask, on eager pandas/cudf frames.  The lower
half holds those per-partition functions: dask-free, pandas/cudf in, pandas out.

Ordering.  Every right row has a key (partition number, position), which is its place
in frame order: among equal float64 scores the smaller key wins, so results do not
depend on how a frame is partitioned.
"""

from __future__ import annotations

import math
import numbers
import uuid
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import dask
import dask.config
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from dask_cosim import backends, options, partition
from dask_cosim import search_kernels as sk

__all__ = ["Side", "dedup", "join", "neighbors", "prepare_side", "topk"]

# Partition numbers sit above the position bits of a row's ordering key.
_POS_BITS = 40
_PAIR_COLUMNS = ["_l", "_key", "left", "right", "score"]


# =========================================================================== dask layer


@dataclass(frozen=True)
class _Options:
    eps: float
    device: str
    tile_bytes: dict[str, int]
    split_every: int


def _options() -> _Options:
    return _Options(
        eps=options.eps(),
        device=options.device(),
        tile_bytes=options.search_tile_bytes(),
        split_every=options.search_split_every(),
    )


def _check_k(k: Any) -> int | None:
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"k={k!r} must be an integer >= 1 (the matches kept per row)")
    return int(k)


def _check_threshold(threshold: Any, required: bool = False) -> float | None:
    if threshold is None and not required:
        return None
    try:
        value = float(threshold)
    except (TypeError, ValueError):
        value = math.nan
    if not -1.0 <= value <= 1.0:
        raise ValueError(
            f"threshold={threshold!r} must be a number in [-1, 1] (a cosine similarity), "
            "e.g. threshold=0.9"
        )
    return value


def _check_k_or_threshold(k: Any, threshold: Any) -> tuple[int | None, float | None]:
    k, threshold = _check_k(k), _check_threshold(threshold)
    if k is None and threshold is None:
        raise ValueError(
            "give k (the best matches of each row), threshold (every pair scoring at "
            "least it), or both; e.g. k=10 or threshold=0.9"
        )
    return k, threshold


def _check_column(meta: Any, column: Any, argument: str) -> backends.VectorSpec:
    if column not in meta.columns:
        raise backends.column_not_found(column, meta.columns, f"{argument}: column")
    return backends.vector_spec(meta[column], column)


def _check_dims(spec_a: backends.VectorSpec, what_a: str, dim_b: int | None, what_b: str) -> None:
    if spec_a.dim is not None and dim_b is not None and spec_a.dim != dim_b:
        raise ValueError(
            f"{what_a} holds vectors of {spec_a.dim} values and {what_b} of {dim_b}; "
            "cosine similarity needs vectors of the same length"
        )


def _meta_of(obj: Any) -> Any:
    return obj._meta if dask.is_dask_collection(obj) else obj


def _score_dtype(*specs: backends.VectorSpec) -> np.dtype:
    dt = partition.default_result_dtype([s.dtype for s in specs])
    return np.dtype("float64") if dt == torch.float64 else np.dtype("float32")


def _label_dtype(index: Any) -> Any:
    dtype = index.dtype
    return dtype if not hasattr(index, "to_pandas") else index[:0].to_pandas().dtype


def _result_meta(left_index: Any, right_index: Any, score: np.dtype, rank: bool) -> pd.DataFrame:
    columns = {
        "left": pd.Series([], dtype=_label_dtype(left_index)),
        "right": pd.Series([], dtype=_label_dtype(right_index)),
        "score": pd.Series([], dtype=score),
    }
    if rank:
        columns["rank"] = pd.Series([], dtype="int64")
    return pd.DataFrame(columns)


class _Builder:
    """Calls a function now (eager frames) or adds it to a graph (dask collections)."""

    def __init__(self, lazy: bool) -> None:
        self.lazy = lazy

    def __call__(self, fn: Callable[..., Any], nout: int | None = None) -> Callable[..., Any]:
        if self.lazy:
            return dask.delayed(fn, pure=True, nout=nout)  # type: ignore[no-any-return]
        return fn

    def partitions(self, obj: Any) -> list[Any]:
        if dask.is_dask_collection(obj):
            return list(obj.to_delayed())
        if self.lazy:
            # One key for the whole eager frame: sent once to each worker that needs it.
            return [dask.delayed(obj, name=f"cosim-frame-{uuid.uuid4().hex}")]
        return [obj]

    def tree(self, items: list[Any], combine: Callable[..., Any], split_every: int) -> Any:
        step = self(combine)
        while len(items) > 1:
            items = [step(*items[s : s + split_every]) for s in range(0, len(items), split_every)]
        return items[0]

    def collect(self, outs: list[Any], meta: Any, divisions: Any = None) -> Any:
        if not self.lazy:
            return outs[0]
        return dd.from_delayed(outs, meta=meta, divisions=divisions, verify_meta=False)


def join(
    left: Any,
    right: Any,
    on: str,
    *,
    right_on: str | None = None,
    k: int | None = None,
    threshold: float | None = None,
) -> Any:
    """See :meth:`dask_cosim.CosimAccessor.join`."""
    k, threshold = _check_k_or_threshold(k, threshold)
    right_on = on if right_on is None else right_on
    lmeta, rmeta = _meta_of(left), _meta_of(right)
    spec_l = _check_column(lmeta, on, "on")
    spec_r = _check_column(rmeta, right_on, "right_on")
    _check_dims(spec_l, f"left column {on!r}", spec_r.dim, f"right column {right_on!r}")
    opts = _options()
    score_dtype = _score_dtype(spec_l, spec_r)
    meta = _result_meta(lmeta.index, rmeta.index, score_dtype, k is not None)
    # float64 results get float64 scores for every pair; float32 ones keep the tile's.
    exact = score_dtype == np.float64
    build = _Builder(dask.is_dask_collection(left) or dask.is_dask_collection(right))
    prep = build(prepare_side)
    lsides = [
        prep(p, on, i, eps=opts.eps, device=opts.device)
        for i, p in enumerate(build.partitions(left[[on]]))
    ]
    rsides = [
        prep(p, right_on, j, eps=opts.eps, device=opts.device)
        for j, p in enumerate(build.partitions(right[[right_on]]))
    ]
    outs = []
    for lside in lsides:
        if k is not None:
            pieces = [
                build(join_pair_topk)(lside, r, k, threshold, opts.tile_bytes) for r in rsides
            ]
            merged = build.tree(pieces, _merger(k), opts.split_every)
        else:
            pieces = [
                build(join_pair_threshold)(lside, r, threshold, opts.tile_bytes, exact)
                for r in rsides
            ]
            merged = build.tree(pieces, concat_pairs, opts.split_every)
        outs.append(build(finish_pairs)(merged, meta, k is not None))
    return build.collect(outs, meta)


def neighbors(df: Any, on: str, *, k: int | None = None, threshold: float | None = None) -> Any:
    """See :meth:`dask_cosim.CosimAccessor.neighbors`."""
    k, threshold = _check_k_or_threshold(k, threshold)
    meta_in = _meta_of(df)
    spec = _check_column(meta_in, on, "on")
    opts = _options()
    meta = _result_meta(meta_in.index, meta_in.index, _score_dtype(spec), k is not None)
    exact = meta["score"].dtype == np.float64
    build = _Builder(dask.is_dask_collection(df))
    sides = _sides(build, df, on, opts)
    n = len(sides)
    pieces: list[list[Any]] = [[] for _ in range(n)]
    for i in range(n):
        for j in range(i, n):
            # Only the upper triangle of partition pairs: (i, j) serves both i and j.
            other = sides[j] if j > i else None
            if k is not None:
                a, b = build(self_pair_topk, nout=2)(sides[i], other, k, threshold, opts.tile_bytes)
                pieces[i].append(a)
                if j > i:
                    pieces[j].append(b)
            else:
                pieces[i].append(
                    build(self_pair_threshold)(sides[i], other, threshold, opts.tile_bytes, exact)
                )
    combine = _merger(k) if k is not None else concat_pairs
    outs = [
        build(finish_pairs)(build.tree(p, combine, opts.split_every), meta, k is not None)
        for p in pieces
    ]
    return build.collect(outs, meta)


def dedup(df: Any, on: str, threshold: float) -> Any:
    """See :meth:`dask_cosim.CosimAccessor.dedup`."""
    threshold_value = _check_threshold(threshold, required=True)
    meta_in = _meta_of(df)
    _check_column(meta_in, on, "on")
    opts = _options()
    build = _Builder(dask.is_dask_collection(df))
    sides = _sides(build, df, on, opts)
    frames = build.partitions(df)
    outs = []
    for j, frame in enumerate(frames):
        drops = [
            build(dedup_pair)(
                sides[i], sides[j] if i < j else None, threshold_value, opts.tile_bytes
            )
            for i in range(j + 1)
        ]
        outs.append(build(drop_rows)(frame, build.tree(drops, union_positions, opts.split_every)))
    divisions = df.divisions if dask.is_dask_collection(df) else None
    return build.collect(outs, meta_in, divisions)


def topk(
    df: Any,
    queries: Any,
    on: str,
    k: int = 10,
    *,
    columns: Sequence[Hashable] | None = None,
) -> Any:
    """See :meth:`dask_cosim.CosimAccessor.topk`."""
    k_value = _check_k(k)
    if k_value is None:
        raise ValueError("k=None: topk needs k, an integer >= 1")
    meta_in = _meta_of(df)
    spec = _check_column(meta_in, on, "on")
    columns = [] if columns is None else list(columns)
    for c in columns:
        if c not in meta_in.columns:
            _check_column(meta_in, c, "columns")
    clash = sorted({str(c) for c in columns} & {"query", "rank", "match", "score"})
    if clash:
        raise ValueError(
            f"columns={columns!r} would overwrite the result columns {clash}; rename them "
            "first (df.rename(columns=...))"
        )
    opts = _options()
    query_side = _query_side(queries, opts.eps)
    _check_dims(spec, f"column {on!r}", query_side.prep.dim, "the queries")
    score_dtype = _score_dtype(spec, backends.VectorSpec(None, _np_dtype(query_side.prep.raw)))
    lazy = dask.is_dask_collection(df)
    build = _Builder(lazy)
    q = dask.delayed(query_side, name=f"cosim-queries-{uuid.uuid4().hex}") if lazy else query_side
    keep = [on, *[c for c in columns if c != on]]
    rsides = [
        build(prepare_side)(p, on, j, eps=opts.eps, device=opts.device, payload=columns)
        for j, p in enumerate(build.partitions(df[keep]))
    ]
    pieces = [build(join_pair_topk)(q, r, k_value, None, opts.tile_bytes) for r in rsides]
    merged = build.tree(pieces, _merger(k_value), opts.split_every)
    result = build(finish_topk)(merged, meta_in, columns, score_dtype)
    out = result.compute() if lazy else result
    return out


def _sides(build: _Builder, df: Any, on: str, opts: _Options) -> list[Any]:
    prep = build(prepare_side)
    return [
        prep(p, on, i, eps=opts.eps, device=opts.device)
        for i, p in enumerate(build.partitions(df[[on]]))
    ]


def _np_dtype(t: torch.Tensor) -> np.dtype:
    return np.dtype(str(t.dtype).removeprefix("torch.")) if t.dtype != torch.bfloat16 else None  # type: ignore[return-value]


def _query_side(queries: Any, eps: float) -> Side:
    """The queries, normalised once in the client (on the CPU: the client touches no GPU)."""
    if isinstance(queries, pd.Series) or hasattr(queries, "list"):  # pandas or cudf Series
        v = backends.to_vectors(queries, str(queries.name))
        x = torch.cat([b.cpu() for b in v.blocks]) if v.blocks else torch.zeros((0, 0))
        null = v.null
        if isinstance(null, torch.Tensor):
            null = null.cpu()
        labels = queries.index
        labels = labels.to_pandas() if hasattr(labels, "to_pandas") else labels
    else:
        if isinstance(queries, torch.Tensor):
            x = queries.detach().cpu()
        elif hasattr(queries, "__cuda_array_interface__"):  # cupy
            x = torch.as_tensor(queries.get())
        else:
            array = np.asarray(queries)
            if array.dtype.kind not in "fiu":
                raise TypeError(
                    f"queries of dtype {array.dtype} are not vectors of numbers; give a 2-D "
                    "numpy/cupy array or torch tensor (n, D), or a Series of vectors"
                )
            x = torch.from_numpy(np.ascontiguousarray(array))
        if x.ndim == 1:
            raise ValueError(
                f"queries has shape {tuple(x.shape)}; give a 2-D array (n, D), e.g. "
                "queries[None, :] for one query"
            )
        if x.ndim != 2:
            raise ValueError(f"queries has shape {tuple(x.shape)}; expected a 2-D array (n, D)")
        null = None
        labels = pd.RangeIndex(len(x))
    null_t = torch.as_tensor(np.asarray(null)) if null is not None else None
    prep = sk.prepare(x, null_t, eps=eps, device="cpu")
    return Side(prep, pd.Index(labels), 0, "queries", None)


# =========================================================================== partitions


@dataclass
class Side:
    """One partition's vectors, normalised (:class:`~dask_cosim.search_kernels.Prepared`),
    with its index labels, its partition number, the column name (for errors) and the
    columns to carry into results (``payload``, or None)."""

    prep: sk.Prepared
    labels: pd.Index
    part: int
    column: str
    payload: pd.DataFrame | None


def prepare_side(
    df: Any,
    column: str,
    part: int,
    *,
    eps: float,
    device: str = "auto",
    payload: list[Any] | None = None,
) -> Side:
    """Normalise one partition's ``column`` (any format :mod:`dask_cosim.backends` reads).

    Null rows and rows holding NaN or inf never match; a zero row scores 0.0.
    """
    v = backends.to_vectors(df[column], column)
    x = v.blocks[0] if len(v.blocks) == 1 else torch.cat(v.blocks)
    target = partition.resolve_device(device, x.device)
    null = v.null
    if null is not None and not isinstance(null, torch.Tensor):
        null = torch.from_numpy(np.asarray(null))
    prep = sk.prepare(x, null, eps=eps, device=target)
    labels = df.index.to_pandas() if hasattr(df.index, "to_pandas") else df.index
    carried = None
    if payload:
        carried = df[payload]
        carried = carried.to_pandas() if hasattr(carried, "to_pandas") else carried
        # Positional names: a user column called "left" or "score" cannot collide with
        # the bookkeeping columns on the way to the result.
        carried.columns = [f"_p{n}" for n in range(len(payload))]
    return Side(prep, labels, part, column, carried)


def _tile_bytes(tile_bytes: dict[str, int], device: torch.device) -> int:
    return tile_bytes["cuda" if device.type == "cuda" else "cpu"]


def _aligned(q: Side, r: Side) -> tuple[sk.Prepared, sk.Prepared] | None:
    """The two sides on one device, or None when either has no valid row; raises when
    both have valid rows of different lengths."""
    qp, rp = q.prep, r.prep
    if not bool(qp.valid.any()) or not bool(rp.valid.any()):
        return None
    if qp.dim != rp.dim:
        raise ValueError(
            f"column {q.column!r} holds vectors of {qp.dim} values and column {r.column!r} "
            f"of {rp.dim}; cosine similarity needs vectors of the same length"
        )
    return qp.to(rp.unit.device), rp


def _pairs_frame(
    q: Side, r: Side, i: torch.Tensor, j: torch.Tensor, s: torch.Tensor
) -> pd.DataFrame:
    i_np, j_np = i.cpu().numpy(), j.cpu().numpy()
    out = pd.DataFrame(
        {
            "_l": i_np.astype(np.int64),
            "_key": (np.int64(r.part) << _POS_BITS) + j_np.astype(np.int64),
            "left": q.labels.take(i_np),
            "right": r.labels.take(j_np),
            "score": s.cpu().numpy(),
        }
    )
    if r.payload is not None:
        taken = r.payload.iloc[j_np].reset_index(drop=True)
        out = pd.concat([out, taken], axis=1)
    return out


def _empty_pairs(q: Side, r: Side) -> pd.DataFrame:
    none = torch.zeros(0, dtype=torch.int64)
    return _pairs_frame(q, r, none, none, torch.zeros(0, dtype=torch.float64))


def _topk_frame(q: Side, r: Side, res: sk.TopK, threshold: float | None) -> pd.DataFrame:
    found = res.index >= 0
    if threshold is not None:
        found &= res.score >= threshold
    rows = torch.arange(len(res.index), device=found.device)[:, None].expand_as(found)
    return _pairs_frame(q, r, rows[found], res.index[found], res.score[found])


def join_pair_topk(
    q: Side, r: Side, k: int, threshold: float | None, tile_bytes: dict[str, int]
) -> pd.DataFrame:
    """For each row of ``q`` its ``k`` best rows of ``r`` (at or above ``threshold``)."""
    sides = _aligned(q, r)
    if sides is None:
        return _empty_pairs(q, r)
    qp, rp = sides
    res, _ = sk.topk(qp, rp, k, tile_bytes=_tile_bytes(tile_bytes, rp.unit.device))
    return _topk_frame(q, r, res, threshold)


def join_pair_threshold(
    q: Side, r: Side, threshold: float, tile_bytes: dict[str, int], exact_scores: bool = False
) -> pd.DataFrame:
    """Every pair (row of ``q``, row of ``r``) scoring at least ``threshold`` (float64
    scores with ``exact_scores``, else float32 ones away from the threshold)."""
    sides = _aligned(q, r)
    if sides is None:
        return _empty_pairs(q, r)
    qp, rp = sides
    i, j, s = sk.threshold_pairs(
        qp,
        rp,
        threshold,
        tile_bytes=_tile_bytes(tile_bytes, rp.unit.device),
        exact_scores=exact_scores,
    )
    return _pairs_frame(q, r, i, j, s)


def self_pair_topk(
    a: Side, b: Side | None, k: int, threshold: float | None, tile_bytes: dict[str, int]
) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """One partition pair of a self-join: the best rows of ``b`` for each row of ``a``
    and of ``a`` for each row of ``b``, from the same tiles (``b`` None: ``a`` with
    itself, no row matching itself)."""
    other = a if b is None else b
    sides = _aligned(a, other)
    if sides is None:
        return _empty_pairs(a, other), (None if b is None else _empty_pairs(other, a))
    ap, bp = sides
    budget = _tile_bytes(tile_bytes, bp.unit.device)
    if b is None:
        res, _ = sk.topk(ap, bp, k, tile_bytes=budget, same=True)
        return _topk_frame(a, a, res, threshold), None
    res_a, res_b = sk.topk(ap, bp, k, tile_bytes=budget, both=True)
    assert res_b is not None
    return _topk_frame(a, b, res_a, threshold), _topk_frame(b, a, res_b, threshold)


def self_pair_threshold(
    a: Side,
    b: Side | None,
    threshold: float,
    tile_bytes: dict[str, int],
    exact_scores: bool = False,
) -> pd.DataFrame:
    """Pairs of a self-join scoring at least ``threshold``, each unordered pair once, the
    earlier row (frame order) on the left."""
    other = a if b is None else b
    sides = _aligned(a, other)
    if sides is None:
        return _empty_pairs(a, other)
    ap, bp = sides
    i, j, s = sk.threshold_pairs(
        ap,
        bp,
        threshold,
        tile_bytes=_tile_bytes(tile_bytes, bp.unit.device),
        mode="upper" if b is None else None,
        exact_scores=exact_scores,
    )
    return _pairs_frame(a, other, i, j, s)


def dedup_pair(a: Side, b: Side | None, threshold: float, tile_bytes: dict[str, int]) -> np.ndarray:
    """Positions in ``b`` (or in ``a`` when ``b`` is None) of rows with an earlier row in
    ``a`` scoring at least ``threshold``."""
    other = a if b is None else b
    sides = _aligned(a, other)
    if sides is None:
        return np.zeros(0, dtype=np.int64)
    ap, bp = sides
    _, j, _ = sk.threshold_pairs(
        ap,
        bp,
        threshold,
        tile_bytes=_tile_bytes(tile_bytes, bp.unit.device),
        mode="upper" if b is None else None,
        exact_scores=False,  # only the pair set matters here
    )
    return np.unique(j.cpu().numpy())


def union_positions(*parts: np.ndarray) -> np.ndarray:
    return np.unique(np.concatenate(parts))


def drop_rows(df: Any, positions: np.ndarray) -> Any:
    """``df`` without the rows at ``positions``."""
    if len(positions) == 0:
        return df
    keep = np.ones(len(df), dtype=bool)
    keep[positions] = False
    if hasattr(df.index, "to_pandas"):  # cudf takes a device mask
        import cupy

        return df[cupy.asarray(keep)]
    return df[keep]


def _sorted_pairs(df: pd.DataFrame, by_score: bool = True) -> pd.DataFrame:
    """By left row, then score descending (``by_score``), then right row."""
    keys = [df["_key"].to_numpy(), df["_l"].to_numpy()]
    if by_score:
        keys.insert(1, -df["score"].to_numpy())
    return df.take(np.lexsort(keys))


def concat_pairs(*parts: pd.DataFrame) -> pd.DataFrame:
    non_empty = [p for p in parts if len(p)]
    return pd.concat(non_empty, ignore_index=True) if non_empty else parts[0]


def merge_topk(k: int, *parts: pd.DataFrame) -> pd.DataFrame:
    """The ``k`` best pairs of each left row among ``parts`` (score desc, then key)."""
    df = _sorted_pairs(concat_pairs(*parts))
    rank = _ranks(df["_l"].to_numpy())
    return df[rank < k].reset_index(drop=True)


def _merger(k: int) -> Callable[..., pd.DataFrame]:
    def merge(*parts: pd.DataFrame) -> pd.DataFrame:
        return merge_topk(k, *parts)

    merge.__name__ = "cosim-merge-topk"
    return merge


def _ranks(groups: np.ndarray) -> np.ndarray:
    """0, 1, 2, ... within each run of equal values of a sorted array."""
    starts = np.searchsorted(groups, groups, side="left")
    return np.arange(len(groups)) - starts


def finish_pairs(merged: pd.DataFrame, meta: pd.DataFrame, rank: bool) -> Any:
    """The result partition: sorted by left row, then rank (score descending, ties by
    right row) with ``rank``, else by right row."""
    df = _sorted_pairs(merged, by_score=rank)
    out = pd.DataFrame(
        {
            "left": df["left"].to_numpy(),
            "right": df["right"].to_numpy(),
            "score": df["score"].to_numpy().astype(meta["score"].dtype),
        }
    )
    if rank:
        out["rank"] = _ranks(df["_l"].to_numpy()).astype(np.int64)
    return out.astype(meta.dtypes.to_dict())


def finish_topk(merged: pd.DataFrame, like: Any, columns: list[Any], score_dtype: np.dtype) -> Any:
    """The ``topk`` result: query, rank, match, score and the carried columns."""
    df = _sorted_pairs(merged)
    out = pd.DataFrame(
        {
            "query": df["left"].to_numpy(),
            "rank": _ranks(df["_l"].to_numpy()).astype(np.int64),
            "match": df["right"].to_numpy(),
            "score": df["score"].to_numpy().astype(score_dtype),
        }
    )
    for n, c in enumerate(columns):
        out[c] = df[f"_p{n}"].to_numpy() if f"_p{n}" in df else np.array([], dtype=object)
    if len(out) == 0:
        out = out.astype({c: like[c].dtype for c in columns})
    return _like(out, like)


def _like(pdf: pd.DataFrame, like: Any) -> Any:
    """``pdf`` in the dataframe library of ``like`` (pandas stays pandas)."""
    if isinstance(like, pd.DataFrame | pd.Series):
        return pdf
    from dask.dataframe.dispatch import from_pyarrow_table_dispatch

    return from_pyarrow_table_dispatch(like, pa.Table.from_pandas(pdf, preserve_index=False))
