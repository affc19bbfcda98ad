"""The graph of a search, its building blocks: tasks (calls now, for eager frames), blocks
of consecutive partitions (or, on a cluster with more threads than the partitions keep
busy, ranges of each partition's rows: :func:`pieces`), and each block's normalised side.

:mod:`dask_cosim.search` builds ``topk``, ``join``, ``neighbors``, ``dedup`` and
``groups`` from these; the per-partition functions they map are in
:mod:`dask_cosim.search_partition` (dask-free).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import dask
import dask.dataframe as dd
import numpy as np
from dask.base import tokenize
from dask.delayed import Delayed

from dask_cosim import backends
from dask_cosim import search_partition as sp
from dask_cosim import search_results as sr
from dask_cosim.io import scattered
from dask_cosim.io.convert import (
    active_client,
    futures_of,
    held_where_it_is,
    objects_kept,
    vectors_as_arrow,
)
from dask_cosim.search_budget import Budget, check_total, check_tree, counted

__all__ = [
    "Builder", "Options", "block_bounds", "holds_data", "meta_of", "pairs_of", "pieces", "sides",
]  # fmt: skip

# Tasks a search gives each thread of a distributed cluster, where its partitions are
# few: a worker thread runs one task at a time, and the pair tasks of a self-search
# differ in size (the diagonal ones are half the others), so with one task a thread the
# threads given the small ones wait for the rest.
TASKS_PER_THREAD = 4


@dataclass(frozen=True)
class Options:
    """The options a search's tasks take, read once when its graph is built."""

    eps: float
    device: str
    tile_bytes: dict[str, int]
    split_every: int
    precision: str
    max_blocks: int
    max_result_bytes: int | str


def meta_of(obj: Any) -> Any:
    return obj._meta if dask.is_dask_collection(obj) else obj


