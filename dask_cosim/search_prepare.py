"""One side of an exact search, prepared once: its rows normalised
(:class:`Prepared`, by :func:`prepare` from the vectors, or by :func:`from_norms` from
the per-row numbers a prepared frame carries), the rounding :func:`margin` of its tile
scores, and the float64 re-score (:func:`rescore`) that decides every answer.

Kernels only: tensors in, tensors out, any device, no dataframes, no config.  The
reductions over tiles are in :mod:`dask_cosim.search_kernels`, which re-exports these.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np
import torch

from dask_cosim import staging
from dask_cosim._search_sweep import by_rows
from dask_cosim._search_tiles import numba_kernels

__all__ = [
    "RAW_UNIT_TOLERANCE",
    "Prepared",
    "from_norms",
    "margin",
    "prepare",
    "rescore",
    "rescore_error",
]

_U = 2.0**-24  # float32's unit roundoff
_U64 = 2.0**-53
# 16-bit rows are widened to float32 for their norms in chunks of about this many bytes.
_WIDEN_BYTES = 64 * 2**20
_NUMBA_DTYPES = (torch.float32, torch.float64)
_TINY = 2.0**-1000  # as in dask_cosim._search_numba.TINY


@dataclass
class Prepared:
    """One side of a search, normalised once.

    ``unit`` (N, D) float32 rows of length 1 (0 for invalid rows) for the tile products;
    ``raw`` the original values, and ``inv`` and ``scale``, float64, for the exact
    re-score ``(raw_i * inv_i) . (raw_j * inv_j) * scale_i * scale_j``: ``inv`` keeps
    ``raw * inv`` in float64's range (1 / max |x| up to 2**1000; on CPUs 1 for float32
    rows, whose products cannot leave it), ``scale`` = 1 / (inv * max(|x|_2, eps)) (1
    for a zero row when eps is 0: zero rows score 0.0 whatever eps is).
    ``valid`` (N,) bool marks rows that take part, ``all_valid`` whether all do; ``err``
    bounds the distance of a valid ``unit`` row from the exact ``x / max(|x|_2, eps)``
    (see :func:`margin`).  ``norm`` (N,) float64, when known: |raw * inv|_2, NaN for
    invalid rows (what a prepared frame stores; with ``inv`` it gives ``scale`` for any
    eps).  Nothing in it depends on a search: a side prepared once serves any number of
    searches (and pickles, for a dask worker to keep).
    """

    unit: torch.Tensor
    raw: torch.Tensor
    inv: torch.Tensor
    scale: torch.Tensor
    valid: torch.Tensor
    err: float = 2.0**-23
    norm: torch.Tensor | None = None
    all_valid: bool = field(init=False)

    def __post_init__(self) -> None:
        self.all_valid = bool(self.valid.all())

    def __len__(self) -> int:
        return int(self.unit.shape[0])

    @property
    def dim(self) -> int:
        return int(self.unit.shape[1])

    def to(self, device: torch.device) -> Prepared:
        """This side on ``device`` (itself when it is there already); from the host to a
        GPU through pinned staging buffers (:mod:`dask_cosim.staging`)."""
        if self.unit.device == device:
            return self
        staged = self.unit.device.type == "cpu" and device.type == "cuda"

        def move(t: torch.Tensor) -> torch.Tensor:
            # A placeholder without memory (a lean side's expanded unit rows) is not staged.
            if staged and t.is_contiguous():
                return staging.to_device([t], device)
            return t.to(device)

        return Prepared(
            move(self.unit),
            move(self.raw),
            move(self.inv),
            move(self.scale),
            move(self.valid),
            self.err,
            None if self.norm is None else move(self.norm),
        )

    def take(self, rows: torch.Tensor) -> Prepared:
        """The rows at positions ``rows`` (int64), in that order."""
        return Prepared(
            self.unit[rows],
            self.raw[rows],
            self.inv[rows],
            self.scale[rows],
            self.valid[rows],
            self.err,
            None if self.norm is None else self.norm[rows],
        )


def margin(dim: int, err_q: float = 2.0**-23, err_r: float = 2.0**-23) -> float:
    """Largest difference between a float32 tile score and the exact cosine of two rows
    of ``dim`` values whose unit rows are within ``err_q`` and ``err_r`` of exact
    (:attr:`Prepared.err`).

    |fl32(a . b) - cos| <= e_q (1 + e_r) + e_r + g_D (1 + e_q)(1 + e_r) with
    g_D = D u / (1 - D u), u = 2**-24 (Higham's bound for a dot product summed in any
    order, with or without FMA); rounded up, and never below ``(dim + 8) * 2**-24``,
    which is what it is for rows normalised in float32 (``err`` of one or two roundings);
    plus twice :func:`rescore_error`, as the decisions are on float64 scores.
    """
    g = dim * _U / (1 - dim * _U)
    bound = err_q * (1 + err_r) + err_r + g * (1 + err_q) * (1 + err_r)
    return max((dim + 8) * _U, bound * (1 + 2.0**-20)) + 2 * rescore_error(dim)


def rescore_error(dim: int) -> float:
    """e: a bound on the difference between the float64 score :func:`rescore` computes
    for a pair of rows of ``dim`` values and their exact cosine (D float64 products and
    sums of values at most 1, and three scalings).

    Every answer is decided on those scores, not on exact cosines, and :func:`rescore`
    reports a score within e of 1 (or -1) as 1 (-1): so a first pass's bound on the
    distance of its score from the exact cosine must be widened by 2e before it can say
    which pairs may reach a float64 bar (:func:`margin` is; the low-precision bounds'
    TAU, 2**-20, exceeds 2e for any D below 2**24)."""
    return (dim + 16) * _U64 * 2.0


# Rows whose norm is this close to 1 serve as unit rows without a normalised copy.
RAW_UNIT_TOLERANCE = 2.0**-20


def prepare(
    x: torch.Tensor,
    null: torch.Tensor | None = None,
    *,
    eps: float,
    device: torch.device | str | None = None,
) -> Prepared:
    """Normalise (N, D) rows once: see :class:`Prepared`.

    ``null`` (N,) bool marks null rows (their values are ignored).  Any real dtype.  On
    a CPU one pass over the rows (numba), elsewhere a few, no N x D temporary but
    ``unit`` itself.
    """
    target = torch.device(device) if device is not None else x.device
    raw = x.detach().to(target)
    if not raw.is_floating_point():
        raw = raw.to(torch.float64)
    wide = raw.dtype in (torch.float32, torch.float64)
    nulls = None if null is None else torch.as_tensor(null, device=target).to(torch.bool)
    fast = numba_kernels() if target.type == "cpu" else None
    if fast is None:
        return _prepare_torch(raw if wide else raw.to(torch.float32), raw, nulls, eps)
    n = len(raw)
    inv, nrm, scale = (torch.empty(n, dtype=torch.float64) for _ in range(3))
    valid = torch.empty(n, dtype=torch.bool)
    no_null = np.zeros(n, dtype=np.bool_) if nulls is None else nulls.numpy()
    if wide:
        work = raw.contiguous()
        arrays = (inv.numpy(), nrm.numpy(), scale.numpy(), valid.numpy())
        worst = fast.norms(work.numpy(), no_null, float(eps), *arrays)
        return _with_units(fast, work, raw, inv, nrm, scale, valid, worst)
    # 16-bit rows are widened to float32 a chunk at a time: only the unit rows are ever
    # held in float32 (a whole widened copy beside them doubled the float16 partition's
    # peak: 500,000 x 384 rows, 1.9 GB over the input's 0.37).
    worst = 0.0
    for a, b, chunk in _widened(raw):
        arrays = (inv[a:b].numpy(), nrm[a:b].numpy(), scale[a:b].numpy(), valid[a:b].numpy())
        worst = max(worst, fast.norms(chunk, no_null[a:b], float(eps), *arrays))
    if worst <= RAW_UNIT_TOLERANCE:
        return _with_units(fast, raw.to(torch.float32), raw, inv, nrm, scale, valid, worst)
    unit = torch.empty(raw.shape, dtype=torch.float32)
    for a, b, chunk in _widened(raw):
        fast.units(chunk, inv[a:b].numpy(), scale[a:b].numpy(), valid[a:b].numpy(),
                   unit[a:b].numpy())  # fmt: skip
    return Prepared(unit, raw, inv, scale, valid, _U + _rounding(raw.shape[1]), nrm)


def _widened(raw: torch.Tensor) -> Iterator[tuple[int, int, np.ndarray]]:
    """(start, stop, rows start:stop of ``raw`` as a C-contiguous float32 array) in
    chunks of about _WIDEN_BYTES."""
    n = len(raw)
    step = max(1, _WIDEN_BYTES // max(1, 4 * raw.shape[1]))
    for a in range(0, n, step):
        b = min(n, a + step)
        yield a, b, raw[a:b].to(torch.float32).contiguous().numpy()


def _rounding(dim: int) -> float:
    """The float64 norms' own error: within (D + 2) 2**-53 of exact (with margin)."""
    return (dim + 9) * 2.0**-53


