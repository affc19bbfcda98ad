"""The plan of the clustered search: what it computes when the call is made, before the
lazy search (:mod:`dask_cosim.clustered`) is built.

0. the rows counted, their values unread (the index alone: no vector is read);
1. a Bernoulli sample of the rows, in one shard per thread of a distributed cluster
   (else one); spherical k-means on it, each Lloyd iteration's product where the shards
   lie (on the workers' devices, :mod:`dask_cosim.clustered_kmeans`); the centroids are
   one key, sent once to each worker;
2. one pass over the rows: each cluster's size and radius (an upper bound of the angle
   between its centroid and any of its rows), gathered in the client;
3. the probes of a sample of rows routed as the search will route them, scaled to the
   rows: the blocks' sizes, the shuffle's partitions, the bytes it will move.

It reports its steps as INFO messages of the ``dask_cosim.clustered`` logger (the CLI
shows them unless --quiet): no progress bar of the lazy result can show them.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from dataclasses import dataclass
from typing import Any

import dask
import numpy as np
import torch
from dask.base import tokenize

from dask_cosim import clustered_kernels as ck
from dask_cosim import clustered_kmeans as km
from dask_cosim import clustered_partition as cp
from dask_cosim import errors, options, partition, search
from dask_cosim import search_graph as sg

__all__ = [
    "COPY_PAIR_SCORES", "EXACT_COPIES_WARNING", "PROBE_SAMPLE", "Plan", "default_clusters",
    "plan",
]  # fmt: skip

# The logger of the clustered search, which the CLI shows.
logger = logging.getLogger("dask_cosim.clustered")

# Rows of the sample the plan routes to estimate each cluster's probes (for block sizes).
PROBE_SAMPLE = 20_000
# The exact mode warns when it expects each row to be copied to more blocks than this.
EXACT_COPIES_WARNING = 8
# The fewest rows a block holds, whatever the block bytes say: a cluster of m rows in
# blocks of b is searched in about (m / b)^2 / 2 pairs of blocks, each with copies of
# its two blocks' rows, so blocks of a few rows (block-bytes of a few KiB) made the
# routing shuffle more partitions than rows (4,000 rows of 32 values at 4 KiB: 22,668).
MIN_BLOCK_ROWS = 32
# What one copy of a row through the routing shuffle costs, in pair scores of the
# blocks' search: both grow with D.  Measured on 2 CPU cores, 50,000-100,000 x 384 rows,
# the shuffle in memory: 830-1,320 (docs/clustered.md, "When it runs exact all-pairs").
COPY_PAIR_SCORES = 1200


def default_clusters(rows: int) -> int:
    """Clusters for ``rows`` rows: the centroid pass costs rows x k scores and the blocks
    about rows x rows / k, so about sqrt(rows) balances them."""
    return max(1, round(math.sqrt(max(rows, 1))))


@dataclass
class Plan:
    """What the clustering found, before the search runs.

    ``layout`` goes to the workers (centroids, score floors, block numbering); ``stats`` the
    clusters' sizes and radii; ``probes`` the estimated probe copies per cluster;
    ``partitions`` the shuffle's output partitions; ``sample`` the rows k-means saw;
    ``exact_instead``: the search runs exact all-pairs instead, expected to cost no more
    (:attr:`cost_vs_exact`, with ``cosim.search.clustered.exact-when-cheaper``).
    """

    layout: cp.Layout
    stats: cp.Stats
    threshold: float
    probes: np.ndarray
    partitions: int
    sample: int
    exact_instead: bool = False

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
    def copies(self) -> float:
        """Estimated routed rows, every copy: each row once, and once per probe."""
        return self.stats.rows + float(self.probes.sum())

    @property
    def all_pairs(self) -> float:
        """The pair scores of exact all-pairs: ``rows * (rows - 1) / 2`` (at least 1)."""
        return max(self.stats.rows * (self.stats.rows - 1) / 2, 1.0)

    @property
    def cost_vs_exact(self) -> float:
        """The clustered search's expected cost over exact all-pairs': its pair scores
        plus :data:`COPY_PAIR_SCORES` per routed row, over :attr:`all_pairs`."""
        return (self.pair_scores + COPY_PAIR_SCORES * self.copies) / self.all_pairs

    def many_copies(self) -> str | None:
        """The warning for a provable plan that copies each row to more than
        :data:`EXACT_COPIES_WARNING` blocks besides its own, else None (said by
        :mod:`dask_cosim.clustered` once it has checked the shuffle's room)."""
        extra = float(self.probes.sum()) / max(self.stats.rows, 1)
        if self.layout.n_probe is not None or extra <= EXACT_COPIES_WARNING:
            return None
        return (
            f"method='clustered' at threshold={self.threshold!r}: the skip rule rules out "
            f"few clusters here, so each row goes to about {extra:.0f} blocks besides its "
            "own (memory and shuffle grow with that); n_probe=2 bounds it (measure the "
            "recall with dask_cosim.clustered_recall)"
        )

    @property
    def routed_bytes(self) -> float:
        """Estimated bytes of the routed rows, every copy (what the shuffle moves)."""
        return self.copies * (self.layout.dim * getattr(torch, self.layout.dtype).itemsize + 40)

    @property
    def centroid_scores(self) -> float:
        """Scores of rows against centroids: two passes over the rows."""
        return 2.0 * self.stats.rows * self.n_clusters


def _check(df: Any, on: str, threshold: Any, n_probe: Any, clusters: Any) -> float:
    """The threshold, once ``on``, ``n_probe`` and ``clusters`` are checked."""
    search.check_column(df, on)
    options.search_method("clustered", threshold=threshold, n_probe=n_probe, clusters=clusters)
    return float(threshold)


def _rows(df: Any) -> int:
    """The rows of ``df``, their values unread.  dask's ``len`` knows them for a frame
    whose graph holds its data (``dd.from_pandas``); elsewhere it hands the count to the
    input's read, and a ``read_parquet`` read (dask's ``from_map``) then reads every
    column: the lengths of an empty projection read the index alone (and the columns a
    filter tests)."""
    if not dask.is_dask_collection(df) or sg.holds_data(df):
        return len(df)
    return int(df[[]].map_partitions(len).sum().compute())


def _tree(call: Any, fn: Any, items: list[Any], every: int = 32) -> Any:
    while len(items) > 1:
        items = [call(fn)(*items[s : s + every]) for s in range(0, len(items), every)]
    return items[0]


def _dim(rows: torch.Tensor) -> int:
    return rows.shape[1]


def _same_dim(column: str, *dims: int) -> int:
    """The one D of every partition's sample, or the error naming two partitions (a
    partition's own rows are checked when it is read, not against the others).  An
    empty partition's list column says 0."""
    first = next((p for p, dim in enumerate(dims) if dim), 0)
    for part, dim in enumerate(dims):
        if dim and dim != dims[first]:
            raise errors.ragged_partitions(column, first, dims[first], part, dim)
    return dims[first]


def _sample(dim: int, *parts: torch.Tensor) -> torch.Tensor:
    """One shard: the samples of its partitions, which :func:`_same_dim` checked (an
    empty partition's sample may be (0, 0): it takes its place as (0, ``dim``))."""
    return torch.cat([p if p.shape[1] == dim else p.reshape(0, dim) for p in parts])


def _head(rows: int, *shards: torch.Tensor) -> torch.Tensor:
    """At most ``rows`` rows of the shards, spread over them (their order follows
    partitions)."""
    sample = torch.cat(shards)
    if len(sample) <= rows:
        return sample
    return sample[torch.linspace(0, len(sample) - 1, rows).long()]


def _shards(lazy: bool, npartitions: int) -> int:
    """Shards of the k-means sample: one per thread of the distributed cluster, where
    there is one (the Lloyd iterations' products then run on all of them: each of the
    CLI's workers has one thread), else one (the local schedulers run its product on all
    of torch's threads)."""
    if not lazy:
        return 1
    try:
        from distributed import default_client

        threads = sum(default_client().nthreads().values())
    except (ImportError, ValueError):
        return 1
    return max(1, min(npartitions, threads))


def _seeds(
    shard: torch.Tensor, lens: list[int], j: int, k: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    return km.seeds(shard, sum(lens[:j]), sum(lens), k, seed)


def _lloyd_sums(
    shard: torch.Tensor, cent: torch.Tensor, device: str, bfloat16: bool | None
) -> km.Sums:
    """:func:`~dask_cosim.clustered_kmeans.lloyd_sums` on the worker's device, back on the
    CPU."""
    target = partition.resolve_device(device, shard.device)
    sums = km.lloyd_sums(shard.to(target), cent.to(target), bfloat16=bfloat16)
    return km.Sums(*(t.cpu() for t in sums))


def _kmeans(
    call: Any, shards: list[Any], lens: list[Any], k: int, iters: int, seed: int, device: str,
    bfloat16: bool | None,
) -> Any:  # fmt: skip
    """The centroids of the sample's ``shards`` (a graph of ``iters`` steps when lazy)."""
    seeded = [call(_seeds)(s, lens, j, k, seed) for j, s in enumerate(shards)]
    cent = call(km.first_centroids)(*seeded)
    for _ in range(iters):
        sums = [call(_lloyd_sums)(s, cent, device, bfloat16) for s in shards]
        cent = call(km.lloyd_step)(cent, *sums)
    return cent


def _probes(
    sample: torch.Tensor, centroids: torch.Tensor, stats: cp.Stats, threshold: float,
    n_probe: int | None, chunk_bytes: int, bfloat16: bool | None,
) -> np.ndarray:  # fmt: skip
    """Per cluster, how many rows of ``sample`` would probe it (to size the blocks)."""
    floor = ck.floors(torch.from_numpy(stats.radius), threshold, stats.dim, stats.delta)
    _, _, clusters = ck.route(
        sample, centroids, floor, threshold, stats.delta, n_probe, chunk_bytes, bfloat16
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
    """Cluster ``df[on]`` for a clustered search at ``threshold`` (computes now: the row
    count, which reads no vector; a sample and k-means; one pass for the clusters' sizes
    and radii).

    Parameters
    ----------
    df : DataFrame
        dask, pandas or cudf.
    on : str
        The embedding column.
    threshold : float
        In (0, 1].
    clusters : int, optional
        k of k-means; default about sqrt(rows); at most the rows.
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
        About the most bytes of rows one block holds (bigger clusters are split), but
        never fewer than :data:`MIN_BLOCK_ROWS` rows; default
        ``cosim.search.clustered.block-bytes``.
    """
    threshold = _check(df, on, threshold, n_probe, clusters)
    sample_rows = options.positive_int("sample_rows", sample_rows, "sample_rows=100_000")
    config = options.clustered()
    iters = config.iterations if iters is None else iters
    block_bytes = config.block_bytes if block_bytes is None else block_bytes
    lazy = dask.is_dask_collection(df)
    eps, device = options.eps(), options.device()
    # Centroid scores from bfloat16 products first where the CPU has bfloat16 units, as
    # the exact search's tiles (None: each worker asks its CPU).
    low = False if options.search_precision() == "fp32" else None
    chunk = options.search_tile_bytes()["cpu"]
    rows = _rows(df)
    # More clusters than rows: k-means seeds one a row (and the sample would be them all).
    k = min(clusters or default_clusters(rows), max(rows, 1))
    want = sample_rows or max(config.min_sample, config.sample_per_cluster * k)
    fraction = min(1.0, want / max(rows, 1))

    def call(fn: Any) -> Any:
        return dask.delayed(fn, pure=True) if lazy else fn

    parts = df[[on]].to_delayed() if lazy else [df]
    drawn = [
        call(cp.sample_partition)(p, on, i, fraction=fraction, seed=seed, eps=eps, device=device)
        for i, p in enumerate(parts)
    ]
    groups = np.array_split(np.arange(len(parts)), _shards(lazy, len(parts)))
    dim = call(_same_dim)(on, *[call(_dim)(d) for d in drawn])
    shards = [call(_sample)(dim, *[drawn[i] for i in g]) for g in groups]
    lens = [call(len)(s) for s in shards]
    # Two computations, so that no partition waits in memory for k-means to finish.
    centroids = _kmeans(call, shards, lens, k, iters, seed, device, low)
    probe_sample = call(_head)(PROBE_SAMPLE, *shards)
    seen = call(sum)(lens)
    started = time.perf_counter()
    logger.info("clustered: k-means on a sample of about %d of %d rows, %d clusters",
                round(fraction * rows), rows, k)  # fmt: skip
    if lazy:
        centroids, probe_sample, seen = dask.compute(centroids, probe_sample, seen)
    logger.info("clustered: k-means done in %.1f s; the clusters' radii next",
                time.perf_counter() - started)  # fmt: skip
    # One key for the centroids, not a copy of them in every partition's task.
    token = tokenize(centroids.cpu().numpy())
    sent = dask.delayed(centroids, name=f"cosim-centroids-{token}") if lazy else centroids
    stats = _tree(
        call,
        cp.merge_stats,
        [
            call(cp.stats_partition)(
                p, on, sent, eps=eps, device=device, chunk_bytes=chunk, bfloat16=low
            )
            for p in parts
        ],
    )
    if lazy:
        (stats,) = dask.compute(stats)
    probes = _probes(probe_sample, centroids, stats, threshold, n_probe, chunk, low)
    scale = stats.rows / max(len(probe_sample), 1)
    found = _layout(
        centroids, stats, threshold, n_probe, probes * scale, seen, block_bytes,
        df.npartitions if lazy else 1, low,
    )  # fmt: skip
    copies = found.copies / max(stats.rows, 1)
    if config.exact_when_cheaper and found.cost_vs_exact >= 1:
        found.exact_instead = True
        warnings.warn(
            f"method='clustered' at threshold={threshold!r}: the plan expects it to cost "
            f"about {found.cost_vs_exact:.1f} times exact all-pairs here ({copies:.1f} "
            f"copies per row, {found.pair_scores / found.all_pairs:.0%} "
            "of the pair scores), so method='exact' runs instead: the same pairs "
            "(cosim.search.clustered.exact-when-cheaper)",
            errors.ExactInsteadWarning,
            stacklevel=errors.caller_stacklevel(),
        )
    parts = found.partitions
    then = "exact all-pairs instead" if found.exact_instead else (
        f"{parts} shuffle partition{'' if parts == 1 else 's'}")  # fmt: skip
    logger.info("clustered: planned in %.1f s: about %.1f copies per row, %s; the search "
                "is lazy from here", time.perf_counter() - started, copies, then)  # fmt: skip
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
    bfloat16: bool | None,
) -> Plan:
    itemsize = getattr(torch, stats.dtype).itemsize
    # A row in a block: its Arrow copy, its raw rows and float32 unit rows after prepare.
    row_bytes = stats.dim * (2 * itemsize + 4) + 64
    rows_per_block = max(MIN_BLOCK_ROWS, block_bytes // row_bytes)
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
        bfloat16=bfloat16,
    )
    partitions = max(npartitions, math.ceil(copies / rows_per_block))
    return Plan(layout, stats, threshold, probes, partitions, seen)
