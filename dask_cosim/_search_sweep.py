"""Walking the score matrix of an exact search one tile at a time, on one thread or
split among several.

Kernels only (tensors in, tensors out; used by :mod:`dask_cosim.search_kernels`).
:func:`sweep` multiplies every tile of ``q @ r.T`` (unit rows) into one buffer per
thread and hands it to a *part*: :class:`TopkPart` offers it to per-row candidate states
(:mod:`dask_cosim._search_tiles`), :class:`NumbaPairs` and :class:`TorchPairs` collect
the entries at or above each row's bar; :func:`compact` keeps the pairs decided, in
place (a task's pairs, not a second copy of them, are its peak).

Threads.  On a CPU, called from the main thread with torch set to several threads, the
column tiles are dealt among that many Python threads (tile t to thread t mod n, which
balances a triangle as well as a rectangle), or for a top-k without column states the
blocks of query rows (so each row's heap sees all columns: half as many entries pass a
bar that rises over all of them as over two halves), each with its own part: each
thread multiplies on one core and selects from its tile while the tile is in that
core's cache.  torch is set to one thread for the call and restored after: it is a process
setting, so only the main thread does this (dask's worker threads keep one sweep, and
get their parallelism from dask).  Torch's OpenMP threads would otherwise wait (or spin)
while one thread selects, and two OpenMP pools (torch's, numba's) contend for the same
cores; under load, a team of OpenMP threads also stalls at every barrier.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Protocol, TypeVar

import numpy as np
import torch

from dask_cosim._search_tiles import Heaps, Running, Tile

__all__ = [
    "DIRECT_BLOCK_ROWS",
    "DIRECT_MAX_QUERIES",
    "PARALLEL_MIN_WORK",
    "DirectPart",
    "NumbaPairs",
    "PairLimit",
    "TooManyPairs",
    "TopkPart",
    "TorchPairs",
    "by_rows",
    "chunks",
    "compact",
    "sweep",
]

# Below this many multiply-adds a search runs on the calling thread alone.
PARALLEL_MIN_WORK = 1 << 26
# The fewest query rows of a thread's block when threads split the rows.
MIN_ROWS = 64


class Part(Protocol):
    def wants(self, a0: int, a1: int, c0: int, c1: int) -> bool:
        """Whether the tile rows a0:a1 x columns c0:c1 is needed at all."""

    def take(self, s: torch.Tensor, a0: int, c0: int) -> None:
        """Reduce the tile ``s`` (rows a0.., columns c0..)."""


P = TypeVar("P", bound=Part)
T = TypeVar("T")


def _threads(steps: int, work: int) -> int:
    """How many threads a call may split into: torch's count on the main thread, at
    most ``steps``, 1 for less than :data:`PARALLEL_MIN_WORK`."""
    if work < PARALLEL_MIN_WORK or threading.current_thread() is not threading.main_thread():
        return 1
    return max(1, min(torch.get_num_threads(), steps))


def by_rows(n: int, work: int, fn: Callable[[int, int], T]) -> list[T]:
    """``fn(start, stop)`` over n rows in equal blocks, one per thread (as :func:`sweep`
    splits; ``work``: its multiply-adds or values), e.g. a nogil numba kernel."""
    threads = _threads(n, work)
    edges = [n * t // threads for t in range(threads + 1)]
    if threads == 1:
        return [fn(0, n)]
    with ThreadPoolExecutor(threads, thread_name_prefix="cosim-rows") as pool:
        return list(pool.map(fn, edges[:-1], edges[1:]))


def sweep(
    q: torch.Tensor,
    r: torch.Tensor,
    tq: int,
    tr: int,
    make: Callable[[], P],
    split: bool,
    by_rows: bool = False,
) -> list[P]:
    """Hand every ``tq`` x ``tr`` tile of ``q @ r.T`` to a part made by ``make``: one
    part, or (``split``, on the main thread, torch on several threads, enough work) one
    per thread, each given every n-th column tile, or with ``by_rows`` every n-th block
    of query rows (of at most ``tq``, at least :data:`MIN_ROWS`) and all its columns: a
    part then meets every column of its rows, and keeps one heap per row, not one per
    thread.  Returns the parts."""
    work = len(q) * len(r) * q.shape[1]
    steps = len(q) // MIN_ROWS if by_rows else -(-len(r) // tr)
    threads = _threads(steps, work) if split else 1
    if threads < 2:
        part = make()
        _sweep(q, r, tq, tr, part, 0, 1, False)
        return [part]
    if by_rows:
        tq = min(tq, -(-len(q) // threads))
    parts = [make() for _ in range(threads)]
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(threads, thread_name_prefix="cosim-search") as pool:
            jobs = [
                pool.submit(_sweep, q, r, tq, tr, p, t, threads, by_rows)
                for t, p in enumerate(parts)
            ]
            for job in jobs:
                job.result()
    finally:
        torch.set_num_threads(previous)
    return parts


def _sweep(
    q: torch.Tensor, r: torch.Tensor, tq: int, tr: int, part: Part, first: int, step: int,
    by_rows: bool,
) -> None:  # fmt: skip
    nq, nr = len(q), len(r)
    if isinstance(part, DirectPart):
        for c0 in range(first * tr, nr, step * tr):
            part.run_q.direct(part.q, part.r, c0, min(nr, c0 + tr))
        return
    tile = Tile(tq, tr, q.device, low=q.dtype == torch.bfloat16)
    # This thread's share: every step-th block of rows (by_rows), else of columns.
    rows, cols = (first, step), (0, 1)
    if not by_rows:
        rows, cols = cols, rows
    with torch.no_grad():
        for a0 in range(rows[0] * tq, nq, rows[1] * tq):
            a1 = min(nq, a0 + tq)
            for c0 in range(cols[0] * tr, nr, cols[1] * tr):
                c1 = min(nr, c0 + tr)
                if part.wants(a0, a1, c0, c1):
                    part.take(tile.product(q[a0:a1], r[c0:c1]), a0, c0)


class TopkPart:
    """Offers each tile to the rows' state ``run_q`` and the columns' ``run_r`` (the
    columns of different parts are disjoint, so parts may share it)."""

    def __init__(self, run_q: Running | Heaps, run_r: Running | Heaps | None) -> None:
        self.run_q, self.run_r = run_q, run_r

    def wants(self, a0: int, a1: int, c0: int, c1: int) -> bool:
        return True

    def take(self, s: torch.Tensor, a0: int, c0: int) -> None:
        self.run_q.rows(s, a0, c0)
        if self.run_r is not None:
            self.run_r.cols(s, a0, c0)


class DirectPart(TopkPart):
    """A few queries (at most :data:`DIRECT_MAX_QUERIES`) on a CPU: no tile product
    (a matrix product of a few rows runs at a fraction of the machine's rate), but the
    numba kernel's dot of each query with each row, one read of r, offered to the
    queries' heaps as it is made.  :func:`sweep` hands it blocks of rows of r."""

    def __init__(self, run_q: Heaps, q: torch.Tensor, r: torch.Tensor) -> None:
        super().__init__(run_q, None)
        self.run_q: Heaps = run_q
        self.q, self.r = q.numpy(), r.numpy()


# Up to this many queries, DirectPart; beyond, tiles (measured: 16 queries x 200,000
# rows took 18 ms dot by dot and 28 ms by tiles at D = 128, 67 and 80 ms at D = 384).
DIRECT_MAX_QUERIES = 16
# Rows of r per block handed to a DirectPart (its threads take every n-th block).
DIRECT_BLOCK_ROWS = 16384

_MODES = {None: 0, "upper": 1, "exclude_self": 2}


class TooManyPairs(Exception):
    """Raised by :meth:`PairLimit.add` once ``found`` pairs exceed its ``most``."""

    def __init__(self, found: int, most: int) -> None:
        super().__init__(f"{found} pairs found, more than {most}")
        self.found, self.most = found, most


class PairLimit:
    """The most pairs a search may collect, counted tile by tile over every part (and
    every call it is handed to): a search that would hold more stops with
    :class:`TooManyPairs` as soon as a tile passes the limit, before its buffers grow."""

    def __init__(self, most: int) -> None:
        self.most, self.found = most, 0
        self._lock = threading.Lock()

    def add(self, n: int, pending: int = 0) -> None:
        """Count ``n`` more pairs; raise if they, and ``pending`` pairs known to be
        still to come (found but not yet held), pass the most."""
        with self._lock:
            self.found += n
            found = self.found
        if found + pending > self.most:
            raise TooManyPairs(found + pending, self.most)

    def left(self) -> int:
        """The pairs that may still be added without passing the most."""
        with self._lock:
            return max(0, self.most - self.found)


class _Pairs:
    """Pair collection's common state: the rows' bars ``low`` (float32, inf for invalid
    rows), the columns' validity, and for ``mode`` "upper" / "exclude_self" each row's
    own position ``pos`` among the columns (keep only later columns / not itself);
    ``limit``: the most pairs to collect, or None."""

    def __init__(
        self, low: torch.Tensor, valid: torch.Tensor, pos: torch.Tensor, mode: str | None, tq: int,
        limit: PairLimit | None = None,
    ) -> None:  # fmt: skip
        self.low, self.valid, self.pos, self.mode = low, valid, pos, _MODES[mode]
        self.limit = limit
        # The smallest position of each block of tq rows: "upper" skips the tiles that
        # lie wholly on or below the diagonal.
        n = len(pos)
        pad = torch.full(
            (-(-n // tq) * tq - n,), n + len(valid), dtype=pos.dtype, device=pos.device
        )
        self.first = torch.cat([pos, pad]).view(-1, tq).amin(dim=1).tolist() if n else []
        self.tq = tq

    def wants(self, a0: int, a1: int, c0: int, c1: int) -> bool:
        return self.mode != 1 or c1 > self.first[a0 // self.tq]

    def _found(self, n: int) -> None:
        """Count ``n`` more pairs against the limit, if there is one."""
        if self.limit is not None:
            self.limit.add(n)


class NumbaPairs(_Pairs):
    """Collects (i, j, float32 score) with the numba scan, into arrays it grows."""

    def __init__(
        self, fast: ModuleType, low: torch.Tensor, valid: torch.Tensor, pos: torch.Tensor,
        mode: str | None, tq: int, tr: int, limit: PairLimit | None = None,
    ) -> None:  # fmt: skip
        super().__init__(low, valid, pos, mode, tq, limit)
        self.fast = fast
        self.np_low, self.np_valid, self.np_pos = low.numpy(), valid.numpy(), pos.numpy()
        self.n = 0
        size = max(1024, tq * tr // 16)
        self.i = np.empty(size, dtype=np.int64)
        self.j = np.empty(size, dtype=np.int64)
        self.s = np.empty(size, dtype=np.float32)

    def _grow(self, size: int) -> None:
        # Only the pairs found are copied: the rest of a new buffer stays untouched, so
        # not resident (a concatenate with an empty array would write all of it).
        n = self.n
        for name in ("i", "j", "s"):
            old = getattr(self, name)
            new = np.empty(size, dtype=old.dtype)
            new[:n] = old[:n]
            setattr(self, name, new)
            del old

    def take(self, s: torch.Tensor, a0: int, c0: int) -> None:
        tile = s.numpy()
        while True:
            n = self.fast.scan_pairs(
                tile, a0, c0, self.np_low, self.np_valid, self.np_pos, self.mode,
                self.i, self.j, self.s, self.n,
            )  # fmt: skip
            if n >= 0:
                self._found(n - self.n)
                self.n = n
                return
            self._grow(2 * len(self.i) + tile.size)

    def result(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = self.n
        return (
            torch.from_numpy(self.i[:n]),
            torch.from_numpy(self.j[:n]),
            torch.from_numpy(self.s[:n]),
        )


class TorchPairs(_Pairs):
    """The same with torch ops (any device): a comparison, one flat nonzero per tile."""

    def __init__(
        self, low: torch.Tensor, valid: torch.Tensor, pos: torch.Tensor, mode: str | None,
        tq: int, identity: bool, all_valid: bool, limit: PairLimit | None = None,
    ) -> None:  # fmt: skip
        super().__init__(low, valid, pos, mode, tq, limit)
        self.identity, self.all_valid = identity, all_valid
        self.out: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def take(self, s: torch.Tensor, a0: int, c0: int) -> None:
        a1, c1 = a0 + s.shape[0], c0 + s.shape[1]
        hit = s >= self.low[a0:a1, None]
        if not self.all_valid:
            hit &= self.valid[None, c0:c1]
        if self.mode and self.identity:
            # Row i of the tile is row a0 + i of r: the diagonal is at c = i + a0 - c0.
            if self.mode == 1:
                hit.triu_(a0 - c0 + 1)
            elif a0 < c1 and c0 < a1:
                hit.diagonal(a0 - c0).fill_(False)
        # One flat nonzero, then arithmetic: few ops per tile, each output-sized.
        flat = hit.view(-1).nonzero().squeeze(1)
        if self.mode and not self.identity:
            ii = torch.div(flat, c1 - c0, rounding_mode="floor")
            cols = flat - ii * (c1 - c0) + c0
            pos = self.pos[ii + a0]
            flat = flat[(cols > pos) if self.mode == 1 else (cols != pos)]
        if len(flat):
            self._found(len(flat))
            ii = torch.div(flat, c1 - c0, rounding_mode="floor")
            self.out.append((ii + a0, flat - ii * (c1 - c0) + c0, s.view(-1)[flat]))

    def result(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not self.out:
            none = torch.zeros(0, dtype=torch.int64, device=self.low.device)
            return none, none.clone(), torch.zeros(0, dtype=torch.float32, device=none.device)
        i, j, s = zip(*self.out)
        return torch.cat(i), torch.cat(j), torch.cat(s)


# Pairs handled at a time where a pass over all of them would make a temporary each.
CHUNK = 1 << 20


def chunks(n: int) -> list[tuple[int, int]]:
    return [(a, min(n, a + CHUNK)) for a in range(0, n, CHUNK)]


def compact(keep: torch.Tensor, *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``v[keep]`` for each of ``values`` (1-D, as long as ``keep``), written over the
    front of ``v`` chunk by chunk (a chunk's kept values are taken before they are
    written, never ahead of the chunk): views of ``values``, whose contents it
    overwrites, so that the kept pairs need no second copy of every pair."""
    if bool(keep.all()):
        return values
    w = 0
    for a, b in chunks(len(keep)):
        k = keep[a:b]
        m = int(k.sum())
        for v in values:
            v[w : w + m] = v[a:b][k]
        w += m
    return tuple(v[:w] for v in values)
