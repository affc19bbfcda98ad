"""One partition in, one Series out: the function dask maps.  Knows no dask.

``pairwise_partition(df, a, b, ...)[i] = cos(df[a][i], df[b][i])`` for a pandas or cudf
DataFrame; the dataframe specifics live in :mod:`dask_cosim.backends`, the math in
:mod:`dask_cosim.kernels`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from dask_cosim import backends, errors, kernels, options, placement
from dask_cosim.options import DEVICE_HELP, torch_dtype

__all__ = ["default_result_dtype", "pairwise_cosine", "pairwise_partition", "resolve_device"]


def pairwise_cosine(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    eps: float | None = None,
    chunk_bytes: Any = None,
    **kwargs: Any,
) -> torch.Tensor:
    """res[i] = cos(a[i], b[i]) for two (N, D) tensors, with the configured options.

    :func:`dask_cosim.kernels.pairwise_cosine` (which reads no configuration) with ``eps``
    and ``chunk_bytes`` taken from config ``cosim.eps`` and ``cosim.chunk-bytes`` when not
    given; every other keyword (``device``, ``dtype``, ``fused``, ``chunk_rows``) is passed
    on as it is.  This is ``dask_cosim.pairwise_cosine``.
    """
    return kernels.pairwise_cosine(
        a, b, eps=options.eps(eps), chunk_bytes=options.chunk_bytes(chunk_bytes), **kwargs
    )


def default_result_dtype(input_dtypes: list[Any]) -> torch.dtype:
    """float64 when every input dtype (numpy or torch) is float64, else float32.

    None stands for a dtype the metadata cannot tell (object columns): float32.
    """
    names = [str(dt).removeprefix("torch.") for dt in input_dtypes]
    return torch.float64 if names and all(n == "float64" for n in names) else torch.float32


def resolve_device(
    device: str | torch.device,
    data_device: torch.device,
    *,
    work: str = "rows",
    nbytes: int = 0,
    cpu_kernel: str | None = "numba",
    rates: placement.Rates | None = None,
) -> torch.device:
    """The device to compute on: ``device``, or for "auto" the one the placement rule picks.

    "auto" (:func:`dask_cosim.placement.choose`, with the rates of config
    ``cosim.placement``): data on a GPU stay there; host data go to this process's GPU
    (cuda:0 under dask-cuda) for ``work="products"`` (search), and for ``work="rows"``
    (pairwise) only when the staged copy of ``nbytes`` would take less time than the host
    kernel ``cpu_kernel`` ("numba", or None for the torch kernel); else the CPU.  Nothing
    is said either way.  ``rates``: those of the rule, read from the config when None (a
    task on a remote worker is given the client's: the worker's config is not the client's).
    """
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        if data_device.type == "cuda":
            return data_device  # the data's own GPU, not cuda:0
        if not torch.cuda.is_available():
            return torch.device("cpu")
        rates = options.placement_rates() if rates is None else rates
        where = placement.choose("cpu", work, nbytes, gpu=True, cpu_kernel=cpu_kernel, rates=rates)
        return torch.device(where)
    try:
        resolved = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device={device!r} is not a device; {DEVICE_HELP}") from err
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"device={device!r} but torch sees no CUDA device in this process; "
            "use device='auto' or 'cpu', or run on a GPU worker"
        )
    return resolved


def pairwise_partition(
    df: Any,
    a: str,
    b: str,
    *,
    eps: float | None = None,
    dtype: Any = None,
    device: str | torch.device = "auto",
    name: Any = "cos",
    chunk_bytes: Any = None,
    rates: placement.Rates | None = None,
) -> Any:
    """res[i] = cos(df[a][i], df[b][i]), a Series of df's library with df's index.

    Parameters
    ----------
    df : pandas.DataFrame or cudf.DataFrame
        One partition.
    a, b : str
        Embedding columns (see :data:`dask_cosim.errors.ACCEPTED`).
    eps : float, default config ``cosim.eps``
        Lower bound on each vector's norm (see :func:`dask_cosim.kernels.pairwise_cosine`).
    dtype : {None, "float32", "float64"}, default None
        Result dtype; None means float64 when both inputs are float64, else float32.
    device : {"auto", "cpu", "cuda", "cuda:N"}, default "auto"
        "auto": where the placement rule says the partition is computed fastest
        (:func:`resolve_device`): cudf partitions on their GPU, pandas partitions on the
        CPU unless a GPU is present and the staged copy there takes less time than the
        host kernel (with the default rates: only where the torch kernel applies, above
        about 2.2 MB of vectors).
    name : hashable, default "cos"
    chunk_bytes : int, str or mapping, default config ``cosim.chunk-bytes``
        Temporaries budget of the torch kernel.
    rates : placement.Rates, default config ``cosim.placement``
        The rates of device="auto"'s rule (read when the graph is built and passed here,
        so that a value set in the client holds on remote workers).

    Null rows give NaN (pandas) or null (cudf).  Raises ``ValueError`` naming the first
    row whose vectors differ in length (ragged rows, or a and b of different lengths).
    """
    # The kernels read no configuration: options are read (and checked) here.
    eps = options.eps(eps)
    chunk_bytes = options.chunk_bytes(chunk_bytes)
    va = backends.to_vectors(df[a], a)
    vb = va if backends.same_label(a, b) else backends.to_vectors(df[b], b)
    null = _either(va.null, vb.null)
    n = va.length

    out_dtype = torch_dtype(dtype, from_config=False)
    if out_dtype is None:
        out_dtype = default_result_dtype([t.dtype for t in va.blocks + vb.blocks])

    data_device = va.blocks[0].device if va.blocks else torch.device("cpu")
    target = resolve_device(
        device,
        data_device,
        nbytes=sum(t.nbytes for t in va.blocks + vb.blocks),
        cpu_kernel=_host_kernel(va, vb, data_device),
        rates=rates,
    )

    if n and va.dim != vb.dim:
        both = _valid_positions(null, n)
        if len(both):
            label = backends.row_label(df.index, int(both[0]))
            raise errors.dims_differ(f"column {a!r}", va.dim, f"column {b!r}", vb.dim, label)
        # Not one row has both vectors: every result is null.
        result = torch.full((n,), float("nan"), dtype=out_dtype, device=target)
        return backends.make_result(df[a], result, null, name)

    pairs = [(x, y) for _, x, y in _aligned(va.blocks, vb.blocks)]
    result = kernels.pairwise_cosine_blocks(
        pairs, eps=eps, device=target, dtype=out_dtype, chunk_bytes=chunk_bytes
    )
    return backends.make_result(df[a], result.to(out_dtype), null, name)


def _host_kernel(va: backends.Vectors, vb: backends.Vectors, where: torch.device) -> str | None:
    """The fused kernel the CPU would run on these vectors (None: the torch kernel), as
    the placement rule of host data asks; not looked up for data on a GPU."""
    if where.type != "cpu" or not va.blocks or not vb.blocks:
        return None
    return kernels.fused_kernel_for(va.blocks[0], vb.blocks[0], device="cpu")


def _either(x: Any, y: Any) -> Any:
    """Union of two null masks (numpy or torch, or None for "no nulls")."""
    if x is None:
        return y
    if y is None or y is x:
        return x
    if isinstance(x, torch.Tensor):
        return torch.logical_or(x, y)
    return np.logical_or(x, y)


def _valid_positions(null: Any, n: int) -> np.ndarray:
    if null is None:
        return np.arange(n)
    if isinstance(null, torch.Tensor):
        null = null.cpu().numpy()
    return np.flatnonzero(~np.asarray(null))


def _aligned(
    blocks_a: list[torch.Tensor], blocks_b: list[torch.Tensor]
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """Walk two block lists covering the same rows; yield (first row, a view, b view).

    The Arrow chunks of two columns need not start at the same rows; views, not copies.
    """
    ia = ib = oa = ob = start = 0
    while ia < len(blocks_a) and ib < len(blocks_b):
        xa, xb = blocks_a[ia], blocks_b[ib]
        take = min(len(xa) - oa, len(xb) - ob)
        if take > 0:
            yield start, xa[oa : oa + take], xb[ob : ob + take]
        start, oa, ob = start + take, oa + take, ob + take
        if oa >= len(xa):
            ia, oa = ia + 1, 0
        if ob >= len(xb):
            ib, ob = ib + 1, 0
