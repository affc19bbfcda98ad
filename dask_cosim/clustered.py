"""Clustered neighbours and dedup: all pairs scoring at least a threshold, without
scoring all pairs.

Exact all-pairs search grows with the square of the rows.  Here the rows are clustered
first and compared within clusters, and a row is also compared with the rows of every
other cluster that the skip rule (:mod:`dask_cosim.clustered_kernels`) cannot rule out:

1. the plan (:mod:`dask_cosim.clustered_plan`), when the call is made (as ``set_index``
   computes its divisions): k-means on a sample, each cluster's size and radius;
2. one pass that copies each row to its home cluster's block, and to the blocks of the
   clusters it probes; a dask ``shuffle`` on the block number brings each block's rows
   together (big clusters are split into sub-blocks, small ones share a partition);
3. in each block the exact kernels (:func:`dask_cosim.search_kernels.threshold_pairs`,
   float64 decisions): every pair reported is exact, and so is its score;
4. back to frame order: pairs sorted by left row, or the dropped rows removed.

The tasks of 3 and those holding the pairs gathered in 4 count them against
``cosim.search.max-result-bytes`` (:mod:`dask_cosim.search_budget`), as the all-pairs
search's tasks do.

Steps 2-4 are the lazy result.  Modes: ``n_probe=None`` (exact) probes every cluster
within reach, so the result equals the all-pairs one (recall 1, by the proof in the
kernels); an integer probes at most that many clusters per row (faster on diffuse data,
where few clusters can be ruled out; recall below 1, measured by
:mod:`dask_cosim.clustered_recall`).
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import tempfile
import warnings
from collections.abc import Hashable, Sequence
from typing import Any

import dask
import dask.dataframe as dd
import pandas as pd
import psutil
import pyarrow as pa
from dask.base import tokenize
from dask.utils import format_bytes

from dask_cosim import backends, errors, options, search
from dask_cosim import clustered_partition as cp
from dask_cosim import clustered_results as cr
from dask_cosim import search_graph as sg
from dask_cosim import search_partition as sp
from dask_cosim.clustered_plan import Plan, plan
from dask_cosim.io.convert import objects_kept
from dask_cosim.search_budget import Budget

__all__ = ["Plan", "dedup", "neighbors", "plan"]


def _pairs_meta(df: Any, on: str, carried: dict[str, Any] | None = None) -> pd.DataFrame:
    """The pandas meta of the result: that of the exact ``neighbors(threshold=...)``
    (with its ``carried`` columns, {name: dtype})."""
    like = sg.meta_of(df)
    spec = backends.column_spec(df, on)
    return sp.result_meta(like.index, like.index, sp.score_dtype(spec), False, carried)


def _found(
    df: Any, on: str, p: Plan, drops: bool, by: str, budget: Budget, best: bool = False
) -> Any:
    """What :func:`clustered_partition.search_blocks` finds with plan ``p`` (the pairs,
    with ``best`` those dedup's removed rows may take, or with ``drops`` the keys of the
    rows to drop; each task holding at most the pairs ``budget`` allows), indexed by the
    key column ``by`` and, for a dask frame, lazily gathered into the input partition
    that key names."""
    eps, device = options.eps(), options.device()
    tiles = options.search_tile_bytes()
    tile = tiles["cuda" if device.startswith("cuda") else "cpu"]
    kwargs: dict[str, Any] = {"eps": eps, "device": device}
    # The blocks are searched as the all-pairs search is: same tiles, same precision.
    search = {"tile_bytes": tile, "precision": options.search_precision(), **kwargs}
    search["budget"] = budget
    search["best"] = best
    if not dask.is_dask_collection(df):
        routed = cp.route_partition(df, on, p.layout, chunk_bytes=tiles["cpu"], **kwargs)
        found = cp.search_blocks(
            routed, p.threshold, p.layout.dtype, p.layout.dim, drops=drops, **search
        )
        return found.set_index(by)
    layout = dask.delayed(p.layout, name=f"cosim-clustered-layout-{tokenize(p.layout)}")
    pieces, keyed = _pieces(df, on, p)
    routed = pieces.map_partitions(
        cp.route_partition,
        on,
        layout,
        chunk_bytes=tiles["cpu"],
        keyed=keyed,
        meta=cp.route_meta(df._meta.index, p.layout.dtype, p.layout.dim),
        enforce_metadata=False,
        token="cosim-clustered-route",
        **kwargs,
    )
    shuffled = routed.shuffle(on="_block", npartitions=p.partitions, shuffle_method=_method(p))
    found = shuffled.map_partitions(
        cp.search_blocks,
        p.threshold,
        p.layout.dtype,
        p.layout.dim,
        drops=drops,
        meta=cp.found_meta(_pairs_meta(df, on), drops),
        enforce_metadata=False,
        token="cosim-clustered-blocks",
        **search,
    )
    return _gather(found, by, df)


def _pieces(df: dd.DataFrame, on: str, p: Plan) -> tuple[dd.DataFrame, bool]:
    """``df[[on]]`` for the routing, its partitions split into pieces (rows keyed by
    their partition and position first: then True) where one would hand the shuffle
    more than ``cosim.search.clustered.route-bytes`` of routed rows: 500,000 x 384
    float16 rows routed to 2.6 blocks each are 1 GB, whose p2p transfer killed 6 GiB
    workers."""
    per_partition = p.routed_bytes / max(1, df.npartitions)
    pieces = math.ceil(per_partition / options.clustered().route_bytes)
    if pieces <= 1:
        return df[[on]], False
    keyed = df.map_partitions(
        cp.with_keys, on, meta=cp.with_keys(df._meta, on), enforce_metadata=False
    )
    return keyed.clear_divisions().repartition(npartitions=df.npartitions * pieces), True


def _method(p: Plan) -> str | None:
    """The routing shuffle's method: dask's (``dataframe.shuffle.method``, else p2p with
    a distributed client), except that on the local schedulers, where dask's is partd's
    disk shuffle, it is the task shuffle, in memory, when the routed rows fit twice in
    the memory available (1M x 384 rows, 2 cores: the lazy part 48 -> 35 s, the peak
    resident memory 7.2 -> 8.5 GB for 4.7 GB of routed rows)."""
    if dask.config.get("dataframe.shuffle.method", None) is not None or _client() is not None:
        return None
    # Arrow's allocator keeps what it freed (7 GB after a provable run at 1M x 384 rows):
    # handed back first, it counts as available.
    pa.default_memory_pool().release_unused()
    return "tasks" if 2 * p.routed_bytes <= psutil.virtual_memory().available else None


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


def _carry(found: Any, df: Any, cols: list[Any], prefix: str, budget: Budget | None = None) -> Any:
    """``found`` (gathered by :func:`_gather`) with the ``cols`` of the rows its keys
    name, taken from their own partitions: :func:`clustered_results.with_carried`
    (``budget``: for the pairs gathered)."""
    if not dask.is_dask_collection(found):
        return cr.with_carried(found, df[cols], prefix, budget)
    payload = df[cols]
    if sg.holds_data(df):
        # Not a projection of the frame in memory: persist() optimizes the graph twice,
        # the second time absorbing the projection into that frame under a new name,
        # and an already fused task then asked for a shuffle output under the old one
        # ("Missing dependency", dask 2026.8).  A projection of a read stays one: it
        # narrows the read.
        payload = df.map_partitions(_select, cols, meta=payload._meta, enforce_metadata=False)
    meta = cr.with_carried(found._meta, payload._meta, prefix)
    return dd.map_partitions(
        cr.with_carried, found, payload, prefix, budget, meta=meta, align_dataframes=False,
        enforce_metadata=False,
    )  # fmt: skip


def _select(part: Any, cols: list[Any]) -> Any:
    return part[cols]


def _per_partition(fn: Any, found: Any, *args: Any, meta: Any = None) -> Any:
    """``fn(part, *args)`` on each partition of ``found`` (eager: on the one frame);
    ``meta`` by default ``fn`` of ``found``'s.

    Every ``map_partitions`` here leaves dask's metadata enforcement off: it gives an
    empty partition the meta itself, whose categoricals of unknown categories (a frame
    read from Parquet) hold dask's placeholder category as data; ``fn`` of an empty
    partition has the meta's columns and dtypes already."""
    if not dask.is_dask_collection(found):
        return fn(found, *args)
    meta = fn(found._meta, *args) if meta is None else meta
    return found.map_partitions(fn, *args, meta=meta, enforce_metadata=False)


