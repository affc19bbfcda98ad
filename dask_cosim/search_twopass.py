"""Exact search in two passes: low-precision candidates, then float64 decisions.

Pure torch plus the fused Triton kernel; any device, no dataframes, no config.  The
same contracts as :func:`dask_cosim.search_kernels.threshold_pairs` and
:func:`~dask_cosim.search_kernels.topk` (float64 decisions, ties by position), for sides
that also carry a low-precision copy (:class:`~dask_cosim.search_precision.LowRows`):

1. the first pass (``engine`` "triton": the fused kernel, :mod:`dask_cosim._search_triton`;
   "torch": tiles of :func:`~dask_cosim.search_precision.low_scores`, the CPU path)
   emits every pair whose low-precision score s_hat is within its bound E of the
   threshold, or of a floor below the row's k-th float64 score;
2. the candidates that can still matter are re-scored in float64
   (:func:`~dask_cosim.search_kernels.rescore`) and decided there.

Exactness: a pair with float64 score c >= t has s_hat >= c - E >= t - E, so it is a
candidate; a pair among a row's k best has c >= c_k >= floor, so s_hat + E >= floor.
With ``exact=False`` (the "fast" policy) the first pass alone decides, on s_hat: the
result is then within E of the exact one (scores and boundary decisions).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

import torch

from dask_cosim import search_kernels as sk
from dask_cosim import search_precision as sp
from dask_cosim._search_sweep import PairLimit
from dask_cosim.staging import OUT_OF_MEMORY

__all__ = [
    "lowered",
    "matched_columns",
    "prepare_lean",
    "seed_floor",
    "threshold_pairs",
    "threshold_prepared",
    "topk",
    "topk_prepared",
]

_NEG_INF = float("-inf")
T = TypeVar("T")
_CHUNK_BYTES = 64 * 2**20


def _engine(engine: str, device: torch.device) -> str:
    if engine not in ("auto", "torch", "triton"):
        raise ValueError(f"engine={engine!r}; use 'auto', 'torch' or 'triton'")
    return engine if engine != "auto" else "triton" if device.type == "cuda" else "torch"


def _without_bound(x: sp.LowRows) -> sp.LowRows:
    """``x`` with a zero bound (E = tau): the first pass then selects on s_hat alone."""
    return dataclasses.replace(x, err=torch.zeros_like(x.err), coef=torch.zeros_like(x.coef))


def _masks(
    a0: int, a1: int, b0: int, b1: int, a: sp.LowRows, b: sp.LowRows, mode: str | None, diag: int
) -> torch.Tensor:
    ok = a.valid[a0:a1, None] & b.valid[None, b0:b1]
    if mode is not None:
        dev = ok.device
        pos = torch.arange(a0, a1, device=dev)[:, None] + diag
        cols = torch.arange(b0, b1, device=dev)[None, :]
        ok &= (cols > pos) if mode == "upper" else (cols != pos)
    return ok


def _torch_candidates(
    a: sp.LowRows, b: sp.LowRows, bar: torch.Tensor, *, k: int, mode: str | None, diag: int,
    tile: int, limit: PairLimit | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """The first pass in torch tiles of ``tile`` x ``tile``: (i, j, s_hat, floor), each
    tile's candidates counted against ``limit``."""
    floor = bar.to(torch.float32).clone()
    out: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    for a0 in range(0, len(a), tile):
        a1 = min(len(a), a0 + tile)
        ta = a.take(torch.arange(a0, a1, device=a.low.device))
        for b0 in range(0, len(b), tile):
            b1 = min(len(b), b0 + tile)
            if mode == "upper" and b1 <= a0 + diag + 1:
                continue  # wholly on or below the diagonal
            tb = b.take(torch.arange(b0, b1, device=b.low.device))
            s = sp.low_scores(ta, tb)
            bound = sp.bound_matrix(ta, tb)
            ok = _masks(a0, a1, b0, b1, a, b, mode, diag)
            if k and b1 - b0 >= k:
                # k distinct columns of this tile: their k-th best s_hat - E is a floor.
                lb = torch.where(ok, s - bound, torch.full_like(s, _NEG_INF))
                kth = torch.topk(lb, k, dim=1).values[:, k - 1]
                torch.maximum(floor[a0:a1], kth, out=floor[a0:a1])
            hit = ok & (s + bound >= floor[a0:a1, None])
            ii, jj = hit.nonzero(as_tuple=True)
            if limit is not None:
                limit.add(len(ii))
            out.append((ii + a0, jj + b0, s[ii, jj]))
    if not out:
        none = torch.zeros(0, dtype=torch.int64, device=a.low.device)
        return none, none.clone(), torch.zeros(0, device=a.low.device), floor
    i, j, s = (torch.cat(t) for t in zip(*out))
    return i, j, s, floor


