"""The exact search inside one block of the clustered search: torch, any device, no
dataframes, no config.  A block holds a cluster's rows (or a chunk of them) and the rows
that probe it, in role order (:data:`MEMBER`, :data:`SIDE`, :data:`PROBE`,
:class:`dask_cosim.clustered_partition.Layout`); :func:`block_pairs` finds its pairs with
the all-pairs kernels and decides them in float64, as the all-pairs search does.
"""

from __future__ import annotations

import torch

from dask_cosim import search_kernels as sk
from dask_cosim._search_sweep import PairLimit, TooManyPairs, chunks, compact
from dask_cosim.search_reduced import best, block_size

__all__ = ["MEMBER", "PROBE", "SIDE", "block_pairs", "kept_pairs", "rows"]

# Roles of a row in a block, in the order a block keeps its rows (see block_pairs).
MEMBER, SIDE, PROBE = 0, 1, 2


def block_pairs(
    prep: sk.Prepared,
    members: int,
    sides: int,
    key: torch.Tensor,
    threshold: float,
    *,
    tile_bytes: int,
    precision: str = "fp32",
    limit: PairLimit | None = None,
    member_pairs: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pairs of one block scoring at least ``threshold`` in float64: (first, second,
    score), positions in ``prep`` with ``key[first] < key[second]``, found by tiles of
    ``precision`` (:func:`~dask_cosim.search_kernels.threshold_pairs`).

    The block's rows come in role order: ``members`` MEMBER rows sorted by ``key``, then
    ``sides`` SIDE rows, then PROBE rows.  Pairs are MEMBER x MEMBER (each unordered pair
    once; not with ``member_pairs`` False) and PROBE x (MEMBER or SIDE).  Each pair is
    re-scored with its earlier row (smaller ``key``, frame order) first, as the all-pairs
    search scores it, so that a pair at the threshold gets the same float64 score, and
    decision, in both.

    ``limit`` counts the candidate pairs as the kernels find them (and may be handed
    every block of a task): past its most, :class:`~dask_cosim._search_sweep.TooManyPairs`.
    """
    device = prep.unit.device
    # The tile scan keeps candidates down to just below the threshold: the re-score with
    # the rows swapped may differ from this one in the last bits.
    low = threshold - 2.0**-50
    first, second = [], []
    if members > 1 and member_pairs:
        pm = rows(prep, 0, members)
        i, j = sk.threshold_pairs(
            pm, pm, low, tile_bytes=tile_bytes, mode="upper", exact_scores=False,
            precision=precision, limit=limit,
        )[:2]  # fmt: skip
        first.append(i)
        second.append(j)
    reach = members + sides
    if len(prep) > reach > 0:
        i, j = sk.threshold_pairs(
            rows(prep, reach, len(prep)),
            rows(prep, 0, reach),
            low,
            tile_bytes=tile_bytes,
            exact_scores=False,
            precision=precision,
            limit=limit,
        )[:2]
        first.append(i + reach)
        second.append(j)
    if not first:
        none = torch.zeros(0, dtype=torch.int64, device=device)
        return none, none.clone(), torch.zeros(0, dtype=torch.float64, device=device)
    a, b = (first[0], second[0]) if len(first) == 1 else (torch.cat(first), torch.cat(second))
    del first, second
    for s, e in chunks(len(a)):  # swapped in place: no second copy of every pair
        swap = key[a[s:e]] > key[b[s:e]]
        a[s:e], b[s:e] = torch.where(swap, b[s:e], a[s:e]), torch.where(swap, a[s:e], b[s:e])
    score = sk.rescore(prep, a, prep, b)
    a, b, score = compact(score >= threshold, a, b, score)
    return a, b, score


def kept_pairs(
    keep: str,
    prep: sk.Prepared,
    members: int,
    sides: int,
    key: torch.Tensor,
    threshold: float,
    *,
    tile_bytes: int,
    precision: str = "fp32",
    most: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What dedup takes of the pairs of :func:`block_pairs` (whose arguments it takes,
    ``keep`` first, and ``most`` for its ``limit``; and whose result it gives): ``keep``
    "rows", the later row (larger ``key``) of each pair alone (the rows dropped; first
    rows and scores empty); "best", of the MEMBER x MEMBER pairs each later row's best
    (highest float64 score, ties to the earlier row: the removed rows' match), and of
    the PROBE pairs too (a row may have one of each: the caller keeps the better).

    The pairs kept are at most the rows, whatever their number: past ``most`` (a cluster
    of many identical rows) the members are searched again by blocks of rows
    (:func:`~dask_cosim.search_reduced.by_blocks`), and so are the PROBE rows against
    the others (copies of a row near another cluster's near-copies:
    :func:`_probe_pairs`)."""
    from dask_cosim import search_reduced

    parts = []
    if members > 1:
        pm = rows(prep, 0, members)
        # Members come sorted by key: each pair's earlier row first (as block_pairs
        # re-scores it), the later its second.
        i, j, s = search_reduced.found(
            keep, pm, pm, threshold, upper=True, tile_bytes=tile_bytes, precision=precision,
            limit=None if most is None else PairLimit(most),
        )  # fmt: skip
        parts.append((i, j, s))
    probes = _probe_pairs(
        prep, members, sides, key, threshold, tile_bytes=tile_bytes, precision=precision,
        most=most,
    )  # fmt: skip
    if keep == "rows":
        later = torch.unique(torch.cat([j for _, j, _ in parts] + [probes[1]]))
        return later[:0], later, torch.zeros(0, dtype=torch.float64, device=later.device)
    parts.append(probes)
    a, b, score = (torch.cat(t) for t in zip(*parts, strict=True))
    return a, b, score


def _probe_pairs(
    prep: sk.Prepared,
    members: int,
    sides: int,
    key: torch.Tensor,
    threshold: float,
    *,
    tile_bytes: int,
    precision: str,
    most: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The PROBE x (MEMBER or SIDE) pairs of :func:`block_pairs`, reduced to each later
    row's best (highest float64 score, ties to the earlier row by ``key``), which serves
    "rows" too (one pair a row it drops).  Searched whole within ``most`` candidates,
    else by blocks of rows (256 to 1,024 a side), each block's pairs reduced with those
    kept before the next."""
    limit = None if most is None else PairLimit(most)
    try:
        a, b, score = block_pairs(
            prep, members, sides, key, threshold, tile_bytes=tile_bytes,
            precision=precision, limit=limit, member_pairs=False,
        )  # fmt: skip
        return best(a, b, score, rank=key[a])
    except TooManyPairs as stop:
        size = block_size(stop.most)
    device = prep.unit.device
    reach, n = members + sides, len(prep)
    kept = [torch.zeros(0, dtype=torch.int64, device=device)] * 2
    kept.append(torch.zeros(0, dtype=torch.float64, device=device))
    for p in range(reach, n, size):
        for r in range(0, reach, size):
            # A block of its own: these rows as SIDE, those as PROBE.
            at = torch.cat([
                torch.arange(r, min(r + size, reach), device=device),
                torch.arange(p, min(p + size, n), device=device),
            ])  # fmt: skip
            a, b, score = block_pairs(
                prep.take(at), 0, min(r + size, reach) - r, key[at], threshold,
                tile_bytes=tile_bytes, precision=precision, member_pairs=False,
            )  # fmt: skip
            a = torch.cat([kept[0], at[a]])
            kept = list(best(a, torch.cat([kept[1], at[b]]), torch.cat([kept[2], score]),
                             rank=key[a]))  # fmt: skip
    return kept[0], kept[1], kept[2]


def rows(prep: sk.Prepared, start: int, stop: int) -> sk.Prepared:
    """Rows ``start:stop`` of ``prep``, as views."""
    cut = slice(start, stop)
    norm = None if prep.norm is None else prep.norm[cut]
    return sk.Prepared(
        prep.unit[cut], prep.raw[cut], prep.inv[cut], prep.scale[cut], prep.valid[cut],
        prep.err, norm,
    )  # fmt: skip
