"""The routing rule of the clustered search on CPUs, in one pass over each row's scores
(numba): torch needs about twenty passes over the rows x clusters matrix for the same
decisions (:func:`dask_cosim.clustered_kernels.route`, which states the rule and its
bounds, and calls this on CPUs).  On CPUs that multiply bfloat16 natively, the scores
come from a bfloat16 product, and only the clusters that its bound cannot rule out are
scored again in float32 (:func:`stats_rows`, :func:`window_rows`).

Imported on the first CPU routing only (importing numba takes time a client that never
computes need not pay).  Every quantity of the rule is computed in float32 with the
operations, and in the order, that the torch path uses, so both make the same decisions
on the same scores.
"""

from __future__ import annotations

import math

import numba
import numpy as np

__all__ = ["home_rows", "route_rows", "stats_rows", "window_rows"]

# What window_rows writes for the clusters it rules out: far below any score, and finite
# (route_rows assumes finite scores).
RULED_OUT = -1e30


# Rows of scores are finite (usable directions against unit centroids): their maximum
# may be taken in any order, which lets LLVM vectorise it.
@numba.njit(
    nogil=True, cache=True, boundscheck=False, inline="always",
    fastmath={"nnan", "ninf", "nsz", "reassoc"},
)  # fmt: skip
def _max(row: np.ndarray) -> float:
    best = row[0]
    for c in range(1, len(row)):
        best = max(best, row[c])
    return best


@numba.njit(nogil=True, cache=True, boundscheck=False)
def route_rows(
    s: np.ndarray,
    floor: np.ndarray,
    gram: np.ndarray,
    far: float,
    delta: float,
    n_probe: int,
    home: np.ndarray,
    probes: np.ndarray,
    counts: np.ndarray,
) -> None:
    """Rows of ``s`` (m, k) float32 scores with the centroids: each one's ``home`` (its
    first highest score) and the clusters it probes, ascending, in ``probes[i, :counts[i]]``.

    A cluster c other than the home h is a candidate when ``s[c] >= floor[c]`` (the radius
    rule) and ``s[h] - s[c] <= norm * far' + 4 delta + 2**-18`` with ``norm = sqrt(max(0,
    2 + 2 delta - 2 gram[h, c]))`` (the bisector rule; ``far' = far (1 + 2**-18)``).
    ``n_probe`` < 0: every candidate above the home; else the ``n_probe`` candidates
    nearest their bisector with the home (``(s[h] - s[c]) / max(norm, 1e-6)``; ties to
    the lower cluster).  ``probes`` has k columns (n_probe < 0) or n_probe.
    """
    m, k = s.shape
    two = np.float32(2.0 + 2.0 * delta)
    scale = np.float32(far * (1.0 + 2.0**-18))
    add = np.float32(4.0 * delta + 2.0**-18)
    minus_two = np.float32(-2.0)
    zero = np.float32(0.0)
    tiny = np.float32(1e-6)
    inf = np.float32(np.inf)
    key = np.empty(k, dtype=np.float32)
    keep = max(n_probe, 1)
    near = np.empty(keep, dtype=np.float32)
    ids = np.empty(keep, dtype=np.int64)
    for i in range(m):
        row = s[i]
        best = _max(row)
        h = 0
        while h < k - 1 and row[h] != best:
            h += 1
        home[i] = h
        g = gram[h]
        low = h + 1 if n_probe < 0 else 0
        # Without branches, so that it vectorises: each candidate's distance to its
        # bisector with the home, +inf for the clusters ruled out.
        for c in range(k):
            norm = np.sqrt(max(minus_two * g[c] + two, zero))
            gap = best - row[c]
            ok = (row[c] >= floor[c]) & (gap <= norm * scale + add) & (c != h) & (c >= low)
            key[c] = gap / max(norm, tiny) if ok else inf
        n = 0
        if n_probe < 0:
            for c in range(low, k):
                probes[i, n] = c
                n += key[c] < inf
        elif n_probe > 0:
            for c in range(k):
                d = key[c]
                if d == inf or (n == n_probe and not d < near[n - 1]):
                    continue
                # Into the list sorted by d (the lower cluster first among equal d).
                j = n if n < n_probe else n_probe - 1
                while j > 0 and near[j - 1] > d:
                    near[j] = near[j - 1]
                    ids[j] = ids[j - 1]
                    j -= 1
                near[j] = d
                ids[j] = c
                if n < n_probe:
                    n += 1
            picked = np.sort(ids[:n])
            for j in range(n):
                probes[i, j] = picked[j]
        counts[i] = n