def _drop(df: Any, found: Any, budget: Budget | None = None) -> Any:
    """``df`` without the rows whose keys index ``found`` (``budget``: where those are
    pairs)."""
    if not dask.is_dask_collection(df):
        return cr.drop_keys(df, found, budget)
    return dd.map_partitions(
        cr.drop_keys, df, found, budget, meta=df._meta, align_dataframes=False,
        enforce_metadata=False,
    )  # fmt: skip


def _planned(
    op: str, df: Any, on: str, threshold: float, kwargs: dict[str, Any]
) -> tuple[Plan, Budget]:
    """The plan of ``op``'s search (:func:`plan` with ``kwargs``) and the pairs its tasks
    may hold; ``cosim.search.max-result-bytes`` is checked first: a bad setting costs
    no plan.  A plan whose routed rows the shuffle has no room for is refused
    (:func:`_check_room`); one that copies the rows many times is warned about."""
    setting = options.search_max_result_bytes()
    p = plan(df, on, threshold, **kwargs)
    if not p.exact_instead:
        if dask.is_dask_collection(df):
            _check_room(p, kwargs.get("n_probe"))
        warning = p.many_copies()
        if warning is not None:
            warnings.warn(warning, errors.CosimWarning, stacklevel=errors.caller_stacklevel())
    eager = not dask.is_dask_collection(df)
    return p, Budget(setting, op, on, p.threshold, method="clustered", eager=eager)


