"""Exact search on CPUs, the parts torch has no fast op for (numba): normalising rows in
one pass, and selecting each row's best candidates from a tile of scores while the tile
is still in cache.

Imported by :mod:`dask_cosim.search_kernels` on the first CPU search only (importing
numba takes time a client that never computes need not pay).  The numerics (what a
candidate is, the rounding margin, the float64 re-check) are decided there; this module
only computes.

Selection.  Each row keeps a min-heap of its ``keep`` best (score, position) entries so
far (-inf / -1 while it fills) and a bar, the heap's root: the ``keep``-th best score
seen.  A tile entry enters only when it beats the bar, replacing the root.  So every
entry outside the heap scores at most the root, and :func:`candidates` returns each
row's ``keep - 1`` best (all but the root) plus the best score outside them (the root).
Most entries of a tile only meet one vectorised comparison with the bar (:data:`BLOCK`
at a time); a heap (not a buffer cut back by a quickselect) keeps the bar exact, so few
entries pass, and each costs a short sift, not a partition's mispredicted branches.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np

__all__ = [
    "BLOCK",
    "candidates",
    "from_norms",
    "merge",
    "norms",
    "rescore",
    "scan_cols",
    "scan_direct",
    "scan_pairs",
    "scan_rows",
    "to_bfloat16",
    "units",
]

# No "nnan"/"ninf": the tests for NaN and inf below must see them as they are.  The
# kernels that take float64 data compile without "reassoc" and "arcp" (_EXACT): their
# range-keeping factors must multiply each value in the order written, never be
# regrouped with another factor (1e308 * 1e308 * 1e-308 * 1e-308 overflows), and a
# division must stay one.  float32 data cannot leave float64's range: its kernels may
# reassociate, which is what lets LLVM vectorise their sums.
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}
_EXACT = {"contract", "nsz"}

# Tile entries compared with the bar per step: a count of the entries above it over a
# fixed-length block is what LLVM turns into a few vector compares.
BLOCK = 64
# Rows whose largest value is below this get inv = 1 / TINY (see norms).
TINY = 2.0**-1000
_BIG = 1.7976931348623157e308  # the largest float64


@numba.njit(inline="always", nogil=True, cache=True, fastmath=_FASTMATH, boundscheck=False)
def _push(hs, hi, bar, r, v, c):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Replace row r's root by (v, c), v > the root, and sift it down."""
    n = hs.shape[1]
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= n:
            break
        if child + 1 < n and hs[r, child + 1] < hs[r, child]:
            child += 1
        if hs[r, child] >= v:
            break
        hs[r, pos] = hs[r, child]
        hi[r, pos] = hi[r, child]
        pos = child
    hs[r, pos] = v
    hi[r, pos] = c
    bar[r] = hs[r, 0]