# A float32 dot product in any order (the bound of a score holds for every order), so
# that it vectorises.  Not inlined by numba: its fastmath flags would be the caller's.
@numba.njit(nogil=True, cache=True, boundscheck=False, fastmath={"reassoc", "contract"})
def _dot(x: np.ndarray, y: np.ndarray) -> float:
    acc = np.float32(0.0)
    for j in range(len(x)):
        acc += x[j] * y[j]
    return acc


@numba.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _window(
    bits: np.ndarray, wide: np.ndarray, v: np.ndarray, a: float, b: float, width: float
) -> np.float32:
    """Widen one row of bfloat16 scores (``bits``) into ``v`` (float32, a view of ``wide``)
    and return the cut: a cluster whose score is below it scores at least ``width`` less
    than the row's best.  A score ``x`` lies within ``a + b |x|`` of the exact cosine, and
    both ``x - a - b |x|`` and ``x + a + b |x|`` grow with ``x`` (b < 1): the best's lower
    bound is that of the highest score, and the cut is the score whose upper bound is that
    lower bound less ``width`` (float64, rounded down to a float32)."""
    for c in range(len(bits)):
        wide[c] = np.uint32(bits[c]) << np.uint32(16)
    top = np.float64(_max(v))
    low = top - a - b * abs(top) - width
    x = (low - a) / (1.0 + b) if low >= a else (low - a) / (1.0 - b)
    cut = np.float32(x)
    return np.nextafter(cut, np.float32(-np.inf)) if np.float64(cut) > x else cut


