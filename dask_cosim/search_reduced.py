"""What dedup and groups keep of a pair task's pairs: at most one entry per row.

A threshold search's pairs grow with the square of the rows (every pair of n identical
rows matches), but what dedup and groups keep of them does not:

- ``"rows"``: the right rows with a match (dedup drops them);
- ``"best"``: each right row's best match, float64 score, ties to the earlier left row
  (dedup with ``return_removed``);
- ``"forest"``: edges that connect the rows as the pairs do, at most one fewer per
  connected set than its rows (groups needs connectivity alone).

A task whose pairs pass its budget (:class:`~dask_cosim._search_sweep.TooManyPairs`)
searches again by blocks of rows (:func:`by_blocks`), each block's pairs reduced before
the next, so that it holds its rows and one block's pairs.  :func:`spanning` reduces a
task's pairs for groups in any case: the merge of every task's edges holds them all.

Knows no dataframes: positions in the two prepared sides, torch or numpy.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from dask_cosim import search_kernels as sk

__all__ = ["KEEPS", "by_blocks", "spanning"]

KEEPS = ("rows", "best", "forest")

# Fewest rows on a side of a block: below it, a block's fixed costs outweigh its work.
_MIN_BLOCK = 256


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
    scoring at least ``threshold`` in float64 (:func:`~dask_cosim.search_kernels.
    threshold_pairs`, with ``precision``; ``upper``: ``r`` is ``q``, each unordered pair
    once, i < j), as (i, j, score): "rows" gives j alone (sorted; i and score empty),
    "forest" no scores (None).

    Searched by blocks of rows, no block pair holding more than a quarter of ``most``
    pairs; a right row that "rows" has found matched is not searched again."""
    device = r.unit.device
    nq, nr = len(q), len(r)
    size = max(_MIN_BLOCK, math.isqrt(max(most, 0) // 4))
    kept = _Kept(keep, nq, nr, upper, device)
    exact_scores = keep == "best" or precision != "fp32"
    for c in range(0, nr, size):
        block = torch.arange(c, min(c + size, nr), device=device)
        # The diagonal block first: "rows" then leaves out the columns it found matched.
        starts = [c, *range(0, c, size)] if upper else range(0, nq, size)
        for a in starts:
            cols = kept.todo(block)
            if len(cols) == 0:
                break
            rows = torch.arange(a, min(a + size, nq), device=device)
            diagonal = upper and a == c
            i, j, s = sk.threshold_pairs(
                q.take(rows), r.take(block if diagonal else cols), threshold,
                tile_bytes=tile_bytes, mode="upper" if diagonal else None,
                exact_scores=exact_scores, precision=precision,
            )  # fmt: skip
            kept.add(rows[i], (block if diagonal else cols)[j], s)
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

    def todo(self, cols: torch.Tensor) -> torch.Tensor:
        """The right rows of ``cols`` still worth searching."""
        return cols[~self.matched[cols]] if self.keep == "rows" else cols

    def add(self, i: torch.Tensor, j: torch.Tensor, s: torch.Tensor) -> None:
        if self.keep == "rows":
            self.matched[j] = True
        elif self.keep == "best":
            # Per right row, the block's best pair (score down, then the earlier left
            # row), then kept where it beats the best so far.
            order = torch.argsort(i, stable=True)
            order = order[torch.argsort(-s[order], stable=True)]
            order = order[torch.argsort(j[order], stable=True)]
            j_o = j[order]
            first = torch.ones(len(order), dtype=torch.bool, device=j.device)
            first[1:] = j_o[1:] != j_o[:-1]
            i, j, s = i[order[first]], j_o[first], s[order[first]]
            now_s, now_i = self.score[j], self.left[j]
            better = (s > now_s) | ((s == now_s) & (i < now_i))
            self.score[j[better]] = s[better]
            self.left[j[better]] = i[better]
        else:
            self.edges.append(np.stack([i.cpu().numpy(), j.cpu().numpy()], axis=1))
            self.held += len(i)
            if self.held > 2 * (self.nq + self.nr):  # a forest has fewer: reduce now
                self.edges = [self._forest()]
                self.held = len(self.edges[0])

    def _forest(self) -> np.ndarray:
        both = np.concatenate(self.edges) if self.edges else np.zeros((0, 2), np.int64)
        return np.stack(spanning(both[:, 0], both[:, 1], self.nq, self.nr, self.upper), axis=1)

    def result(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        if self.keep == "rows":
            j = torch.nonzero(self.matched).flatten()
            return j[:0], j, None
        if self.keep == "best":
            j = torch.nonzero(self.left >= 0).flatten()
            return self.left[j], j, self.score[j]
        forest = self._forest()
        return torch.from_numpy(forest[:, 0].copy()), torch.from_numpy(forest[:, 1].copy()), None


def spanning(
    i: np.ndarray, j: np.ndarray, nq: int, nr: int, upper: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Edges (i, j), left row i and right row j, that connect the rows as the pairs
    (``i``, ``j``) do, one fewer per connected set than its rows: a star around its
    first rows.  ``upper``: one set of ``nq`` rows and every i < j (the star's centre is
    the set's first row); else ``nq`` left and ``nr`` right rows, each pair one of each
    (each left row joined to the set's first right row, each other right row to its
    first left row).  Not the pairs themselves: groups needs only what they connect."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    i = np.asarray(i, dtype=np.int64)
    j = np.asarray(j, dtype=np.int64)
    nodes = nq if upper else nq + nr
    v = j if upper else j + nq
    graph = coo_matrix((np.ones(len(i), dtype=np.int8), (i, v)), shape=(nodes, nodes))
    _, label = connected_components(graph, directed=False)
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
