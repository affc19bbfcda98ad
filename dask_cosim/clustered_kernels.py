"""Kernels of the clustered search: torch, any device, no dataframes, no config (on CPUs
the routing rule runs as one numba pass, :mod:`dask_cosim._clustered_numba`).

The bounds of the skip rule (:func:`cluster_stats`, :func:`floors`), each row's home
cluster and the clusters it probes (:func:`route`); the centroids come from
:mod:`dask_cosim.clustered_kmeans`, the search inside a block is
:mod:`dask_cosim.clustered_blocks`.

The skip rule.  Let ``x`` be the direction of a row, ``z_c`` the direction of cluster
c's centroid, ``angle(*, *)`` the angle between directions and ``R_c`` an upper bound of
``angle(y, z_c)`` over the rows y routed to c.  A pair scoring ``cos >= t > 0`` has
``angle(x, y) <= alpha = arccos(t)`` (a row shorter than ``eps`` only scores lower than its
direction does), so by the triangle inequality on the sphere
``angle(x, z_c) <= angle(x, y) + angle(y, z_c) <= alpha + R_c``: a cluster with
``angle(x, z_c) > alpha + R_c`` holds no match of x and is skipped.

Rounding, derived rather than guessed (u = 2**-24, float32's unit roundoff):

- a direction row ``d`` is within ``e_d`` of ``x`` (:func:`directions`): ``4 err + 2**-30``
  for a unit row whose length is within ``2 err + 2**-30`` of 1 (``err`` as
  :class:`~dask_cosim.search_kernels.Prepared` states it), else ``2u`` for a row
  divided by its float64 norm (rows shorter than ``eps``);
- a centroid ``m`` is the float64 normalisation of its rows' sum (within ``(D + 4)
  2**-53`` of the unit vector ``z``, its direction) rounded to float32: within ``c_u = u +
  2 (D + 4) 2**-53`` of ``z`` (:func:`dask_cosim.clustered_kmeans.unit_rows`; torch's
  float32 normalisation left centroids up to 2u from unit length);
- a float32 product of D terms is within ``gamma_D = D*u' / (1 - D*u')`` of the exact sum of
  products of its inputs (any summation order, fused multiply-adds included), where u' is
  the unit roundoff of the product's inputs: u for IEEE float32, 2**-11 for TF32 and
  2**-8 for bfloat16 (as torch is set: :func:`~dask_cosim.search_precision.float32_matmul`);

so a computed score ``s`` is within ``delta = gamma_D (1 + e_d)(1 + c_u) + e_d (1 + c_u) + c_u``
of ``cos(x, z)`` (:func:`product_error`).  Bounds then use ``arccos(s + delta) <= angle <=
arccos(s - delta)``, float64 arccos (an ulp or two, covered by ``ANGLE_SLACK``), and
``alpha`` is at ``t - 2*eps64``, where ``eps64``
(:func:`~dask_cosim.search_prepare.rescore_error`) bounds how far the float64 re-score
that decides a pair lies from the exact score (a score within it of 1 counts as 1).  No
summation order is assumed equal between two computations: a row counts towards the
radius of every cluster whose score is within ``4delta`` of its best one, so whichever of
them a later pass picks as its home (the scores differ by at most ``2delta``), the radius
covers it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from dask_cosim import search_kernels as sk
from dask_cosim import search_precision as sp
from dask_cosim._search_sweep import by_rows

__all__ = [
    "ANGLE_SLACK",
    "bfloat16_scores",
    "chord",
    "cluster_stats",
    "directions",
    "floors",
    "matmul_inputs",
    "nearest",
    "product_error",
    "route",
    "use_bfloat16",
]

U32 = 2.0**-24
U64 = 2.0**-53
# Float64 arccos and the sums of angles (all below 2pi) are within a few ulps of 8: 2**-46
# is 64 such ulps.
ANGLE_SLACK = 2.0**-46


_INPUT_ROUNDOFF = {"ieee": U32, "tf32": 2.0**-11, "bf16": 2.0**-8}


def matmul_inputs() -> str:
    """What torch's float32 products may round their inputs to as it is set now ("ieee",
    "tf32" or "bf16"): the plan's products and the workers' may run on different devices,
    so the setting that rounds most on either counts (both derive the same delta)."""
    kinds = (sp.float32_matmul(device) for device in ("cpu", "cuda"))
    return max(kinds, key=sp.FLOAT32_MATMUL.index)


def product_error(dim: int, err: float = 8.0 * U32) -> float:
    """delta: the largest difference between a computed float32 score of a direction row
    (within ``err`` of its exact direction: :func:`directions`) and a centroid, and the
    cosine of their exact directions (module docstring)."""
    u_in = _INPUT_ROUNDOFF[matmul_inputs()]
    n_u = dim * u_in
    if n_u >= 0.5:
        raise ValueError(f"vectors of {dim} values are too long for float32 bounds")
    gamma = n_u / (1.0 - n_u)
    c_u = U32 + 2.0 * (dim + 4) * U64  # the centroid's distance from its direction
    bound = gamma * (1.0 + err) * (1.0 + c_u) + err * (1.0 + c_u) + c_u
    return bound * (1.0 + 2.0**-40)


def directions(prep: sk.Prepared) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Float32 directions of prepared rows, which rows have one, and how far (at most)
    a direction lies from the exact one.

    A valid row's unit row serves when its length is within ``2 err + 2**-30`` of 1
    (``err``: :attr:`~dask_cosim.search_kernels.Prepared.err`); the others (rows shorter
    than ``eps``, whose unit rows are shorter than 1) are their float64 values over
    their float64 norm.  Zero rows and invalid rows have none; with a threshold above 0
    they match nothing.

    The distance returned is that of any rows of this D (:func:`~dask_cosim.
    search_kernels.largest_err`), not of these rows' ``err``, which is larger where
    every row serves as its own unit row: a partition's rows routed in pieces must have
    the delta its radii were computed with, whichever rows each piece holds (a piece of
    rows of norm 1 cut from a partition with one row that is not failed the route).
    """
    d, has = prep.unit, prep.valid.clone()
    length = _lengths(prep.unit)
    tol = 2.0 * prep.err + 2.0**-30
    short = (has & ((length - 1.0).abs() > tol)).nonzero().squeeze(1)
    if len(short):
        rows = prep.raw[short].to(torch.float64) * prep.inv[short, None]
        norm = torch.linalg.vector_norm(rows, dim=1, keepdim=True)
        d = d.clone()
        d[short] = (rows / norm.clamp(min=1e-300)).to(torch.float32)
        has[short] = norm[:, 0] > 0
    err = max(prep.err, sk.largest_err(prep.dim))
    return d, has, max(4.0 * err + 2.0**-30, 2.0 * U32)