@numba.njit(nogil=True, cache=True, inline="always")
def _scratch(k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A row's room for :func:`_scored`: its widened scores (uint32, and as float32), the
    clusters scored again and their scores."""
    wide = np.empty(k, dtype=np.uint32)
    return wide, wide.view(np.float32), np.empty(k, dtype=np.int64), np.empty(k, np.float32)


@numba.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _scored(
    bits: np.ndarray, x: np.ndarray, cent: np.ndarray, wide: np.ndarray, v: np.ndarray,
    a: float, b: float, width: float, cand: np.ndarray, score: np.ndarray,
) -> tuple[int, int]:  # fmt: skip
    """Row ``x``'s float32 scores with the clusters that may score within ``width`` of
    its best (:func:`_window`), into ``cand[:n]`` and ``score[:n]`` in cluster order;
    returns n and the place of the first highest score."""
    cut = _window(bits, wide, v, a, b, width)
    n, at = 0, 0
    for c in range(len(bits)):
        if v[c] >= cut:
            s = _dot(x, cent[c])
            cand[n] = c
            score[n] = s
            if n == 0 or s > score[at]:
                at = n
            n += 1
    return n, at


@numba.njit(nogil=True, cache=True, boundscheck=False)
def home_rows(
    bits: np.ndarray,
    d: np.ndarray,
    cent: np.ndarray,
    a: float,
    b: float,
    delta: float,
    home: np.ndarray,
    best: np.ndarray,
) -> None:
    """Each row's highest float32 score with the centroids and its first cluster, from
    bfloat16 scores ``bits`` (as :func:`stats_rows` takes them): only the clusters within
    2 delta of the best are scored in float32, and the highest float32 score is among
    them."""
    m, k = bits.shape
    wide, v, cand, score = _scratch(k)
    width = 2.0 * delta + 2.0**-20
    for i in range(m):
        _, at = _scored(bits[i], d[i], cent, wide, v, a, b, width, cand, score)
        home[i] = cand[at]
        best[i] = score[at]


@numba.njit(nogil=True, cache=True, boundscheck=False)
def stats_rows(
    bits: np.ndarray,
    d: np.ndarray,
    cent: np.ndarray,
    a: float,
    b: float,
    delta: float,
    counts: np.ndarray,
    radius: np.ndarray,
) -> None:
    """:func:`dask_cosim.clustered_kernels.cluster_stats` from bfloat16 scores ``bits``
    (m, k, uint16) of rows ``d`` (m, D) with centroids ``cent`` (k, D), each within ``a +
    b |score|`` of the exact cosine: the clusters that may score within 5 delta of a row's
    best in float32 (within 7 delta of the exact best) are scored again in float32, and
    the rule of cluster_stats runs on those: ``counts[home] += 1`` (the first highest
    score), and ``radius[c]`` (float64) raised to ``arccos(s - delta)`` for each score
    ``s >= best - 5 delta``."""
    m, k = bits.shape
    wide, v, cand, score = _scratch(k)
    width = 7.0 * delta + 2.0**-20
    edge = np.float32(5.0 * delta)
    for i in range(m):
        n, at = _scored(bits[i], d[i], cent, wide, v, a, b, width, cand, score)
        counts[cand[at]] += 1
        floor = score[at] - edge
        for t in range(n):
            if score[t] >= floor:
                far = math.acos(max(np.float64(score[t]) - delta, -1.0))
                radius[cand[t]] = max(radius[cand[t]], far)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def window_rows(
    bits: np.ndarray,
    d: np.ndarray,
    cent: np.ndarray,
    a: float,
    b: float,
    delta: float,
    floor: np.ndarray,
    gram: np.ndarray,
    far: float,
    n_probe: int,
    out: np.ndarray,
) -> None:
    """Float32 scores for :func:`route_rows` from bfloat16 scores ``bits`` (as
    :func:`stats_rows` takes them): ``out[i, c]`` is the float32 score of row i with
    centroid c wherever route_rows could decide on it, else :data:`RULED_OUT`.

    Scored: the clusters within 7 delta of the best (the home among them), then those the
    bfloat16 bound cannot rule out by either rule of route_rows (with ``n_probe`` < 0
    only clusters above the home).  The test runs in float32 without branches (it
    vectorises); 2**-16 covers its rounding, a few operations on values below 8."""
    m, k = bits.shape
    wide, v, cand, score = _scratch(k)
    need = np.empty(k, dtype=np.bool_)
    width = 7.0 * delta + 2.0**-20
    ruled = np.float32(RULED_OUT)
    one_a, one_b = np.float32(a + delta + 2.0**-16), np.float32(b)
    scale = np.float32(far * (1.0 + 2.0**-18))
    add = np.float32(4.0 * delta + 2.0**-18 + 2.0**-16)
    two = np.float32(2.0 + 2.0 * delta)
    minus_two, zero = np.float32(-2.0), np.float32(0.0)
    for i in range(m):
        n, at = _scored(bits[i], d[i], cent, wide, v, a, b, width, cand, score)
        row = out[i]
        row[:] = ruled
        for t in range(n):
            row[cand[t]] = score[t]
        h, best = cand[at], score[at]
        g = gram[h]
        low = h + 1 if n_probe < 0 else 0
        for c in range(k):
            # The highest float32 score c could have, against both rules' bars.
            high = v[c] + one_a + one_b * abs(v[c])
            bar = max(floor[c], best - np.sqrt(max(minus_two * g[c] + two, zero)) * scale - add)
            need[c] = (high >= bar) & (row[c] == ruled) & (c >= low) & (c != h)
        for c in range(k):
            if need[c]:
                row[c] = _dot(d[i], cent[c])