@numba.njit(inline="always", nogil=True, cache=True, fastmath=_FASTMATH, boundscheck=False)
def _quiet(row, blk, width, b):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Whether block ``blk`` of ``row`` (``width`` entries from blk * BLOCK) surely holds
    no entry above b: a full block is counted at once (a fixed-length count LLVM
    vectorises, given an index it can prove is not negative); a short one is not."""
    hits = 0
    if width == BLOCK:
        for t in range(BLOCK):
            hits += row[blk * BLOCK + t] > b
    return width == BLOCK and hits == 0


@numba.njit(inline="always", nogil=True, cache=True, fastmath=_FASTMATH, boundscheck=False)
def _quiet_each(row, bars, blk, width):  # type: ignore[no-untyped-def]  # pragma: no cover
    """The same against each entry's own bar, bars[blk * BLOCK + t]."""
    above = 0
    if width == BLOCK:
        for t in range(BLOCK):
            above += row[blk * BLOCK + t] > bars[blk * BLOCK + t]
    return above == 0 and width == BLOCK


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH, boundscheck=False)
def scan_rows(s, row0, col0, hs, hi, bar, rvalid, qvalid, same):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Offer tile ``s`` (rows ``row0..`` of q x columns ``col0..`` of r) to the rows'
    heaps: entries of invalid rows or columns, and with ``same`` the row itself
    (column == row), never enter."""
    m, w = s.shape
    for i in range(m):
        r = row0 + i
        if not qvalid[r]:
            continue
        row = s[i]
        b = bar[r]
        own = r if same else -1
        for blk in range(-(-w // BLOCK)):
            base = blk * BLOCK
            width = min(BLOCK, w - base)
            if _quiet(row, blk, width, b):
                continue
            for j in range(base, base + width):
                v = row[j]
                if v > b:
                    c = col0 + j
                    if rvalid[c] and c != own:
                        _push(hs, hi, bar, r, v, c)
                        b = bar[r]


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH, boundscheck=False)
def scan_cols(s, row0, col0, hs, hi, bar, rvalid, qvalid):  # type: ignore[no-untyped-def]  # pragma: no cover
    """The same for the columns: column ``col0 + j`` (a row of r) is offered the rows
    ``row0 + i`` of q (the self-join's off-diagonal pairs reduce both ways)."""
    m, w = s.shape
    cb = bar[col0 : col0 + w]
    for i in range(m):
        if not qvalid[row0 + i]:
            continue
        row = s[i]
        for blk in range(-(-w // BLOCK)):
            base = blk * BLOCK
            width = min(BLOCK, w - base)
            if _quiet_each(row, cb, blk, width):
                continue
            for j in range(base, base + width):
                if row[j] > cb[j] and rvalid[col0 + j]:
                    _push(hs, hi, bar, col0 + j, row[j], row0 + i)


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH, boundscheck=False)
def candidates(hs, hi, index, dropped):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Per row its ``keep - 1`` best positions (all but the root; unordered, -1 padded)
    into ``index``, and the best score of every entry outside them (the root; -inf:
    none) into ``dropped``."""
    n, keep = hs.shape
    for r in range(n):
        dropped[r] = hs[r, 0]
        for t in range(1, keep):
            index[r, t - 1] = hi[r, t]


def norms(x: np.ndarray, *args: Any) -> float:
    """``norms(x, null, eps, inv, nrm, scale, valid)``: one read of each row of ``x``
    (float32 or float64, C-contiguous) for the fields of
    :class:`~dask_cosim.search_prepare.Prepared` but ``unit``: ``inv`` (a factor that
    keeps the row in range for a float64 dot product: 1 for float32 rows, whose products
    can neither overflow nor underflow in float64; 1 / the largest magnitude for float64
    ones, capped at 1 / TINY), ``nrm`` = |x * inv|_2 (NaN for invalid rows), ``scale``
    = 1 / max(nrm, inv * eps) (0 for invalid rows, 1 for a zero row when eps is 0:
    :func:`~dask_cosim.search_prepare.from_norms` computes it alike) and ``valid``
    (finite and not null).

    Returns the largest |norm - 1| of the valid nonzero rows (inf for float64 ``x``):
    how far ``x`` itself is from unit rows.  Zero rows are their own unit rows, and the
    rows that never match may hold anything: the scans skip them by ``valid``.
    """
    if x.dtype == np.float32:
        return float(_norms32(x, *args))
    return float(_norms64(x, *args))


@numba.njit(inline="always", nogil=True, cache=True, boundscheck=False)
def _norms(x, null, eps, inv, nrm, scale, valid, narrow):  # type: ignore[no-untyped-def]  # pragma: no cover
    n, d = x.shape
    worst = 0.0 if narrow else np.inf
    for i in range(n):
        row = x[i]
        ss = 0.0
        for j in range(d):
            v = np.float64(row[j])
            ss += v * v
        mx = 1.0
        if not narrow:
            mx = 0.0
            for j in range(d):
                a = abs(np.float64(row[j]))
                mx = a if a > mx else mx
        # float32 rows: a NaN or inf value, and only that, makes the sum of squares NaN
        # or inf.  float64 rows: NaN makes it NaN, inf makes the largest value inf (a
        # sum of finite squares may overflow: those rows are summed again below).
        # Comparisons, not math.isfinite: numba computes that as x - x, which LLVM
        # folds to 0 under "reassoc" + "nsz".
        finite = ss <= _BIG if narrow else ss == ss
        ok = finite and mx <= _BIG and not null[i]
        valid[i] = ok
        if not ok:
            inv[i], nrm[i], scale[i] = 1.0, np.nan, 0.0
            continue
        # 1 / mx overflows below ~5.6e-309: a capped factor keeps such rows near 2**-74.
        f = 1.0 if mx == 0.0 else (1.0 / mx if mx > TINY else 1.0 / TINY)
        if not narrow:
            ss = 0.0
            for j in range(d):
                y = np.float64(row[j]) * f
                ss += y * y
        norm = math.sqrt(ss)
        inv[i], nrm[i] = f, norm
        scale[i] = _over(max(norm, f * eps))
        if norm > 0.0:  # a zero row is its own unit row, exactly
            worst = max(worst, abs(norm - 1.0))
    return worst


@numba.njit(inline="always", nogil=True, cache=True, boundscheck=False)
def _over(bar):  # type: ignore[no-untyped-def]  # pragma: no cover
    """1 / ``bar``, the scale of a row of norm max(|x|, eps) = ``bar``; 1 for a zero row
    when eps is 0 (any finite positive scale keeps its products at 0.0, as with any
    eps: its unit row is zero)."""
    return 1.0 / bar if bar > 0.0 else 1.0


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH, boundscheck=False)
def _norms32(x, null, eps, inv, nrm, scale, valid):  # type: ignore[no-untyped-def]  # pragma: no cover
    return _norms(x, null, eps, inv, nrm, scale, valid, True)


@numba.njit(nogil=True, cache=True, fastmath=_EXACT, boundscheck=False)
def _norms64(x, null, eps, inv, nrm, scale, valid):  # type: ignore[no-untyped-def]  # pragma: no cover
    return _norms(x, null, eps, inv, nrm, scale, valid, False)


def units(x: np.ndarray, *args: Any) -> None:
    """``units(x, inv, scale, valid, unit)``: unit[i] = (x[i] * inv[i]) * scale[i] in
    float32 (rows of norm 1; 0 for invalid), ``x`` float32 or float64.  For float64 rows
    in that order, never inv * scale first: for a row whose largest value is below TINY
    (inv capped at 1 / TINY) and eps 0, that product overflows (a row of 1e-310 gave
    inf unit rows, which matched nothing)."""
    if x.dtype == np.float32:
        _units32(x, *args)
    else:
        _units64(x, *args)


@numba.njit(inline="always", nogil=True, cache=True, boundscheck=False)
def _units(x, inv, scale, valid, unit):  # type: ignore[no-untyped-def]  # pragma: no cover
    n, d = x.shape
    for i in range(n):
        out = unit[i]
        if not valid[i]:
            out[:] = 0.0
            continue
        row = x[i]
        a, b = inv[i], scale[i]
        for j in range(d):
            out[j] = np.float32((np.float64(row[j]) * a) * b)


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH, boundscheck=False)
def _units32(x, inv, scale, valid, unit):  # type: ignore[no-untyped-def]  # pragma: no cover
    _units(x, inv, scale, valid, unit)  # (inv is 1 for float32 rows: any order will do)


@numba.njit(nogil=True, cache=True, fastmath=_EXACT, boundscheck=False)
def _units64(x, inv, scale, valid, unit):  # type: ignore[no-untyped-def]  # pragma: no cover
    _units(x, inv, scale, valid, unit)


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH, boundscheck=False)
def to_bfloat16(unit, valid, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    """out = the bfloat16 bits (uint16) of float32 ``unit``, rounded to nearest even as
    torch rounds; returns the largest |bfloat16 row - float32 row|_2 of the valid rows,
    summed in float64 (the error term of the first pass's bound)."""
    n, d = unit.shape
    bits = unit.view(np.uint32)
    wide = np.empty(d, dtype=np.uint32)
    back = wide.view(np.float32)  # the bfloat16 values, widened
    worst = 0.0
    for i in range(n):
        for j in range(d):
            b = bits[i, j]
            top = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
            out[i, j] = np.uint16(top)
            wide[j] = np.uint32(top) << np.uint32(16)
        if valid[i]:
            ss = 0.0
            for j in range(d):
                e = np.float64(back[j]) - np.float64(unit[i, j])
                ss += e * e
            worst = max(worst, ss)
    return math.sqrt(worst)


def rescore(xq: np.ndarray, *args: Any) -> None:
    """``rescore(xq, inv_q, scale_q, i, xr, inv_r, scale_r, j, out)``: out[t] =
    cos(q[i[t]], r[j[t]]) in float64, clamped to [-1, 1], by the formula of
    :func:`dask_cosim.search_kernels.rescore`, one pass over the two rows per pair."""
    if xq.dtype == np.float32 and args[3].dtype == np.float32:
        _rescore32(xq, *args)
    else:
        _rescore64(xq, *args)


@numba.njit(inline="always", nogil=True, cache=True, boundscheck=False)
def _rescore(xq, inv_q, scale_q, i, xr, inv_r, scale_r, j, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    d = xq.shape[1]
    for t in range(i.shape[0]):
        a = xq[i[t]]
        b = xr[j[t]]
        fa = inv_q[i[t]]
        fb = inv_r[j[t]]
        s = 0.0
        for c in range(d):
            s += (np.float64(a[c]) * fa) * (np.float64(b[c]) * fb)
        out[t] = _scaled(s, scale_q[i[t]], scale_r[j[t]])


@numba.njit(nogil=True, cache=True, fastmath=_EXACT, boundscheck=False)
def _scaled(s, scale_a, scale_b):  # type: ignore[no-untyped-def]  # pragma: no cover
    """``s`` times both rows' scales, clamped to [-1, 1]: a function of its own, without
    "reassoc", so that the product is ``s * (scale_a * scale_b)`` in every caller.  Under
    the float32 rescore's "reassoc" it was ``(s * scale_a) * scale_b``, and cos(a, b)
    could differ from cos(b, a) in the last bit: a self-join at a threshold equal to
    that score kept one of the two pairs.  (The sum before it is symmetric already: for
    float32 rows each term is an exact float64 product, the same either way.)"""
    return min(1.0, max(-1.0, s * (scale_a * scale_b)))


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH, boundscheck=False)
def _rescore32(xq, inv_q, scale_q, i, xr, inv_r, scale_r, j, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    _rescore(xq, inv_q, scale_q, i, xr, inv_r, scale_r, j, out)


@numba.njit(nogil=True, cache=True, fastmath=_EXACT, boundscheck=False)
def _rescore64(xq, inv_q, scale_q, i, xr, inv_r, scale_r, j, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    _rescore(xq, inv_q, scale_q, i, xr, inv_r, scale_r, j, out)


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH, boundscheck=False)
def merge(hs, hi, bar, hs2, hi2):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Offer the entries of heaps (hs2, hi2) to heaps (hs, hi): the heaps of one set of
    rows from two disjoint sets of columns become those of their union (what either
    dropped scores at most its root, which is at most the union's root)."""
    for r in range(hs.shape[0]):
        for t in range(hs2.shape[1]):
            v = hs2[r, t]
            if hi2[r, t] >= 0 and v > bar[r]:
                _push(hs, hi, bar, r, v, hi2[r, t])


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH, boundscheck=False)
def scan_pairs(s, row0, col0, low, rvalid, pos, mode, out_i, out_j, out_s, n):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Append (row0 + i, col0 + j, s[i, j]) for every tile entry >= low[row0 + i] of a
    valid column to the outputs from ``n`` on (mode 1: only columns > pos[row]; mode 2:
    not the column pos[row]).  Returns the new count, or -1 when the outputs are too
    short (nothing from this tile counts then: grow them and call again)."""
    m, w = s.shape
    cap = out_i.shape[0]
    for i in range(m):
        r = row0 + i
        if low[r] == np.inf:  # a row that never matches (it may hold NaN or inf)
            continue
        # x >= low  <=>  x > the float32 just below low (one comparison for all scans).
        below = np.nextafter(low[r], np.float32(-np.inf))
        p = pos[r] - col0
        start = min(w, max(0, p + 1)) if mode == 1 else 0
        skip = p if mode == 2 else -1
        row = s[i, start:]  # from its first column that may count
        c0 = col0 + start
        for blk in range(-(-(w - start) // BLOCK)):
            base = blk * BLOCK
            width = min(BLOCK, w - start - base)
            if _quiet(row, blk, width, below):
                continue
            for j in range(base, base + width):
                if row[j] > below and rvalid[c0 + j] and j + start != skip:
                    if n == cap:
                        return -1
                    out_i[n] = r
                    out_j[n] = c0 + j
                    out_s[n] = row[j]
                    n += 1
    return n


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH, boundscheck=False)
def scan_direct(q, r, col0, col1, hs, hi, bar, rvalid, qvalid, same):  # type: ignore[no-untyped-def]  # pragma: no cover
    """For a few queries: the float32 dot of each query with each row of r[col0:col1],
    offered to the queries' heaps as it is made (one read of r, no tile; a float32 sum
    in any order meets the same rounding bound as the tile product's)."""
    nq, d = q.shape
    for j in range(col0, col1):
        if not rvalid[j]:
            continue
        rj = r[j]
        for i in range(nq):
            if not qvalid[i]:
                continue
            qi = q[i]
            acc = np.float32(0.0)
            for c in range(d):
                acc += qi[c] * rj[c]
            if acc > bar[i] and not (same and i == j):
                _push(hs, hi, bar, i, acc, j)


@numba.njit(nogil=True, cache=True, fastmath=_EXACT, boundscheck=False)
def from_norms(inv, nrm, null, eps, scale, valid):  # type: ignore[no-untyped-def]  # pragma: no cover
    """What :func:`norms` writes, from its ``inv`` and ``nrm`` (a prepared frame's):
    ``scale`` and ``valid``.  Returns (the largest |nrm - 1|, whether a valid row has
    0 < |x| < eps, whose unit row depends on eps)."""
    worst = 0.0
    tiny = False
    for i in range(inv.shape[0]):
        nr = nrm[i]
        ok = nr == nr and not null[i]
        valid[i] = ok
        if not ok:
            scale[i] = 0.0
            continue
        bar = inv[i] * eps
        tiny = tiny or (0.0 < nr < bar)
        scale[i] = _over(max(nr, bar))
        if nr > 0.0:
            worst = max(worst, abs(nr - 1.0))
    return worst, tiny
