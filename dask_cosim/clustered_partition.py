"""The clustered search, one partition at a time: dask-free, pandas/cudf in, pandas out.

:mod:`dask_cosim.clustered` strings these into a dask graph (or calls them directly on an
eager frame): sample rows for k-means (:func:`sample_partition`), the clusters' sizes and
radii (:func:`stats_partition`), each row copied to its home cluster's block and to the
blocks it probes (:func:`route_partition`), the exact search inside the blocks of one
shuffled partition (:func:`search_blocks`); :mod:`dask_cosim.clustered_results` takes
the pairs back to frame order.

Rows are named by a key that is their place in frame order: ``(partition << 40) +
position``, as the all-pairs search orders them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from dask_cosim import backends, partition
from dask_cosim import clustered_blocks as cb
from dask_cosim import clustered_kernels as ck
from dask_cosim import search_kernels as sk
from dask_cosim import search_partition as sp
from dask_cosim.clustered_rows import decode_rows, encode_rows
from dask_cosim.search_budget import Budget, collecting

__all__ = [
    "Layout",
    "Stats",
    "found_meta",
    "labels",
    "merge_stats",
    "partition_number",
    "prepared_rows",
    "route_partition",
    "row_keys",
    "sample_partition",
    "search_blocks",
    "stats_partition",
]

POS_BITS = sp.POS_BITS  # a row's key: its partition above its position, as the search's
# How a task searching blocks gets fewer pairs: fewer rows a block, so more tasks (the
# plan gives the routing shuffle a partition per block_bytes of routed rows).
SMALLER_BLOCKS = (
    "set a smaller cosim.search.clustered.block-bytes (smaller blocks, in more tasks: "
    "fewer pairs per task)"
)
VEC = "_vec"  # the vector column of routed frames (no user column name can clash)
KEY = "_key"  # frame-order keys (row_keys)


def partition_number(partition_info: dict[str, Any] | None) -> int:
    """The number dask's ``partition_info`` gives a partition (0 outside dask)."""
    return 0 if partition_info is None else int(partition_info["number"])


def key_positions(keys: np.ndarray) -> np.ndarray:
    """The positions in their partition of the rows ``keys`` name (their low bits): not
    from dask's partition number, which a selection (``result.partitions[i]``) renumbers."""
    return np.asarray(keys, dtype=np.int64) & np.int64((1 << POS_BITS) - 1)


def row_keys(part: int, n: int) -> np.ndarray:
    return (np.int64(part) << POS_BITS) + np.arange(n, dtype=np.int64)


def with_keys(df: Any, column: str, partition_info: dict[str, Any] | None = None) -> Any:
    """The partition's ``column`` and each row's frame-order key (its partition's number
    and its position in it) in the column :func:`key_column` names, so that the rows can
    be routed in pieces."""
    part = partition_number(partition_info)
    return df[[column]].assign(**{key_column(column): row_keys(part, len(df))})


def key_column(column: Any) -> str:
    """The name of :func:`with_keys`' key column beside the vector column ``column``:
    KEY, unless the vectors are named so."""
    return KEY if column != KEY else f"{KEY}_"


def labels(df: Any) -> pd.Index:
    """The index labels of a partition, as pandas holds them."""
    index = df.index
    return index.to_pandas() if hasattr(index, "to_pandas") else index


def prepared_rows(
    df: Any, column: str, eps: float, device: str, rows: np.ndarray | None = None
) -> sk.Prepared:
    v = backends.to_vectors(df[column], column)
    x = v.blocks[0] if len(v.blocks) == 1 else torch.cat(v.blocks)
    null = v.null
    if null is not None and not isinstance(null, torch.Tensor):
        null = torch.from_numpy(np.asarray(null))
    if rows is not None:
        picked = torch.from_numpy(rows).to(x.device)
        x = x[picked]
        null = None if null is None else null.to(x.device)[picked]
    return sk.prepare(x, null, eps=eps, device=partition.resolve_device(device, x.device))


