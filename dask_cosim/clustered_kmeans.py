"""Spherical k-means of the clustered search's sample, in shards: torch, any device, no
dataframes, no config.

The sample may lie in several shards (:mod:`dask_cosim.clustered_plan` makes one per
thread of a distributed cluster, each where its rows were drawn).  Each Lloyd iteration
sums every shard's rows by their most similar centroid where the shard lies
(:func:`lloyd_sums`: the product, the whole cost), and one small step adds the sums up
and normalises them (:func:`lloyd_step`), so the product runs on every worker at once
instead of one thread.  :func:`kmeans` is the same on one tensor.

Seeds are ``k`` distinct random rows of the shards taken together, drawn by a CPU
generator: the same rows for the same sample and seed however it is split, on any device.
A centroid that loses all its rows restarts at a row least similar to its own centroid:
the least similar of the whole sample, among the :data:`RESTARTS` least similar rows each
shard offers (a centroid beyond those keeps its place for that iteration).  Any centroids
give exact results (the skip rule holds for every assignment); good ones make tight
clusters, which skip more.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from dask_cosim import clustered_kernels as ck

__all__ = [
    "RESTARTS", "Sums", "first_centroids", "kmeans", "lloyd_step", "lloyd_sums", "seeds",
    "unit_rows",
]  # fmt: skip

# Rows each shard offers per iteration to restart the centroids that lost all theirs.
RESTARTS = 64


class Sums(NamedTuple):
    """One shard's share of a Lloyd iteration."""

    sums: torch.Tensor  # (k, D) float32: the sum of the rows most similar to each centroid
    counts: torch.Tensor  # (k,) int64: how many rows that is
    low: torch.Tensor  # the scores of the shard's RESTARTS rows least similar to their own
    rows: torch.Tensor  # centroid, ascending, and those rows


def unit_rows(x: torch.Tensor) -> torch.Tensor:
    """``x``'s rows over their float64 norms, rounded to float32: each within ``u = 2**-24``
    of a unit vector plus the float64 rounding (the bound of the skip rule counts on it,
    :func:`dask_cosim.clustered_kernels.product_error`); zero rows stay zero."""
    return torch.nn.functional.normalize(x.to(torch.float64), dim=1).to(torch.float32)


def seeds(
    x: torch.Tensor, start: int, n: int, k: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The seeds that lie in shard ``x`` (rows ``start`` to ``start + len(x)`` of a sample
    of ``n`` rows): their numbers among the ``min(k, n)`` seeds, and the rows."""
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randperm(n, generator=gen)[: max(1, min(k, n))]
    number = ((pick >= start) & (pick < start + len(x))).nonzero().squeeze(1)
    return number, x[(pick[number] - start).to(x.device)]


def first_centroids(*parts: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The seeds of every shard (:func:`seeds`), in their order; for a sample without a
    row, one centroid (any will do)."""
    rows = torch.cat([r for _, r in parts])
    if len(rows) == 0:
        one = torch.zeros((1, rows.shape[1]), dtype=torch.float32, device=rows.device)
        one[0, :1] = 1.0
        return one
    number = torch.cat([n for n, _ in parts]).to(rows.device)
    out = torch.empty_like(rows)
    out[number] = rows
    return unit_rows(out)


def lloyd_sums(
    x: torch.Tensor, cent: torch.Tensor, chunk_bytes: int = 64 * 2**20,
    bfloat16: bool | None = False,
) -> Sums:  # fmt: skip
    """Shard ``x``'s share of a Lloyd iteration from centroids ``cent`` (same device;
    ``bfloat16``: each row's nearest centroid as
    :func:`dask_cosim.clustered_kernels.nearest` finds it)."""
    score, home = ck.nearest(x, cent, chunk_bytes, bfloat16)
    low = torch.topk(score, min(RESTARTS, len(x)), largest=False)
    return Sums(
        torch.zeros_like(cent).index_add_(0, home, x),
        torch.bincount(home, minlength=len(cent)),
        low.values,
        x[low.indices],
    )


def lloyd_step(cent: torch.Tensor, *parts: Sums) -> torch.Tensor:
    """The next centroids: each the normalised sum of its rows over every shard; an
    emptied one restarts at the least similar row the shards offer, or keeps its place
    when they offer none (as does one whose rows sum to zero)."""
    sums = parts[0].sums.clone()
    counts = parts[0].counts.clone()
    for p in parts[1:]:
        sums += p.sums
        counts += p.counts
    empty = (counts == 0).nonzero().squeeze(1)
    if len(empty):
        low = torch.cat([p.low for p in parts])
        order = torch.argsort(low, stable=True)[: len(empty)]
        sums[empty[: len(order)]] = torch.cat([p.rows for p in parts])[order]
        sums[empty[len(order) :]] = cent[empty[len(order) :]]
    new = unit_rows(sums)
    zero = ~new.any(dim=1)
    new[zero] = cent[zero]
    return new.contiguous()


def kmeans(
    x: torch.Tensor, k: int, *, iters: int, seed: int, chunk_bytes: int = 64 * 2**20
) -> torch.Tensor:
    """Spherical k-means of unit rows ``x`` (n, D), one shard: ``min(k, n)`` float32 unit
    centroids after ``iters`` Lloyd iterations (module docstring)."""
    cent = first_centroids(seeds(x, 0, len(x), k, seed))
    for _ in range(iters):
        cent = lloyd_step(cent, lloyd_sums(x, cent, chunk_bytes))
    return cent
