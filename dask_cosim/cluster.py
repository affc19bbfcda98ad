"""``local_cluster()``: every GPU with dask-cuda when there are GPUs, else every CPU core.

All GPU specifics of cluster set-up live here.  Nothing in this module touches CUDA in the
client process: GPUs are counted through NVML (dask-cuda's helper), so workers are the
first processes to create a CUDA context.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from distributed import Client, LocalCluster

__all__ = ["local_cluster", "gpu_count"]


def gpu_count() -> int:
    """GPUs this process may use (respects CUDA_VISIBLE_DEVICES), 0 without dask-cuda."""
    if importlib.util.find_spec("dask_cuda") is None:
        return 0
    try:
        from dask_cuda.utils import get_n_gpus

        return int(get_n_gpus())
    except Exception:  # no driver / NVML: a CPU machine with dask-cuda installed
        return 0


def local_cluster(
    n_workers: int | None = None,
    *,
    gpus: bool | str = "auto",
    threads_per_worker: int | None = None,
    rmm_pool_size: Any = None,
    dashboard_address: str = "127.0.0.1:8787",
    **kwargs: Any,
) -> Client:
    """Start a local cluster bound to 127.0.0.1 and return a connected Client.

    Parameters
    ----------
    n_workers : int, optional
        GPU cluster: one worker per visible GPU (default).  CPU cluster: default one
        worker per core.
    gpus : {"auto", True, False}, default "auto"
        "auto": a ``LocalCUDACluster`` when dask-cuda is installed and sees a GPU, else a
        ``LocalCluster``.  True: require GPUs.  False: CPU workers only.
    threads_per_worker : int, optional
        CPU cluster: default 1, so dask threads x torch threads (1 in a dask worker)
        never exceed the cores.
    rmm_pool_size : str or int, optional
        GPU cluster: an RMM pool per worker (e.g. "20GB"), shared with torch.
    dashboard_address : str, default "127.0.0.1:8787"
    **kwargs
        Passed to ``LocalCUDACluster`` or ``LocalCluster``.
    """
    if gpus not in ("auto", True, False):
        raise ValueError(f"gpus={gpus!r}; use 'auto', True or False")
    if n_workers is not None and (not isinstance(n_workers, int) or n_workers < 1):
        raise ValueError(f"n_workers={n_workers!r} must be a positive integer, e.g. n_workers=2")
    kwargs.setdefault("host", "127.0.0.1")
    n_gpus = gpu_count() if gpus else 0
    if gpus is True and n_gpus == 0:
        raise RuntimeError(
            "gpus=True but no GPU is usable here: it needs an NVIDIA driver and "
            "`pip install 'dask-cosim[cuda12]'` (dask-cuda); use gpus='auto' to fall back to CPUs"
        )
    if n_gpus:
        from dask_cuda import LocalCUDACluster

        if rmm_pool_size is not None:
            kwargs.setdefault("rmm_pool_size", rmm_pool_size)
            # One pool for RMM (cudf) and torch, instead of two allocators fighting.
            kwargs.setdefault("rmm_allocator_external_lib_list", ["torch"])
        cluster = LocalCUDACluster(
            n_workers=n_workers, dashboard_address=dashboard_address, **kwargs
        )
    else:
        cluster = LocalCluster(
            n_workers=n_workers or (os.cpu_count() or 1),
            threads_per_worker=threads_per_worker or 1,
            processes=True,
            dashboard_address=dashboard_address,
            **kwargs,
        )
    return Client(cluster)