def _check_room(p: Plan, n_probe: int | None) -> None:
    """Raise ValueError, before anything is routed, when the routing shuffle would hold
    more bytes than it has room for (:func:`_room`): it would fill the disk after running
    for a while (100,000 x 384 float64 rows at threshold 0.5, 164 copies each: 51 GB)."""
    room = _room(p)
    if room is None or p.routed_bytes <= room[0]:
        return
    free, where = room
    copies = p.copies / max(p.stats.rows, 1)
    fewer = "more clusters"
    if n_probe is None or n_probe > 2:
        fewer = "n_probe=2 (at most 3 copies per row; the recall is measured by "
        fewer += "dask_cosim.clustered_recall)"
    slower = 1 / max(p.cost_vs_exact, 1e-9)
    exact = f"about {slower:.0f} times the cost" if slower >= 1.5 else "about as costly here"
    raise ValueError(
        f"method='clustered' at threshold={p.threshold!r}: the plan routes about "
        f"{copies:.1f} copies of each row, {format_bytes(int(p.routed_bytes))} through the "
        f"shuffle, more than the {format_bytes(int(free))} free {where}; use {fewer}, or "
        f"method='exact' (all pairs, no shuffle: {exact})"
    )


def _client() -> Any:
    """distributed's default client, where there is one, else None: the shuffles of a
    search built under it run on its cluster (:func:`_method`, :func:`_room`)."""
    try:
        from distributed import default_client

        return default_client()
    except (ImportError, ValueError):
        return None


def _room(p: Plan) -> tuple[float, str] | None:
    """The bytes the routing shuffle can hold, and where: on a distributed cluster the
    free space of its workers' local directories (dask's p2p shuffle writes there; one
    disk shared by workers counts once); on the local schedulers nothing to check when
    the shuffle runs in memory (:func:`_method`), else the free space of dask's
    temporary directory, where partd writes.  None: not known (dask's task shuffle on a
    distributed cluster, whose workers spill as they are configured)."""
    configured = dask.config.get("dataframe.shuffle.method", None)
    client = _client()
    if client is not None:
        if configured == "tasks":
            return None
        disks = client.run(_local_disk)
        free = {(host, dev): room for host, dev, room in disks.values()}
        return float(sum(free.values())), "on the workers' disks"
    if (configured or _method(p)) == "tasks":
        return None
    folder = dask.config.get("temporary-directory", None) or tempfile.gettempdir()
    return float(shutil.disk_usage(folder).free), f"in dask's temporary-directory ({folder})"


def _local_disk(dask_worker: Any) -> tuple[str, int, int]:
    """A worker's host, the device of its local directory and the bytes free there."""
    folder = dask_worker.local_directory
    return socket.gethostname(), os.stat(folder).st_dev, shutil.disk_usage(folder).free


def _search(df: Any, on: str, p: Plan, cols: list[Any], budget: Budget) -> Any:
    """The pairs of plan ``p``: the ``neighbors(threshold=...)`` result, each task holding
    at most the pairs ``budget`` allows.  With ``cols`` the pairs go to their right row's
    partition for its columns, then to their left row's for its own."""
    dtypes, carried = search._pair_columns(df, cols, df, cols)
    meta, like = _pairs_meta(df, on, dtypes), sg.meta_of(df)
    if not cols:
        found = _found(df, on, p, drops=False, by="_lkey", budget=budget)
    else:
        pairs = _found(df, on, p, drops=False, by="_rkey", budget=budget)
        found = _carry(pairs, df, cols, "_p", budget)
        found = _carry(_gather(found.reset_index(), "_lkey", df, True), df, cols, "_q", budget)
    out_meta = backends.frame_like(meta, like)
    # Numbered from 0 in each partition, as the exact method's: no divisions.
    finish = _per_partition(cr.finish_pairs, found, meta, like, carried, budget, meta=out_meta)
    return _unsorted(finish)