class Builder:
    """Calls a function now (eager frames) or adds it to a graph (dask collections)."""

    def __init__(self, lazy: bool) -> None:
        self.lazy = lazy

    def __call__(self, fn: Callable[..., Any], nout: int | None = None) -> Callable[..., Any]:
        if self.lazy:
            return dask.delayed(fn, pure=True, nout=nout)  # type: ignore[no-any-return]
        return fn

    def shared(self, obj: Any) -> Any:
        """``obj`` (a task that many tasks take) with the graph behind it as one layer;
        itself when eager.  dask merges the layers of a task's inputs into its own graph
        at each call: an input with thousands of layers behind it (``groups``' components,
        after every pair task), taken by a task per partition, made building the graph
        quadratic in the partitions (1,000 partitions: 24 s)."""
        if not self.lazy:
            return obj
        graph = dict(obj.__dask_graph__())
        return Delayed(obj.key, graph, length=getattr(obj, "_length", None))

    def value(self, obj: Any, name: str, token: Callable[[Any], str] = tokenize) -> Any:
        """``obj`` as one key; itself when eager (and then not hashed).  With an active
        distributed client it is scattered to every worker (the queries of topk and an
        eager side, which every pair task reads) rather than sent inside the graph
        ("Sending large graph"), under a key of its own, ``name``-<random>; a copy on
        each worker also outlives the death of one of them (a local scheduler gathers it
        back: :mod:`dask_cosim.io.scattered`).  Else it is in the graph, named
        ``name``-``token(obj)``."""
        if not self.lazy:
            return obj
        client = active_client()
        if client is None:
            return dask.delayed(obj, name=f"{name}-{token(obj)}")
        # Never a key an earlier scatter used: the release of that copy (the client's
        # batched stream) can reach the scheduler after this scatter (an RPC), and would
        # then release this copy too, under the tasks that need it.
        key = f"{name}-{uuid.uuid4().hex}"
        futures = scattered.scatter(client, {key: obj}, broadcast=True, hash=False)
        return dask.delayed(futures[key])

    def partitions(self, obj: Any) -> list[Any]:
        """``obj``'s partitions (one key, :meth:`value`, for an eager frame).  Those of a
        frame scattered to a client's workers (``from_pandas`` under a client) each
        depend on a task that holds its futures: the graph of ``to_delayed()`` names
        them without holding them, so a search whose input frame was dropped before it
        was computed would find them released ("lost dependencies").  RuntimeError where
        the client that scattered them has closed: they are gone.  The partitions are
        those of ``obj`` optimised (projections and filters pushed into its reads) but
        not fused, as dask computes a frame beside other collections: their keys are
        then the frame's own, and a step before the search (an embedding model after a
        Parquet read) runs once for both, where the fused read-and-model task of
        ``to_delayed()`` matched no key and ran it again."""
        if not dask.is_dask_collection(obj):
            return [self.value(obj, "cosim-frame", backends.data_token)]
        parts = list(obj.optimize(fuse=False).to_delayed(optimize_graph=False))
        futures = futures_of(obj)
        if not futures:
            return parts
        closed = [f.client for f in futures if f.client.status in ("closing", "closed")]
        if closed:
            raise RuntimeError(
                f"this frame's partitions were scattered to the workers of {closed[0]!r}, "
                "which has closed: they are gone with it (dask_cosim.from_pandas under a "
                "client scatters them); build the frame again under the client that computes"
            )
        active = active_client()
        owners = {id(f.client): f.client for f in futures}.values()
        if active is not None and not any(_same_scheduler(active, c) for c in owners):
            raise RuntimeError(
                f"this frame's partitions were scattered to the workers of "
                f"{futures[0].client!r}, but {active!r} computes now, whose workers do not "
                "hold them (dask_cosim.from_pandas under a client scatters them); compute "
                "under the frame's client (with client.as_current(): ...), or build the "
                "frame again under this one"
            )
        held = self(held_where_it_is)(*[self(held_where_it_is)(dask.delayed(f)) for f in futures])
        return [self(_with)(part, held) for part in parts]

    def cut(self, parts: list[Any], pieces: int) -> list[Any]:
        """Each of ``parts`` as ``pieces`` consecutive ranges of its rows, in frame
        order (:func:`pieces`); ``parts`` themselves for 1."""
        if pieces == 1:
            return parts
        return [self(_rows_of)(part, k, pieces) for part in parts for k in range(pieces)]

    def rejoin(
        self, outs: list[Any], pieces: int, renumber: bool = False, budget: Budget | None = None
    ) -> list[Any]:
        """The outputs of :meth:`cut`'s ranges, ``pieces`` at a time, as one per
        partition they were cut from; ``renumber``: index them 0, 1, ... (a result's
        rows), else keep their labels (the input's rows).  With a threshold search's
        ``budget``, each join is a merge like any other (:meth:`checked`): it runs only
        once its pairs' total fits one task."""
        if pieces == 1:
            return outs
        join = functools.partial(_concat, renumber=renumber)
        groups = [outs[s : s + pieces] for s in range(0, len(outs), pieces)]
        return [
            self.tree(
                group,
                join,
                pieces,
                self.checked(group, budget, f"the merge of output partition {p}"),
            )
            for p, group in enumerate(groups)
        ]

    def tree(
        self,
        items: list[Any],
        combine: Callable[..., Any],
        split_every: int,
        after: Any = None,
    ) -> Any:
        """``items`` merged by ``combine``, ``split_every`` at a time, until one is left.
        ``after``: a task every merge depends on (and ignores), so that the scheduler
        sends no item to a merge before it has run: :meth:`checked`'s check."""
        step = self(combine if after is None else functools.partial(_after, combine))
        first = () if after is None else (after,)
        while len(items) > 1:
            items = [
                step(*first, *items[s : s + split_every]) for s in range(0, len(items), split_every)
            ]
        return items[0]

    def checked(
        self, items: list[Any], budget: Budget | None, where: str, *,
        tree: tuple[int, list[Any]] | None = None,
    ) -> Any:  # fmt: skip
        """A task that raises ``budget``'s error, naming ``where``, when the pairs of
        ``items`` (frames of pairs, or arrays of edges: their lengths) together are more
        than one task may hold; for :meth:`tree`'s ``after``, so that the items of a
        merge move to one worker only once their total fits.  Each pair task, within
        the budget alone, cannot know what the merge will receive.  It adds a task per
        item (its length, run where the item is, recorded in the merge's running total:
        :func:`~dask_cosim.search_budget.counted`) and this one; None without a budget
        (a k-search's merges keep k a row), or for a single item (no merge, and its
        pair task checked itself).  ``tree``: (split_every, the rows of each side) for
        merges that reduce their edges to a forest (:func:`check_tree`)."""
        if budget is None or len(items) < 2:
            return None
        if tree is not None:
            counts = [self(len)(item) for item in items]
            return self(check_tree)(budget, where, tree[0], tree[1], *counts)
        if not self.lazy:
            return check_total(budget, where, *map(len, items))
        ledger = f"cosim-merge-check-{tokenize(budget)}-{tokenize(where, [i.key for i in items])}"
        count = self(counted)
        counts = [count(item, budget, where, ledger, i, len(items)) for i, item in enumerate(items)]
        return self(check_total)(budget, where, *counts, ledger=ledger, dask_key_name=ledger)

    def collect(self, outs: list[Any], meta: Any, divisions: Any = None) -> Any:
        if not self.lazy:
            return outs[0]
        # The partitions come back with the dtypes they were computed with: dask's string
        # conversion would turn an object column (vectors of a frame built without it)
        # into text, in the meta and the data alike.
        with objects_kept():
            return dd.from_delayed(outs, meta=meta, divisions=divisions, verify_meta=False)


