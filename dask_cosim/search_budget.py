"""How many pairs one task of a threshold search may hold, and the error past that.

A threshold search (``join`` / ``neighbors`` with ``threshold`` alone, and the pairs
``dedup`` and ``groups`` scan) returns every pair scoring at or above the threshold: its
size grows with the pairs found, not with the rows, and a low threshold on real
embeddings finds a sizeable fraction of all N x M pairs.  Each task counts its pairs as
its tiles find them (:class:`~dask_cosim._search_sweep.PairLimit`) and stops with
:class:`~dask_cosim.errors.ResultTooLargeError` once they would take more than
``cosim.search.max-result-bytes``, instead of running its worker out of memory (which
dask answers by restarting the worker, then ``KilledWorker``, without a word about why).
A task of ``dedup`` or ``groups``, which keep at most one entry a row of the pairs,
searches its rows again by blocks instead (:mod:`dask_cosim.search_reduced`).

The clustered search (``method="clustered"``, :mod:`dask_cosim.clustered`) counts its
pairs the same way: each task searching blocks, and each task holding the pairs gathered
into a partition of the frame.

Pairs are counted at :data:`PAIR_BYTES` each, what one takes in a task's frame of
pairs.  Finding the pairs and framing them, and sorting a merged partition's pairs
(with them), take up to about 1.9 times as much at their peak (measured,
``python -m benchmarks.pair_memory``).  The merge of an output partition receives the
pairs of every pair task that feeds it, each task within the budget: :func:`check_total`
sums their counts before they move (:meth:`~dask_cosim.search_graph.Builder.checked`), so
that a merge past the budget never gathers them.  And :func:`counted` keeps a running
total of each merge's counts as its pair tasks finish, so that a threshold far too low
stops at the first tasks that show it: waiting for all of them let the pairs of every
merge fill the workers' memory, and dask pauses a full worker, which then runs no task,
not even the check (the search hung).  groups' merges reduce the edges they
receive to a forest of at most a row each: :func:`check_tree` bounds what each receives.
Hence the share "auto" takes: :data:`AUTO_SHARE` of the memory of one thread, the
worker's memory limit over its threads (distributed), else the memory available over the
CPUs (local schedulers, eager frames).  Read on the worker that runs the task.  The
clustered search's tasks peak at about 2 times the bytes a pair, and its shuffles hold
what dask's hold beside them (:data:`CLUSTERED_AUTO_SHARE`).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from dask.utils import format_bytes

from dask_cosim._search_sweep import PairLimit, TooManyPairs
from dask_cosim.errors import ResultTooLargeError

__all__ = [
    "AS_DASK_FRAME",
    "AUTO_SHARE",
    "CLUSTERED_AUTO_SHARE",
    "MORE_FRAME_PARTITIONS",
    "MORE_PARTITIONS",
    "PAIR_BYTES",
    "Budget",
    "check_total",
    "check_tree",
    "collecting",
    "counted",
]

# Bytes of one pair in a task's frame of pairs: the left row's position and ordering
# key, two int64 labels and the score (carried columns come on top).
PAIR_BYTES = 40
# "auto": the pairs of one task may take this fraction of one thread's memory.  Not more,
# though the tasks now peak at 1.9 times their pairs, not 2.8: at 1/6, neighbors at 0.1
# of 40,000 x 64 rows in 8 partitions on 1.5 GiB workers (1 thread) let every pair task
# through, and the merge of an output partition then had 1.56 GiB of inputs (dask's
# MemoryError before it runs, where 1/8 stopped a pair task with this module's error).
AUTO_SHARE = 1 / 8
# The same for the clustered search, whose tasks peak at 75 to 80 bytes a pair
# (benchmarks.pair_memory, 4.3M pairs: a task searching blocks +75 above its routed
# rows; the pairs gathered into a partition, 40, finished +38), beside its routing
# shuffle's buffers: at 1/8, neighbors at 0.1 of 10,000 x 64 rows in 4 partitions still
# had a 1.5 GiB worker killed (p2p shuffle, block tasks within the budget); at 1/16 a
# block task stops with the error.
CLUSTERED_AUTO_SHARE = 1 / 16
# Where the docs say more, by method.
DOCS = {"exact": "docs/similarity-search.md", "clustered": "docs/clustered.md"}
# How an exact search's pair task gets fewer pairs.
MORE_PARTITIONS = (
    "split the frame into more partitions (fewer pairs per task; a side is cut into at "
    "most cosim.search.max-blocks blocks)"
)
# The same, where the frame's sides are as many as cosim.search.max-blocks allows already:
# more partitions would be searched in as many blocks, each holding more of them.
MORE_BLOCKS = (
    "raise cosim.search.max-blocks (the frame is searched in {blocks} blocks, the most it "
    "allows now, so more partitions alone make no smaller tasks; the pair tasks grow as "
    "the square of the blocks)"
)
# How a clustered search's task holding the pairs gathered into a partition of the
# frame gets fewer.
MORE_FRAME_PARTITIONS = (
    "split the frame into more partitions (each gathers the pairs of its own rows)"
)
# Either, for an eager frame: it is one partition.
AS_DASK_FRAME = (
    "search it as a dask frame of several partitions, dask_cosim.from_pandas(df, "
    "npartitions=8) (fewer pairs per task)"
)


@dataclass(frozen=True)
class Budget:
    """What the tasks of one search may hold: ``setting`` is
    ``cosim.search.max-result-bytes`` as :func:`dask_cosim.options.search_max_result_bytes`
    checked it ("auto" or bytes, part of the graph's keys); ``op``, ``column``,
    ``threshold`` and ``method`` ("exact" or "clustered") name the search in the error,
    and ``method`` picks the share of memory "auto" takes; ``eager``: the frame is one
    (pandas, cudf), which no advice to split into more partitions fits; ``blocks``: the
    sides a dask frame is searched in where they are ``cosim.search.max-blocks`` already
    (advice of more partitions would not help: :data:`MORE_BLOCKS`), else None."""

    setting: int | str
    op: str
    column: str
    threshold: float | None
    method: str = "exact"
    eager: bool = False
    blocks: int | None = None

    def allowed(self) -> tuple[int, str]:
        """The bytes one task may hold here, and where that number comes from."""
        key = f"cosim.search.max-result-bytes={self.setting!r}"
        if self.setting != "auto":
            return int(self.setting), key
        memory, threads, what = _memory()
        fraction = AUTO_SHARE if self.method == "exact" else CLUSTERED_AUTO_SHARE
        share = int(memory * fraction / threads)
        per = f"1/{round(1 / fraction)} of {what} ({format_bytes(memory)})"
        return share, f"{key}: {per} per thread, {threads} thread{'s' * (threads > 1)}"

    def most_pairs(self) -> int:
        """The most pairs one task may hold here."""
        return self.allowed()[0] // PAIR_BYTES

    def limit(self) -> PairLimit:
        return PairLimit(self.most_pairs())

    def check(self, found: int, where: str, fewer: str | None = None) -> None:
        """Raise the error when ``found`` pairs are more than one task may hold."""
        if found > self.most_pairs():
            raise self.error(found, where, fewer)

    def error(self, found: int, where: str, fewer: str | None = None) -> ResultTooLargeError:
        """The error for a task (``where``) that found ``found`` pairs; ``fewer``: how that
        task gets fewer pairs, where not as an exact search's (:data:`MORE_PARTITIONS`)."""
        allowed, why = self.allowed()
        fixes = ["raise the threshold"]
        if self.op in ("join", "neighbors") and self.method == "exact":
            fixes.append("give k= to keep each row's k best matches")
        if fewer is None and self.op != "groups":  # its components need every pair in one task
            fewer = MORE_PARTITIONS
        if self.eager and fewer in (MORE_PARTITIONS, MORE_FRAME_PARTITIONS):
            fewer = AS_DASK_FRAME
        elif self.blocks is not None and fewer == MORE_PARTITIONS:
            fewer = MORE_BLOCKS.format(blocks=self.blocks)
        if fewer is not None:
            fixes.append(fewer)
        fixes.append("set a larger cosim.search.max-result-bytes where the workers have the memory")
        method = "" if self.method == "exact" else f", method={self.method!r}"
        return ResultTooLargeError(
            f"{self.op}(threshold={self.threshold!r}{method}) on column {self.column!r}: {where} "
            f"found {found:,} pairs ({format_bytes(found * PAIR_BYTES)} at {PAIR_BYTES} "
            f"bytes a pair), more than one task may hold, {format_bytes(allowed)} ({why}); "
            "stopped before its worker runs out of memory. A threshold search's result "
            f"grows with the pairs found, not with the rows: {', '.join(fixes[:-1])}, or "
            f'{fixes[-1]} ({DOCS[self.method]}, "Memory")'
        )


def check_total(budget: Budget, where: str, *counts: int, ledger: str | None = None) -> None:
    """``budget``'s error, naming ``where``, when the pair tasks that found ``counts``
    pairs together found more than one task may hold: the check of a merge's inputs
    while they are still on the workers that found them.  ``ledger``: the running total
    :func:`counted` kept for them, dropped here (a distributed scheduler drops it with
    this task)."""
    if ledger is not None:
        with _LOCK:
            _LEDGERS.pop(ledger, None)
    budget.check(sum(counts), f"{where} (the pairs of its {len(counts)} pair tasks)")


def counted(item: Any, budget: Budget, where: str, ledger: str, index: int, tasks: int) -> int:
    """The pairs of ``item``, the ``index``-th of the ``tasks`` pair tasks a merge
    receives, recorded in the merge's running total, ``ledger`` (the key of its
    :func:`check_total` task, "<the search>-<the merge>"); ``budget``'s error, naming
    ``where``, once the pairs of those recorded so far are more than one task may hold.
    On a distributed worker the total is kept in the scheduler's task metadata under
    ``ledger``, which the scheduler forgets with that task; elsewhere in this process.
    Each task's count replaces what it recorded before (a task run twice, or the graph
    computed again, counts once), so the total never exceeds what :func:`check_total`
    sums: it raises only where that would, and sooner.  A task within its share of the
    budget (1 / ``tasks`` of it) records nothing: tasks within theirs alone never exceed
    it, and a search well within its budget then makes no call to the scheduler (two a
    task made 32 partitions of 20,000 rows 1.4 times slower to search).  A task that
    finishes after its search was cancelled (or stopped) records after the scheduler
    forgot the merge: its count stays behind, a few numbers, until that search runs
    again."""
    count = len(item)
    most = budget.most_pairs()
    if count * tasks <= most:
        return count
    recorded = _record(ledger, index, count)
    total = sum(recorded.values())
    if total > most:
        # The search stops: its other merges' totals go too (those of any search with
        # an equal budget, named alike: a total dropped early only counts less).
        search = ledger.rsplit("-", 1)[0]
        with _LOCK:
            for name in [name for name in _LEDGERS if name.rsplit("-", 1)[0] == search]:
                del _LEDGERS[name]
        seen = len(recorded)
        which = f"its {tasks} pair tasks"
        if seen < tasks:
            which = f"{seen} of its {tasks} pair tasks, finished before the rest"
        raise budget.error(total, f"{where} (the pairs of {which})")
    return count


# Running totals of the merges computed in this process (local schedulers): ledger ->
# {pair task: pairs}, the oldest dropped past MOST_LEDGERS (those of searches stopped by
# another error stay behind, and so does the count of a task that finished after its
# search stopped; a total dropped early only counts less).
_LEDGERS: OrderedDict[str, dict[int, int]] = OrderedDict()
MOST_LEDGERS = 10_000
_LOCK = threading.Lock()


def _record(ledger: str, index: int, count: int) -> dict[Any, int]:
    """``ledger`` once ``count`` is recorded in it as task ``index``'s: {task: pairs}.
    On a distributed worker, two calls to the scheduler, each answered in the order it
    came: of the tasks recording at once, the last to read sees every count."""
    try:
        from distributed import get_client, get_worker

        get_worker()
    except (ImportError, ValueError):
        with _LOCK:
            book = _LEDGERS.setdefault(ledger, {})
            book[index] = count
            while len(_LEDGERS) > MOST_LEDGERS:
                _LEDGERS.popitem(last=False)
            return dict(book)
    client = get_client()
    client.set_metadata([ledger, str(index)], count)
    return dict(client.get_metadata([ledger], {}))


def check_tree(budget: Budget, where: str, split_every: int, rows: list[int], *counts: int) -> None:
    """``budget``'s error, naming ``where``, when a merge of a tree of merges of
    ``counts`` edges, ``split_every`` at a time, would receive more than one task may
    hold, each merge giving at most the rows of all ``rows`` (a forest of them): as
    :func:`check_total` for merges that reduce what they receive."""
    level, largest, most_out = list(counts), 0, sum(rows)
    while len(level) > 1:
        sums = [sum(level[s : s + split_every]) for s in range(0, len(level), split_every)]
        largest = max(largest, *sums)
        level = [min(n, most_out) for n in sums]
    budget.check(largest, f"{where} (the edges of at most {split_every} tasks)")


@contextmanager
def collecting(
    budget: Budget | None, where: str, fewer: str | None = None
) -> Iterator[PairLimit | None]:
    """The limit to hand a search's kernels (None: no ``budget``), its
    :class:`~dask_cosim._search_sweep.TooManyPairs` turned into ``budget``'s error,
    naming the task by ``where`` ("partitions 0 and 3"), ``fewer`` as
    :meth:`Budget.error` takes it."""
    if budget is None:
        yield None
        return
    try:
        yield budget.limit()
    except TooManyPairs as stop:
        raise budget.error(stop.found, where, fewer) from None


def _memory() -> tuple[int, int, str]:
    """(bytes, threads sharing them, what they are): the memory limit of the worker
    running this task, else the memory available now (within a container's limit) and
    the CPUs."""
    try:
        from distributed import get_worker

        worker = get_worker()
        limit = worker.memory_manager.memory_limit
        if limit:
            return int(limit), max(1, worker.state.nthreads), "the worker's memory limit"
    except (ImportError, ValueError, AttributeError):
        pass
    import psutil
    from distributed import system

    # psutil sees the host's memory; distributed's limit sees a container's (cgroups) and
    # RLIMIT_RSS too, as a worker's default memory limit does.
    available = min(psutil.virtual_memory().available, system.MEMORY_LIMIT)
    return int(available), max(1, os.cpu_count() or 1), "the memory available"
