"""Where ``device="auto"`` computes: the rule, as a pure function of sizes, rates and where
the data are.

The rule, in one sentence: data already on a GPU stay there; host data for a search (matrix
products) go to the GPU when there is one; host data for row-wise ``pairwise`` are computed
on the host unless moving them to the GPU (a pinned, double-buffered copy, plus a fixed
cost per call) takes less time than the host kernel that would read them.

Row-wise cosine reads each byte once and does two flops with it, so the comparison is of
rates: bytes / host kernel rate against fixed cost + bytes / host-to-device rate.  With the
rates measured on the H100 machine (config ``cosim.placement``, each with its source in
``cosim.yaml``), the fused CPU kernel (numba: float32 or float64 pairs of one dtype)
beats the copy at every size, and the torch fallback (float16, bfloat16, integers, mixed
dtypes, strided rows) loses to it above a few megabytes.  Nothing here touches a device or
reads the configuration: :func:`dask_cosim.partition.resolve_device` does both and asks
:func:`choose`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Rates", "choose", "estimate"]

# What the work is: "rows" (pairwise: a few flops per byte, bound by reading the bytes) or
# "products" (search: matrix products, hundreds of flops per byte).
WORKS = ("rows", "products")


@dataclass(frozen=True)
class Rates:
    """The measured constants of the rule (config ``cosim.placement``).

    ``cpu_fused`` and ``cpu_torch``: bytes of both inputs the host kernel reads per second
    (the fused numba kernel; the chunked torch kernel that runs where numba does not
    apply); ``host_to_gpu``: bytes per second from pageable host memory to the GPU through
    pinned staging buffers; ``gpu_fixed``: seconds a GPU call on host data costs whatever
    its size (launches, synchronisations, the result's trip back).
    """

    cpu_fused: float
    cpu_torch: float
    host_to_gpu: float
    gpu_fixed: float


def estimate(nbytes: int, cpu_kernel: str | None, rates: Rates) -> tuple[float, float]:
    """(host seconds, GPU seconds) for row-wise work on ``nbytes`` of host data.

    ``cpu_kernel`` is the fused kernel the host would run ("numba"), or None for the torch
    kernel.  The GPU's time is that of the copy: its kernel reads device memory some 30
    times faster than the bus delivers it, and the pipeline overlaps the two.
    """
    host_rate = rates.cpu_fused if cpu_kernel is not None else rates.cpu_torch
    return nbytes / host_rate, rates.gpu_fixed + nbytes / rates.host_to_gpu


def choose(
    data: str,
    work: str,
    nbytes: int,
    *,
    gpu: bool,
    cpu_kernel: str | None,
    rates: Rates,
) -> str:
    """Where "auto" computes: "cuda" or "cpu".

    Parameters
    ----------
    data : {"cpu", "cuda"}
        Where the data are (the device type of their tensors).
    work : {"rows", "products"}
        Row-wise ``pairwise``, or a search's matrix products.
    nbytes : int
        Bytes of the inputs.
    gpu : bool
        Whether this process sees a CUDA device.
    cpu_kernel : str or None
        The fused kernel the host would run on these data ("numba"), or None for the
        torch kernel (see :func:`dask_cosim.kernels.fused_kernel_for`).
    rates : Rates
        The measured constants.
    """
    if work not in WORKS:
        raise ValueError(f"work={work!r}; use one of {WORKS}")
    if data == "cuda":
        return "cuda"
    if not gpu:
        return "cpu"
    if work == "products":
        return "cuda"
    host, device = estimate(nbytes, cpu_kernel, rates)
    return "cuda" if device < host else "cpu"