def block_bounds(n: int, max_blocks: int) -> list[tuple[int, int]]:
    """Consecutive partitions [a, b) searched together: one each, unless there are more
    than ``max_blocks`` (the pair tasks grow as their square)."""
    cuts = np.linspace(0, n, min(n, max_blocks) + 1).round().astype(int)
    return list(zip(cuts[:-1].tolist(), cuts[1:].tolist()))


def pieces(build: Builder, df: Any, opts: Options, tasks: Callable[[int], int]) -> int:
    """Ranges of rows each partition of ``df`` is searched in (:meth:`Builder.cut`): 1,
    unless a distributed client of two threads or more runs the search and ``df``'s
    partitions are too few to give each of its threads :data:`TASKS_PER_THREAD` tasks;
    ``tasks(n)``: the search's tasks for n sides of ``df`` (a self-search n (n + 1) / 2
    pairs, ``topk`` n).  Never more sides than ``opts.max_blocks``.  100,000 x 384 rows
    in 2 partitions, dedup on 2 one-thread workers: 49.7 s, one worker busy for 46 s of
    it; cut into 4 sides, 39.8 s."""
    client = active_client() if build.lazy and dask.is_dask_collection(df) else None
    threads = sum(client.nthreads().values()) if client is not None else 1
    if threads < 2:  # one thread runs the tasks one after the other, however many
        return 1
    want = TASKS_PER_THREAD * threads
    n = max(1, df.npartitions)
    most = max(1, opts.max_blocks // n)
    return next((cut for cut in range(1, most + 1) if tasks(n * cut) >= want), most)


def pairs_of(n: int) -> int:
    """The pair tasks of a self-search of ``n`` sides: the upper triangle, diagonal in."""
    return n * (n + 1) // 2


def sides(
    build: Builder,
    df: Any,
    on: str,
    opts: Options,
    payload: Sequence[Any] = (),
    frames: list[Any] | None = None,
    cut: int = 1,
    frame: str = "",
) -> list[Any]:
    """One normalised side per block of ``df[on]`` (carrying the ``payload`` columns);
    ``frame``: "left" or "right" for a join's sides (errors name it).

    ``frames``: the partitions of the whole of ``df`` where the caller's graph has them
    (dedup and groups return whole rows, matched to the sides' rows by position), cut as
    ``cut`` says already.  The sides are taken from a projection of ``df`` where that
    reads the same rows again, narrower (:func:`rereads_alike`: a Parquet read reads only
    the columns the sides need), each partition in ``cut`` ranges of rows
    (:func:`pieces`); else from ``frames``, or the whole of ``df``'s partitions, so that
    the graph computes each partition once, and shares it with what else is computed
    with it (the frame, another search: a projection of a ``map_partitions`` output is a
    task of its own, which ran the function again).  A side's partition number, for
    messages, is the partition its rows came from.
    """
    prep = build(sp.prepare_side)
    # A prepared frame's companion columns travel with the vectors (prepare_side reads
    # them instead of the vectors' norms).
    ready = [sp.companion(on, w) for w in sp.COMPANIONS]
    ready = ready if all(c in meta_of(df).columns for c in ready) else []
    keep = [on, *ready, *[c for c in payload if c not in (on, *ready)]]
    # (A lazy graph may hold an eager frame: a join's side; its projection is pandas'.)
    lazy = dask.is_dask_collection(df)
    alike = lazy and rereads_alike(df)
    if frames is not None and not alike:
        parts, columns = frames, keep
    elif lazy and not alike:
        parts, columns = build.cut(build.partitions(df), cut), keep
    else:
        projected = df[keep]
        if build.lazy and not lazy and on not in payload:
            # An eager frame in a graph is hashed, and sent to the workers, as one key:
            # an object column's cells one by one.
            projected = vectors_as_arrow(projected, on)
        parts, columns = build.cut(build.partitions(projected), cut), None
    concat = functools.partial(sr.concat_frames, columns=columns)
    blocks = [
        parts[a] if b == a + 1 else build(concat)(*parts[a:b])
        for a, b in block_bounds(len(parts), opts.max_blocks)
    ]
    return [
        prep(
            p, on, i, eps=opts.eps, device=opts.device, payload=list(payload) or None,
            precision=opts.precision, source=i // cut if lazy else None, frame=frame,
        )
        for i, p in enumerate(blocks)
    ]  # fmt: skip


def rereads_alike(df: Any) -> bool:
    """Whether a column projection of the dask frame ``df`` reads each partition's rows
    again, narrower, in the same order: its expression is a read of storage that reads
    the columns asked for alone (``read_parquet``, ours or dask's; ``read_csv``; not a
    frame held in memory, nor ``from_map`` of a function that makes whole partitions)
    under row-wise steps alone (projections, ``assign``, ``astype``, arithmetic: dask's
    Elemwise; filters).  Anything else upstream (a shuffle, a merge, ``set_index``,
    ``map_partitions``, a model embedding the rows, a persisted frame) would run a second
    time for the projection, and a shuffle gives its rows in another order each time:
    the positions found in one would then name other rows of the other."""
    for expr in df.expr.simplify().walk():  # the optimizer's first step; touches no data
        kind = backends.expression_kinds(expr)
        if kind & {"BlockwiseIO"}:
            in_memory = kind & {"FromPandas", "FromArray", "FromGraph"}
            if in_memory or "columns" not in getattr(type(expr), "_parameters", ()):
                return False
        elif not kind & {"Elemwise", "Filter"}:
            return False
    return True


def holds_data(df: Any) -> bool:
    """Whether the graph of the dask frame ``df`` holds the data of its partitions
    (``dd.from_pandas``, which ``dask_cosim.from_pandas`` calls without a client): a
    column projection of it is then a second copy of that data in the graph, where one of
    a Parquet read is a narrower read."""
    return bool(backends.in_memory_sources(df))


def _same_scheduler(a: Any, b: Any) -> bool:
    """Whether the clients ``a`` and ``b`` talk to one scheduler: by its address, else
    (one scheduler reached as 127.0.0.1 and as localhost) by the id it reports."""
    if a is b or a.scheduler.address == b.scheduler.address:
        return True
    try:
        return bool(a.scheduler_info()["id"] == b.scheduler_info()["id"])
    except Exception:  # a scheduler that does not answer is none to compute on
        return False


def _rows_of(part: Any, k: int, pieces: int) -> Any:
    """Range ``k`` of ``pieces`` (about equal, consecutive) of ``part``'s rows."""
    n = len(part)
    return part.iloc[n * k // pieces : n * (k + 1) // pieces]


def _concat(*parts: Any, renumber: bool) -> Any:
    # dask's pandas concat takes ignore_index but does not pass it on to pd.concat.
    out = sr.concat_frames(*parts)
    return out.reset_index(drop=True) if renumber else out


def _after(combine: Callable[..., Any], _check: None, *parts: Any) -> Any:
    """``combine(*parts)``, as a task that waited for ``_check`` (see :meth:`Builder.tree`)."""
    return combine(*parts)


def _with(part: Any, _held: None) -> Any:
    """``part``, as a task that depends on (and so holds) a frame's scattered futures."""
    return part
