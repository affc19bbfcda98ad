"""The rows the fast kernels may not answer, answered by one careful rule: tensors only.

The fused kernels and the chunked torch kernel sum a.b, a.a and b.b in one pass.  Where a
row's sums leave the range in which that is exact enough (:func:`limits`: huge or tiny
magnitudes, zero vectors, NaN and inf) the kernel flags it, and :func:`careful_rows`
recomputes just those rows by :func:`scaled_cosine`, whatever kernel ran.
"""

from __future__ import annotations

import math

import torch

__all__ = ["careful_rows", "limits", "scaled_cosine"]


def limits(acc: torch.dtype) -> tuple[float, float]:
    """[lo, hi]: sums of squares in this range were computed without loss of range.

    Below lo, squares may have fallen into subnormals (losing digits) or to zero; above
    the largest finite value they overflowed.  lo leaves 26 (float32) and 114 (float64)
    bits of margin over the subnormals, so what was lost there is far below rounding.
    """
    if acc == torch.float64:
        return 2.0**-960, float(torch.finfo(torch.float64).max)
    return 2.0**-100, float(torch.finfo(torch.float32).max)


def careful_rows(
    res: torch.Tensor, redo: torch.Tensor, a: torch.Tensor, b: torch.Tensor, eps: float
) -> None:
    """Answer the rows flagged in ``redo`` by the rule, whatever their magnitudes.

    These are rows whose sums left the range where the fast kernels are exact enough:
    huge or tiny magnitudes, zero vectors, NaN and inf.  They are rare, so the second
    read of just those rows costs one pass over N flags, not over N x D values.
    """
    if not bool(redo.any()):
        return
    rows = redo.nonzero().squeeze(1)
    x = a.index_select(0, rows.to(a.device)).to(device=res.device, dtype=torch.float64)
    y = b.index_select(0, rows.to(b.device)).to(device=res.device, dtype=torch.float64)
    res.index_copy_(0, rows, scaled_cosine(x, y, eps).to(res.dtype))


def scaled_cosine(x: torch.Tensor, y: torch.Tensor, eps: float) -> torch.Tensor:
    """The cosine rule for float64 rows of any finite magnitude (D >= 1).

    Each vector is divided by its largest magnitude first, as reference BLAS ``nrm2``
    does, so every entry lies in [-1, 1] with one of magnitude 1: no sum below can
    overflow, and none can underflow enough to matter.  The eps rule is applied through
    ``a / max(|a|, eps) = (a / |a|) * min(1, |a| / eps)``, which needs no product of
    norms (that product overflows at |a| = |b| = 1e155).
    """
    sx = x.abs().amax(1)  # amax propagates NaN
    sy = y.abs().amax(1)
    finite = torch.isfinite(sx) & torch.isfinite(sy)
    zero = (sx == 0) | (sy == 0)
    ok_x = torch.where(finite & (sx > 0), sx, 1.0)
    ok_y = torch.where(finite & (sy > 0), sy, 1.0)
    xs = x / ok_x[:, None]
    ys = y / ok_y[:, None]
    nx = xs.square().sum(1).sqrt()  # in [1, sqrt(D)] unless the row is zero
    ny = ys.square().sum(1).sqrt()
    cos = (xs * ys).sum(1) / nx / ny
    if eps > 0:
        # |a| = sx * nx may overflow to inf: then it is >= eps and the factor is 1.
        cos = cos * (ok_x * nx / eps).clamp(max=1.0) * (ok_y * ny / eps).clamp(max=1.0)
    # A zero vector: 0 / eps = 0.0, or 0 / 0 = NaN when eps is 0 (the formula, as stated).
    cos = torch.where(zero, 0.0 if eps > 0 else math.nan, cos)
    cos = torch.where(finite, cos, math.nan)
    return cos.clamp(-1.0, 1.0)
