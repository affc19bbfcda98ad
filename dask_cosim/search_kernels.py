"""Exact cosine search kernels: pure torch, any device, no dataframes, no config.

Two reductions over blocks of the score matrix ``S = U_q @ U_r.T`` of two sets of
unit vectors, one tile at a time (the whole matrix never exists):

- :func:`topk`: for each query row its ``k`` best rows, kept per row between tiles;
- :func:`threshold_pairs`: every pair (i, j, score) with score >= a threshold.

Exactness.  Tiles are float32 products, but every answer is decided on float64 scores
re-computed from the original values for the candidates only: a float32 score differs
from the exact one by at most :func:`margin` (``(D + 8) * 2**-24`` for rows normalised
in float32), so keeping every candidate within that margin of the boundary and
re-scoring it in float64 gives the float64 answer.  Ties of the float64 score are
broken by position (the lower position first), so the result does not depend on how
the rows were split into tiles or partitions.  A top-k row keeps its float32 best
k + max(8, k // 4) and the best float32 score outside them: if that score plus the
margin is below the row's k-th float64 score, the row is certain; else an exact
threshold pass decides it.  On CPUs numba kernels select from each tile while it is
in cache (:mod:`dask_cosim._search_sweep`); elsewhere ``torch.topk`` merges do.

bfloat16 tiles.  On a CPU that multiplies bfloat16 natively (:func:`~dask_cosim.
_search_tiles.cpu_bfloat16`), an "exact" search multiplies bfloat16 copies of the unit
rows (twice the float32 rate) and decides on float64 scores just the same, with the
first pass's bound in place of the margin: |s_hat - cos| <= A + B |s_hat|
(:func:`bfloat16_bound`).  A top-k row keeps 2k + 32 candidates; those whose s_hat
cannot reach its k-th are not re-scored.  A threshold search re-scores every pair it
keeps.

Validity.  Rows holding NaN or inf, and rows marked null, are invalid: they never match
and get no matches.  A zero vector is valid and scores 0.0 with every row (the numerics
policy: cos = (a / max(|a|, eps)) . (b / max(|b|, eps))).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dask_cosim._search_sweep import (
    DIRECT_BLOCK_ROWS,
    DIRECT_MAX_QUERIES,
    DirectPart,
    NumbaPairs,
    PairLimit,
    TopkPart,
    TorchPairs,
    by_rows,
    chunks,
    compact,
    sweep,
)
from dask_cosim._search_tiles import (
    Heaps,
    Running,
    cpu_bfloat16,
    cpu_tile_bytes,
    numba_kernels,
    tiles,
)
from dask_cosim.search_precision import TAU, kappa
from dask_cosim.search_prepare import (
    RAW_UNIT_TOLERANCE,
    Prepared,
    from_norms,
    largest_err,
    margin,
    prepare,
    rescore,
    rescore_error,
)

# Prepared, from_norms, largest_err, margin, prepare, rescore, rescore_error: re-exported from
# dask_cosim.search_prepare.
__all__ = [
    "RAW_UNIT_TOLERANCE",
    "Prepared",
    "TopK",
    "bfloat16_bound",
    "bfloat16_rows",
    "from_norms",
    "largest_err",
    "margin",
    "prepare",
    "rescore",
    "rescore_error",
    "threshold_pairs",
    "top_of_pairs",
    "topk",
    "topk_width",
]

_NEG_INF = float("-inf")


@dataclass
class TopK:
    """Per query row its best rows: ``index`` (n, w) int64 positions (-1: none) and
    ``score`` (n, w) float64 (-inf: none), sorted by score descending, then position;
    w is k, or fewer where the other side has fewer rows."""

    index: torch.Tensor
    score: torch.Tensor


def topk_width(k: int, rows: int) -> int:
    """How many candidates a row of a top-k keeps, for ``k`` against ``rows`` rows: no
    more than those rows (at least 1), since no row has more; a k beyond them would only
    allocate (k=10**6 for 2,000 queries: a 15 GiB state)."""
    return min(k, max(1, rows))


def _order(score: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Column order per row: score descending, then position ascending (-1 last)."""
    key = torch.where(index < 0, torch.iinfo(torch.int64).max, index)
    by_pos = torch.argsort(key, dim=1, stable=True)
    s = torch.gather(score, 1, by_pos)
    by_score = torch.argsort(s, dim=1, descending=True, stable=True)
    return torch.gather(by_pos, 1, by_score)


