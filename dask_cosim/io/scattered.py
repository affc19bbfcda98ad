"""What this package scatters to a distributed client's workers, readable by dask's local
schedulers too.

Under an active client, :func:`~dask_cosim.from_pandas` scatters the partitions it
converts, and a search its eager inputs (topk's queries, join's eager side): graphs built
from them then name the scattered keys, which only the distributed scheduler holds.  A
local scheduler (``compute(scheduler="sync")``, which dask's docs give for debugging with
pdb, ``"threads"`` or ``"processes"``) runs only the graph it is given, and a key the graph lacks is
"Missing dependency".  :func:`scatter` remembers each key it scatters; a callback of
dask's local schedulers (their ``start`` hook, through which ``dask.cache.Cache`` gives
them the values it holds) adds, to a graph that names such keys without holding them,
each one's value, gathered from the workers when the computation starts.  The
distributed scheduler does not run these callbacks: with the client, the data stays on
the workers and the graph stays small.

dask gives its global callbacks only to the first local computation they meet: one that
starts while another thread runs one does not see them, and still finds its keys
missing.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections.abc import MutableMapping
from contextlib import suppress
from typing import Any

from dask._task_spec import DataNode
from dask.callbacks import Callback

__all__ = ["scatter"]

# Key -> the Future that scattered it, while something holds that Future (a frame, a
# graph): once it is dropped the client releases the data, and nothing can read it.
_SCATTERED: weakref.WeakValueDictionary[Any, Any] = weakref.WeakValueDictionary()
_LOCK = threading.Lock()


def scatter(client: Any, data: Any, **kwargs: Any) -> Any:
    """``client.scatter(data, **kwargs)``, its futures remembered for the local
    schedulers."""
    from distributed import futures_of

    futures = client.scatter(data, **kwargs)
    with _LOCK:
        for future in futures_of(futures):
            _SCATTERED[future.key] = future
        _register()
        if not _AT_EXIT:  # (distributed is imported by now: this hook runs before its own)
            atexit.register(_release_at_exit)
            _AT_EXIT.append(True)
    return futures


_AT_EXIT: list[bool] = []


def _release_at_exit() -> None:
    """Release what dask_cosim scattered, client by client, before distributed's exit
    hooks close a script's clusters (they close the clusters first, then the clients): a
    scheduler losing the workers that held scattered data logs an ERROR ("caused the
    cluster to lose scattered data") at the exit of a script that left its own client
    open, where ``dd.from_pandas`` says nothing.  Only those futures are cancelled: the
    client stays open for exit hooks of the user's that run after this one.  The cancel
    travels on the client's batched stream, which nothing waits for: this asks the
    scheduler until it holds none of them (2 s at most).
    :func:`dask_cosim.local_cluster`'s clients are closed at exit for the same reason."""
    with _LOCK:
        futures = [f for f in list(_SCATTERED.values()) if f is not None]
    for group in _by_client(futures):
        client = group[0].client
        if client.asynchronous or client.status != "running":
            continue  # (an event loop's client: nothing can wait for it here)
        with suppress(Exception):  # as distributed's own exit hooks: nothing left to tell
            keys = [f.key for f in group]
            client.cancel(group)
            deadline = time.monotonic() + 2.0
            # (The scheduler's who_has by key: the client's refuses cancelled futures.)
            while time.monotonic() < deadline and any(
                client.sync(client.scheduler.who_has, keys=keys).values()
            ):
                time.sleep(0.01)


class _LocalReads(Callback):
    """Gives a local scheduler's graph the values of the scattered keys it names."""

    def _start(self, dsk: MutableMapping[Any, Any]) -> None:
        with _LOCK:
            held = {key: _SCATTERED.get(key) for key in list(_SCATTERED.keys()) if key not in dsk}
        if not held:
            return
        named = set().union(*(getattr(node, "dependencies", ()) for node in dsk.values()))
        futures = [f for key, f in held.items() if key in named and f is not None]
        for group in _by_client(futures):
            client = group[0].client
            try:
                values = client.gather(group)
            except Exception as err:
                raise _unreadable([f.key for f in group], client, err) from err
            for future, value in zip(group, values):
                dsk[future.key] = DataNode(future.key, value)


def _by_client(futures: list[Any]) -> list[list[Any]]:
    """``futures`` in groups of one client's each (a gather or cancel is per client)."""
    groups: dict[int, list[Any]] = {}
    for future in futures:
        groups.setdefault(id(future.client), []).append(future)
    return list(groups.values())


def _unreadable(keys: list[Any], client: Any, err: Exception) -> RuntimeError:
    """The data a local computation needs could not be gathered from ``client``."""
    return RuntimeError(
        f"this computation reads {len(keys)} piece(s) of data (key {keys[0]!r}"
        f"{' and others' if len(keys) > 1 else ''}) that dask_cosim scattered to the "
        f"workers of {client!r}: a frame made by dask_cosim.from_pandas, or the queries of "
        "topk or the eager frame of a join, while that client was active; a local "
        "scheduler gathers them from those workers when it starts, and that failed "
        f"({type(err).__name__}: {err}). Compute with that client while it runs, or build "
        "the frame (and the search) again: without an active client its data stays in "
        "the graph"
    )


_READS = _LocalReads()


def _register() -> None:
    """The callback in ``Callback.active`` (again: a local computation running in another
    thread puts back, when it ends, the callbacks it found when it started)."""
    if _READS._callback not in Callback.active:
        _READS.register()
