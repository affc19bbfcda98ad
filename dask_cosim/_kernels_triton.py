"""The fused CUDA kernel (Triton): one read of each row, three sums in registers.

Triton ships with the CUDA builds of torch, so GPU users need nothing more.  Imported by
:mod:`dask_cosim.kernels` on the first CUDA call only.  With ``TRITON_INTERPRET=1`` set
before this module is imported, the same kernel runs on CPU tensors in Triton's
interpreter: that is how it is tested on machines without a GPU.  Numerics (which rows the
fast path may answer, and the rule for the others) are decided in ``kernels``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["rows_cosine"]


@triton.jit
def _rows(
    a_ptr,
    b_ptr,
    limits_ptr,
    out_ptr,
    redo_ptr,
    n,
    d,
    stride_a,
    stride_b,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ACC64: tl.constexpr,
    ALIGN: tl.constexpr,
):
    # One program per BLOCK_R rows; each row is read once, BLOCK_D columns at a time.
    acc = tl.float64 if ACC64 else tl.float32
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < n
    # N x D may pass 2**31 elements.  Every row starts ALIGN elements apart: said so,
    # Triton loads 16 bytes at a time even where D (say 300) is not a multiple of 16.
    offs_a = tl.multiple_of(rows.to(tl.int64) * stride_a, ALIGN)
    offs_b = tl.multiple_of(rows.to(tl.int64) * stride_b, ALIGN)
    dot = tl.zeros([BLOCK_R], dtype=acc)
    aa = tl.zeros([BLOCK_R], dtype=acc)
    bb = tl.zeros([BLOCK_R], dtype=acc)
    for start in range(0, d, BLOCK_D):
        cols = start + tl.arange(0, BLOCK_D)
        mask = row_ok[:, None] & (cols[None, :] < d)
        x = tl.load(a_ptr + offs_a[:, None] + cols[None, :], mask=mask, other=0.0).to(acc)
        y = tl.load(b_ptr + offs_b[:, None] + cols[None, :], mask=mask, other=0.0).to(acc)
        dot += tl.sum(x * y, axis=1)
        aa += tl.sum(x * x, axis=1)
        bb += tl.sum(y * y, axis=1)
    # eps, lo, hi in the accumulation dtype: as scalar arguments Triton would pass them as
    # float32, and float64's hi (1.8e308) does not fit.
    eps = tl.load(limits_ptr)
    lo = tl.load(limits_ptr + 1)
    hi = tl.load(limits_ptr + 2)
    # NaN fails every comparison, so non-finite rows go to the careful path too.
    fast = (aa >= lo) & (aa <= hi) & (bb >= lo) & (bb <= hi) & (tl.abs(dot) <= hi)
    res = dot / tl.maximum(tl.sqrt(aa), eps) / tl.maximum(tl.sqrt(bb), eps)
    res = tl.minimum(tl.maximum(res, -1.0), 1.0)
    tl.store(out_ptr + rows, res.to(out_ptr.dtype.element_ty), mask=row_ok)
    tl.store(redo_ptr + rows, (fast == 0).to(tl.int8), mask=row_ok)


def rows_cosine(
    a: torch.Tensor,
    b: torch.Tensor,
    acc: torch.dtype,
    eps: float,
    lo: float,
    hi: float,
    out: torch.Tensor,
    redo: torch.Tensor,
) -> None:
    """out[i] = cos(a[i], b[i]) where the row's sums are in [lo, hi]; else redo[i] = 1.

    ``a`` and ``b``: (N, D) on one device with unit column stride, float16, bfloat16,
    float32 or float64; ``acc``: float32 or float64; ``out``: (N,) in ``acc``;
    ``redo``: (N,) int8.  Rows flagged in ``redo`` hold an unspecified value.
    """
    n, d = a.shape
    # 128 columns x 16 rows: 8 KiB of float32 per input per step, a row's loads
    # coalesced along D.  Narrower for short vectors, so masked lanes stay few.
    block_d = min(128, triton.next_power_of_2(max(d, 16)))
    block_r = max(1, 2048 // block_d)
    limits = _limits(a.device, acc, eps, lo, hi)
    grid = (triton.cdiv(n, block_r),)
    _rows[grid](
        a, b, limits, out, redo, n, d, a.stride(0), b.stride(0),
        BLOCK_R=block_r, BLOCK_D=block_d, ACC64=acc == torch.float64,
        ALIGN=_row_alignment(a, b),
        enable_fp_fusion=True,  # Triton's default until 3.10, said so (3.9 warns)
    )  # fmt: skip


# (device, dtype, eps, lo, hi) -> the kernel's limits tensor on that device.  Made once:
# building it from Python numbers is a copy from pageable memory, which waits for the
# stream, and that wait would stall the staged pipeline (dask_cosim.staging) every chunk.
_LIMITS: dict[tuple[torch.device, torch.dtype, float, float, float], torch.Tensor] = {}


def _limits(
    device: torch.device, acc: torch.dtype, eps: float, lo: float, hi: float
) -> torch.Tensor:
    key = (device, acc, eps, lo, hi)
    limits = _LIMITS.get(key)
    if limits is None:
        limits = _LIMITS[key] = torch.tensor([eps, lo, hi], dtype=acc, device=device)
    return limits


def _row_alignment(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest count of elements, up to 16 bytes' worth, that every row start of both
    inputs is a multiple of (from the data pointers and the row strides)."""
    itemsize = a.element_size()
    align = max(1, 16 // itemsize)
    for t in (a, b):
        while align > 1 and (t.stride(0) % align or t.data_ptr() % (align * itemsize)):
            align //= 2
    return align
