"""The fused CPU kernel (numba): one read of each row, three sums in registers.

Imported by :mod:`dask_cosim.kernels` on the first CPU call only: importing numba takes
time that a client process which never computes need not pay.  Numerics (which rows
the fast path may answer, and the rule for the others) are decided in ``kernels``; this
module only computes.
"""

from __future__ import annotations

import math
import threading

import numba
import numpy as np

__all__ = ["rows_cosine"]

# No "nnan"/"ninf": the range test below must see NaN and inf as they are.  "reassoc" is
# what lets LLVM vectorise the three reductions; "contract" turns them into FMAs.
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}


@numba.njit(fastmath=_FASTMATH, cache=True, nogil=True, inline="always")
def _row(
    a: np.ndarray,
    b: np.ndarray,
    i: int,
    eps: float,
    lo: float,
    hi: float,
    out: np.ndarray,
    redo: np.ndarray,
) -> None:
    # float64 sums of float32 input: as fast (the loop waits on memory, not on the
    # conversions) and more accurate than float32 sums (benchmarks/NOTES.md, section 7);
    # no float32 square can overflow or underflow in float64 either.
    dot = 0.0
    aa = 0.0
    bb = 0.0
    for j in range(a.shape[1]):
        x = np.float64(a[i, j])
        y = np.float64(b[i, j])
        dot += x * y
        aa += x * x
        bb += y * y
    # NaN fails every comparison, so non-finite rows go to the careful path too.
    if lo <= aa <= hi and lo <= bb <= hi and abs(dot) <= hi:
        r = dot / max(math.sqrt(aa), eps) / max(math.sqrt(bb), eps)
        out[i] = min(1.0, max(-1.0, r))
        redo[i] = False
    else:
        out[i] = math.nan
        redo[i] = True


# One parallel region per call, whatever N: thousands of short regions (one per torch op
# per chunk) are what made the torch kernel slow beside a busy process.
@numba.njit(parallel=True, fastmath=_FASTMATH, cache=True, nogil=True)
def _rows_parallel(a, b, eps, lo, hi, out, redo):  # type: ignore[no-untyped-def]
    for i in numba.prange(a.shape[0]):
        _row(a, b, i, eps, lo, hi, out, redo)


@numba.njit(fastmath=_FASTMATH, cache=True, nogil=True)
def _rows_serial(a, b, eps, lo, hi, out, redo):  # type: ignore[no-untyped-def]
    for i in range(a.shape[0]):
        _row(a, b, i, eps, lo, hi, out, redo)


# Below this many values per input, one thread: waking a second one costs more than
# reading 4 MiB takes on a busy machine (a scheduler time slice).
PARALLEL_MIN_VALUES = 1 << 20


# The "workqueue" layer (numba's fallback when neither OpenMP nor TBB loads) aborts the
# process when two threads launch parallel kernels at once: dask runs tasks in threads.
_launch_lock = threading.Lock()
_layer: str | None = None


def rows_cosine(
    a: np.ndarray,
    b: np.ndarray,
    eps: float,
    lo: float,
    hi: float,
    out: np.ndarray,
    redo: np.ndarray,
    threads: int,
) -> None:
    """out[i] = cos(a[i], b[i]) where the row's sums are in [lo, hi]; else redo[i] = True.

    ``a`` and ``b`` are C-contiguous (N, D) arrays of one dtype, float32 or float64,
    summed in float64 (``lo`` and ``hi`` bound float64 sums).  ``threads`` caps numba's
    threads for this call (numba's setting is per calling thread, so each call sets it);
    inputs under :data:`PARALLEL_MIN_VALUES` values run on the calling thread alone.
    """
    global _layer
    most = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]
    threads = max(1, min(threads, most))
    if threads == 1 or a.size < PARALLEL_MIN_VALUES:
        _rows_serial(a, b, eps, lo, hi, out, redo)
        return
    numba.set_num_threads(threads)
    if _layer is None or _layer == "workqueue":
        with _launch_lock:
            _rows_parallel(a, b, eps, lo, hi, out, redo)
            _layer = numba.threading_layer()
    else:
        _rows_parallel(a, b, eps, lo, hi, out, redo)
