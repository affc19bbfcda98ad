"""``local_cluster()``: every GPU with dask-cuda when there are GPUs, else every CPU core;
``describe(client)``: the cluster a client computes on, in one line.

All GPU specifics of cluster set-up live here.  Nothing in this module touches CUDA in the
client process: GPUs are counted through NVML (dask-cuda's helper), so workers are the
first processes to create a CUDA context.
"""

from __future__ import annotations

import ast
import atexit
import importlib.util
import inspect
import logging
import multiprocessing
import sys
import warnings
import weakref
from contextlib import suppress
from types import FrameType
from typing import Any

import dask.config
from dask.system import CPU_COUNT
from dask.typing import no_default
from dask.utils import format_bytes
from distributed import Client, LocalCluster, Nanny, Worker
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.security import Security

from dask_cosim import errors, options

__all__ = [
    "ClusterClient",
    "TorchThreads",
    "describe",
    "gpu_count",
    "local_cluster",
    "torch_threads",
]

_LOCAL_HOSTS = ("127.0.0.1", "localhost")


def gpu_count() -> int:
    """GPUs this process may use (respects CUDA_VISIBLE_DEVICES), 0 without dask-cuda."""
    if importlib.util.find_spec("dask_cuda") is None:
        return 0
    try:
        from dask_cuda.utils import get_n_gpus

        return int(get_n_gpus())
    except Exception:  # no driver / NVML: a CPU machine with dask-cuda installed
        return 0


