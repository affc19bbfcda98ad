"""Cosine similarity kernels: pure torch, any device, no dataframes.

The one kernel here streams both inputs once, chunk by chunk, so that its temporary
memory stays under a fixed budget whatever the number of rows.
"""

from __future__ import annotations

from collections.abc import Mapping

import dask.config
import torch
from dask.utils import parse_bytes

__all__ = ["pairwise_cosine", "chunk_rows_for", "compute_dtype_for"]

_SMALL_FLOATS = (torch.float16, torch.bfloat16)


def compute_dtype_for(*dtypes: torch.dtype) -> torch.dtype:
    """The dtype the kernel accumulates in: float32 at least, float64 if any input is.

    fp16/bf16 are upcast because their norms overflow (65504 is fp16's largest value).
    """
    result = torch.float32
    for dt in dtypes:
        result = torch.promote_types(result, dt)
    if not result.is_floating_point or result in _SMALL_FLOATS:
        return torch.float32
    return result


def chunk_rows_for(
    dim: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    *,
    converts: bool = False,
    chunk_bytes: int | str | Mapping[str, int | str] | None = None,
) -> int:
    """Rows per chunk so that one chunk's temporaries fit in ``chunk_bytes``.

    Parameters
    ----------
    dim : int
        Vector length D.
    dtype : torch.dtype
        The compute dtype (see :func:`compute_dtype_for`).
    device : torch.device or str, default "cpu"
        Picks the default budget: config ``cosim.chunk-bytes.cpu`` or ``.cuda``.
    converts : bool, default False
        Whether each chunk of ``a`` and ``b`` is also copied (dtype or device change).
    chunk_bytes : int, str or mapping, optional
        Overrides the configured budget: "1MiB", 1048576, or a mapping by device type
        like the config's ``{"cpu": "1MiB", "cuda": "256MiB"}``.
    """
    kind = "cuda" if torch.device(device).type == "cuda" else "cpu"
    if chunk_bytes is None:
        chunk_bytes = dask.config.get("cosim.chunk-bytes")
    if isinstance(chunk_bytes, Mapping):
        chunk_bytes = chunk_bytes[kind]
    budget = parse_bytes(chunk_bytes) if isinstance(chunk_bytes, str) else int(chunk_bytes)
    itemsize = torch.empty((), dtype=dtype).element_size()
    # The reused product buffer, plus a converted copy of a and of b when needed.
    per_row = max(1, dim) * itemsize * (3 if converts else 1)
    return max(1, budget // per_row)


def pairwise_cosine(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    eps: float | None = None,
    chunk_rows: int | None = None,
    chunk_bytes: int | str | Mapping[str, int | str] | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """res[i] = cos(a[i], b[i]) for two (N, D) tensors.

    ``cos = (a / max(|a|, eps)) . (b / max(|b|, eps))``, clamped to [-1, 1]: a zero vector
    gives 0.0, NaN or inf anywhere in a row gives NaN.

    Parameters
    ----------
    a, b : torch.Tensor
        Two tensors of the same shape (N, D), any floating or integer dtype, any device.
    eps : float, default config ``cosim.eps`` (1e-8)
        Lower bound on each vector's norm.
    chunk_rows : int, optional
        Rows per chunk; default from ``chunk_bytes``.
    chunk_bytes : int or str, default config ``cosim.chunk-bytes.cpu`` / ``.cuda``
        Budget for one chunk's temporaries (see :func:`chunk_rows_for`).
    device : torch.device or str, optional
        Where to compute; default ``a.device``.  Chunks are moved there one at a time,
        so a host tensor is never copied to the device whole.  When the device runs out
        of memory (``torch.cuda.OutOfMemoryError``, or ``MemoryError`` from RMM) the
        chunk is halved and retried, down to one row.
    dtype : torch.dtype, optional
        Accumulate in at least this dtype (float64 for a float64 result).

    Returns
    -------
    torch.Tensor
        Shape (N,), on ``device``, in the accumulation dtype: float32, or float64 when
        an input or ``dtype`` is float64.
    """
    if a.ndim != 2 or b.ndim != 2 or a.shape != b.shape:
        raise ValueError(
            f"pairwise_cosine needs two (N, D) tensors of the same shape; "
            f"got a {tuple(a.shape)} and b {tuple(b.shape)}"
        )
    if eps is None:
        eps = float(dask.config.get("cosim.eps"))
    target = torch.device(device) if device is not None else a.device
    dtype = compute_dtype_for(a.dtype, b.dtype, *([dtype] if dtype is not None else []))
    n, dim = a.shape
    converts = a.dtype != dtype or b.dtype != dtype or a.device != target or b.device != target
    if chunk_rows is None:
        chunk_rows = chunk_rows_for(dim, dtype, target, converts=converts, chunk_bytes=chunk_bytes)
    chunk_rows = max(1, int(chunk_rows))

    dot = torch.empty(n, dtype=dtype, device=target)
    norm_a = torch.empty(n, dtype=dtype, device=target)
    norm_b = torch.empty(n, dtype=dtype, device=target)
    # Three products per chunk, each summed while the chunk is still in cache:
    # F.cosine_similarity on the whole input would instead materialise several N x D
    # temporaries and run ~9x below the memory floor on a CPU.  The norms are sums of
    # x * x, the same cascaded summation as the dot product, so errors largely cancel
    # (vector_norm was off by 4e-6 at D=4096).
    # Every temporary is allocated once (again only after an out-of-memory halving) and
    # reused for each chunk.  (vecdot would
    # allocate its product per chunk, and dask workers set MALLOC_TRIM_THRESHOLD_, which
    # returns each such block to the OS and page-faults it back: 3x slower there.)
    start, rows = 0, min(chunk_rows, n)
    buffers: tuple[torch.Tensor, ...] | None = None
    while start < n:
        stop = min(n, start + rows)
        try:
            if buffers is None:
                buffers = tuple(
                    torch.empty((rows, dim), dtype=dtype, device=target)
                    for _ in range(3 if converts else 1)
                )
            _products(a, b, start, stop, buffers, dot, norm_a, norm_b)
        except _OUT_OF_MEMORY:
            # The device is short of memory (other work on the GPU, RMM's pool): halve
            # the chunk and redo this one; only a single row that does not fit raises.
            if rows == 1:
                raise
            buffers = None
            rows //= 2
            if target.type == "cuda":
                torch.cuda.empty_cache()
            continue
        start = stop

    norm_a.sqrt_()
    norm_b.sqrt_()
    denom = norm_a.clamp_min_(eps).mul_(norm_b.clamp_min_(eps))
    res = dot.div_(denom)
    if dtype == torch.float32:
        _recompute_overflowed(res, denom, a, b, eps, target)
    return res.clamp_(-1.0, 1.0)


# What an allocation on a full device raises: torch's caching allocator, or RMM (when
# torch allocates through RMM's pool, as under dask-cuda with the shared pool).
_OUT_OF_MEMORY = (torch.cuda.OutOfMemoryError, MemoryError)


def _products(
    a: torch.Tensor,
    b: torch.Tensor,
    start: int,
    stop: int,
    buffers: tuple[torch.Tensor, ...],
    dot: torch.Tensor,
    norm_a: torch.Tensor,
    norm_b: torch.Tensor,
) -> None:
    """dot, |a|^2, |b|^2 for rows start:stop, through the preallocated ``buffers``
    (the product, then the converted copies of a and b when there are three)."""
    x, y = a[start:stop], b[start:stop]
    if len(buffers) == 3:
        x = buffers[1][: stop - start].copy_(x)
        y = buffers[2][: stop - start].copy_(y)
    p = buffers[0][: stop - start]
    torch.sum(torch.mul(x, y, out=p), dim=1, out=dot[start:stop])
    torch.sum(torch.mul(x, x, out=p), dim=1, out=norm_a[start:stop])
    torch.sum(torch.mul(y, y, out=p), dim=1, out=norm_b[start:stop])


def _recompute_overflowed(
    res: torch.Tensor,
    denom: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    eps: float,
    device: torch.device,
) -> None:
    """Redo in float64 the rows whose float32 sums overflowed (|x| beyond ~1e18).

    Rows holding inf give inf here too and still come out NaN in float64, as they should.
    Such rows are rare, so the check costs one pass over N values, not N x D.
    """
    bad = torch.isinf(denom) | torch.isinf(res)
    if not bool(bad.any()):
        return
    rows = bad.nonzero().squeeze(1)
    # The kernel itself, in float64 (which takes no such fallback), on just those rows.
    redo = pairwise_cosine(
        a.index_select(0, rows.to(a.device)),
        b.index_select(0, rows.to(b.device)),
        eps=eps,
        device=device,
        dtype=torch.float64,
    )
    res.index_copy_(0, rows, redo.to(res.dtype))