def largest_err(dim: int) -> float:
    """The largest :attr:`Prepared.err` of rows of ``dim`` values, whatever rows share
    the side: that of rows serving as their own unit rows, up to RAW_UNIT_TOLERANCE from
    norm 1 (a normalised copy's, ``_U`` plus the norm's rounding, and the torch path's,
    ``2 _U`` plus it, are smaller).  For bounds that must not depend on which rows were
    prepared together (:func:`~dask_cosim.clustered_kernels.directions`)."""
    return RAW_UNIT_TOLERANCE * (1 + 2.0**-40) + 2 * _rounding(dim)


def _with_units(
    fast: ModuleType,
    work: torch.Tensor,
    raw: torch.Tensor,
    inv: torch.Tensor,
    nrm: torch.Tensor,
    scale: torch.Tensor,
    valid: torch.Tensor,
    worst: float,
) -> Prepared:
    """The side, its rows serving as unit rows when all are within RAW_UNIT_TOLERANCE of
    norm 1 (``worst``), else a normalised float32 copy."""
    rounding = _rounding(work.shape[1])
    if worst <= RAW_UNIT_TOLERANCE:
        # Rows already of norm 1 (as most embedding models write them) serve as they
        # are: no copy, and margin() takes their distance from norm 1 into account.  So
        # do zero rows (exactly) and rows that never match (every scan skips them).
        err = worst * (1 + 2.0**-40) + 2 * rounding
        return Prepared(work, raw, inv, scale, valid, err, nrm)
    unit = torch.empty(work.shape, dtype=torch.float32)
    fast.units(work.numpy(), inv.numpy(), scale.numpy(), valid.numpy(), unit.numpy())
    # One float32 rounding of each value of a row scaled in float64.
    return Prepared(unit, raw, inv, scale, valid, _U + rounding, nrm)


