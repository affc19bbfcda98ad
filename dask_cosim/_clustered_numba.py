"""The routing rule of the clustered search on CPUs, in one pass over each row's scores
(numba): torch needs about twenty passes over the rows x clusters matrix for the same
decisions (:func:`dask_cosim.clustered_kernels.route`, which states the rule and its
bounds, and calls this on CPUs).

Imported on the first CPU routing only (importing numba takes time a client that never
computes need not pay).  Every quantity of the rule is computed in float32 with the
operations, and in the order, that the torch path uses, so both make the same decisions
on the same scores.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["route_rows"]


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