def _dedup(df: Any, on: str, p: Plan, removed: bool, cols: list[Any], budget: Budget) -> Any:
    """``df`` without the rows that have an earlier match; with ``removed`` also dedup's
    removed rows: the pairs, gathered by their later (right) row's partition, give both
    the rows to drop and each one's best earlier match (chosen as the exact method
    chooses it, :func:`dask_cosim.search_dedup.best_matches`); with ``cols`` those
    matches go to their earlier row's partition for its columns, and back.  Each task
    holds at most the pairs ``budget`` allows."""
    if not removed:
        return _drop(df, _found(df, on, p, drops=True, by="_key", budget=budget))
    dtypes, carried = search._pair_columns(df, cols, df, cols)
    meta, like = _pairs_meta(df, on, dtypes), sg.meta_of(df)
    pairs = _found(df, on, p, drops=False, by="_rkey", budget=budget, best=True)
    best = pairs
    if cols:
        # One match per removed row from here: fewer than the partition's rows.
        best = _per_partition(cr.best_earlier, pairs, budget)
        best = _carry(_gather(best, "_lkey", df), df, cols, "_q")
        best = _carry(_gather(best.reset_index(), "_key", df, True), df, cols, "_p")
    out_meta = backends.frame_like(meta, like)
    return _drop(df, pairs, budget), _unsorted(
        _per_partition(cr.removed_rows, best, meta, like, carried, budget, meta=out_meta)
    )


def _exact_instead(run: Any, *args: Any, **kwargs: Any) -> Any:
    """``run`` (exact all-pairs :func:`dask_cosim.search.neighbors` or ``dedup``) for a
    plan that expects it to cost no more; the accessor warned of repeating labels
    already."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", errors.RepeatedLabelsWarning)
        return run(*args, **kwargs)


def _standalone(result: Any) -> Any:
    """``result`` (a dask frame) as a frame of its own tasks (dask's ``from_delayed``),
    as the exact method's results are.  dask lines up a frame and a series made from it
    (``r[r["left_id"] % 3 == 0]``) partition by partition only when both come from one
    source; this result's graph holds several (the input read for the rows routed and
    for the columns carried, the shuffles), and dask lined such a filter up by index
    instead, an index numbered from 0 in each partition: the rows came back in another
    order under other labels, or it failed "indices are out-of-bounds"."""
    if not dask.is_dask_collection(result):
        return result
    # The partitions' dtypes as computed: dask's string conversion would turn an object
    # column carried (vectors of a frame built without it) into text.
    with objects_kept():
        return dd.from_delayed(
            result.to_delayed(), meta=result._meta, divisions=result.divisions,
            verify_meta=False,
        )  # fmt: skip


def _unsorted(result: Any) -> Any:
    """``result`` without the divisions of the keys it was gathered by (dask frames)."""
    return result.clear_divisions() if dask.is_dask_collection(result) else result


def neighbors(
    df: Any, on: str, *, threshold: float, columns: Sequence[Hashable] | None = None,
    **options: Any,
) -> Any:  # fmt: skip
    """Every pair of rows scoring at least ``threshold``, by the clustered method.

    The result is that of ``neighbors(on, threshold=..., columns=...)`` (exact
    all-pairs): columns ``left``, ``right`` (index labels), ``score``, then
    ``left_<c>``, ``right_<c>`` for each of ``columns`` (taken from the rows' own
    partitions: rows are named by frame position, never by label); each unordered pair
    once, the earlier row (frame order) on the left; one partition per input partition
    (where exact all-pairs runs instead, its partitions), sorted by left row then right
    row.  Scores are the float64 ones (cast to the result dtype).  Other arguments as
    :func:`plan` takes them (``clusters``, ``n_probe``, ...).
    Where the plan expects exact all-pairs to cost no more, that runs instead, with a
    warning (``cosim.search.clustered.exact-when-cheaper``); a plan whose routed rows the
    shuffle has no room for is refused with ValueError, before anything runs.

    Returns
    -------
    DataFrame
        Lazy for a dask frame (the clustering is computed when this is called), else
        eager.
    """
    cols = search._carried(df, columns, "columns")
    p, budget = _planned("neighbors", df, on, threshold, options)
    if p.exact_instead:
        return _exact_instead(search.neighbors, df, on, threshold=threshold, columns=columns)
    return _standalone(_search(df, on, p, cols, budget))


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
    for each of ``columns``).  Options, and exact all-pairs where it costs no more, as
    in :func:`neighbors`."""
    cols = search.removed_columns(df, columns, return_removed)
    p, budget = _planned("dedup", df, on, threshold, options)
    if p.exact_instead:
        return _exact_instead(
            search.dedup, df, on, threshold, return_removed=return_removed, columns=columns
        )
    result = _dedup(df, on, p, return_removed, cols, budget)
    return tuple(map(_standalone, result)) if return_removed else _standalone(result)