def bfloat16_bound(dim: int, err_q: float, err_r: float) -> tuple[float, float]:
    """(A, B): a score of two rows' bfloat16 copies, multiplied with float32
    accumulation and rounded to bfloat16, differs from their exact cosine by at most
    A + B |score|.  ``err_q``, ``err_r``: the largest distance of a side's copy from its
    exact unit row (the copy's rounding, measured, plus :attr:`Prepared.err`).

    With b the copies and x the exact unit rows, |b_q . b_r - x_q . x_r| <= e_q (1 + e_r)
    + e_r; the float32 sum of the (exact) products errs by at most kappa(D) |b_q| |b_r|
    (:func:`~dask_cosim.search_precision.kappa`); rounding that sum p to bfloat16 by at
    most 2^-8 |p| <= |score| / 255.  TAU covers the subnormals that bfloat16 products
    may flush to zero and the float32 and float64 arithmetic of the comparisons."""
    a = err_q * (1 + err_r) + err_r + kappa(dim) * (1 + err_q) * (1 + err_r) + TAU
    return a, (1 + 2.0**-20) / 255


def bfloat16_rows(
    unit: torch.Tensor, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, float]:
    """Float32 CPU rows ``unit`` rounded to nearest bfloat16 as torch rounds (numba), and
    the largest distance of a ``valid`` row (default: every row) from its copy, rounded up
    (the float64 sum of squares, reassociated, errs by far less than the 2^-30 added)."""
    fast = numba_kernels()
    assert fast is not None, "bfloat16 copies are made by numba"
    bits = torch.empty(unit.shape, dtype=torch.int16)
    rows, out = unit.contiguous().numpy(), bits.numpy().view("uint16")
    ok = (torch.ones(len(rows), dtype=torch.bool) if valid is None else valid).numpy()
    worst = by_rows(
        len(rows), rows.size, lambda a, b: fast.to_bfloat16(rows[a:b], ok[a:b], out[a:b])
    )
    return bits.view(torch.bfloat16), max(worst) * (1 + 2.0**-30)


def _low_sides(
    fast: Any, q: Prepared, r: Prepared, precision: str, bfloat16: bool | None
) -> tuple[torch.Tensor, torch.Tensor, tuple[float, float] | None]:
    """The two sides' tile operands and the bound of their scores: bfloat16 copies and
    :func:`bfloat16_bound` for "exact" on a CPU where ``bfloat16`` (default: the CPU
    multiplies bfloat16 natively) and numba; else the float32 unit rows and None."""
    if (
        fast is None
        or precision != "exact"
        or not (cpu_bfloat16() if bfloat16 is None else bfloat16)
    ):
        return q.unit, r.unit, None
    qa, err_q = bfloat16_rows(q.unit, q.valid)
    ra, err_r = (qa, err_q) if r is q else bfloat16_rows(r.unit, r.valid)
    return qa, ra, bfloat16_bound(q.dim, err_q + q.err, err_r + r.err)


def _window(ci: torch.Tensor, s32: torch.Tensor, k: int, a: float, b: float) -> torch.Tensor:
    """The candidates ``ci`` less those whose first-pass score ``s32`` cannot reach their
    row's k-th: some k candidates score s_hat >= h_k, so cos >= h_k - E(h_k) for k rows;
    a candidate with s_hat + E(s_hat) below that is surely not among the k best."""
    s = s32.to(torch.float64)
    kk = s.shape[1]
    hk = torch.topk(s, min(k, kk), dim=1).values[:, -1:]
    reach = s + (a + b * s.abs())
    return ci.masked_fill(reach < hk - (a + b * hk.abs()), -1)