def torch_threads(n_workers: int, threads_per_worker: int, cores: int = CPU_COUNT) -> int:
    """Torch threads per task so that workers x dask threads x torch threads <= cores."""
    return max(1, cores // (n_workers * threads_per_worker))


class ClusterClient(Client):
    """A ``Client`` that owns the cluster it was started with: ``close()`` (or leaving its
    ``with`` block) also closes ``client.cluster``; one still open when the interpreter
    exits is closed then, before distributed closes the clusters."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _OPEN.add(self)

    def close(self, timeout: Any = no_default) -> None:
        cluster = self.cluster
        try:
            super().close(timeout)
        finally:
            if cluster is not None:
                cluster.close()  # a no-op once closed


_OPEN: weakref.WeakSet[ClusterClient] = weakref.WeakSet()


@atexit.register  # after distributed's exit hooks (imported above), so it runs before them
def _close_open_clients() -> None:
    # distributed closes a script's clusters at exit before its clients: the workers went
    # while the scheduler still held what the client had scattered (from_pandas), and it
    # logged an ERROR about data lost. The client's close releases that data first.
    for client in list(_OPEN):
        with suppress(Exception):  # as distributed's own exit hooks: nothing left to tell
            client.close()


def local_cluster(
    n_workers: int | None = None,
    *,
    gpus: bool | str = "auto",
    threads_per_worker: int | None = None,
    memory_limit: Any = "auto",
    rmm_pool_size: Any = "auto",
    dashboard_address: str | int | None = "127.0.0.1:8787",
    security: bool | Security | None = None,
    **kwargs: Any,
) -> ClusterClient:
    """Start a local cluster on 127.0.0.1 and return a Client that owns it, once every
    worker has joined.

    Every argument is checked before anything starts.  ``client.cluster`` is the cluster;
    ``client.close()`` closes both.

    Parameters
    ----------
    n_workers : int, optional
        GPU cluster: one worker per visible GPU (default; respects CUDA_VISIBLE_DEVICES).
        CPU cluster: default ``cores // threads_per_worker`` workers (at least 1), the
        cores being those this process may use (dask's ``CPU_COUNT``: CPU affinity and a
        container's limit count); one per core with the default ``threads_per_worker``.
    gpus : {"auto", True, False}, default "auto"
        "auto": a ``LocalCUDACluster`` when dask-cuda is installed and sees a GPU, else a
        ``LocalCluster``.  True: require GPUs.  False: CPU workers only.
    threads_per_worker : int, optional
        Dask threads per worker, default 1.  Each task's torch gets
        ``cores // (n_workers * threads_per_worker)`` threads (at least 1), so the
        product never exceeds the cores; on GPU workers too, where host partitions are
        computed on the CPU (``device="auto"``).
    memory_limit : str, int, float or None, default "auto"
        Per worker: bytes, a string like "4GiB", a fraction of the machine's memory, "auto"
        (an equal share) or None (no limit).  dask pauses a worker at 80 % of it.
    rmm_pool_size : "auto", str, int, float or None, default "auto"
        GPU cluster: the RMM pool of each worker, also used by torch
        (``rmm_allocator_external_lib_list=["torch"]``) so that the two do not compete for
        device memory.  "auto": half of each GPU's memory when rmm is installed (the pool
        grows on demand), none otherwise.  Ignored by a CPU cluster under gpus="auto".
    dashboard_address : str, int or None, default "127.0.0.1:8787"
        Where the dashboard listens: a port, ":port" or "127.0.0.1:port"; None for no
        dashboard (distributed still serves its ``/health`` and ``/metrics`` routes on
        127.0.0.1, port 8787 or a free one, which ``client.dashboard_link`` names: its
        ``/status`` page is then not found).  If the port is taken, dask picks another
        (``client.dashboard_link``).
    security : bool or distributed.security.Security, optional
        True: TLS between client, scheduler and workers with throwaway certificates
        (``Security.temporary()``); or your own ``Security`` object.
    **kwargs
        Passed to ``LocalCUDACluster`` / ``LocalCluster`` (and from there to the nannies
        and workers), e.g. ``silence_logs``, ``local_directory``, ``device_memory_limit``;
        not ``processes`` or ``nthreads`` (TypeError: the workers are processes, with
        ``threads_per_worker`` threads each).

    Examples
    --------
    >>> client = dask_cosim.local_cluster()                    # every GPU, or every core
    >>> client = dask_cosim.local_cluster(2, memory_limit="4GiB", gpus=False)

    In a script, call it under ``if __name__ == "__main__":``: worker processes start by
    importing the script, and one that starts a cluster at import would start another.

    The worker processes ignore Ctrl-C (SIGINT), which a terminal sends to them too: the
    process that started them handles it, and closing the client stops them.

    The scheduler runs in this process, and its log with it: distributed's p2p shuffle
    logs two WARNING lines for every shuffle that starts and ends as it should
    ("Shuffle ... initialized by task ...", "... deactivated due to stimulus ..."; a
    clustered search shuffles twice).  Those two are left out of it; its other lines
    pass.
    """
    _check_main_guard()
    if gpus not in ("auto", True, False):
        raise ValueError(f"gpus={gpus!r}; use 'auto', True or False, e.g. gpus=False")
    n_workers = options.positive_int("n_workers", n_workers, "n_workers=2")
    threads_per_worker = options.positive_int("threads_per_worker", threads_per_worker,
                                              "threads_per_worker=1") or 1  # fmt: skip
    options.memory_size("memory_limit", memory_limit, '"4GiB"')
    _warn_if_memory_is_short(memory_limit, threads_per_worker)
    options.memory_size("rmm_pool_size", rmm_pool_size, '"20GB"')
    dashboard_address = _local_dashboard(dashboard_address)
    if security not in (None, True, False) and not isinstance(security, Security):
        raise TypeError(
            f"security={security!r}; use True for TLS with temporary certificates or a "
            "distributed.security.Security, e.g. security=True"
        )
    host = kwargs.pop("host", "127.0.0.1")
    if host not in _LOCAL_HOSTS:
        raise ValueError(
            f"host={host!r}: local_cluster listens on 127.0.0.1 only.  To serve other "
            "machines, start `dask scheduler` and `dask worker` (or `dask cuda worker`) "
            "yourself and connect with Client('tcp://HOST:8786')"
        )
    n_gpus = gpu_count() if gpus else 0
    if gpus is True and n_gpus == 0:
        raise RuntimeError(
            "gpus=True but no GPU is usable here: it needs an NVIDIA driver and "
            "`pip install 'dask-cosim[cuda12]'` (dask-cuda); use gpus='auto' to fall back to CPUs"
        )
    if gpus is False and rmm_pool_size not in ("auto", None):
        raise ValueError(
            f"rmm_pool_size={rmm_pool_size!r} applies to GPU workers only; drop it or "
            "use gpus='auto'"
        )
    if n_gpus and n_workers is not None and n_workers > n_gpus:
        raise ValueError(
            f"n_workers={n_workers} but only {n_gpus} GPU(s) are visible (see "
            "CUDA_VISIBLE_DEVICES); a GPU cluster runs one worker per GPU: use "
            f"n_workers={n_gpus} or fewer, or gpus=False for CPU workers"
        )
    common = dict(
        threads_per_worker=threads_per_worker,
        memory_limit=memory_limit,
        dashboard_address=dashboard_address,
        host="127.0.0.1",
        security=security or None,
        **kwargs,
    )
    if n_gpus:
        from dask_cuda import LocalCUDACluster

        _check_kwargs(kwargs, LocalCUDACluster)
        pool = _rmm_pool(rmm_pool_size)
        if pool is not None:
            common.setdefault("rmm_pool_size", pool)
            # One pool for RMM (cudf) and torch, instead of two allocators fighting.
            common.setdefault("rmm_allocator_external_lib_list", ["torch"])
        cluster: LocalCluster = LocalCUDACluster(n_workers=n_workers, **common)
        # Host partitions that device="auto" keeps on a GPU worker's CPU (the placement
        # rule) run on torch's threads there: the cores the GPU workers share.
        n_workers = n_workers or n_gpus
    else:
        _check_kwargs(kwargs, LocalCluster)
        n_workers = n_workers or max(1, CPU_COUNT // threads_per_worker)
        cluster = LocalCluster(n_workers=n_workers, processes=True, **common)
    plugins: list[WorkerPlugin] = [
        TorchThreads(torch_threads(n_workers, threads_per_worker)),
        IgnoreCtrlC(),
    ]
    _quiet_shuffle_lifecycle()
    try:
        client = ClusterClient(cluster)
        # Every worker joined, so that the first computation (and scheduler_info, which a
        # script may print) sees them all: under load one had not, the client connected
        # before its registration reached the scheduler.
        client.wait_for_workers(n_workers, timeout=_WORKERS_JOIN)
        for plugin in plugins:
            client.register_plugin(plugin)
        return client
    except BaseException:
        cluster.close()
        raise


# How long local_cluster waits for its workers to join, once started.
_WORKERS_JOIN = 60.0  # seconds


# What a CPU worker needs (docs/clusters.md, "Memory"): about 0.35 GiB once torch and
# pyarrow are loaded, near 1 GiB at its peak on a partition of our readers' size; 1.25 GiB
# workers paused there, and 1 GiB ones were killed in a clustered search's shuffle.
SHORT_MEMORY = 3 * 2**29  # 1.5 GiB


def _warn_if_memory_is_short(memory_limit: Any, threads_per_worker: int) -> None:
    """Warn when ``memory_limit`` gives each worker less than :data:`SHORT_MEMORY`: dask
    would pause it and restart it until the task fails (KilledWorker), its only words an
    "unmanaged memory" warning that reads like a leak."""

    from distributed.worker_memory import parse_memory_limit

    logger = logging.getLogger(__name__)
    limit = parse_memory_limit(memory_limit, threads_per_worker, CPU_COUNT, logger=logger)
    if limit is not None and limit < SHORT_MEMORY:
        warnings.warn(
            f"memory_limit={memory_limit!r} gives each worker {format_bytes(limit)}: a "
            "worker holds about 0.35 GiB once torch and pyarrow are loaded and nears 1 GiB "
            "on a partition, so dask would pause and restart it until the task fails "
            "(KilledWorker); give each worker at least '1.5GiB' (fewer workers, or "
            "memory_limit='1.5GiB')",
            errors.CosimWarning,
            stacklevel=3,  # the line that called local_cluster
        )


def describe(client: Client) -> str:
    """ "2 workers of 4.00 GiB, dashboard http://...": the cluster a client computes on."""
    workers = client.scheduler_info()["workers"].values()
    limits = {w.get("memory_limit") for w in workers}
    memory = ""
    if len(limits) == 1 and (limit := limits.pop()):
        memory = f" of {format_bytes(limit)}"
    count = f"{len(workers):,} worker{'' if len(workers) == 1 else 's'}"
    return f"{count}{memory}, dashboard {client.dashboard_link}"


class TorchThreads(WorkerPlugin):
    """Sets torch's threads in every worker, restarted ones included.

    dask starts workers with OMP_NUM_THREADS=1; this gives torch the cores that dask's own
    threads leave idle.  An environment variable would not do: a worker that imports torch
    before reading it (a spawned worker re-imports the user's main module) keeps 1.
    """

    name = "dask-cosim-torch-threads"

    def __init__(self, n: int) -> None:
        self.n = n

    def setup(self, worker: Worker) -> None:
        import torch

        torch.set_num_threads(self.n)


class IgnoreCtrlC(WorkerPlugin):
    """Makes a worker process ignore SIGINT, restarted ones included.

    A Ctrl-C in a terminal reaches every process of the foreground group: the worker
    processes too, each of which printed a KeyboardInterrupt traceback through asyncio
    while the process that owns the cluster stopped them anyway (closing the cluster).
    That process alone handles the Ctrl-C.  Workers that run no Python main thread of
    their own (``processes=False``) are left as they are.
    """

    name = "dask-cosim-ignore-ctrl-c"

    def setup(self, worker: Worker) -> None:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)


_GUARD = 'if __name__ == "__main__":'
_GUARD_HELP = (
    "every worker process starts by importing the script and would start a cluster of its "
    f"own; move the code from this call on (or a call to a main() that holds it) under `{_GUARD}`"
)


def _check_main_guard() -> None:
    """Raise before any process starts if the main script calls us outside its guard.

    Without the guard each spawned worker re-runs the script, which tries to start a
    cluster of its own while multiprocessing is still bootstrapping it: the user gets
    "Nanny failed to start" and a hundred lines of tracebacks from every process.
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        # A worker process re-running the script (a safety net for scripts whose source
        # could not be read below).
        raise RuntimeError(
            f"local_cluster() ran while a worker process was starting, outside `{_GUARD}`: "
            + _GUARD_HELP
        )
    where = _unguarded_main_call()
    if where is not None:
        raise RuntimeError(f"local_cluster() called at {where}, outside `{_GUARD}`: {_GUARD_HELP}")


def _unguarded_main_call() -> str | None:
    """Where the main script's top level calls us outside the guard ("'x.py', line N"), if
    it does and workers are spawned (so that they re-run the script); else None."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path or not str(path).endswith(".py"):
        return None  # a notebook, a REPL, python -c: children have no script to re-run
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name.endswith("__main__"):
        return None  # multiprocessing does not re-run a package's __main__ (python -m pkg)
    method = dask.config.get("distributed.worker.multiprocessing-method", "spawn")
    if method not in ("spawn", "forkserver"):
        return None
    frame: FrameType | None = inspect.currentframe()
    while frame is not None and not (
        frame.f_code.co_name == "<module>" and frame.f_globals is vars(main)
    ):
        frame = frame.f_back
    if frame is None:
        return None  # not called while the script's top level runs (a thread, a callback)
    line = frame.f_lineno
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test) and node.body:
            if node.body[0].lineno <= line <= (node.body[-1].end_lineno or line):
                return None
    return f"{str(path)!r}, line {line}"


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"``, either way round."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    if not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    texts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(texts) == 1


def _rmm_pool(size: Any) -> Any:
    if size == "auto":
        return 0.5 if importlib.util.find_spec("rmm") is not None else None
    return size


def _local_dashboard(address: str | int | None) -> str | None:
    """The dashboard on 127.0.0.1 (":8787" alone would listen on every interface)."""
    if address is None:
        return None
    if isinstance(address, int) and not isinstance(address, bool):
        return f"127.0.0.1:{address}"
    if isinstance(address, str):
        host, _, port = address.rpartition(":")
        if port.isdigit() and host in ("", *_LOCAL_HOSTS):
            return f"127.0.0.1:{port}"
    raise ValueError(
        f"dashboard_address={address!r}: use a port on 127.0.0.1, e.g. "
        "dashboard_address='127.0.0.1:8787' (':0' for any free port), or None"
    )


class _ShuffleLifecycle(logging.Filter):
    """Drops the p2p shuffle's lines about a shuffle starting and ending as it should."""

    ROUTINE = ("Shuffle %s initialized by task", "Shuffle %s deactivated due to stimulus")

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.ROUTINE))