def _first_pass(
    a: sp.LowRows,
    b: sp.LowRows,
    bar: torch.Tensor,
    *,
    k: int,
    mode: str | None,
    diag: int,
    engine: str = "auto",
    config: object | None = None,
    limit: PairLimit | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if _engine(engine, a.low.device) == "torch":
        tile = 256 if config is None else int(config)  # type: ignore[call-overload]
        return _torch_candidates(a, b, bar, k=k, mode=mode, diag=diag, tile=tile, limit=limit)
    from dask_cosim import _search_triton as st

    cfg = config or st.config_for(a.kind, k, a.low.device)
    if k > cfg.bn:  # type: ignore[attr-defined]
        k = 0  # more than one tile's buckets: the bar (the seed floor) alone selects
    found = st.search_candidates(a, b, bar, k=k, mode=mode, diag=diag, config=cfg, limit=limit)  # type: ignore[arg-type]
    floor = found.floor if found.floor is not None else bar
    return found.i, found.j, found.s, floor


def _unit64(p: sk.Prepared, rows: torch.Tensor) -> torch.Tensor:
    """float64 unit rows, as :func:`~dask_cosim.search_kernels.rescore` computes them."""
    return (p.raw[rows].to(torch.float64) * p.inv[rows, None]) * p.scale[rows, None]


def seed_floor(
    q: sk.Prepared,
    r: sk.Prepared,
    k: int,
    *,
    exclude_self: bool = False,
    diag: int = 0,
    sample: int = 2048,
) -> torch.Tensor:
    """A floor per row of ``q`` (float32, rounded down; -inf where unknown): the k-th
    best float64 score over ``sample`` evenly spaced rows of ``r``, less its rounding,
    a lower bound of the row's k-th best score over all of ``r``."""
    dev = q.unit.device
    nq, nr = len(q), len(r)
    floor = torch.full((nq,), _NEG_INF, dtype=torch.float64, device=dev)
    cols = torch.linspace(0, max(nr - 1, 0), min(nr, sample), device=dev).round().long().unique()
    if len(cols) < k or nq == 0:
        return floor.to(torch.float32)
    ur = _unit64(r, cols)
    slack = (q.dim + 8) * 2.0**-51  # float64 product and normalisation, rounded up
    step = max(1, _CHUNK_BYTES // (8 * max(len(cols), q.dim)))
    for s in range(0, nq, step):
        rows = torch.arange(s, min(nq, s + step), device=dev)
        c = torch.mm(_unit64(q, rows), ur.T) - slack
        c.masked_fill_(~r.valid[cols][None, :], _NEG_INF)
        if exclude_self:
            c.masked_fill_(cols[None, :] == rows[:, None] + diag, _NEG_INF)
        floor[rows] = torch.topk(c, k, dim=1).values[:, k - 1]
    return sp.down32(floor)


def _kth_per_row(n: int, i: torch.Tensor, v: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th largest of ``v`` among each row's entries (-inf with fewer than k)."""
    out = torch.full((n,), _NEG_INF, dtype=v.dtype, device=v.device)
    if len(i) == 0:
        return out
    o = torch.argsort(v, descending=True, stable=True)
    o = o[torch.argsort(i[o], stable=True)]
    ii = i[o]
    rank = torch.arange(len(ii), device=ii.device) - torch.searchsorted(ii, ii)
    at = rank == k - 1
    out[ii[at]] = v[o][at]
    return out


def _prep_rows(p: sk.Prepared, a0: int, a1: int) -> sk.Prepared:
    """Rows a0:a1 of ``p`` as views."""
    return dataclasses.replace(
        p,
        unit=p.unit[a0:a1],
        raw=p.raw[a0:a1],
        inv=p.inv[a0:a1],
        scale=p.scale[a0:a1],
        valid=p.valid[a0:a1],
    )


def _by_row_blocks(n: int, rows: int | None, block: Callable[[int, int], T]) -> list[T]:
    """``block(a0, a1)`` over consecutive row blocks of at most ``rows`` (None: all);
    a block that runs the device out of memory is halved and done again, down to one
    row (which raises)."""
    out: list[T] = []
    start, size = 0, max(1, min(n, rows or n))
    while start < n:
        stop = min(n, start + size)
        try:
            out.append(block(start, stop))
        except OUT_OF_MEMORY:
            if size == 1:
                raise
            size //= 2
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            continue
        start = stop
    return out


def threshold_pairs(
    q: sk.Prepared,
    ql: sp.LowRows,
    r: sk.Prepared,
    rl: sp.LowRows,
    threshold: float,
    *,
    mode: str | None = None,
    diag: int = 0,
    exact: bool = True,
    exact_scores: bool = True,
    engine: str = "auto",
    config: object | None = None,
    block_rows: int | None = None,
    limit: PairLimit | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every pair with float64 cos(q[i], r[j]) >= threshold: (i, j, score), unsorted.

    ``mode`` "upper" keeps j > i + diag (each unordered pair of a self-join once),
    "exclude_self" drops j == i + diag.  With ``exact_scores`` False, pairs certain to
    pass (s_hat - E >= threshold) keep their low-precision score (within E of the exact
    one).  ``exact`` False: the "fast" policy, s_hat >= threshold decides and s_hat is
    reported.  ``config``: the kernel's :class:`~dask_cosim._search_triton.TileConfig`
    (engine "triton") or the tile size (engine "torch").  ``block_rows``: rows of ``q``
    searched at a time (None: all; halved on out-of-memory).  ``limit`` counts the first
    pass's candidates as it finds them (a superset of the pairs) and raises
    :class:`~dask_cosim._search_sweep.TooManyPairs` past its most: before they fill the
    device's memory.
    """
    t = float(threshold)

    def decide(a0: int, qp: sk.Prepared, qa: sp.LowRows, i: torch.Tensor, j: torch.Tensor,
               s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        # Low-precision scores that are reported are clamped as every score is: that of
        # parallel rows can exceed 1 (by up to its bound).
        if not exact:
            keep = s >= t
            return i[keep] + a0, j[keep], s[keep].to(torch.float64).clamp_(-1.0, 1.0)
        score = s.to(torch.float64)
        if exact_scores:
            unsure = torch.ones_like(i, dtype=torch.bool)
        else:
            unsure = score - sp.pair_bound(qa, i, rl, j) < t
        score[unsure] = sk.rescore(qp, i[unsure], r, j[unsure])
        keep = score >= t
        return i[keep] + a0, j[keep], score[keep].clamp_(-1.0, 1.0)

    opts = _ThresholdRun(t, mode, diag, exact, engine, config, block_rows, limit)
    parts = _threshold_blocks(q, ql, rl, opts, decide)
    if not parts:
        none = torch.zeros(0, dtype=torch.int64, device=ql.low.device)
        return none, none.clone(), torch.zeros(0, dtype=torch.float64, device=ql.low.device)
    i, j, score = (torch.cat(t) for t in zip(*parts))
    return i, j, score


@dataclasses.dataclass(frozen=True)
class _ThresholdRun:
    threshold: float
    mode: str | None
    diag: int
    exact: bool
    engine: str
    config: object | None
    block_rows: int | None
    limit: PairLimit | None = None


def _threshold_blocks(
    q: sk.Prepared,
    ql: sp.LowRows,
    rl: sp.LowRows,
    run: _ThresholdRun,
    decide: Callable[..., T],
) -> list[T]:
    """The first pass of a threshold search over blocks of ``q``'s rows (halved on
    out-of-memory); ``decide(first row, q block, its low rows, i, j, s_hat)`` turns each
    block's candidates (``i`` counted from the block's first row) into its answer."""
    a, b = (ql, rl) if run.exact else (_without_bound(ql), _without_bound(rl))

    def block(a0: int, a1: int) -> T:
        qa = a.rows(a0, a1)
        bar = torch.full((a1 - a0,), run.threshold, dtype=torch.float64, device=qa.low.device)
        i, j, s, _ = _first_pass(
            qa, b, sp.down32(bar), k=0, mode=run.mode, diag=run.diag + a0, engine=run.engine,
            config=run.config, limit=run.limit,
        )  # fmt: skip
        return decide(a0, _prep_rows(q, a0, a1), ql.rows(a0, a1), i, j, s)

    return _by_row_blocks(len(q), run.block_rows, block)


def matched_columns(
    q: sk.Prepared, ql: sp.LowRows, r: sk.Prepared, rl: sp.LowRows, threshold: float, *,
    mode: str | None = None, diag: int = 0, engine: str = "auto", config: object | None = None,
) -> torch.Tensor:  # fmt: skip
    """The positions j of ``r`` (sorted, unique) that some row of ``q`` matches with a
    float64 score >= threshold (``mode`` and the rest as for :func:`threshold_pairs`):
    what ``dedup`` drops.  Only what can change a column's fate is re-scored: a pair with
    s_hat - E >= threshold decides without float64, and the unsure pairs of a column
    already decided are skipped."""
    t = float(threshold)
    hit = torch.zeros(len(r), dtype=torch.bool, device=rl.low.device)

    def decide(_: int, qp: sk.Prepared, qa: sp.LowRows, i: torch.Tensor, j: torch.Tensor,
               s: torch.Tensor) -> None:  # fmt: skip
        hit[j[s.to(torch.float64) - sp.pair_bound(qa, i, rl, j) >= t]] = True
        unsure = ~hit[j]
        i, j = i[unsure], j[unsure]
        hit[j[sk.rescore(qp, i, r, j) >= t]] = True

    _threshold_blocks(q, ql, rl, _ThresholdRun(t, mode, diag, True, engine, config, None), decide)
    return hit.nonzero().squeeze(1)


def topk(
    q: sk.Prepared,
    ql: sp.LowRows,
    r: sk.Prepared,
    rl: sp.LowRows,
    k: int,
    *,
    exclude_self: bool = False,
    diag: int = 0,
    exact: bool = True,
    engine: str = "auto",
    config: object | None = None,
    sample: int | None = None,
    block_rows: int | None = None,
) -> sk.TopK:
    """For each row of ``q`` its ``k`` best rows of ``r`` (float64 scores, ties by
    position; row i + diag of ``r`` excluded with ``exclude_self``).  ``exact`` False:
    the "fast" policy, ranked on s_hat.  ``sample``: rows of ``r`` scored in float64 first
    to seed each row's floor (default: max(2048, 64 k)).  ``block_rows`` as for
    :func:`threshold_pairs`."""
    sample = sample or max(2048, 64 * k)
    a, b = (ql, rl) if exact else (_without_bound(ql), _without_bound(rl))
    mode = "exclude_self" if exclude_self else None

    def block(a0: int, a1: int) -> sk.TopK:
        qp, qa = _prep_rows(q, a0, a1), a.rows(a0, a1)
        n = a1 - a0
        seed = (
            seed_floor(qp, r, k, exclude_self=exclude_self, diag=diag + a0, sample=sample)
            if exact
            else torch.full((n,), _NEG_INF, device=qa.low.device)
        )
        i, j, s, floor = _first_pass(
            qa, b, seed, k=k, mode=mode, diag=diag + a0, engine=engine, config=config
        )
        if not exact:  # ranked on s_hat clamped, as every score is
            return sk.top_of_pairs(n, i, j, s.to(torch.float64).clamp_(-1.0, 1.0), k)
        bound = sp.pair_bound(qa, i, rl, j)
        s64 = s.to(torch.float64)
        # The final floor: the best of the kernel's and the k-th best s_hat - E among the
        # candidates themselves (distinct columns of one row).
        floor64 = torch.maximum(floor.to(torch.float64), _kth_per_row(n, i, s64 - bound, k))
        keep = s64 + bound >= floor64[i]
        i, j = i[keep], j[keep]
        return sk.top_of_pairs(n, i, j, sk.rescore(qp, i, r, j), k)

    parts = _by_row_blocks(len(q), block_rows, block)
    if not parts:
        dev = ql.low.device
        return sk.TopK(
            torch.full((0, k), -1, dtype=torch.int64, device=dev),
            torch.full((0, k), _NEG_INF, dtype=torch.float64, device=dev),
        )
    return sk.TopK(torch.cat([p.index for p in parts]), torch.cat([p.score for p in parts]))


# --------------------------------------------------------------------------- entry points
# What search_kernels.topk and .threshold_pairs hand over to on CUDA.


def lowered(p: sk.Prepared) -> sp.LowRows:
    """``p``'s low-precision copy (:func:`~dask_cosim.search_precision.lower`), made once
    and kept on ``p`` for as long as it lives: a prepared side serves many searches."""
    low = p.__dict__.get("_lowered")
    if low is None or low.low.device != p.raw.device:
        low = sp.lower(p.raw, p.inv, p.scale, p.valid)
        p.__dict__["_lowered"] = low
    return low


def topk_prepared(
    q: sk.Prepared, r: sk.Prepared, k: int, *, same: bool, both: bool, exact: bool
) -> tuple[sk.TopK, sk.TopK | None]:
    """:func:`~dask_cosim.search_kernels.topk`'s contract in two passes (``both``: a
    second search, the rows of ``r`` against ``q``)."""
    ql, rl = lowered(q), lowered(r)
    kq, kr = sk.topk_width(k, len(r)), sk.topk_width(k, len(q))
    res = topk(q, ql, r, rl, kq, exclude_self=same, exact=exact)
    return res, (topk(r, rl, q, ql, kr, exact=exact) if both else None)


def threshold_prepared(
    q: sk.Prepared,
    r: sk.Prepared,
    threshold: float,
    *,
    mode: str | None,
    exact_scores: bool,
    exact: bool,
    limit: PairLimit | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`~dask_cosim.search_kernels.threshold_pairs`'s contract in two passes."""
    return threshold_pairs(
        q, lowered(q), r, lowered(r), threshold, mode=mode, exact=exact,
        exact_scores=exact_scores, limit=limit,
    )  # fmt: skip


def prepare_lean(
    x: torch.Tensor,
    null: torch.Tensor | None = None,
    *,
    eps: float,
    device: torch.device | str | None = None,
    chunk_rows: int = 2**20,
) -> sk.Prepared:
    """:func:`~dask_cosim.search_kernels.prepare` without the float32 unit rows, which
    only the float32 path reads: ``unit`` is a zero-stride placeholder of their shape
    (no memory; 30 GB saved at 10M x 768).  Prepared ``chunk_rows`` at a time."""
    target = torch.device(device) if device is not None else x.device
    raw = x.to(target)
    if not raw.is_floating_point():
        raw = raw.to(torch.float64)
    n, d = raw.shape
    if null is not None:
        null = torch.as_tensor(null, device=target)
    parts = [
        sk.prepare(
            raw[s : s + chunk_rows], None if null is None else null[s : s + chunk_rows], eps=eps
        )
        for s in range(0, n, chunk_rows)
    ] or [sk.prepare(raw, null, eps=eps)]
    unit = torch.zeros((), dtype=torch.float32, device=target).expand(n, d)
    return sk.Prepared(
        unit,
        raw,
        torch.cat([p.inv for p in parts]),
        torch.cat([p.scale for p in parts]),
        torch.cat([p.valid for p in parts]),
    )