def _chunk_rows(k: int, chunk_bytes: int) -> int:
    return max(1, chunk_bytes // max(1, 8 * k))


def nearest(
    x: torch.Tensor, centroids: torch.Tensor, chunk_bytes: int, bfloat16: bool | None = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's highest float32 score with the centroids, and its (first) cluster;
    ``bfloat16`` as :func:`cluster_stats` takes it (the float32 scores then only of the
    clusters within 2 delta of the best, for rows within 8u of their directions)."""
    fast = _clustered_fast() if use_bfloat16(bfloat16, x) else None
    score = torch.empty(len(x), dtype=torch.float32, device=x.device)
    home = torch.empty(len(x), dtype=torch.int64, device=x.device)
    step = _chunk_rows(len(centroids), chunk_bytes)
    if fast is not None:
        exact, delta = centroids.contiguous().numpy(), product_error(x.shape[1])
        for r0, rows, bits, a, b in _bfloat16_chunks(x, centroids, delta, step):
            h, top = home[r0 : r0 + len(rows)].numpy(), score[r0 : r0 + len(rows)].numpy()

            def block(p: int, q: int, rows: np.ndarray = rows, bits: np.ndarray = bits,
                      a: float = a, b: float = b, h: np.ndarray = h,
                      top: np.ndarray = top) -> None:  # fmt: skip
                fast.home_rows(bits[p:q], rows[p:q], exact, a, b, delta, h[p:q], top[p:q])

            by_rows(len(rows), rows.size * 8, block)
        return score, home
    for r0 in range(0, len(x), step):
        s = x[r0 : r0 + step] @ centroids.T
        torch.max(s, dim=1, out=(score[r0 : r0 + step], home[r0 : r0 + step]))
    return score, home


def cluster_stats(
    d: torch.Tensor,
    centroids: torch.Tensor,
    delta: float,
    chunk_bytes: int,
    bfloat16: bool | None = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per cluster: how many rows of ``d`` are closest to it, and an upper bound (float64
    radians, -inf when none) of the angle to its centroid of every row that a later pass
    could make its member (scores within 4delta of the row's best; module docstring).
    ``bfloat16`` (CPU, numba; None: where the CPU multiplies bfloat16 natively): from a
    bfloat16 product and the float32 scores of the clusters its bound cannot rule out
    (:func:`bfloat16_scores`), the same rule."""
    k = len(centroids)
    fast = _clustered_fast() if use_bfloat16(bfloat16, d) else None
    if fast is not None:
        return _stats_bfloat16(fast, d, centroids, delta, chunk_bytes)
    counts = torch.zeros(k, dtype=torch.int64, device=d.device)
    radius = torch.full((k,), -math.inf, dtype=torch.float64, device=d.device)
    step = _chunk_rows(k, chunk_bytes)
    for r0 in range(0, len(d), step):
        s = d[r0 : r0 + step] @ centroids.T
        best, home = s.max(dim=1)
        counts += torch.bincount(home, minlength=k)
        # 5delta in float32 covers 4delta and the rounding of the subtraction.
        rows, cols = (s >= (best - 5.0 * delta)[:, None]).nonzero(as_tuple=True)
        far = torch.acos((s[rows, cols].to(torch.float64) - delta).clamp_(min=-1.0))
        radius.scatter_reduce_(0, cols, far, reduce="amax")
    return counts, radius


def _low(threshold: float, dim: int) -> float:
    """The threshold less twice the re-score's error: a pair reported has exact cos above
    it (its float64 score is at least the threshold, or within the error of 1)."""
    return threshold - 2.0 * sk.rescore_error(dim)


def floors(radius: torch.Tensor, threshold: float, dim: int, delta: float) -> torch.Tensor:
    """Per cluster, the lowest float32 score with its centroid at which a row may still
    have a match in it (the radius rule in cosines, no arccos per row):
    ``angle(x, z) >= arccos(s + delta)``, so ``arccos(s + delta) <= R + alpha`` is
    ``s >= cos(R + alpha) - delta``, rounded down to a float32 (+inf for empty clusters, -inf
    when ``R + alpha`` reaches pi)."""
    low = _low(threshold, dim)
    alpha = math.acos(low) if low > 0 else math.pi  # at or below 0 short rows break the rule
    reach = (radius.to(torch.float64) + alpha + ANGLE_SLACK).clamp(max=math.pi)
    floor = torch.cos(reach) - delta - ANGLE_SLACK
    floor = torch.where(reach >= math.pi, -math.inf, floor)
    floor = torch.where(torch.isneginf(radius), math.inf, floor)
    f32 = floor.to(torch.float32)
    return torch.where(f32.to(torch.float64) > floor, torch.nextafter(f32, f32 - 1), f32)


def chord(threshold: float, dim: int) -> float:
    """The longest distance ``|x - y| = sqrt(2 - 2 cos)`` between the directions of a
    pair scoring at least ``threshold``, rounded up."""
    low = _low(threshold, dim)
    return math.sqrt(2.0 - 2.0 * low) * (1.0 + 2.0**-40) if low > 0 else 2.0


def route(
    d: torch.Tensor,
    centroids: torch.Tensor,
    floor: torch.Tensor,
    threshold: float,
    delta: float,
    n_probe: int | None,
    chunk_bytes: int,
    bfloat16: bool | None = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's home (its most similar centroid), and the (row, cluster) probes.

    A row x probes a cluster b other than its home a only when neither rule rules b out:

    - the radius rule: ``s_b >= floor_b`` (:func:`floors`);
    - the bisector rule: a row y of b is at least as close to z_b as to z_a (its scores,
      within delta each, say so), so it lies beyond the bisector of z_a and z_b, at distance
      at least ``(x*z_a - x*z_b) / |z_a - z_b|`` from x: ``s_a - s_b - 4delta > chord *
      |z_a - z_b|`` (the norm bounded above from the centroids' own scores) proves that
      no y of b is within ``chord`` of x.  Computed in float32, with 2**-18 for the
      rounding of its half-dozen operations on values below 4.

    ``n_probe`` None (exact): every such cluster numbered above the home (a pair across
    clusters a < b is then probed from a: both rules hold both ways, so probing from both
    sides would find it twice).  An int: at most the ``n_probe`` such clusters whose
    bisector with the home is nearest to the row (where a match across the boundary is
    likeliest), on both sides: faster; a pair is missed when neither row probed the
    other's cluster, which the recall measures.  0: no probes (each row meets its own
    cluster's rows only, as NeMo Curator's semantic dedup compares them).
    """
    k = len(centroids)
    far = chord(threshold, centroids.shape[1])
    fast = _clustered_fast() if d.device.type == "cpu" else None
    if fast is not None:
        low = use_bfloat16(bfloat16, d)
        return _route_numba(fast, d, centroids, floor, far, delta, n_probe, chunk_bytes, low)
    home = torch.empty(len(d), dtype=torch.int64, device=d.device)
    rows_out, clusters_out = [], []
    step = _chunk_rows(k, chunk_bytes)
    ids = torch.arange(k, device=d.device)
    for r0 in range(0, len(d), step):
        s = d[r0 : r0 + step] @ centroids.T
        h = s.argmax(dim=1)
        home[r0 : r0 + len(s)] = h
        cand = s >= floor[None, :]
        homes, which = torch.unique(h, return_inverse=True)
        gram = (centroids[homes] @ centroids.T)[which]
        norm = gram.mul_(-2.0).add_(2.0 + 2.0 * delta).clamp_(min=0.0).sqrt_()
        gap = s.gather(1, h[:, None]) - s
        # The distance from the row to the bisector with b, for ranking the probes.
        near = gap / norm.clamp(min=1e-6) if n_probe is not None and n_probe < k else None
        bar = norm.mul_(far * (1.0 + 2.0**-18)).add_(4.0 * delta + 2.0**-18)
        cand &= gap <= bar
        if n_probe is None:
            cand &= ids[None, :] > h[:, None]
        else:
            cand[torch.arange(len(s), device=d.device), h] = False
            if near is not None:
                keep = torch.topk(near.masked_fill_(~cand, math.inf), n_probe, largest=False)
                cand &= torch.zeros_like(cand).scatter_(1, keep.indices, True)
        r, c = cand.nonzero(as_tuple=True)
        rows_out.append(r + r0)
        clusters_out.append(c)
    empty = torch.zeros(0, dtype=torch.int64, device=d.device)
    rows = torch.cat(rows_out) if rows_out else empty
    return home, rows, torch.cat(clusters_out) if clusters_out else empty


def use_bfloat16(bfloat16: bool | None, d: torch.Tensor) -> bool:
    """Whether to score ``d`` against the centroids in bfloat16 first (``bfloat16``:
    None where the CPU multiplies bfloat16 natively)."""
    wanted = sk.cpu_bfloat16() if bfloat16 is None else bfloat16
    return wanted and d.device.type == "cpu" and sk.numba_kernels() is not None


def _clustered_fast() -> Any:
    """:mod:`dask_cosim._clustered_numba`, or None where numba does not import (the torch
    path decides the same)."""
    return sk.numba_kernels("_clustered_numba")


def bfloat16_scores(
    x: torch.Tensor, cent: tuple[torch.Tensor, float], delta: float
) -> tuple[np.ndarray, float, float]:
    """The bfloat16 product of CPU rows ``x`` with the centroids' bfloat16 copy and its
    distance ``cent`` (:func:`~dask_cosim.search_kernels.bfloat16_rows`), as uint16 bits
    (m, k), and (a, b): each score ``s`` is within ``a + b |s|`` of the cosine of the
    exact directions (:func:`dask_cosim.search_kernels.bfloat16_bound`, with the rows' and
    centroids' own distances from their directions bounded by ``delta``).  Where a CPU
    multiplies bfloat16 natively this product costs about 1/2.6 of the float32 one."""
    xb, err_x = sk.bfloat16_rows(x)
    a, b = sk.bfloat16_bound(x.shape[1], err_x + delta, cent[1] + delta)
    bits = torch.mm(xb, cent[0].T).view(torch.int16).numpy().view(np.uint16)
    return bits, a, b


def _bfloat16_chunks(
    d: torch.Tensor, centroids: torch.Tensor, delta: float, step: int
) -> Iterator[tuple[int, np.ndarray, np.ndarray, float, float]]:
    """Per chunk of ``step`` CPU rows of ``d``: where it starts, its rows (numpy) and their
    scores with the centroids as :func:`bfloat16_scores` gives them (bits, a, b); the
    centroids' bfloat16 copy made once."""
    cent = sk.bfloat16_rows(centroids)
    for r0 in range(0, len(d), step):
        x = d[r0 : r0 + step].contiguous()
        bits, a, b = bfloat16_scores(x, cent, delta)
        yield r0, x.numpy(), bits, a, b


def _stats_bfloat16(
    fast: Any, d: torch.Tensor, centroids: torch.Tensor, delta: float, chunk_bytes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    k = len(centroids)
    exact = centroids.contiguous().numpy()
    counts = np.zeros(k, dtype=np.int64)
    radius = np.full(k, -math.inf)
    for _, rows, bits, a, b in _bfloat16_chunks(d, centroids, delta, _chunk_rows(k, chunk_bytes)):

        def part(p: int, q: int, bits: np.ndarray = bits, rows: np.ndarray = rows,
                 a: float = a, b: float = b) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
            n, r = np.zeros(k, dtype=np.int64), np.full(k, -math.inf)
            fast.stats_rows(bits[p:q], rows[p:q], exact, a, b, delta, n, r)
            return n, r

        for n, r in by_rows(len(rows), rows.size * 8, part):
            counts += n
            np.maximum(radius, r, out=radius)
    return torch.from_numpy(counts), torch.from_numpy(radius)


def _lengths(unit: torch.Tensor) -> torch.Tensor:
    """The float64 lengths of float32 rows: on CPUs the one-pass numba norms of the
    search (torch's float64 norm first widens every value)."""
    fast = sk.numba_kernels() if unit.device.type == "cpu" and unit.dtype == torch.float32 else None
    if fast is None:
        return torch.linalg.vector_norm(unit, dim=1, dtype=torch.float64)
    x = unit.contiguous().numpy()
    n = len(x)
    out, inv, scale = np.empty(n), np.empty(n), np.empty(n)
    null, valid = np.zeros(n, dtype=bool), np.empty(n, dtype=bool)
    by_rows(n, x.size, lambda a, b: fast.norms(
        x[a:b], null[a:b], 1.0, inv[a:b], out[a:b], scale[a:b], valid[a:b]
    ))  # fmt: skip
    # Unit rows are finite (an invalid row's is zero): every length is a number.
    return torch.from_numpy(out)


def _route_numba(
    fast: Any,
    d: torch.Tensor,
    centroids: torch.Tensor,
    floor: torch.Tensor,
    far: float,
    delta: float,
    n_probe: int | None,
    chunk_bytes: int,
    bfloat16: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`route` on CPUs: torch's product per chunk of rows, then the rule in one
    numba pass over each row's scores, the rows split among the threads.  ``bfloat16``:
    the scores from :func:`bfloat16_scores`, the float32 ones only where the rule could
    use them (``_clustered_numba.window_rows``)."""
    kernel = fast.route_rows
    k = len(centroids)
    probe = -1 if n_probe is None else min(n_probe, k)
    cap = k if probe < 0 else max(probe, 1)
    gram = (centroids @ centroids.T).numpy()
    bars = floor.to(torch.float32).contiguous().numpy()
    home = np.empty(len(d), dtype=np.int64)
    rows_out, clusters_out = [], []
    step = _chunk_rows(k, chunk_bytes)
    scores = _route_scores(fast, d, centroids, step, bfloat16, bars, gram, far, delta, probe)
    for r0, s in scores:
        m, at = len(s), home[r0 : r0 + step]
        probes = np.empty((m, cap), dtype=np.int32)
        counts = np.empty(m, dtype=np.int64)

        def rows_of(
            a: int, b: int, s: np.ndarray = s, at: np.ndarray = at,
            p: np.ndarray = probes, c: np.ndarray = counts,
        ) -> None:  # fmt: skip
            kernel(s[a:b], bars, gram, far, delta, probe, at[a:b], p[a:b], c[a:b])

        by_rows(m, m * k * d.shape[1], rows_of)
        rows_out.append(np.repeat(np.arange(r0, r0 + m, dtype=np.int64), counts))
        clusters_out.append(probes[np.arange(cap) < counts[:, None]].astype(np.int64))
    rows = np.concatenate(rows_out) if rows_out else np.zeros(0, np.int64)
    clusters = np.concatenate(clusters_out) if clusters_out else np.zeros(0, np.int64)
    return torch.from_numpy(home), torch.from_numpy(rows), torch.from_numpy(clusters)


def _route_scores(
    fast: Any, d: torch.Tensor, centroids: torch.Tensor, step: int, bfloat16: bool,
    bars: np.ndarray, gram: np.ndarray, far: float, delta: float, probe: int,
) -> Iterator[tuple[int, np.ndarray]]:  # fmt: skip
    """Per chunk of ``step`` rows: where it starts, and the float32 scores route_rows
    decides on: torch's product, or with ``bfloat16`` those ``window_rows`` finds."""
    if not bfloat16:
        for r0 in range(0, len(d), step):
            yield r0, (d[r0 : r0 + step] @ centroids.T).numpy()
        return
    exact = centroids.contiguous().numpy()
    for r0, rows, bits, a, b in _bfloat16_chunks(d, centroids, delta, step):
        out = np.empty(bits.shape, dtype=np.float32)

        def block(p: int, q: int, rows: np.ndarray = rows, bits: np.ndarray = bits,
                  a: float = a, b: float = b, out: np.ndarray = out) -> None:  # fmt: skip
            fast.window_rows(
                bits[p:q], rows[p:q], exact, a, b, delta, bars, gram, far, probe, out[p:q]
            )

        by_rows(len(rows), rows.size * 8, block)
        yield r0, out