def _finish(
    run: Running | Heaps,
    q: Prepared,
    r: Prepared,
    k: int,
    tile_bytes: int,
    self_pos: bool,
    bound: tuple[float, float] | None = None,
) -> TopK:
    ci, dropped32 = run.result()
    if bound is not None:
        ci = _window(ci, run.scores(), k, *bound)  # type: ignore[union-attr]
    n, kk = ci.shape
    s64 = torch.full((n, kk), _NEG_INF, dtype=torch.float64, device=ci.device)
    found = ci >= 0
    rows = torch.arange(n, device=ci.device)[:, None].expand(n, kk)
    s64[found] = rescore(q, rows[found], r, ci[found])
    order = _order(s64, ci)[:, :k]
    score = torch.gather(s64, 1, order)
    index = torch.gather(ci, 1, order)
    # A row is certain when nothing it dropped can reach its k-th float64 score.
    kth = score[:, k - 1] if score.shape[1] == k else torch.full_like(score[:, 0], _NEG_INF)
    dropped = dropped32.to(torch.float64)
    delta = margin(q.dim, q.err, r.err) if bound is None else bound[0] + bound[1] * dropped.abs()
    unsure = torch.isfinite(dropped) & (dropped + delta >= kth)
    if bool(unsure.any()):
        u = unsure.nonzero().squeeze(1)
        sub = q.take(u)
        ii, jj, ss = threshold_pairs(
            sub,
            r,
            kth[u],
            tile_bytes=tile_bytes,
            row_pos=u if self_pos else None,
            mode="exclude_self" if self_pos else None,
        )
        fix = top_of_pairs(len(u), ii, jj, ss, k)
        index[u], score[u] = fix.index, fix.score
    index[~q.valid] = -1
    score[~q.valid] = _NEG_INF
    return TopK(index, score)


def top_of_pairs(n: int, i: torch.Tensor, j: torch.Tensor, s: torch.Tensor, k: int) -> TopK:
    """The k best of each of ``n`` rows from a list of pairs (row ``i``, position ``j``,
    score ``s``): ``TopK`` ordered by score descending, then position ascending."""
    index = torch.full((n, k), -1, dtype=torch.int64, device=i.device)
    score = torch.full((n, k), _NEG_INF, dtype=torch.float64, device=i.device)
    if len(i) == 0:
        return TopK(index, score)
    o = torch.argsort(j, stable=True)
    o = o[torch.argsort(-s[o], stable=True)]
    o = o[torch.argsort(i[o], stable=True)]
    i, j, s = i[o], j[o], s[o]
    starts = torch.searchsorted(i, i, right=False)
    rank = torch.arange(len(i), device=i.device) - starts
    keep = rank < k
    index[i[keep], rank[keep]] = j[keep]
    score[i[keep], rank[keep]] = s[keep]
    return TopK(index, score)


