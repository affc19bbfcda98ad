"""What dedup and groups keep of a pair task's pairs: at most one entry per row.

A threshold search's pairs grow with the square of the rows (every pair of n identical
rows matches), but what dedup and groups keep of them does not:

- ``"rows"``: the right rows with a match (dedup drops them);
- ``"best"``: each right row's best match, float64 score, ties to the earlier left row
  (dedup with ``return_removed``);
- ``"forest"``: edges that connect the rows as the pairs do, at most one fewer per
  connected set than its rows (groups needs connectivity alone).

:func:`found` reduces a task's pairs so in any case (groups' merge of every task's
edges holds them all); a task whose pairs pass its budget
(:class:`~dask_cosim._search_sweep.TooManyPairs`) searches again by blocks of rows
(:func:`by_blocks`), each block's pairs reduced before the next, so that it holds its
rows and one block's pairs.

Knows no dataframes: positions in the two prepared sides, torch or numpy.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from dask_cosim import search_kernels as sk
from dask_cosim._search_sweep import PairLimit, TooManyPairs

__all__ = ["KEEPS", "best", "block_size", "by_blocks", "found", "labels", "spanning"]

KEEPS = ("rows", "best", "forest")

# Rows on a side of a block, at most and (where the budget is smaller) at least: below
# the least a block's fixed costs outweigh its work; the most keeps what a block finds
# before its rows can be skipped small (rows of one vector: every pair a match).
_MIN_BLOCK, _MAX_BLOCK = 256, 1024


def block_size(most: int) -> int:
    """Rows on a side of a block searched past a budget of ``most`` pairs: 256 to 1,024,
    no block pair holding more than max(256 x 256, ``most`` / 4) pairs."""
    return max(_MIN_BLOCK, min(_MAX_BLOCK, math.isqrt(max(most, 0) // 4)))


def found(
    keep: str,
    q: sk.Prepared,
    r: sk.Prepared,
    threshold: float,
    *,
    upper: bool,
    limit: PairLimit | None,
    tile_bytes: int,
    precision: str = "fp32",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """What ``keep`` keeps of the pairs of ``q`` and ``r`` scoring at least
    ``threshold``, as :func:`by_blocks` gives it (the same arguments, ``limit`` for
    ``most``): from the whole search where ``limit`` holds its candidates, else
    (:class:`~dask_cosim._search_sweep.TooManyPairs`) by blocks of rows."""
    if keep not in KEEPS:
        raise ValueError(f"keep={keep!r}: one of {KEEPS}")
    try:
        i, j, s = sk.threshold_pairs(
            q, r, threshold, tile_bytes=tile_bytes, mode="upper" if upper else None,
            # Rows and edges need only the pair set; a float16 pass's score is none to
            # report.  ("fast" runs exact off CUDA: its low-precision pass is CUDA's.)
            exact_scores=keep == "best", precision=precision, limit=limit,
        )  # fmt: skip
    except TooManyPairs as stop:
        return by_blocks(
            keep, q, r, threshold, upper=upper, most=stop.most, tile_bytes=tile_bytes,
            precision=precision,
        )  # fmt: skip
    if keep == "rows":
        j = torch.unique(j)
        return j[:0], j, None
    if keep == "best":
        return best(i, j, s)
    fi, fj = spanning(i.cpu().numpy(), j.cpu().numpy(), len(q), len(r), upper)
    return torch.from_numpy(fi), torch.from_numpy(fj), None


def by_blocks(
    keep: str,
    q: sk.Prepared,
    r: sk.Prepared,
    threshold: float,
    *,
    upper: bool,
    most: int,
    tile_bytes: int,
    precision: str = "fp32",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """What ``keep`` (one of :data:`KEEPS`) asks of the pairs (i, j) of ``q`` and ``r``
    scoring at least ``threshold`` in float64, as (i, j, score): "rows" gives j alone
    (sorted; i and score empty), "forest" no scores (None).  The pairs are those of
    :func:`~dask_cosim.search_kernels.threshold_pairs` with ``precision``; ``upper``:
    ``r`` is ``q``, each unordered pair once, i < j.

    Searched by blocks of rows (256 to 1,024 a side: no block pair holding more than
    max(256 x 256, ``most`` / 4) pairs), the left blocks in order (with ``upper`` the
    diagonal block last): a right row that "rows" has found matched, or whose best score
    "best" has found 1 (no later left row can beat it: ties go to the earlier), is not
    searched again, nor a block pair whose rows "forest" has found connected already."""
    device = r.unit.device
    nq, nr = len(q), len(r)
    size = block_size(most)
    kept = _Kept(keep, nq, nr, upper, device)
    exact_scores = keep == "best" or precision != "fp32"
    for c in range(0, nr, size):
        block = torch.arange(c, min(c + size, nr), device=device)
        for a in range(0, c + 1 if upper else nq, size):
            cols = kept.todo(block)
            if len(cols) == 0:
                break
            rows = torch.arange(a, min(a + size, nq), device=device)
            # The diagonal block whole: "upper" takes its rows' positions as its own.
            if upper and a == c:
                cols = block
            if kept.connected(rows, cols):
                continue
            i, j, s = sk.threshold_pairs(
                q.take(rows), r.take(cols), threshold, tile_bytes=tile_bytes,
                mode="upper" if upper and a == c else None, exact_scores=exact_scores,
                precision=precision,
            )  # fmt: skip
            kept.add(rows, cols, i, j, s, diagonal=upper and a == c)
    return kept.result()


class _Kept:
    """What ``keep`` keeps of the pairs :meth:`add` hands it, over ``nq`` left and
    ``nr`` right rows (one set of rows where ``upper``)."""

    def __init__(self, keep: str, nq: int, nr: int, upper: bool, device: torch.device) -> None:
        if keep not in KEEPS:
            raise ValueError(f"keep={keep!r}: one of {KEEPS}")
        self.keep, self.nq, self.nr, self.upper = keep, nq, nr, upper
        if keep == "rows":
            self.matched = torch.zeros(nr, dtype=torch.bool, device=device)
        if keep == "best":
            self.score = torch.full((nr,), -math.inf, dtype=torch.float64, device=device)
            self.left = torch.full((nr,), -1, dtype=torch.int64, device=device)
        self.edges: list[np.ndarray] = []
        self.held = 0
        # Each row's connected set as the edges labelled last found it; the edges added
        # since (labelled again once they are an eighth of the rows: a bounded cost).
        self.label: np.ndarray | None = None
        self.fresh = 0

    def todo(self, cols: torch.Tensor) -> torch.Tensor:
        """The right rows of ``cols`` still worth searching (by later left rows)."""
        if self.keep == "rows":
            return cols[~self.matched[cols]]
        if self.keep == "best":
            return cols[self.score[cols] < 1.0]
        return cols

    def connected(self, rows: torch.Tensor, cols: torch.Tensor) -> bool:
        """Whether "forest" has found ``rows`` (left) and ``cols`` (right) all in one
        connected set: their pairs would join nothing."""
        if self.keep != "forest" or self.label is None:
            return False
        offset = 0 if self.upper else self.nq
        found = np.concatenate([rows.cpu().numpy(), cols.cpu().numpy() + offset])
        held = self.label[found]
        return bool((held == held[0]).all())

    def add(
        self,
        rows: torch.Tensor,
        cols: torch.Tensor,
        i: torch.Tensor,
        j: torch.Tensor,
        s: torch.Tensor,
        diagonal: bool = False,
    ) -> None:
        """The pairs (``rows[i]``, ``cols[j]``) of a block, score ``s``; ``diagonal``:
        ``rows`` are ``cols``, each pair once (i < j)."""
        if self.keep == "forest":
            # The block's pairs as a forest of its own rows first: at most its rows.
            fi, fj = spanning(i.cpu().numpy(), j.cpu().numpy(), len(rows), len(cols), diagonal)
            edges = np.stack([rows.cpu().numpy()[fi], cols.cpu().numpy()[fj]], axis=1)
            self._add_edges(edges)
            return
        i, j = rows[i], cols[j]
        if self.keep == "rows":
            self.matched[j] = True
        elif self.keep == "best" and len(j):
            lo, hi = int(j.min()), int(j.max()) + 1
            top, first = _best_in_range(i, j - lo, s, hi - lo)
            now_s, now_i = self.score[lo:hi], self.left[lo:hi]
            better = (top > now_s) | ((top == now_s) & (first < now_i))
            self.score[lo:hi] = torch.where(better, top, now_s)
            self.left[lo:hi] = torch.where(better, first, now_i)

    def _add_edges(self, edges: np.ndarray) -> None:
        self.edges.append(edges)
        self.held += len(edges)
        self.fresh += len(edges)
        if self.held > 2 * (self.nq + self.nr):  # a forest has fewer: reduce now
            self.edges = [self._forest()]
            self.held = len(self.edges[0])
        elif self.fresh >= max(1, (self.nq + self.nr) // 8):
            both = np.concatenate(self.edges)
            self.label = labels(both[:, 0], both[:, 1], self.nq, self.nr, self.upper)
            self.fresh = 0

    def _forest(self) -> np.ndarray:
        both = np.concatenate(self.edges) if self.edges else np.zeros((0, 2), np.int64)
        i, j = both[:, 0], both[:, 1]
        self.label, self.fresh = labels(i, j, self.nq, self.nr, self.upper), 0
        return np.stack(spanning(i, j, self.nq, self.nr, self.upper, self.label), axis=1)

    def result(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        if self.keep == "rows":
            j = torch.nonzero(self.matched).flatten()
            return j[:0], j, None
        if self.keep == "best":
            j = torch.nonzero(self.left >= 0).flatten()
            return self.left[j], j, self.score[j]
        forest = self._forest()
        return torch.from_numpy(forest[:, 0].copy()), torch.from_numpy(forest[:, 1].copy()), None


def best(
    i: torch.Tensor, j: torch.Tensor, s: torch.Tensor, rank: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Of the pairs (``i``, ``j``, score ``s``), each right row's best: the highest
    score, then the earliest left row of that score (dedup's removed rows' match), as
    (i, j, s) in the order of j.  ``rank``: each pair's left row's place in frame order
    where ``i`` is not it (rows of a clustered block: one pair kept of pairs that tie
    on both)."""
    if not len(j):
        return i, j, s
    lo = int(j.min())
    at, n = j - lo, int(j.max()) + 1 - lo
    top, first = _best_in_range(i if rank is None else rank, at, s, n)
    if rank is None:
        held = torch.nonzero(first != _NONE).flatten()
        return first[held], held + lo, top[held]
    # The first pair of each right row that holds its best score and rank.
    hit = torch.nonzero((s == top[at]) & (rank == first[at])).flatten()
    pick = torch.full((n,), _NONE, dtype=torch.int64, device=hit.device)
    pick = pick.scatter_reduce(0, at[hit], hit, "amin")
    pick = pick[pick != _NONE]
    return i[pick], j[pick], s[pick]