def _usable(prep: sk.Prepared) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Directions of the rows that can match (valid, non-zero), their positions, and the
    score error ``delta`` of those directions (:func:`~dask_cosim.clustered_kernels.directions`)."""
    d, has, err = ck.directions(prep)
    rows = has.nonzero().squeeze(1)
    usable = d if len(rows) == len(d) else d[rows]  # no copy of a partition of usable rows
    return usable, rows, ck.product_error(prep.dim, err)


def sample_partition(
    df: Any, column: str, part: int, *, fraction: float, seed: int, eps: float, device: str
) -> torch.Tensor:
    """Directions (CPU float32) of a Bernoulli(``fraction``) sample of the partition's
    usable rows, the same for the same ``seed`` and partition number."""
    keep = np.random.default_rng([seed, part]).random(len(df)) < fraction
    d, _, _ = _usable(prepared_rows(df, column, eps, device, np.flatnonzero(keep)))
    return d.cpu()


@dataclass
class Stats:
    """Per cluster: rows whose home it is and the radius bound (float64 radians, -inf
    when empty); the dtype rows are carried in (the input's own float dtype: a float16
    column crosses the shuffle in 2 bytes a value), D, the rows seen and the score error
    delta the bounds were computed with."""

    counts: np.ndarray
    radius: np.ndarray
    dtype: str
    dim: int
    rows: int
    delta: float


def stats_partition(
    df: Any,
    column: str,
    centroids: torch.Tensor,
    *,
    eps: float,
    device: str,
    chunk_bytes: int,
    bfloat16: bool | None = False,
) -> Stats:
    """The sizes and radii of the clusters over one partition's rows (``bfloat16``: as
    :func:`~dask_cosim.clustered_kernels.cluster_stats` takes it)."""
    prep = prepared_rows(df, column, eps, device)
    d, _, delta = _usable(prep)
    counts, radius = ck.cluster_stats(d, centroids.to(d.device), delta, chunk_bytes, bfloat16)
    dtype = str(prep.raw.dtype).removeprefix("torch.")
    return Stats(counts.cpu().numpy(), radius.cpu().numpy(), dtype, prep.dim, len(df), delta)


def merge_stats(*parts: Stats) -> Stats:
    # Partitions of one column may differ (float16 in one file, float32 in another): the
    # blocks carry the type that holds them all.
    dtype = functools.reduce(torch.promote_types, (getattr(torch, p.dtype) for p in parts))
    return Stats(
        np.sum([p.counts for p in parts], axis=0),
        np.max([p.radius for p in parts], axis=0),
        str(dtype).removeprefix("torch."),
        max(p.dim for p in parts),
        sum(p.rows for p in parts),
        max(p.delta for p in parts),
    )


@dataclass
class Layout:
    """Everything routing needs, sent once to each worker.

    Cluster c's rows are split by a hash of their key into ``members[c]`` chunks, the rows
    probing it into ``probes[c]`` chunks; its blocks are numbered from ``base[c]``:
    one per member chunk i (its rows as MEMBER: pairs among them), one per pair of member
    chunks i < j (i as PROBE, j as SIDE), and, with more than one probe chunk, one per
    (member chunk i, probe chunk k) (k as PROBE, i as SIDE); with one probe chunk the
    probes join each member chunk's block as PROBE.
    """

    centroids: torch.Tensor
    floor: torch.Tensor
    threshold: float
    delta: float
    n_probe: int | None
    base: np.ndarray
    members: np.ndarray
    probes: np.ndarray
    dtype: str
    dim: int
    bfloat16: bool | None = False

    def __dask_tokenize__(self) -> tuple[Any, ...]:
        # dask's token of a torch tensor differs from call to call: the values say it.
        tensors = [t.detach().cpu().numpy() for t in (self.centroids, self.floor)]
        rest = (self.threshold, self.delta, self.n_probe, self.dtype, self.dim, self.bfloat16)
        return (*tensors, self.base, self.members, self.probes, *rest)


def blocks_of(members: np.ndarray, probes: np.ndarray) -> np.ndarray:
    """How many blocks each cluster has (Layout)."""
    s, t = members.astype(np.int64), probes.astype(np.int64)
    return s + s * (s - 1) // 2 + np.where(t > 1, s * t, 0)


def _chunk(keys: np.ndarray, n: int | np.ndarray) -> np.ndarray:
    mixed = keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return ((mixed >> np.uint64(32)) % np.asarray(n, dtype=np.uint64)).astype(np.int64)


def _copies(
    lay: Layout, keys: np.ndarray, home: np.ndarray, prow: np.ndarray, pclu: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, block, role) of every copy of the rows: members first, then probes."""
    rows = [np.arange(len(home)), prow]
    blocks = [lay.base[home], lay.base[pclu]]
    roles = [np.full(len(home), cb.MEMBER, np.int8), np.full(len(prow), cb.PROBE, np.int8)]
    split = (lay.members > 1) | (lay.probes > 1)
    simple = [~split[home], ~split[pclu]]
    rows = [r[m] for r, m in zip(rows, simple, strict=True)]
    blocks = [b[m] for b, m in zip(blocks, simple, strict=True)]
    roles = [o[m] for o, m in zip(roles, simple, strict=True)]
    for c in np.flatnonzero(split):
        s, t, base = int(lay.members[c]), int(lay.probes[c]), int(lay.base[c])
        tri = (
            s + np.arange(s)[:, None] * s - np.arange(s)[:, None] * (np.arange(s)[:, None] + 1) // 2
        )
        m = np.flatnonzero(home == c)
        i = _chunk(keys[m], s)[:, None]
        j = np.arange(s)[None, :]
        lo, hi = np.minimum(i, j), np.maximum(i, j)
        block = np.where(i == j, i, tri[lo, 0] + hi - lo - 1)
        role = np.select([i == j, i < j], [cb.MEMBER, cb.PROBE], cb.SIDE)
        rows.append(np.repeat(m, s))
        blocks.append(base + block.reshape(-1))
        roles.append(role.reshape(-1).astype(np.int8))
        p = prow[pclu == c]
        pblock = j if t == 1 else s + s * (s - 1) // 2 + j * t + _chunk(keys[p], t)[:, None]
        rows.append(np.repeat(p, s))
        blocks.append(base + np.broadcast_to(pblock, (len(p), s)).reshape(-1))
        roles.append(np.full(len(p) * s, cb.PROBE, np.int8))
        if t > 1:
            k = np.arange(t)[None, :]
            rows.append(np.repeat(m, t))
            blocks.append(base + (s + s * (s - 1) // 2 + i * t + k).reshape(-1))
            roles.append(np.full(len(m) * t, cb.SIDE, np.int8))
    return np.concatenate(rows), np.concatenate(blocks), np.concatenate(roles)


def route_partition(
    df: Any,
    column: str,
    layout: Layout,
    *,
    eps: float,
    device: str,
    chunk_bytes: int,
    keyed: bool = False,
    partition_info: dict[str, Any] | None = None,
) -> pd.DataFrame:
    """One copy of each usable row for its home cluster's block(s) and one for each block
    it probes: "_block", "_role", "_key" and the raw vectors ("_vec", the layout's dtype),
    indexed by the rows' labels.  Rows that cannot match are left out.  The keys are
    made from the partition's number, or with ``keyed`` taken from the keys
    :func:`with_keys` put beside ``column`` (a piece of a partition): never from a
    column of the user's, whatever its name."""
    part = partition_number(partition_info)
    all_keys = df[key_column(column)].to_numpy() if keyed else row_keys(part, len(df))
    prep = prepared_rows(df, column, eps, device)
    d, usable, delta = _usable(prep)
    if delta > layout.delta:
        raise RuntimeError(
            f"torch's float32 matrix products here may round their inputs to {ck.matmul_inputs()}, "
            "more than where the cluster radii were computed; give every worker the same "
            "torch float32 matmul settings (torch.set_float32_matmul_precision or "
            "torch.backends' fp32_precision)"
        )
    home, prow, pclu = ck.route(
        d, layout.centroids.to(d.device), layout.floor.to(d.device), layout.threshold,
        layout.delta, layout.n_probe, chunk_bytes, layout.bfloat16,
    )  # fmt: skip
    # The float32 unit rows (twice a float16 partition) go before the copies come.
    raw_rows = prep.raw
    del d, prep
    usable_np = usable.cpu().numpy()
    keys = all_keys[usable_np]
    rows, blocks, roles = _copies(
        layout, keys, home.cpu().numpy(), prow.cpu().numpy(), pclu.cpu().numpy()
    )
    src = usable_np[rows]
    raw = raw_rows[torch.from_numpy(src).to(raw_rows.device)]
    raw = raw.to(getattr(torch, layout.dtype)).cpu()
    return pd.DataFrame(
        {"_block": blocks, "_role": roles, "_key": keys[rows], VEC: encode_rows(raw)},
        index=labels(df)[src],
    )


def route_meta(index: pd.Index, dtype: str, dim: int) -> pd.DataFrame:
    """The (empty) frame :func:`route_partition` returns."""
    empty = torch.zeros((0, dim), dtype=getattr(torch, dtype))
    return pd.DataFrame(
        {
            "_block": np.zeros(0, np.int64),
            "_role": np.zeros(0, np.int8),
            "_key": np.zeros(0, np.int64),
            VEC: encode_rows(empty),
        },
        index=index[:0],
    )


def search_blocks(
    df: pd.DataFrame,
    threshold: float,
    dtype: str,
    dim: int,
    *,
    drops: bool,
    eps: float,
    device: str,
    tile_bytes: int,
    precision: str = "fp32",
    budget: Budget | None = None,
    partition_info: dict[str, Any] | None = None,
    best: bool = False,
) -> pd.DataFrame:
    """Every pair scoring at least ``threshold`` in each block of a shuffled partition
    (its rows of ``dim`` values of ``dtype``), found by tiles of ``precision`` (as
    :func:`~dask_cosim.search_kernels.threshold_pairs` takes it).

    ``drops`` False: "_lkey", "_rkey" (frame-order keys, the earlier row first), "left",
    "right" (labels) and "score" (float64).  ``drops`` True: "_key", the later row of
    each pair (the row ``dedup`` drops).  ``budget``: the pairs the task may hold, over
    all its blocks, past which it raises :class:`~dask_cosim.errors.ResultTooLargeError`;
    with ``drops`` (or ``best``: dedup's removed rows, each later row's best alone) what
    the task keeps of its blocks (a block's pairs past it are searched again by blocks
    of rows: :func:`.clustered_blocks.kept_pairs`).
    """
    block_all, role_all = df["_block"].to_numpy(), df["_role"].to_numpy()
    # Each block's rows together, in role order, members by key (block_pairs).
    order = np.lexsort([df["_key"].to_numpy(), role_all, block_all])
    x = decode_rows(df[VEC], dtype, dim, order)
    df = df.drop(columns=VEC).iloc[order]
    block, role = block_all[order], role_all[order]
    keys_np = df["_key"].to_numpy()
    prep = sk.prepare(x, eps=eps, device=partition.resolve_device(device, x.device))
    key = torch.from_numpy(keys_np.copy()).to(prep.unit.device)
    starts = np.flatnonzero(np.r_[True, block[1:] != block[:-1]])[: len(block)]
    stops = np.r_[starts[1:], len(block)][: len(starts)]
    first: list[np.ndarray] = []
    second: list[np.ndarray] = []
    score: list[np.ndarray] = []
    blocks = f"{len(starts)} block{'s' * (len(starts) != 1)}"
    where = (
        f"the search of the blocks of routing-shuffle partition "
        f"{partition_number(partition_info)} ({len(block):,} routed rows in {blocks})"
    )
    with collecting(budget, where, SMALLER_BLOCKS) as limit:
        for s, e in zip(starts, stops, strict=True):
            counts = np.bincount(role[s:e], minlength=3)
            if drops or best:  # a row or a pair a dropped row
                i, j, sc = cb.kept_pairs(
                    "rows" if drops else "best", cb.rows(prep, s, e), int(counts[cb.MEMBER]),
                    int(counts[cb.SIDE]), key[s:e], threshold, tile_bytes=tile_bytes,
                    precision=precision, most=None if limit is None else limit.most,
                )  # fmt: skip
                # The block's search held to the budget alone; what the task keeps of
                # every block, together.
                if limit is not None:
                    limit.add(len(j))
            else:
                i, j, sc = cb.block_pairs(
                    cb.rows(prep, s, e),
                    int(counts[cb.MEMBER]),
                    int(counts[cb.SIDE]),
                    key[s:e],
                    threshold,
                    tile_bytes=tile_bytes,
                    precision=precision,
                    limit=limit,
                )
            # Positions in the partition, in place (the pairs are this task's to change).
            first.append(i.add_(s).cpu().numpy())
            second.append(j.add_(s).cpu().numpy())
            score.append(sc.cpu().numpy())
    # Each list goes as soon as it is joined: no block's arrays beside the whole.
    b = _joined(second, np.int64)
    if drops:
        return pd.DataFrame({"_key": np.unique(keys_np[b])})
    labels = df.index
    columns = {"_rkey": keys_np[b], "right": labels.take(b)}
    del b
    a = _joined(first, np.int64)
    columns |= {"_lkey": keys_np[a], "left": labels.take(a)}
    del a
    columns["score"] = _joined(score, np.float64)
    names = ["_lkey", "_rkey", "left", "right", "score"]
    return pd.DataFrame({c: columns.pop(c) for c in names}, copy=False)


def _joined(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    """``parts`` as one array, emptying the list (one part: itself, no copy)."""
    out = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, dtype)
    parts.clear()
    return out


def found_meta(meta: pd.DataFrame, drops: bool) -> pd.DataFrame:
    """The (empty) frame :func:`search_blocks` returns, for a result of meta ``meta``."""
    if drops:
        return pd.DataFrame({"_key": np.zeros(0, np.int64)})
    keys = pd.DataFrame({"_lkey": np.zeros(0, np.int64), "_rkey": np.zeros(0, np.int64)})
    return pd.concat([keys, meta.astype({"score": np.float64})], axis=1)