def from_norms(
    x: torch.Tensor,
    null: torch.Tensor | None,
    inv: torch.Tensor,
    norm: torch.Tensor,
    unit: torch.Tensor | None,
    *,
    eps: float,
) -> Prepared | None:
    """The side of float32 or float64 rows ``x`` on the CPU from the numbers
    :func:`prepare` found (``inv``, ``norm``: :attr:`Prepared.norm`), without reading
    ``x``: ``scale`` for this ``eps``, ``x`` itself as unit rows when within tolerance,
    else ``unit`` (the rows over their norms, float32; None: not stored).

    None when the numbers cannot stand for a prepared side: numba missing, or a valid
    row with 0 < |x| < eps (its unit row depends on eps: stored ones are over |x|).
    """
    fast = numba_kernels()
    if fast is None or x.dtype not in _NUMBA_DTYPES or x.device.type != "cpu":
        return None
    n = len(x)
    scale = torch.empty(n, dtype=torch.float64)
    valid = torch.empty(n, dtype=torch.bool)
    nulls = np.zeros(n, dtype=np.bool_) if null is None else torch.as_tensor(null).numpy()
    inv, norm = inv.contiguous(), norm.contiguous()
    worst, tiny = fast.from_norms(
        inv.numpy(), norm.numpy(), nulls, float(eps), scale.numpy(), valid.numpy()
    )
    if tiny:
        return None
    if x.dtype == torch.float32 and worst <= RAW_UNIT_TOLERANCE and x.is_contiguous():
        return _with_units(fast, x, x, inv, norm, scale, valid, worst)
    if unit is None:
        return _with_units(fast, x.contiguous(), x, inv, norm, scale, valid, math.inf)
    return Prepared(unit, x, inv, scale, valid, _U + (x.shape[1] + 9) * 2.0**-53, norm)


