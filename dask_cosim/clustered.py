"""Clustered neighbours and dedup: all pairs scoring at least a threshold, without
scoring all pairs.

Exact all-pairs search grows with the square of the rows.  Here the rows are clustered
first and compared within clusters, and a row is also compared with the rows of every
other cluster that the skip rule (:mod:`dask_cosim.clustered_kernels`) cannot rule out:

1. a Bernoulli sample of the rows; spherical k-means on it, in one task (on the worker's
   device); the centroids are one key, sent once to each worker;
2. one pass over the rows: each cluster's size and radius (an upper bound of the angle
   between its centroid and any of its rows), gathered in the client;
3. one pass that copies each row to its home cluster's block, and to the blocks of the
   clusters it probes; a dask ``shuffle`` on the block number brings each block's rows
   together (big clusters are split into sub-blocks, small ones share a partition);
4. in each block the exact kernels (:func:`dask_cosim.search_kernels.threshold_pairs`,
   float64 decisions): every pair reported is exact, and so is its score;
5. back to frame order: pairs sorted by left row, or the dropped rows removed.

Steps 1-2 run when the call is made (as ``set_index`` computes its divisions); 3-5 are
the lazy result.  Modes: ``n_probe=None`` (exact) probes every cluster within reach, so
the result equals the all-pairs one (recall 1, by the proof in the kernels); an integer
probes at most that many clusters per row (faster on diffuse data, where few clusters
can be ruled out; recall below 1, measured by :mod:`dask_cosim.clustered_recall`).
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import torch
from dask.base import tokenize

from dask_cosim import backends, options, partition, search
from dask_cosim import clustered_kernels as ck
from dask_cosim import clustered_partition as cp
from dask_cosim import search_partition as sp

__all__ = ["Plan", "dedup", "neighbors", "plan"]

# The plan computes when the call is made, before any progress bar of the lazy result can
# show: it reports its steps here (INFO; the CLI shows them unless --quiet).
logger = logging.getLogger(__name__)

# Rows of the sample the plan routes to estimate each cluster's probes (for block sizes).
PROBE_SAMPLE = 20_000
# The exact mode warns when it expects each row to be copied to more blocks than this.
EXACT_COPIES_WARNING = 8


def default_clusters(rows: int) -> int:
    """Clusters for ``rows`` rows: the centroid pass costs rows x k scores and the blocks
    about rows x rows / k, so about sqrt(rows) balances them."""
    return max(1, round(math.sqrt(max(rows, 1))))


@dataclass
class Plan:
    """What the clustering found, before the search runs.

    ``layout`` goes to the workers (centroids, score floors, block numbering); ``stats`` the
    clusters' sizes and radii; ``probes`` the estimated probe copies per cluster;
    ``partitions`` the shuffle's output partitions; ``sample`` the rows k-means saw.
    """

    layout: cp.Layout
    stats: cp.Stats
    threshold: float
    probes: np.ndarray
    partitions: int
    sample: int

    @property
    def n_clusters(self) -> int:
        return len(self.stats.counts)

    @property
    def pair_scores(self) -> float:
        """Estimated pair scores in the blocks (members among themselves, probes against
        members), to compare with ``rows * (rows - 1) / 2`` for all pairs."""
        n = self.stats.counts.astype(np.float64)
        return float((n * (n - 1) / 2 + self.probes * n).sum())

    @property
    def centroid_scores(self) -> float:
        """Scores of rows against centroids: two passes over the rows."""
        return 2.0 * self.stats.rows * self.n_clusters


def _check(df: Any, on: str, threshold: Any, n_probe: Any, clusters: Any) -> float:
    """The threshold, once ``on``, ``n_probe`` and ``clusters`` are checked."""
    search.check_column(df, on)
    options.search_method("clustered", threshold=threshold, n_probe=n_probe, clusters=clusters)
    return float(threshold)


def _tree(call: Any, fn: Any, items: list[Any], every: int = 32) -> Any:
    while len(items) > 1:
        items = [call(fn)(*items[s : s + every]) for s in range(0, len(items), every)]
    return items[0]


def _sample(*parts: torch.Tensor) -> torch.Tensor:
    return torch.cat(parts)


def _head(sample: torch.Tensor, rows: int) -> torch.Tensor:
    """At most ``rows`` rows of ``sample``, spread over it (its order follows partitions)."""
    if len(sample) <= rows:
        return sample
    return sample[torch.linspace(0, len(sample) - 1, rows).long()]


def _kmeans(sample: torch.Tensor, k: int, iters: int, seed: int, device: str) -> torch.Tensor:
    if len(sample) == 0:  # no usable row: any centroid will do
        one = torch.zeros((1, sample.shape[1]), dtype=torch.float32)
        one[0, :1] = 1.0
        return one
    target = partition.resolve_device(device, sample.device)
    return ck.kmeans(sample.to(target), k, iters=iters, seed=seed).cpu()


def _probes(
    sample: torch.Tensor, centroids: torch.Tensor, stats: cp.Stats, threshold: float,
    n_probe: int | None, chunk_bytes: int,
) -> np.ndarray:  # fmt: skip
    """Per cluster, how many rows of ``sample`` would probe it (to size the blocks)."""
    floor = ck.floors(torch.from_numpy(stats.radius), threshold, stats.dim, stats.delta)
    _, _, clusters = ck.route(
        sample, centroids, floor, threshold, stats.delta, n_probe, chunk_bytes
    )
    return torch.bincount(clusters.cpu(), minlength=len(centroids)).numpy()


def plan(
    df: Any,
    on: str,
    threshold: float,
    *,
    clusters: int | None = None,
    n_probe: int | None = None,
    sample_rows: int | None = None,
    iters: int | None = None,
    seed: int = 0,
    block_bytes: int | None = None,
) -> Plan:
    """Cluster ``df[on]`` for a clustered search at ``threshold`` (computes now: a sample,
    k-means, one pass for the clusters' sizes and radii).

    Parameters
    ----------
    df : DataFrame
        dask, pandas or cudf.
    on : str
        The embedding column.
    threshold : float
        In (0, 1].
    clusters : int, optional
        k of k-means; default about sqrt(rows).
    n_probe : int, optional
        None (provable: every pair is found, recall 1) or the most clusters each row
        probes beyond its own (faster when the skip rule rules out few clusters; recall
        may fall below 1: measure it with :func:`dask_cosim.clustered_recall.sample_truth`);
        0: each row meets its own cluster's rows only.
    sample_rows : int, optional
        Rows k-means sees; default ``cosim.search.clustered.sample-per-cluster`` per
        cluster, at least ``min-sample``.
    iters : int, optional
        Lloyd iterations; default ``cosim.search.clustered.iterations``.
    seed : int, default 0
        Seed of the sample and of k-means' seeding.
    block_bytes : int, optional
        About the most bytes of rows one block holds (bigger clusters are split); default
        ``cosim.search.clustered.block-bytes``.
    """
    threshold = _check(df, on, threshold, n_probe, clusters)
    sample_rows = options.positive_int("sample_rows", sample_rows, "sample_rows=100_000")
    config = options.clustered()
    iters = config.iterations if iters is None else iters
    block_bytes = config.block_bytes if block_bytes is None else block_bytes
    lazy = dask.is_dask_collection(df)
    eps, device = options.eps(), options.device()
    chunk = options.search_tile_bytes()["cpu"]
    rows = len(df)
    k = clusters or default_clusters(rows)
    want = sample_rows or max(config.min_sample, config.sample_per_cluster * k)
    fraction = min(1.0, want / max(rows, 1))

    def call(fn: Any) -> Any:
        return dask.delayed(fn, pure=True) if lazy else fn

    parts = df[[on]].to_delayed() if lazy else [df]
    sample = call(_sample)(
        *[
            call(cp.sample_partition)(
                p, on, i, fraction=fraction, seed=seed, eps=eps, device=device
            )
            for i, p in enumerate(parts)
        ]
    )
    # Two computations, so that no partition waits in memory for k-means to finish.
    centroids = call(_kmeans)(sample, k, iters, seed, device)
    probe_sample = call(_head)(sample, PROBE_SAMPLE)
    seen = call(len)(sample)
    started = time.perf_counter()
    logger.info("clustered: k-means on a sample of about %d of %d rows, %d clusters",
                round(fraction * rows), rows, k)  # fmt: skip
    if lazy:
        centroids, probe_sample, seen = dask.compute(centroids, probe_sample, seen)
    logger.info("clustered: k-means done in %.1f s; the clusters' radii next",
                time.perf_counter() - started)  # fmt: skip
    stats = _tree(
        call,
        cp.merge_stats,
        [
            call(cp.stats_partition)(p, on, centroids, eps=eps, device=device, chunk_bytes=chunk)
            for p in parts
        ],
    )
    if lazy:
        (stats,) = dask.compute(stats)
    probes = _probes(probe_sample, centroids, stats, threshold, n_probe, chunk)
    scale = stats.rows / max(len(probe_sample), 1)
    if n_probe is None and probes.sum() * scale > EXACT_COPIES_WARNING * stats.rows:
        warnings.warn(
            f"method='clustered' at threshold={threshold!r}: the skip rule rules out few "
            f"clusters here, so each row goes to about {probes.sum() * scale / stats.rows:.0f} "
            "blocks besides its own (memory and shuffle grow with that); n_probe=2 bounds "
            "it (measure the recall with dask_cosim.clustered_recall)",
            stacklevel=6,  # the line that called df.cosim.neighbors or dedup
        )
    found = _layout(
        centroids, stats, threshold, n_probe, probes * scale, seen, block_bytes,
        df.npartitions if lazy else 1,
    )  # fmt: skip
    logger.info("clustered: planned in %.1f s: about %.1f copies per row, %d output "
                "partitions; the search is lazy from here", time.perf_counter() - started,
                1 + probes.sum() * scale / max(stats.rows, 1), found.partitions)  # fmt: skip
    return found


def _layout(
    centroids: torch.Tensor,
    stats: cp.Stats,
    threshold: float,
    n_probe: int | None,
    probes: np.ndarray,
    seen: int,
    block_bytes: int,
    npartitions: int,
) -> Plan:
    itemsize = getattr(torch, stats.dtype).itemsize
    # A row in a block: its Arrow copy, its raw rows and float32 unit rows after prepare.
    row_bytes = stats.dim * (2 * itemsize + 4) + 64
    rows_per_block = max(1, block_bytes // row_bytes)
    members = np.maximum(1, -(-stats.counts // rows_per_block))
    probe_chunks = np.maximum(1, np.ceil(probes / rows_per_block)).astype(np.int64)
    blocks = cp.blocks_of(members, probe_chunks)
    base = np.r_[0, np.cumsum(blocks)[:-1]].astype(np.int64)
    copies = float((stats.counts * (members + np.where(probe_chunks > 1, probe_chunks, 0))).sum())
    copies += float((probes * members).sum())
    layout = cp.Layout(
        centroids=centroids,
        floor=ck.floors(torch.from_numpy(stats.radius), threshold, stats.dim, stats.delta),
        threshold=threshold,
        delta=stats.delta,
        n_probe=n_probe,
        base=base,
        members=members.astype(np.int64),
        probes=probe_chunks,
        dtype=stats.dtype,
        dim=stats.dim,
    )
    partitions = max(npartitions, math.ceil(copies / rows_per_block))
    return Plan(layout, stats, threshold, probes, partitions, seen)


def _pairs_meta(df: Any, on: str, carried: dict[str, Any] | None = None) -> pd.DataFrame:
    """The pandas meta of the result: that of the exact ``neighbors(threshold=...)``
    (with its ``carried`` columns, {name: dtype})."""
    like = search._meta_of(df)
    spec = backends.column_spec(df, on)
    return sp.result_meta(like.index, like.index, sp.score_dtype(spec), False, carried)


def _found(df: Any, on: str, p: Plan, drops: bool, by: str) -> Any:
    """What :func:`clustered_partition.search_blocks` finds with plan ``p`` (the pairs, or
    with ``drops`` the keys of the rows to drop), indexed by the key column ``by`` and,
    for a dask frame, lazily gathered into the input partition that key names."""
    eps, device = options.eps(), options.device()
    tiles = options.search_tile_bytes()
    tile = tiles["cuda" if device.startswith("cuda") else "cpu"]
    kwargs: dict[str, Any] = {"eps": eps, "device": device}
    # The blocks are searched as the all-pairs search is: same tiles, same precision.
    search = {"tile_bytes": tile, "precision": options.search_precision(), **kwargs}
    if not dask.is_dask_collection(df):
        routed = cp.route_partition(df, on, p.layout, chunk_bytes=tiles["cpu"], **kwargs)
        found = cp.search_blocks(
            routed, p.threshold, p.layout.dtype, p.layout.dim, drops=drops, **search
        )
        return found.set_index(by)
    layout = dask.delayed(p.layout, name=f"cosim-clustered-layout-{tokenize(p.layout.centroids)}")
    routed = df[[on]].map_partitions(
        cp.route_partition,
        on,
        layout,
        chunk_bytes=tiles["cpu"],
        meta=cp.route_meta(df._meta.index, p.layout.dtype, p.layout.dim),
        token="cosim-clustered-route",
        **kwargs,
    )
    shuffled = routed.shuffle(on="_block", npartitions=p.partitions)
    found = shuffled.map_partitions(
        cp.search_blocks,
        p.threshold,
        p.layout.dtype,
        p.layout.dim,
        drops=drops,
        meta=cp.found_meta(_pairs_meta(df, on), drops),
        token="cosim-clustered-blocks",
        **search,
    )
    return _gather(found, by, df)


def _gather(found: Any, by: str, df: Any, carried: bool = False) -> Any:
    """``found`` indexed by its key column ``by``, for a dask frame gathered into the
    partition of ``df`` that each key names (its top bits).  ``carried``: ``found``
    holds carried columns, which go by dask's task shuffle (the p2p one rebuilds
    dtypes from their names, and cannot, e.g., an Arrow list's)."""
    if not dask.is_dask_collection(found):
        return found.set_index(by)
    bounds = [i << cp.POS_BITS for i in range(df.npartitions + 1)]
    method = "tasks" if carried else None
    return found.set_index(by, divisions=bounds, shuffle_method=method)


def _carry(found: Any, df: Any, cols: list[Any], prefix: str) -> Any:
    """``found`` (gathered by :func:`_gather`) with the ``cols`` of the rows its keys
    name, taken from their own partitions: :func:`clustered_partition.with_carried`."""
    payload = df[cols]
    if not dask.is_dask_collection(found):
        return cp.with_carried(found, payload, prefix)
    meta = cp.with_carried(found._meta, payload._meta, prefix)
    return dd.map_partitions(
        cp.with_carried, found, payload, prefix, meta=meta, align_dataframes=False
    )


def _per_partition(fn: Any, found: Any, *args: Any, meta: Any = None) -> Any:
    """``fn(part, *args)`` on each partition of ``found`` (eager: on the one frame);
    ``meta`` by default ``fn`` of ``found``'s."""
    if not dask.is_dask_collection(found):
        return fn(found, *args)
    return found.map_partitions(fn, *args, meta=fn(found._meta, *args) if meta is None else meta)


def _drop(df: Any, found: Any) -> Any:
    """``df`` without the rows whose keys index ``found``."""
    if not dask.is_dask_collection(df):
        return cp.drop_keys(df, found)
    return dd.map_partitions(cp.drop_keys, df, found, meta=df._meta, align_dataframes=False)


def _search(df: Any, on: str, p: Plan, cols: list[Any]) -> Any:
    """The pairs of plan ``p``: the ``neighbors(threshold=...)`` result.  With ``cols``
    the pairs go to their right row's partition for its columns, then to their left
    row's for its own."""
    dtypes, carried = search._pair_columns(df, cols, df, cols)
    meta, like = _pairs_meta(df, on, dtypes), search._meta_of(df)
    if not cols:
        found = _found(df, on, p, drops=False, by="_lkey")
    else:
        found = _carry(_found(df, on, p, drops=False, by="_rkey"), df, cols, "_p")
        found = _carry(_gather(found.reset_index(), "_lkey", df, True), df, cols, "_q")
    out_meta = backends.frame_like(meta, like)
    return _per_partition(cp.finish_pairs, found, meta, like, carried, meta=out_meta)


def _dedup(df: Any, on: str, p: Plan, removed: bool, cols: list[Any]) -> Any:
    """``df`` without the rows that have an earlier match; with ``removed`` also dedup's
    removed rows: the pairs, gathered by their later (right) row's partition, give both
    the rows to drop and each one's best earlier match (chosen as the exact method
    chooses it, :func:`dask_cosim.search_dedup.best_matches`); with ``cols`` those
    matches go to their earlier row's partition for its columns, and back."""
    if not removed:
        return _drop(df, _found(df, on, p, drops=True, by="_key"))
    dtypes, carried = search._pair_columns(df, cols, df, cols)
    meta, like = _pairs_meta(df, on, dtypes), search._meta_of(df)
    pairs = _found(df, on, p, drops=False, by="_rkey")
    best = pairs
    if cols:
        best = _carry(_gather(_per_partition(cp.best_earlier, pairs), "_lkey", df), df, cols, "_q")
        best = _carry(_gather(best.reset_index(), "_key", df, True), df, cols, "_p")
    out_meta = backends.frame_like(meta, like)
    return _drop(df, pairs), _per_partition(
        cp.removed_rows, best, meta, like, carried, meta=out_meta
    )


def neighbors(
    df: Any, on: str, *, threshold: float, columns: Sequence[Hashable] | None = None,
    **options: Any,
) -> Any:  # fmt: skip
    """Every pair of rows scoring at least ``threshold``, by the clustered method.

    The result is that of ``neighbors(on, threshold=..., columns=...)`` (exact
    all-pairs): columns ``left``, ``right`` (index labels), ``score``, then
    ``left_<c>``, ``right_<c>`` for each of ``columns`` (taken from the rows' own
    partitions: rows are named by frame position, never by label); each unordered pair
    once, the earlier row (frame order) on the left; one partition per input partition,
    sorted by left row then right row.  Scores are the float64 ones (cast to the result
    dtype).  Other arguments as :func:`plan` takes them (``clusters``, ``n_probe``, ...).

    Returns
    -------
    DataFrame
        Lazy for a dask frame (the clustering is computed when this is called), else
        eager.
    """
    cols = search._carried(df, columns, "columns")
    return _search(df, on, plan(df, on, threshold, **options), cols)


def dedup(
    df: Any, on: str, threshold: float, *, return_removed: bool = False,
    columns: Sequence[Hashable] | None = None, **options: Any,
) -> Any:  # fmt: skip
    """``df`` without every row that has an earlier row (frame order) scoring at least
    ``threshold`` with it, by the clustered method (as ``dedup``: chains are not
    followed; rows that cannot match are kept).  Same partitions and divisions as
    ``df``; with ``n_probe`` set, rows whose only earlier matches were missed are kept.
    With ``return_removed``, ``(kept, removed)``: ``removed`` as the exact method's (per
    dropped row, in frame order, ``left`` its earlier match of highest float64 score,
    ties to the earliest, ``right`` the row, ``score``, then ``left_<c>``, ``right_<c>``
    for each of ``columns``).  Options as in :func:`neighbors`."""
    cols = search._carried(df, columns, "columns")
    return _dedup(df, on, plan(df, on, threshold, **options), return_removed, cols)
