"""Search, one partition (or pair of partitions) at a time: the functions :mod:`.search` maps.

Knows no dask.  A partition's vectors are normalised once into a :class:`Side`
(:func:`prepare_side`, :func:`query_side`); a pair of sides is reduced tile by tile by
:mod:`dask_cosim.search_kernels` into a frame of candidate pairs (:func:`join_pair_topk`,
:func:`self_pair_topk`, :func:`pair_threshold`), whose columns and dtypes
:func:`result_meta` states; :mod:`dask_cosim.search_results` merges them into the result.
pandas/cudf partitions in (through :mod:`dask_cosim.backends`), pandas out.

Ordering.  Every right row has a key (partition number, position), which is its place
in frame order: among equal float64 scores the smaller key wins, so results do not
depend on how a frame is partitioned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from dask_cosim import backends, errors, partition, search_twopass, staging
from dask_cosim import search_kernels as sk
from dask_cosim.search_budget import Budget, collecting

__all__ = [
    "COMPANIONS",
    "Side",
    "carried_rows",
    "companion",
    "join_pair_topk",
    "pair_threshold",
    "prepare_columns",
    "prepare_side",
    "query_side",
    "result_meta",
    "score_dtype",
    "self_pair_topk",
    "unusable_queries",
]

# Partition numbers sit above the position bits of a row's ordering key (search_dedup
# and the clustered search decode and make keys the same way).
POS_BITS = 40
QUERIES = "queries"  # the column name of a query side (for errors)


@dataclass
class Side:
    """One partition's vectors, normalised (:class:`~dask_cosim.search_kernels.Prepared`),
    with its index labels, its number among the sides (its rows' ordering keys), the
    column name (for errors), the columns to carry into results (``payload``, or None),
    the partition its rows came from (for errors; a partition may be searched in several
    sides; None: an eager frame's rows, which has none) and which frame of a join it
    belongs to ("left", "right"; "" for one frame: for errors).  Labels and payload stay
    in the partition's library (on the device for cudf): results take only their own
    rows."""

    prep: sk.Prepared
    labels: Any
    part: int
    column: str
    payload: Any
    partition: int | None = None
    frame: str = ""

    def __dask_tokenize__(self) -> tuple[Any, ...]:
        # dask would pickle the tensors (slow); their bytes say the same.  ``scale``
        # depends on eps, so two sides normalised with different eps differ.
        p = self.prep
        tensors = [backends.tensor_token(t) for t in (p.raw, p.scale, p.valid)]
        carried = None if self.payload is None else backends.data_token(self.payload)
        labels = backends.data_token(self.labels)
        return (*tensors, labels, self.part, self.column, carried, self.partition, self.frame)


def prepare_side(
    df: Any,
    column: str,
    part: int,
    *,
    eps: float,
    device: str = "auto",
    payload: list[Any] | None = None,
    precision: str = "fp32",
    source: int | None = None,
    frame: str = "",
) -> Side:
    """Normalise one partition's ``column`` (any format :mod:`dask_cosim.backends` reads),
    or take its normalisation from the columns :func:`prepare_columns` added, when ``df``
    has them.  ``part``: the side's number; ``source``: the partition its rows came from
    (None: an eager frame's rows, named so in errors); ``frame``: "left" or "right" for
    a join's sides (for errors).

    Null rows and rows holding NaN or inf never match; a zero row scores 0.0.  On CUDA
    with ``precision`` "exact" or "fast" the float32 unit rows, which only the float32
    path reads, are not kept (:func:`~dask_cosim.search_twopass.prepare_lean`).
    """
    v = backends.to_vectors(df[column], column)
    data_device = v.blocks[0].device if v.blocks else torch.device("cpu")
    target = partition.resolve_device(device, data_device, work="products")
    if target.type == "cuda" and data_device.type == "cpu" and v.blocks:
        # Matrix products are worth the trip: through pinned staging, not a pageable copy.
        x = staging.to_device(v.blocks, target)
    else:
        x = v.blocks[0] if len(v.blocks) == 1 else torch.cat(v.blocks)
    null = v.null
    if null is not None and not isinstance(null, torch.Tensor):
        null = torch.from_numpy(np.asarray(null))
    prep = None
    if precision != "fp32" and target.type == "cuda":
        prep = search_twopass.prepare_lean(x, null, eps=eps, device=target)
    elif target == x.device and all(companion(column, w) in df.columns for w in COMPANIONS):
        prep = _from_companions(df, column, x, null, eps)
    if prep is None:
        prep = sk.prepare(x, null, eps=eps, device=target)
    carried = None
    if payload:
        carried = df[payload]
        # Positional names: a user column called "left" or "score" cannot collide with
        # the bookkeeping columns on the way to the result.
        carried.columns = [f"_p{n}" for n in range(len(payload))]
    return Side(prep, df.index, part, column, carried, source, frame)


# --------------------------------------------------------------------------- prepared frames

# The columns prepare_columns adds beside a vector column: its rows' range factors and
# norms (float64), and their unit rows where the rows cannot serve as their own (a list
# column, null where they can).
COMPANIONS = ("inv", "norm", "unit")


def companion(column: str, what: str) -> str:
    """The name of the ``what`` column (one of :data:`COMPANIONS`) beside ``column``."""
    return f"{column}.cosim.{what}"


def prepare_columns(df: Any, column: str, *, device: str = "auto") -> Any:
    """``df`` with :data:`COMPANIONS` beside ``column``: what a search would compute
    from its vectors on every call (:class:`~dask_cosim.search_kernels.Prepared`),
    computed once, for any ``cosim.eps``: the norms do not depend on it, and the unit rows
    are over ``|x|`` (eps 0), as :func:`~dask_cosim.search_kernels.from_norms` reads them
    under any eps (over ``max(|x|, eps)`` they were too short for a search under a
    smaller eps, which then lost those rows' matches).  Unit rows are stored only for rows on the
    CPU that are not already of norm 1 (on a GPU they are quick to redo)."""
    v = backends.to_vectors(df[column], column)
    x = v.blocks[0] if len(v.blocks) == 1 else torch.cat(v.blocks)
    null = v.null
    if null is not None and not isinstance(null, torch.Tensor):
        null = torch.from_numpy(np.asarray(null))
    p = sk.prepare(x, null, eps=0.0, device=partition.resolve_device(device, x.device))
    assert p.norm is not None
    n = len(p)
    # Stored only where a search reads them back (from_norms: float32/float64 rows on a
    # CPU) and the rows cannot serve as their own.
    stored = (
        n > 0
        and p.unit.device.type == "cpu"
        and p.raw.dtype in (torch.float32, torch.float64)
        and p.unit.data_ptr() != p.raw.data_ptr()
    )
    # Of fixed size where the column's dtype fixes D (as read_parquet and from_pandas give
    # it): a partition with no unit rows stored (rows of norm 1, no rows) then still has
    # the meta's dtype, and Parquet a D to store for it.
    dim = backends.vector_spec(df[column].iloc[:0], column).dim
    if stored and dim:
        unit = pa.FixedSizeListArray.from_arrays(pa.array(p.unit.numpy().reshape(-1)), dim)
    elif stored:
        step = np.arange(0, n * p.dim + 1, p.dim, dtype=np.int32)
        unit = pa.ListArray.from_arrays(step, pa.array(p.unit.numpy().reshape(-1)))
    else:
        unit = pa.nulls(n, pa.list_(pa.float32(), dim) if dim else pa.list_(pa.float32()))
    extra = pd.DataFrame(
        {
            companion(column, "inv"): p.inv.cpu().numpy(),
            companion(column, "norm"): p.norm.cpu().numpy(),
            companion(column, "unit"): pd.arrays.ArrowExtensionArray(unit),
        }
    )
    return backends.add_columns(df, extra)


def _from_companions(
    df: Any, column: str, x: torch.Tensor, null: torch.Tensor | None, eps: float
) -> sk.Prepared | None:
    """The side from :func:`prepare_columns`' numbers (None: they cannot stand for it,
    see :func:`~dask_cosim.search_kernels.from_norms`, or they are not ``column``'s:
    :func:`_stale`)."""
    inv = backends.to_numbers(df[companion(column, "inv")])
    norm = backends.to_numbers(df[companion(column, "norm")])
    if _stale(x, null, inv, norm, column):
        return None
    u = backends.to_vectors(df[companion(column, "unit")], companion(column, "unit"))
    unit = None
    if u.null is None and u.length == len(x) and u.dim == x.shape[1]:
        unit = u.blocks[0] if len(u.blocks) == 1 else torch.cat(u.blocks)
    return sk.from_norms(x, null, inv, norm, unit, eps=eps)


# Rows of a partition whose norms are checked against the prepared ones.
_CHECKED_ROWS = 8


def _stale(
    x: torch.Tensor, null: torch.Tensor | None, inv: torch.Tensor, norm: torch.Tensor, column: str
) -> bool:
    """Whether the prepared ``norm`` (``|x * inv|``) of a few rows spread over the partition
    differs from their vectors' (warned: the search then normalises them itself).  A
    column assigned again after ``prepare`` (the vectors of another model) kept the
    companions of the old one, and searches trusted them: scores above 1, or the old
    vectors' matches.  A few rows cost nothing beside the search, and tell a replaced
    column; rows changed one by one need ``prepare`` again (its docstring says so)."""
    n = len(x)
    if n == 0 or len(norm) != n or len(inv) != n:
        return False
    rows = torch.unique(torch.linspace(0, n - 1, min(n, _CHECKED_ROWS)).round().long())
    held = norm.to(torch.float64)[rows].cpu()
    scaled = x[rows].to(torch.float64).cpu() * inv.to(torch.float64)[rows].cpu()[:, None]
    now = torch.linalg.vector_norm(scaled, dim=1)
    # Rows that never match (null, NaN, inf) are held as NaN.
    never = ~torch.isfinite(now)
    if null is not None:
        never |= torch.as_tensor(null)[rows].cpu().to(torch.bool)
    now = torch.where(never, torch.full_like(now, float("nan")), now)
    same = torch.isclose(now, held, rtol=1e-9, atol=0.0, equal_nan=True)
    if bool(same.all()):
        return False
    # One message for every partition, which Python's default filter shows once a
    # process (and a client once, however many workers send it).  distributed's warn
    # sends it from a worker to the clients too (a notebook's cell), where warnings.warn
    # would leave it in the worker's log; elsewhere it is that.
    from distributed import warn

    warn(
        f"the columns prepare added beside {column!r} ({companion(column, 'norm')}, ...) "
        f"are not its vectors' (their norms differ): {column!r} changed after prepare; "
        f"the search normalises its vectors itself. Call prepare({column!r}) again, or "
        "drop those columns",
        errors.StalePreparedWarning,
        stacklevel=2,
    )
    return True


def query_side(queries: Any, eps: float) -> Side:
    """The queries of ``topk`` (a 2-D array or tensor, or a Series of vectors) as a side,
    normalised on the CPU: this runs in the client, which touches no GPU."""
    if backends.is_vector_series(queries):
        # Errors name the rows "column <the Series' name>", or "column 'queries'".
        v = backends.to_vectors(queries, "queries" if queries.name is None else str(queries.name))
        x = torch.cat([b.cpu() for b in v.blocks]) if v.blocks else torch.zeros((0, 0))
        null = v.null.cpu() if isinstance(v.null, torch.Tensor) else v.null
        labels = backends.to_pandas(queries.index)
    else:
        x = backends.to_host_tensor(queries)
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
    return Side(prep, pd.Index(labels), 0, QUERIES, None)


def unusable_queries(side: Side) -> tuple[list[Any], list[Any]]:
    """The labels of the queries of ``side`` that match nothing (null, NaN or inf), and of
    those that are zero vectors."""
    p = side.prep
    invalid = ~p.valid.cpu().numpy()
    zero = p.valid.cpu().numpy() & (p.raw.cpu() == 0).all(dim=1).numpy()
    return side.labels[invalid].tolist(), side.labels[zero].tolist()


def score_dtype(*specs: backends.VectorSpec) -> np.dtype:
    """The scores' dtype: float64 when every side is float64, else float32."""
    dt = partition.default_result_dtype([s.dtype for s in specs])
    return np.dtype("float64") if dt == torch.float64 else np.dtype("float32")


def result_meta(
    left_index: Any,
    right_index: Any,
    score: np.dtype,
    rank: bool,
    carried: dict[str, Any] | None = None,
) -> pd.DataFrame:
    """The empty result of a join or neighbours search: ``left`` and ``right`` (index
    labels, as pandas holds them), ``score``, with ``rank`` ``rank``, then the
    ``carried`` columns ({name: dtype}, e.g. ``left_id``, ``right_id``)."""
    columns = {
        "left": pd.Series([], dtype=backends.to_pandas(left_index[:0]).dtype),
        "right": pd.Series([], dtype=backends.to_pandas(right_index[:0]).dtype),
        "score": pd.Series([], dtype=score),
    }
    if rank:
        columns["rank"] = pd.Series([], dtype="int64")
    for name, dtype in (carried or {}).items():
        columns[name] = pd.Series([], dtype=dtype)
    return pd.DataFrame(columns)


# --------------------------------------------------------------------------- pairs of sides


def _tile_bytes(tile_bytes: dict[str, int], device: torch.device) -> int:
    return tile_bytes["cuda" if device.type == "cuda" else "cpu"]


def _aligned(q: Side, r: Side) -> tuple[sk.Prepared, sk.Prepared] | None:
    """The two sides on one device, or None when either has no valid row; raises when
    both have valid rows of different lengths."""
    qp, rp = q.prep, r.prep
    if not bool(qp.valid.any()) or not bool(rp.valid.any()):
        return None
    if qp.dim != rp.dim:  # two frames, or two partitions of one (each checked alone)
        raise errors.dims_differ(_what(q), qp.dim, _what(r), rp.dim)
    return qp.to(rp.unit.device), rp


def _what(side: Side) -> str:
    if side.column == QUERIES:
        return "argument 'queries'"
    frame = f"{side.frame} " if side.frame else ""
    where = "" if side.partition is None else f" (partition {side.partition})"
    return f"{frame}column {side.column!r}{where}"


def _pairs_frame(
    q: Side, r: Side, i: torch.Tensor, j: torch.Tensor, s: torch.Tensor
) -> pd.DataFrame:
    """The frame of the pairs (row ``i`` of ``q``, row ``j`` of ``r``, score ``s``).

    The caller hands the three over: on a CPU they become the frame's columns as they
    are, ``j`` turned into keys in place (a pair task's peak: its pairs once, beside
    their labels, not copied into a frame as well)."""
    i_np = i.cpu().numpy().astype(np.int64, copy=False)
    j_np = j.cpu().numpy().astype(np.int64, copy=False)
    columns = {
        "_l": i_np,
        "_key": j_np,
        "left": backends.take_to_pandas(q.labels, i_np),
        "right": backends.take_to_pandas(r.labels, j_np),
        "score": s.cpu().numpy(),
    }
    carried = []
    if q.payload is not None:
        carried.append(carried_rows(q.payload, i_np, "_q"))
    if r.payload is not None:
        carried.append(carried_rows(r.payload, j_np, "_p"))
    j_np += np.int64(r.part) << POS_BITS  # positions taken: now the keys
    out = pd.DataFrame(columns, copy=False)
    return pd.concat([out, *carried], axis=1) if carried else out


def carried_rows(payload: Any, rows: np.ndarray, prefix: str) -> pd.DataFrame:
    """The rows at positions ``rows`` of the carried columns ``payload`` (pandas or cudf:
    only those rows leave the device), as pandas with a RangeIndex, named ``{prefix}0``,
    ``{prefix}1``, ... in order: "_q" for the left row of a pair, "_p" for the right,
    the names :func:`dask_cosim.search_results.pairs_result` maps to ``left_<c>`` and
    ``right_<c>``."""
    taken = backends.take_to_pandas(payload, rows).reset_index(drop=True)
    return taken.set_axis([f"{prefix}{n}" for n in range(taken.shape[1])], axis=1)


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
    q: Side,
    r: Side,
    k: int,
    threshold: float | None,
    tile_bytes: dict[str, int],
    precision: str = "fp32",
) -> pd.DataFrame:
    """For each row of ``q`` its ``k`` best rows of ``r`` (at or above ``threshold``);
    ``precision``: how the exact answer is found (``cosim.search.precision``)."""
    sides = _aligned(q, r)
    if sides is None:
        return _empty_pairs(q, r)
    qp, rp = sides
    budget = _tile_bytes(tile_bytes, rp.unit.device)
    res, _ = sk.topk(qp, rp, k, tile_bytes=budget, precision=precision)
    return _topk_frame(q, r, res, threshold)


def self_pair_topk(
    a: Side,
    b: Side | None,
    k: int,
    threshold: float | None,
    tile_bytes: dict[str, int],
    precision: str = "fp32",
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
        res, _ = sk.topk(ap, bp, k, tile_bytes=budget, same=True, precision=precision)
        return _topk_frame(a, a, res, threshold), None
    res_a, res_b = sk.topk(ap, bp, k, tile_bytes=budget, both=True, precision=precision)
    assert res_b is not None
    return _topk_frame(a, b, res_a, threshold), _topk_frame(b, a, res_b, threshold)


def _named(side: Side) -> str:
    """ "partition 2", or "partition 2 of the right frame" in a join; "the frame" or "the
    right frame" for an eager one (for errors)."""
    if side.partition is None:
        return f"the {side.frame} frame" if side.frame else "the frame"
    return f"partition {side.partition}" + (f" of the {side.frame} frame" if side.frame else "")


def pair_threshold(
    q: Side,
    r: Side | None,
    threshold: float,
    tile_bytes: dict[str, int],
    *,
    exact_scores: bool = False,
    keep: str | None = None,
    precision: str = "fp32",
    budget: Budget | None = None,
) -> Any:
    """Every pair (row of ``q``, row of ``r``) scoring at least ``threshold``.

    ``r`` None: ``q`` with itself, each unordered pair once, the earlier row (frame
    order) on the left, no row with itself (a self-join's diagonal partition pair).
    Returns the pairs as a frame (float64 scores with ``exact_scores``, else float32 ones
    away from the threshold), or what ``keep`` (:mod:`dask_cosim.search_reduced`) keeps
    of them: "rows", the sorted positions in ``r`` (``q`` when ``r`` is None) of the
    right rows with a match (those dedup drops); "best", a frame of each right row's
    best pair (float64 scores); "forest", the (E, 2) ordering keys of edges
    that connect the rows as the pairs do (groups).  With ``precision`` "exact" every
    reported score is the float64 one, on any device ("fast" too, but on CUDA).

    ``budget``: the pairs the task may hold, past which it raises
    :class:`~dask_cosim.errors.ResultTooLargeError`; but with ``keep``, whose result has
    at most one entry per row whatever the pairs, it searches again by blocks of rows
    (:func:`~dask_cosim.search_reduced.by_blocks`), each reduced before the next.
    """
    from dask_cosim import search_reduced

    if keep is not None and keep not in search_reduced.KEEPS:
        raise ValueError(f"keep={keep!r}: None or one of {search_reduced.KEEPS}")
    other = q if r is None else r
    sides = _aligned(q, other)
    if sides is None:
        if keep == "rows":
            return np.zeros(0, dtype=np.int64)
        return np.zeros((0, 2), dtype=np.int64) if keep == "forest" else _empty_pairs(q, other)
    qp, rp = sides
    where = f"the task of {_named(q)} " + ("with itself" if r is None else f"with {_named(other)}")
    tiles = _tile_bytes(tile_bytes, rp.unit.device)
    s: torch.Tensor | None
    with collecting(budget, where) as limit:
        if keep is None:
            i, j, s = sk.threshold_pairs(
                qp,
                rp,
                threshold,
                tile_bytes=tiles,
                mode="upper" if r is None else None,
                exact_scores=exact_scores or precision != "fp32",
                precision=precision,
                limit=limit,
            )
        else:
            i, j, s = search_reduced.found(
                keep, qp, rp, threshold, upper=r is None, limit=limit, tile_bytes=tiles,
                precision=precision,
            )  # fmt: skip
    if keep == "rows":
        return j.cpu().numpy()
    if keep == "forest":
        ends = np.stack([i.cpu().numpy(), j.cpu().numpy()], axis=1).astype(np.int64)
        return ends + (np.array([[q.part, other.part]], dtype=np.int64) << POS_BITS)
    assert s is not None
    return _pairs_frame(q, other, i, j, s)