def _prepare_torch(
    work: torch.Tensor, raw: torch.Tensor, null: torch.Tensor | None, eps: float
) -> Prepared:
    target = work.device
    n, d = work.shape
    f64 = torch.float64
    if n and d:
        # NaN propagates through max/min; inf stays inf: one test for both.
        m = torch.maximum(work.amax(dim=1), -work.amin(dim=1)).to(f64)
    else:
        m = torch.zeros(n, dtype=f64, device=target)
    valid = torch.isfinite(m)
    if null is not None:
        valid &= ~null
    # Zero and invalid rows: any finite positive scale keeps their products at 0.
    m = torch.where(valid & (m > 0), m, torch.ones_like(m))
    # Norms in float64: exact enough for the re-score, and float32 values can neither
    # overflow nor underflow there.
    norm = torch.linalg.vector_norm(work, dim=1, dtype=f64) if d else torch.zeros_like(m)
    # A zero row with eps = 0 gets 1 / 1 (its unit row is zero whatever its scale).
    bar = torch.clamp(norm, min=eps)
    scale = m / torch.where(bar > 0, bar, torch.ones_like(bar))
    unit = torch.mul(work, (scale / m).to(work.dtype)[:, None]).to(torch.float32)
    # 1 / m overflows below ~5.6e-309: a capped factor keeps such rows near 2**-74.
    inv = torch.where(m > _TINY, 1.0 / m, torch.full_like(m, 1.0 / _TINY))
    nrm = norm * inv
    if work.dtype == f64:
        # float64 squares overflow past ~1e154 and lose precision below ~1e-154: those
        # rows again, divided by their largest value first.
        redo = valid & ((m > 1e150) | (m < 1e-150))
        if bool(redo.any()):
            rows = redo.nonzero().squeeze(1)
            y = work[rows] * inv[rows, None]
            ny = torch.linalg.vector_norm(y, dim=1)
            scale[rows] = 1.0 / torch.maximum(ny, inv[rows] * eps)
            unit[rows] = (y * scale[rows, None]).to(torch.float32)
            nrm[rows] = ny
    nrm = torch.where(valid, nrm, torch.full_like(nrm, math.nan))
    if not bool(valid.all()):
        unit[~valid] = 0.0
        scale = torch.where(valid, scale, torch.zeros_like(scale))
    # Two float32 roundings (the row's factor, the product), and the float64 norm's.
    err = 2 * _U + (d + 9) * 2.0**-53
    return Prepared(unit.contiguous(), raw, inv, scale, valid, err, nrm)


def _numba_rows(
    p: Prepared, rows: torch.Tensor
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(values, positions of ``rows`` in them, inv, scale): what the numba re-score reads
    for the rows ``rows`` of ``p``.  16-bit rows are widened to float32 (exactly), only
    those asked for: a pair must score the same whatever dtype holds its values, as two
    partitions of one column can differ (Arrow float16 rows come as float32 beside a
    null row), and the tie rule compares scores from different partitions."""
    if p.raw.dtype in _NUMBA_DTYPES:
        return p.raw.contiguous().numpy(), rows.numpy(), p.inv.numpy(), p.scale.numpy()
    used, at = torch.unique(rows, return_inverse=True)
    wide = p.raw[used].to(torch.float32)
    return wide.numpy(), at.numpy(), p.inv[used].numpy(), p.scale[used].numpy()


def _numba_rescore(
    fast: ModuleType, q: Prepared, i: torch.Tensor, r: Prepared, j: torch.Tensor, out: torch.Tensor
) -> None:
    """out[t] = the float64 score of (q[i[t]], r[j[t]]) by the numba kernel, unclamped."""
    xq, qi, inv_q, scale_q = _numba_rows(q, i)
    xr, ri, inv_r, scale_r = _numba_rows(r, j)
    o = out.numpy()
    by_rows(len(o), len(o) * q.dim, lambda a, b: fast.rescore(
        xq, inv_q, scale_q, qi[a:b], xr, inv_r, scale_r, ri[a:b], o[a:b],
    ))  # fmt: skip


def rescore(
    q: Prepared, i: torch.Tensor, r: Prepared, j: torch.Tensor, *, chunk: int = 65536
) -> torch.Tensor:
    """float64 cos(q[i[t]], r[j[t]]) for each t, clamped to [-1, 1], and a score within
    :func:`rescore_error` of 1 (or -1) reported as exactly 1 (-1): parallel rows
    (duplicates, scaled copies, rows of one value) score 1 whatever the rounding of
    their products, so that ``threshold=1.0`` finds them and their ties go by frame
    order."""
    out = torch.empty(len(i), dtype=torch.float64, device=q.unit.device)
    fast = numba_kernels() if out.device.type == "cpu" else None
    if fast is not None:
        for s in range(0, len(i), chunk):
            _numba_rescore(fast, q, i[s : s + chunk], r, j[s : s + chunk], out[s : s + chunk])
    else:
        for s in range(0, len(i), chunk):
            ii, jj = i[s : s + chunk], j[s : s + chunk]
            a = q.raw[ii].to(torch.float64) * q.inv[ii, None]
            b = r.raw[jj].to(torch.float64) * r.inv[jj, None]
            # One product of the two scales, as the numba kernel: cos(a, b) = cos(b, a).
            out[s : s + chunk] = (a * b).sum(dim=1) * (q.scale[ii] * r.scale[jj])
    near = 1.0 - rescore_error(q.dim)
    out.clamp_(-1.0, 1.0)
    out.masked_fill_(out >= near, 1.0)
    return out.masked_fill_(out <= -near, -1.0)