def topk(
    q: Prepared,
    r: Prepared,
    k: int,
    *,
    tile_bytes: int,
    same: bool = False,
    both: bool = False,
    precision: str = "fp32",
    bfloat16: bool | None = None,
) -> tuple[TopK, TopK | None]:
    """For each row of ``q`` its ``k`` best rows of ``r`` (and, with ``both``, for each row
    of ``r`` its ``k`` best rows of ``q``, from the same tiles).

    Parameters
    ----------
    q, r : Prepared
        The two sides (same D).
    k : int
        Matches per row, >= 1; fewer when ``r`` has fewer valid rows.
    tile_bytes : int
        Budget for one float32 tile of scores.
    same : bool, default False
        ``q`` and ``r`` are the same rows: a row never matches itself.
    both : bool, default False
        Also reduce the columns (the self-join's off-diagonal partition pairs).
    precision : {"fp32", "exact", "fast"}, default "fp32"
        On CUDA, "exact" and "fast" hand over to :mod:`dask_cosim.search_twopass` (a
        float16 first pass; "fast" ranks on it alone); elsewhere all three run this,
        "exact" from bfloat16 tiles where ``bfloat16`` says so.
    bfloat16 : bool, optional
        With "exact" on a CPU, whether the tiles are bfloat16 products (see the module
        docstring; not for :data:`DIRECT_MAX_QUERIES` queries or fewer, which run dot by
        dot).  Default: where the CPU multiplies bfloat16 natively.

    Returns
    -------
    (TopK, TopK or None)
        Exact float64 results, ties broken by position.
    """
    if precision != "fp32" and q.unit.device.type == "cuda":
        from dask_cosim import search_twopass

        exact = precision == "exact"
        return search_twopass.topk_prepared(q, r, k, same=same, both=both, exact=exact)
    nq, nr = len(q), len(r)
    kk = k + max(8, k // 4)  # candidates kept per row: room below the k-th for near-ties
    fast = numba_kernels() if q.unit.device.type == "cpu" and max(nq, nr) < 2**31 else None

    def state(n: int, own: torch.Tensor, other: torch.Tensor, same: bool = False) -> Any:
        width = topk_width(kk, len(other))
        return (
            Running(n, width, own, other, same)
            if fast is None
            else Heaps(fast, n, width, own, other, same)
        )

    qa, ra, bound = q.unit, r.unit, None
    if nq > DIRECT_MAX_QUERIES or both:
        qa, ra, bound = _low_sides(fast, q, r, precision, bfloat16)
    if bound is not None:
        kk = 2 * k + 32  # the window of bfloat16 scores that may hold a row's k best
    run_r = state(nr, r.valid, q.valid) if both else None
    # Without column states the threads split the query rows: each row's heap meets all
    # columns (fewer entries pass a bar that rises over all of them than over a part).
    rows = run_r is None
    make: Callable[[], TopkPart]
    if fast is None:
        tq, tr = tiles(nq, nr, tile_bytes)
        make = lambda: TopkPart(state(nq, q.valid, r.valid, same), run_r)  # noqa: E731
    elif nq <= DIRECT_MAX_QUERIES and not both:
        tq, tr, rows = nq, DIRECT_BLOCK_ROWS, False  # a few queries: blocks of r per thread
        make = lambda: DirectPart(state(nq, q.valid, r.valid, same), q.unit, r.unit)  # noqa: E731
    else:
        # The numba scan reads each tile right after the product wrote it: from cache.
        tq, tr = tiles(nq, nr, min(tile_bytes, cpu_tile_bytes("topk")), fast.BLOCK)
        make = lambda: TopkPart(state(nq, q.valid, r.valid, same), run_r)  # noqa: E731
    parts = sweep(qa, ra, tq, tr, make, fast is not None, by_rows=rows)
    run_q = parts[0].run_q
    for part in parts[1:]:  # several parts: numba heaps of other rows or columns
        run_q.merge(part.run_q)  # type: ignore[union-attr,arg-type]
    with torch.no_grad():
        res_q = _finish(run_q, q, r, k, tile_bytes, same, bound)
        res_r = _finish(run_r, r, q, k, tile_bytes, False, bound) if run_r is not None else None
    return res_q, res_r


def threshold_pairs(
    q: Prepared,
    r: Prepared,
    threshold: float | torch.Tensor,
    *,
    tile_bytes: int,
    row_pos: torch.Tensor | None = None,
    mode: str | None = None,
    exact_scores: bool = True,
    precision: str = "fp32",
    bfloat16: bool | None = None,
    limit: PairLimit | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every pair with float64 cos(q[i], r[j]) >= threshold: (i, j, score), unsorted.

    ``threshold`` is one number or one per row of ``q``.  ``mode`` "upper" keeps only
    j > row_pos[i] (each unordered pair of a self-join once), "exclude_self" drops
    j == row_pos[i]; ``row_pos`` (default: 0..n-1) gives each row of ``q`` its position
    among the rows of ``r``.  The pair set is always decided on float64 scores; with
    ``exact_scores`` False only the pairs within :func:`margin` of the threshold are
    re-scored and the others keep their float32 tile score (within the margin of the
    exact one, typically 1e-7), which saves a gather of two rows per pair.  ``precision``
    as for :func:`topk` (on CUDA: one threshold for all rows, no ``row_pos``), and so is
    ``bfloat16``: the pairs of bfloat16 tiles within their bound of the threshold are
    all re-scored (every score is then the float64 one).

    ``limit`` counts the candidate pairs (those near or above the threshold) as tiles
    find them and raises :class:`~dask_cosim._search_sweep.TooManyPairs` past its most
    (on CUDA with ``precision`` "exact" or "fast": the first pass's candidates, as its
    kernel writes them).
    """
    if precision != "fp32" and q.unit.device.type == "cuda" and row_pos is None:
        from dask_cosim import search_twopass

        exact = precision == "exact"
        return search_twopass.threshold_prepared(
            q, r, float(threshold), mode=mode, exact_scores=exact_scores, exact=exact,
            limit=limit,
        )  # fmt: skip
    device = q.unit.device
    nq, nr = len(q), len(r)
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    if nq == 0 or nr == 0:
        return empty, empty.clone(), torch.zeros(0, dtype=torch.float64, device=device)
    thr = torch.as_tensor(threshold, dtype=torch.float64, device=device).expand(nq)
    fast = numba_kernels() if device.type == "cpu" else None
    qa, ra, bound = _low_sides(fast, q, r, precision, bfloat16)
    delta = margin(q.dim, q.err, r.err)
    if bound is None:
        reach = thr - delta
    else:  # the scores s with s + A + B |s| >= thr
        a, b = bound
        reach = torch.where(thr >= a, (thr - a) / (1 + b), (thr - a) / (1 - b))
        exact_scores = True
    # Invalid query rows get an unreachable bar.
    low = torch.where(q.valid, reach, torch.full_like(thr, math.inf))
    # Rounded down: a float32 bar above ``low`` would narrow the margin.
    low32 = low.to(torch.float32)
    below = torch.nextafter(low32, torch.full_like(low32, -math.inf))
    low32 = torch.where(low32.to(torch.float64) > low, below, low32)
    identity = row_pos is None  # row i of q is row i of r (the self-join's diagonal pair)
    pos = torch.arange(nq, device=device) if row_pos is None else row_pos
    if device.type == "cpu":
        # The scan for hits reads each tile again: from the cache, if the tile fits.
        tile_bytes = min(tile_bytes, cpu_tile_bytes("threshold"))
    tq, tr = tiles(nq, nr, tile_bytes, 1 if fast is None else fast.BLOCK)
    make: Callable[[], NumbaPairs | TorchPairs]
    if fast is not None:
        make = lambda: NumbaPairs(fast, low32, r.valid, pos, mode, tq, tr, limit)  # noqa: E731
    else:
        make = lambda: TorchPairs(  # noqa: E731
            low32, r.valid, pos, mode, tq, identity, r.all_valid, limit
        )
    parts: list[NumbaPairs | TorchPairs] = sweep(qa, ra, tq, tr, make, fast is not None)
    found = [part.result() for part in parts]
    del parts  # the parts' buffers live on in the views ``found`` holds, no longer
    with torch.no_grad():
        if not any(len(f[0]) for f in found):
            return empty, empty.clone(), torch.zeros(0, dtype=torch.float64, device=device)
        # One part (one thread, as on a dask worker): its buffers as they are, no copy.
        i, j, s32 = found[0] if len(found) == 1 else (torch.cat(f) for f in zip(*found))
        del found
        # One bar for all rows: a scalar, not one float64 per pair.
        bar = thr[i] if isinstance(threshold, torch.Tensor) and threshold.ndim else thr[0]
        if exact_scores:
            del s32
            score = rescore(q, i, r, j)
        else:
            # Clamped as every score is: the tile score of parallel rows can exceed 1.
            score = s32.to(torch.float64).clamp_(-1.0, 1.0)
            del s32
            near = torch.empty(len(score), dtype=torch.bool, device=device)
            for a, b in chunks(len(score)):  # no float64 temporary of every pair
                share = bar if bar.ndim == 0 else bar[a:b]  # one bar for all, or a pair's
                near[a:b] = (score[a:b] - share).abs_() < delta
            if bool(near.any()):
                score[near] = rescore(q, i[near], r, j[near])
            del near
        keep = score >= bar
        del bar
        i, j, score = compact(keep, i, j, score)
    return i, j, score
