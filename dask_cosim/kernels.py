"""Cosine similarity kernels: tensors in, tensors out, any device, no dataframes.

``pairwise_cosine`` runs one fused kernel per device where it can (numba on the CPU,
Triton on CUDA: each row read once, the three sums a.b, a.a, b.b kept in registers) and a
chunked torch kernel everywhere else; host rows computed on a GPU reach it chunk by chunk
through pinned, double-buffered staging (:mod:`dask_cosim.staging`).  Rows whose sums
leave the floating-point range (huge or tiny magnitudes, zero vectors, NaN and inf) are
answered by one careful rule (:mod:`dask_cosim._kernels_careful`) whatever kernel ran.
Options (``eps``, ``chunk_bytes``) arrive as arguments, without defaults of their own:
this module reads no configuration, and the defaults live in ``cosim.yaml`` alone
(:mod:`dask_cosim.options` reads them).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping
from types import ModuleType

import torch
from dask.utils import parse_bytes

from dask_cosim import staging
from dask_cosim._kernels_careful import careful_rows, limits
from dask_cosim.staging import OUT_OF_MEMORY as _OUT_OF_MEMORY

__all__ = [
    "chunk_rows_for",
    "compute_dtype_for",
    "fused_kernel_for",
    "pairwise_cosine",
    "pairwise_cosine_blocks",
]

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
    chunk_bytes: int | str | Mapping[str, int | str],
) -> int:
    """Rows per chunk so that one chunk's temporaries fit in ``chunk_bytes``.

    Parameters
    ----------
    dim : int
        Vector length D.
    dtype : torch.dtype
        The compute dtype (see :func:`compute_dtype_for`).
    device : torch.device or str, default "cpu"
        Picks the budget's entry when ``chunk_bytes`` is a mapping by device type.
    converts : bool, default False
        Whether each chunk of ``a`` and ``b`` is also copied (dtype or device change).
    chunk_bytes : int, str or mapping
        The budget: "1MiB", 1048576, or a mapping by device type like
        ``{"cpu": "1MiB", "cuda": "256MiB"}`` (the shape of config ``cosim.chunk-bytes``).
    """
    kind = "cuda" if torch.device(device).type == "cuda" else "cpu"
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
    eps: float,
    chunk_bytes: int | str | Mapping[str, int | str],
    chunk_rows: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    fused: bool | str | None = None,
) -> torch.Tensor:
    """res[i] = cos(a[i], b[i]) for two (N, D) tensors.

    ``cos = (a / max(|a|, eps)) . (b / max(|b|, eps))``, clamped to [-1, 1], for every
    finite input: a zero vector gives 0.0 (NaN with ``eps=0``: 0/0), and so does every
    row when D = 0; NaN or inf anywhere in a row gives NaN.  Rows whose sums of
    squares would overflow or lose digits to underflow (magnitudes past ~1e154 or below
    ~1e-145 in float64, past ~1e19 or below ~1e-16 in float32's own sums) are recomputed
    in float64 with each vector first scaled by its largest magnitude, so ``[1e308] * 3``
    against its negation gives -1.0 and ``[1e200, 0]`` against ``[1, 0]`` gives 1.0.

    Parameters
    ----------
    a, b : torch.Tensor
        Two tensors of the same shape (N, D), any floating or integer dtype, any device.
    eps : float
        Lower bound on each vector's norm (``cosim.eps``, 1e-8 by default, is what the
        accessor passes).
    chunk_bytes : int, str or mapping
        Budget for one chunk's temporaries in the torch kernel (see
        :func:`chunk_rows_for`; ``options.chunk_bytes()`` gives the configured one); the
        fused kernels need none.
    chunk_rows : int, optional
        Rows per chunk of the torch kernel, and per staged chunk of host rows on a GPU;
        default from ``chunk_bytes``.
    device : torch.device or str, optional
        Where to compute; default ``a.device``.  Host tensors computed on a GPU are moved
        there chunk by chunk through pinned staging buffers (the copy of one chunk
        overlapping the kernel on the last), never whole.  When the device runs out
        of memory (``torch.cuda.OutOfMemoryError``, or ``MemoryError`` from RMM) the
        chunk is halved and retried, down to one row.
    dtype : torch.dtype, optional
        Accumulate in at least this dtype (float64 for a float64 result).
    fused : bool or {"numba", "triton"}, optional
        None: the fused kernel for this input when there is one (see
        :func:`fused_kernel_for`), else the torch kernel.  False: the torch kernel.
        True: the fused kernel or a ``RuntimeError`` saying why none applies.  A name
        runs that kernel (tests run "triton" on CPU tensors in Triton's interpreter).

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
    target = _resolve(torch.device(device) if device is not None else a.device)
    dtype = compute_dtype_for(a.dtype, b.dtype, *([dtype] if dtype is not None else []))
    n, dim = a.shape
    if n == 0 or dim == 0:
        # D = 0: every vector is the zero vector, and the zero-vector rule applies.
        return torch.full((n,), 0.0 if eps > 0 else math.nan, dtype=dtype, device=target)
    if _staged_to(target, [(a, b)]):
        res, redo = _staged([(a, b)], eps, target, dtype, fused, chunk_rows, chunk_bytes)
        careful_rows(res, redo, a, b, eps)
        return res
    kernel = _choose_kernel(fused, a, b, target)
    if kernel is None:
        res, redo = _torch_kernel(a, b, eps, target, dtype, chunk_rows, chunk_bytes)
    else:
        res, redo = _fused_kernel(kernel, a, b, eps, target, dtype)
    careful_rows(res, redo, a, b, eps)
    return res


def pairwise_cosine_blocks(
    pairs: list[tuple[torch.Tensor, torch.Tensor]],
    *,
    eps: float,
    chunk_bytes: int | str | Mapping[str, int | str],
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    fused: bool | str | None = None,
) -> torch.Tensor:
    """``torch.cat([pairwise_cosine(x, y, ...) for x, y in pairs])``, the blocks never
    concatenated: the row blocks of one partition (its Arrow chunks), in order.

    Host blocks computed on a GPU go through one staging pipeline together, so that
    chunks span block boundaries and the copy stays overlapped from the first block to
    the last.  Arguments as for :func:`pairwise_cosine`; ``device`` defaults to the first
    block's.
    """
    pairs = [(x, y) for x, y in pairs if len(x)]
    if not pairs:
        acc = compute_dtype_for(*([dtype] if dtype is not None else []))
        return torch.empty(0, dtype=acc, device=device or "cpu")
    target = _resolve(torch.device(device) if device is not None else pairs[0][0].device)
    if not _staged_to(target, pairs) or pairs[0][0].shape[1] == 0:
        parts = [
            pairwise_cosine(x, y, eps=eps, chunk_bytes=chunk_bytes, device=target, dtype=dtype,
                            fused=fused)
            for x, y in pairs
        ]  # fmt: skip
        return parts[0] if len(parts) == 1 else torch.cat(parts)
    for x, y in pairs:
        if x.ndim != 2 or x.shape != y.shape or x.shape[1] != pairs[0][0].shape[1]:
            raise ValueError(f"pairwise_cosine_blocks needs (N, D) blocks of one D; got "
                             f"{tuple(x.shape)} and {tuple(y.shape)}")  # fmt: skip
    acc = compute_dtype_for(pairs[0][0].dtype, pairs[0][1].dtype, *([dtype] if dtype else []))
    res, redo = _staged(pairs, eps, target, acc, fused, None, chunk_bytes)
    if bool(redo.any()):  # one synchronisation, after every chunk is queued
        start = 0
        for x, y in pairs:
            stop = start + len(x)
            careful_rows(res[start:stop], redo[start:stop], x, y, eps)
            start = stop
    return res


def fused_kernel_for(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    device: torch.device | str | None = None,
) -> str | None:
    """The fused kernel :func:`pairwise_cosine` runs on this input, or None for torch's.

    "numba" on the CPU for C-contiguous float32 or float64 inputs of one dtype, when
    numba imports; "triton" on CUDA for float16, bfloat16, float32 or float64 inputs on
    the device with unit column stride, or on the host (they reach the GPU as staged,
    contiguous chunks), when triton imports (it ships with the CUDA builds of torch).
    Anything else (integers, mixed dtypes on the CPU, strided views on a device) runs the
    torch kernel.
    """
    return _fused_kernel_why(a, b, _resolve(torch.device(device) if device else a.device))[0]


def _resolve(target: torch.device) -> torch.device:
    """A bare "cuda" is the current GPU: the device of tensors on "cuda:0" there."""
    if target.type == "cuda" and target.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return target


def _fused_kernel_why(
    a: torch.Tensor, b: torch.Tensor, target: torch.device
) -> tuple[str | None, str]:
    if target.type == "cpu":
        if a.device.type != "cpu" or b.device.type != "cpu":
            return None, f"the inputs are on {a.device} and {b.device}, not the CPU"
        if a.dtype != b.dtype or a.dtype not in (torch.float32, torch.float64):
            return None, f"numba takes float32 or float64 pairs, got {a.dtype} and {b.dtype}"
        if not (a.is_contiguous() and b.is_contiguous()):
            return None, "numba takes C-contiguous inputs; pass a.contiguous()"
        return _available("numba")
    if target.type == "cuda":
        # Host inputs arrive as staged, contiguous chunks on the target.
        if any(t.device not in (target, _HOST) for t in (a, b)):
            return None, f"triton takes inputs on {target} or the host, got {a.device}, {b.device}"
        if a.dtype not in _TRITON_DTYPES or b.dtype not in _TRITON_DTYPES:
            return None, f"triton takes float16/bfloat16/float32/float64, got {a.dtype}, {b.dtype}"
        if any(t.device == target and t.stride(1) != 1 for t in (a, b)):
            return None, "triton takes inputs with unit column stride; pass a.contiguous()"
        return _available("triton")
    return None, f"no fused kernel for device type {target.type!r}"


_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_HOST = torch.device("cpu")
_MODULES = {"numba": "dask_cosim._kernels_numba", "triton": "dask_cosim._kernels_triton"}
_loaded: dict[str, ModuleType | str] = {}


def _available(kernel: str) -> tuple[str | None, str]:
    """(kernel, "") when its compiler imports here, else (None, why not)."""
    if kernel not in _loaded:
        if importlib.util.find_spec(kernel) is None:
            _loaded[kernel] = f"{kernel} is not installed (pip install {kernel})"
        else:
            try:
                _loaded[kernel] = importlib.import_module(_MODULES[kernel])
            except Exception as err:  # a broken install falls back to the torch kernel
                _loaded[kernel] = f"importing {kernel} failed: {err!r}"
    status = _loaded[kernel]
    return (None, status) if isinstance(status, str) else (kernel, "")


def _choose_kernel(
    fused: bool | str | None, a: torch.Tensor, b: torch.Tensor, target: torch.device
) -> str | None:
    if fused is None or fused is False:
        return _fused_kernel_why(a, b, target)[0] if fused is None else None
    if fused is True:
        kernel, why = _fused_kernel_why(a, b, target)
        if kernel is None:
            raise RuntimeError(f"fused=True but no fused kernel applies: {why}; use fused=None")
        return kernel
    if fused not in _MODULES:
        raise ValueError(f"fused={fused!r}; use None, True, False, 'numba' or 'triton'")
    kernel, why = _available(fused)
    if kernel is None:
        raise RuntimeError(f"fused={fused!r}: {why}")
    return kernel


def _staged_to(target: torch.device, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    """Whether host rows are to be computed on a GPU (through :mod:`dask_cosim.staging`)."""
    return target.type == "cuda" and any(t.device.type == "cpu" for p in pairs for t in p)


def _staged(
    pairs: list[tuple[torch.Tensor, torch.Tensor]],
    eps: float,
    target: torch.device,
    dtype: torch.dtype,
    fused: bool | str | None,
    chunk_rows: int | None,
    chunk_bytes: int | str | Mapping[str, int | str],
) -> tuple[torch.Tensor, torch.Tensor]:
    """(res, redo) over row blocks staged onto ``target`` chunk by chunk: each chunk's
    kernel is queued while the next chunk is copied, and nothing waits for the device
    until the caller reads ``redo``."""
    x0, y0 = pairs[0]
    n, dim = sum(len(x) for x, _ in pairs), x0.shape[1]
    if chunk_rows is None:
        # Two inputs x two slots x (pinned + device buffer): eight buffers in the budget.
        wider = x0.dtype if x0.element_size() >= y0.element_size() else y0.dtype
        chunk_rows = chunk_rows_for(dim, wider, target, chunk_bytes=chunk_bytes) // 8
    res = torch.empty(n, dtype=dtype, device=target)
    redo = torch.empty(n, dtype=torch.bool, device=target)
    for start, (x, y) in staging.device_chunks(pairs, target, max(1, chunk_rows)):
        kernel = _choose_kernel(fused, x, y, target)
        if kernel is None:
            part, flags = _torch_kernel(x, y, eps, target, dtype, None, chunk_bytes)
        else:
            part, flags = _fused_kernel(kernel, x, y, eps, target, dtype)
        res[start : start + len(x)] = part
        redo[start : start + len(x)] = flags
    return res, redo


def _fused_kernel(
    kernel: str,
    a: torch.Tensor,
    b: torch.Tensor,
    eps: float,
    target: torch.device,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(res, redo): the fused kernel's results and the rows left to :func:`careful_rows`."""
    n = a.shape[0]
    module = _loaded[kernel]
    assert isinstance(module, ModuleType)
    res = torch.empty(n, dtype=dtype, device=target)
    if kernel == "numba":
        redo = torch.empty(n, dtype=torch.bool)
        lo, hi = limits(torch.float64)  # numba sums in float64 whatever the input
        threads = torch.get_num_threads()
        module.rows_cosine(
            a.detach().numpy(), b.detach().numpy(), eps, lo, hi,
            res.numpy(), redo.numpy(), threads,
        )  # fmt: skip
        if torch.get_num_threads() != threads:
            # numba's OpenMP pool, started by this thread's first parallel call, set the
            # thread's OpenMP threads (torch's) to all of numba's: in a dask task thread,
            # every later kernel would run on every core, in each worker at once.
            torch.set_num_threads(threads)
        return res, redo
    flags = torch.empty(n, dtype=torch.int8, device=target)
    lo, hi = limits(dtype)
    module.rows_cosine(a.detach(), b.detach(), dtype, eps, lo, hi, res, flags)
    return res, flags.bool()


def _torch_kernel(
    a: torch.Tensor,
    b: torch.Tensor,
    eps: float,
    target: torch.device,
    dtype: torch.dtype,
    chunk_rows: int | None,
    chunk_bytes: int | str | Mapping[str, int | str],
) -> tuple[torch.Tensor, torch.Tensor]:
    """(res, redo) from three chunked reductions per chunk; any dtype, any device."""
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
    # temporaries and fall far below the memory floor.  The norms are sums of x * x, the
    # same cascaded summation as the dot product, so errors largely cancel (vector_norm's
    # do not).  Every temporary is allocated once (again only after an out-of-memory
    # halving) and reused for each chunk: dask workers set MALLOC_TRIM_THRESHOLD_, which
    # returns a per-chunk allocation to the OS and page-faults it back (benchmarks/NOTES.md,
    # section 1b, has the measurements).
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

    lo, hi = limits(dtype)
    # NaN fails every comparison, so non-finite rows are redone (and come out NaN).
    fast = (norm_a >= lo) & (norm_a <= hi)
    fast &= (norm_b >= lo) & (norm_b <= hi)
    fast &= dot.abs() <= hi
    # Two divisions, not one by a product of norms, which could overflow.
    res = dot.div_(norm_a.sqrt_().clamp_min_(eps)).div_(norm_b.sqrt_().clamp_min_(eps))
    return res.clamp_(-1.0, 1.0), fast.logical_not_()


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