def _quiet_shuffle_lifecycle() -> None:
    """:class:`_ShuffleLifecycle` on the logger of the p2p shuffle's scheduler plugin,
    once a process (worded otherwise in another distributed, its lines pass)."""
    logger = logging.getLogger("distributed.shuffle._scheduler_plugin")
    if not any(isinstance(f, _ShuffleLifecycle) for f in logger.filters):
        logger.addFilter(_ShuffleLifecycle())


# Keywords of the cluster and its workers that local_cluster sets itself: given, they were
# overridden without a word (nthreads, by threads_per_worker) or collided (processes).
_SET_HERE = {
    "nthreads": "each worker's threads are threads_per_worker, e.g. threads_per_worker=2",
    "processes": "it starts worker processes; for workers in this process, use "
    "distributed.LocalCluster(processes=False) and a Client of it",
}


def _check_kwargs(kwargs: dict[str, Any], cluster_class: type) -> None:
    """Unknown keywords fail here, not in a worker process after the scheduler started,
    and so do those local_cluster sets itself (:data:`_SET_HERE`)."""
    known: set[str] = set()
    for target in (*cluster_class.__mro__[:-1], Nanny, Worker):  # [:-1]: not object
        for p in inspect.signature(target).parameters.values():
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                known.add(p.name)
    for name in kwargs:
        if name in _SET_HERE:
            raise TypeError(f"local_cluster() takes no {name!r}: {_SET_HERE[name]}")
        if name not in known:
            hint = errors.did_you_mean(name, sorted((known - set(_SET_HERE)) | {"n_workers"}))
            if not hint and "thread" in name:
                hint = "; did you mean 'threads_per_worker'?"
            raise TypeError(f"local_cluster() got an unexpected keyword argument {name!r}{hint}")