_NONE = torch.iinfo(torch.int64).max


def _best_in_range(
    i: torch.Tensor, at: torch.Tensor, s: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per right row ``at`` (0..n-1) of the pairs: the highest score (-inf for none) and
    the earliest left row ``i`` of that score (:data:`_NONE` for none), by two scatters
    (no sort)."""
    top = torch.full((n,), -math.inf, dtype=s.dtype, device=s.device)
    top = top.scatter_reduce(0, at, s, "amax")
    tied = s == top[at]
    first = torch.full((n,), _NONE, dtype=torch.int64, device=i.device)
    first = first.scatter_reduce(0, at[tied], i[tied], "amin")
    return top, first


def labels(i: np.ndarray, j: np.ndarray, nq: int, nr: int, upper: bool) -> np.ndarray:
    """Each row's connected set under the pairs (``i``, ``j``): the labels of
    ``scipy.sparse.csgraph.connected_components``, left rows then right rows (one set of
    ``nq`` rows where ``upper``)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    nodes = nq if upper else nq + nr
    v = j if upper else j + nq
    graph = coo_matrix((np.ones(len(i), dtype=np.int8), (i, v)), shape=(nodes, nodes))
    return np.asarray(connected_components(graph, directed=False)[1], dtype=np.int64)


def spanning(
    i: np.ndarray,
    j: np.ndarray,
    nq: int,
    nr: int,
    upper: bool,
    label: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Edges (i, j), left row i and right row j, that connect the rows as the pairs
    (``i``, ``j``) do, one fewer per connected set than its rows: a star around its
    first rows.  ``upper``: one set of ``nq`` rows and every i < j (the star's centre is
    the set's first row); else ``nq`` left and ``nr`` right rows, each pair one of each
    (each left row joined to the set's first right row, each other right row to its
    first left row).  Not the pairs themselves: groups needs only what they connect.
    ``label``: :func:`labels` of the pairs, where known."""
    i = np.asarray(i, dtype=np.int64)
    j = np.asarray(j, dtype=np.int64)
    nodes = nq if upper else nq + nr
    v = j if upper else j + nq
    if label is None:
        label = labels(i, j, nq, nr, upper)
    touched = np.zeros(nodes, dtype=bool)
    touched[i] = True
    touched[v] = True
    if upper:
        members = np.flatnonzero(touched)
        centre = _firsts(label, members)
        other = members[centre[label[members]] != members]
        return centre[label[other]], other
    left, right = np.flatnonzero(touched[:nq]), np.flatnonzero(touched[nq:]) + nq
    first_left, first_right = _firsts(label, left), _firsts(label, right)
    # Every left row to its set's first right row; every other right row to its set's
    # first left row (the pair of the two firsts is in the first list).
    others = right[first_right[label[right]] != right]
    out_i = np.concatenate([left, first_left[label[others]]])
    out_j = np.concatenate([first_right[label[left]], others]) - nq
    return out_i, out_j


def _firsts(label: np.ndarray, members: np.ndarray) -> np.ndarray:
    """For each label, the first (smallest) of ``members`` (ascending) that has it; -1
    for a label none has."""
    first = np.full(int(label.max(initial=-1)) + 1, -1, dtype=np.int64)
    seen, at = np.unique(label[members], return_index=True)
    first[seen] = members[at]
    return first
