"""Similarity search on dataframes, the graph: top-k, joins, neighbours, dedup, groups
and prepare.

One task per block of consecutive partitions (a partition, unless there are more than
``cosim.search.max-blocks``) normalises its vectors once
(:func:`~dask_cosim.search_graph.sides`), one task per pair of blocks reduces their tiles,
and the results of one left block are merged by a tree of tasks
(``cosim.search.split-every`` at a time), never by a groupby over lists.  The graph's
building blocks are in :mod:`dask_cosim.search_graph`, the per-partition functions in
:mod:`dask_cosim.search_partition` (dask-free); on eager pandas/cudf frames they run
directly, without dask.  ``method="clustered"`` (neighbours and dedup) builds its own
graph, in :mod:`dask_cosim.clustered`.

Inputs are validated from the metadata before any graph is built.  Without a
distributed client every key is deterministic: an eager frame that joins a dask one, and
the queries of :func:`topk`, are named by a token of their contents, so the same call
built twice gives the same graph.  With one they are scattered to the workers under a key
of their own each time (:meth:`~dask_cosim.search_graph.Builder.value`).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

import dask
import numpy as np
from dask.dataframe.utils import is_dataframe_like

from dask_cosim import backends, errors, options
from dask_cosim import search_dedup as sd
from dask_cosim import search_graph as sg
from dask_cosim import search_partition as sp
from dask_cosim import search_results as sr
from dask_cosim.search_budget import Budget

__all__ = ["check_column", "dedup", "groups", "join", "neighbors", "prepare", "topk"]


def _options() -> sg.Options:
    return sg.Options(
        eps=options.eps(),
        device=options.device(),
        tile_bytes=options.search_tile_bytes(),
        split_every=options.search_split_every(),
        precision=options.search_precision(),
        max_blocks=options.search_max_blocks(),
        max_result_bytes=options.search_max_result_bytes(),
    )


def check_topk_columns(columns: Sequence[Hashable], what: str, fix: str) -> None:
    """ValueError where a carried column of ``topk`` (``what`` they are) has the name of
    a result column (query, rank, match, score): it would overwrite it; ``fix`` says what
    to do."""
    clash = sorted({str(c) for c in columns} & {"query", "rank", "match", "score"})
    if clash:
        raise ValueError(f"{what} would overwrite the result columns {clash}; {fix}")


def check_column(frame: Any, column: Any, argument: str = "on") -> backends.VectorSpec:
    """What ``column`` of ``frame`` (dask, pandas or cudf: its metadata; the first rows
    only for a column of strings, to tell text from vectors written as text) holds, or
    the error to show: a KeyError naming ``argument`` with the closest column (else the
    frame's vector columns), or a TypeError saying why the column holds no vectors."""
    backends.check_column_name(sg.meta_of(frame), column, argument, f"{argument}: column")
    return backends.column_spec(frame, column)


def _budget(
    opts: sg.Options, build: sg.Builder, op: str, on: str, threshold: Any, sides: int
) -> Budget:
    """What each task of the threshold search ``op`` may hold (an eager frame's error
    advises no more partitions: it has none, nor a frame of ``sides`` blocks as many as
    ``cosim.search.max-blocks`` allows)."""
    capped = build.lazy and sides >= opts.max_blocks
    return Budget(opts.max_result_bytes, op, on, threshold, eager=not build.lazy,
                  blocks=sides if capped else None)  # fmt: skip


def _check_dims(spec_a: backends.VectorSpec, what_a: str, dim_b: int | None, what_b: str) -> None:
    if spec_a.dim is not None and dim_b is not None and spec_a.dim != dim_b:
        raise errors.dims_differ(what_a, spec_a.dim, what_b, dim_b)


def _combine(k: int | None) -> Callable[..., Any]:
    """How partial pair frames of one left partition merge: the k best, or all of them
    (a threshold search's once their total passed its check, :func:`_merged`)."""
    if k is not None:
        return functools.partial(sr.merge_topk, k)
    return sr.concat_pairs


def _merged(
    build: sg.Builder,
    pieces: list[Any],
    k: int | None,
    budget: Budget | None,
    split_every: int,
    part: int,
) -> Any:
    """The pair frames ``pieces`` of output partition ``part`` merged, a threshold
    search's (``budget``) only once their total fits one task."""
    check = build.checked(pieces, budget, f"the merge of output partition {part}")
    return build.tree(pieces, _combine(k), split_every, check)


def _carried(frame: Any, columns: Hashable | Sequence[Hashable] | None, argument: str) -> list[Any]:
    """``columns`` of ``frame`` to carry into a result, checked: each is a column, once.
    A string (or other non-iterable label) is one column, as pandas takes it."""
    if isinstance(columns, Iterable) and not isinstance(columns, str):
        columns = list(columns)
    else:
        columns = [] if columns is None else [columns]
    available = sg.meta_of(frame).columns
    missing = [c for c in columns if c not in available]
    if missing:
        raise errors.column_not_found(missing[0], available, f"{argument}: column")
    if len(set(columns)) != len(columns):
        raise ValueError(f"{argument}={columns!r} names a column twice; name each once")
    for column in columns:
        backends.check_named_once(available, column, f"{argument}: column")
    return columns


def _pair_columns(
    left: Any, lcols: list[Any], right: Any, rcols: list[Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The carried columns of a pairs result, ``left_<c>`` then ``right_<c>``: {name:
    dtype} for its meta, and {name in the partial frames: name} for finish_pairs.
    Raises ValueError where two columns of a side would give one name (``1`` and
    ``"1"``): the second would overwrite the first."""
    dtypes: dict[str, Any] = {}
    inner: dict[str, str] = {}
    source: dict[str, Any] = {}
    for side, frame, cols, prefix in ((0, left, lcols, "_q"), (1, right, rcols, "_p")):
        meta = backends.to_pandas(sg.meta_of(frame)[cols].iloc[:0]) if cols else None
        for n, c in enumerate(cols):
            name = f"{'right' if side else 'left'}_{c}"
            if name in source:
                raise ValueError(
                    f"columns {source[name]!r} and {c!r} would both be carried as {name!r}; "
                    f"rename one of them first (df.rename(columns={{{c!r}: ...}}))"
                )
            source[name] = c
            dtypes[name] = meta[c].dtype  # type: ignore[index]
            inner[f"{prefix}{n}"] = name
    return dtypes, inner


def _warn_if_labels_repeat(sides: list[tuple[Any, str, str, str]]) -> None:
    """One warning for the first of ``sides`` (frame, what it is, the result columns
    naming its rows, the keyword that carries its columns) whose index labels may repeat:
    a dask frame of several partitions with unknown divisions, or an eager frame whose
    labels repeat, or a dask frame of ``dd.from_pandas`` (known divisions, or one
    partition; every row kept since: :func:`~dask_cosim.backends.in_memory_index`)
    whose frame in memory repeats them (other frames' known divisions may repeat a
    label too, which only the data tell).  Sides that carry columns are left out."""
    for frame, what, names, keyword in sides:
        if dask.is_dask_collection(frame):
            if frame.npartitions < 2 or frame.known_divisions:
                index = backends.in_memory_index(frame)
                if index is None or index.is_unique:
                    continue
                parts: int | None = None
            else:
                parts = frame.npartitions
        elif frame.index.is_unique:  # (pandas and cudf keep it once computed)
            continue
        else:
            parts = None
        # dask's own Parquet read (ReadParquetPyarrowFS, ...).
        read = parts is not None and any(
            "ReadParquet" in backends.expression_kinds(e) for e in frame.expr.walk()
        )
        warning = errors.labels_may_repeat(what, parts, names, frame.columns, keyword, read)
        warnings.warn(warning, stacklevel=errors.caller_stacklevel())
        return


def join(
    left: Any,
    right: Any,
    on: str,
    *,
    right_on: str | None = None,
    k: int | None = None,
    threshold: float | None = None,
    columns: Hashable | Sequence[Hashable] | None = None,
    right_columns: Hashable | Sequence[Hashable] | None = None,
) -> Any:
    """See :meth:`dask_cosim.CosimAccessor.join`."""
    k, threshold = options.k_or_threshold(k, threshold)
    if isinstance(right, str) and not errors.is_label(on):
        raise errors.arguments_swapped("join", "right frame", "right", right)
    right_on = on if right_on is None else right_on
    # dask's test for a frame: a dask Series has an attribute "columns" too.
    if not is_dataframe_like(right):
        raise errors.join_not_frame(right, on, right_on)
    spec_l = check_column(left, on, "on")
    spec_r = check_column(right, right_on, "right_on")
    _check_dims(spec_l, f"left column {on!r}", spec_r.dim, f"right column {right_on!r}")
    lcols = _carried(left, columns, "columns")
    if right_columns is None:  # the left's columns, carried from the right frame too
        rcols = _carried(
            right, columns, "columns (the right frame's too: right_columns= names others)"
        )
    else:
        rcols = _carried(right, right_columns, "right_columns")
    _warn_if_labels_repeat(
        [(left, "the left frame", "'left'", "columns")] * (not lcols)
        + [(right, "the right frame", "'right'", "right_columns")] * (not rcols)
    )
    opts = _options()
    score_dtype = sp.score_dtype(spec_l, spec_r)
    like = sg.meta_of(left)
    dtypes, carried = _pair_columns(left, lcols, right, rcols)
    meta = sp.result_meta(like.index, sg.meta_of(right).index, score_dtype, k is not None, dtypes)
    # float64 results get float64 scores for every pair; float32 ones keep the tile's.
    exact = score_dtype == np.float64
    build = sg.Builder(dask.is_dask_collection(left) or dask.is_dask_collection(right))
    rsides = sg.sides(build, right, right_on, opts, rcols, frame="right")
    cut = sg.pieces(build, left, opts, lambda n: n * len(rsides))
    lsides = sg.sides(build, left, on, opts, lcols, cut=cut, frame="left")
    # More partitions of either frame help (fewer pairs per merge, per pair task).
    blocks = min(len(lsides), len(rsides))
    budget = None if k is not None else _budget(opts, build, "join", on, threshold, blocks)
    outs = []
    for i, lside in enumerate(lsides):
        if k is not None:
            pair = build(sp.join_pair_topk)
            pieces = [pair(lside, r, k, threshold, opts.tile_bytes, opts.precision) for r in rsides]
        else:
            pair = build(sp.pair_threshold)
            pieces = [
                pair(lside, r, threshold, opts.tile_bytes, exact_scores=exact,
                     precision=opts.precision, budget=budget)
                for r in rsides
            ]  # fmt: skip
        merged = _merged(build, pieces, k, budget, opts.split_every, i // cut)
        outs.append(build(sr.finish_pairs)(merged, meta, k is not None, like, carried))
    joined = build.rejoin(outs, cut, renumber=True, budget=budget)
    return build.collect(joined, backends.frame_like(meta, like))


def neighbors(
    df: Any,
    on: str,
    *,
    k: int | None = None,
    threshold: float | None = None,
    columns: Hashable | Sequence[Hashable] | None = None,
    method: str = "exact",
    n_probe: int | None = None,
    clusters: int | None = None,
) -> Any:
    """See :meth:`dask_cosim.CosimAccessor.neighbors`."""
    k, threshold = options.k_or_threshold(k, threshold)
    spec = check_column(df, on)
    cols = _carried(df, columns, "columns")
    dtypes, carried = _pair_columns(df, cols, df, cols)
    _warn_if_labels_repeat([(df, "the frame", "'left' and 'right'", "columns")] * (not cols))
    how = options.search_method(method, k=k, threshold=threshold, n_probe=n_probe,
                                clusters=clusters)  # fmt: skip
    if how[0] == "clustered":
        return _clustered("neighbors", df, on, threshold, how, columns=cols)
    opts = _options()
    like = sg.meta_of(df)
    meta = sp.result_meta(like.index, like.index, sp.score_dtype(spec), k is not None, dtypes)
    exact = meta["score"].dtype == np.float64
    build = sg.Builder(dask.is_dask_collection(df))
    cut = sg.pieces(build, df, opts, sg.pairs_of)
    sides = sg.sides(build, df, on, opts, cols, cut=cut)
    n = len(sides)
    budget = None if k is not None else _budget(opts, build, "neighbors", on, threshold, n)
    pieces: list[list[Any]] = [[] for _ in range(n)]
    for i in range(n):
        for j in range(i, n):
            # Only the upper triangle of partition pairs: (i, j) serves both i and j.
            other = sides[j] if j > i else None
            if k is not None:
                pair = build(sp.self_pair_topk, nout=2)
                a, b = pair(sides[i], other, k, threshold, opts.tile_bytes, opts.precision)
                pieces[i].append(a)
                if j > i:
                    pieces[j].append(b)
            else:
                pair = build(sp.pair_threshold)
                pieces[i].append(
                    pair(sides[i], other, threshold, opts.tile_bytes, exact_scores=exact,
                         precision=opts.precision, budget=budget)
                )  # fmt: skip
    finish = build(sr.finish_pairs)
    outs = [
        finish(_merged(build, p, k, budget, opts.split_every, i // cut), meta, k is not None,
               like, carried)
        for i, p in enumerate(pieces)
    ]  # fmt: skip
    joined = build.rejoin(outs, cut, renumber=True, budget=budget)
    return build.collect(joined, backends.frame_like(meta, like))


def removed_columns(df: Any, columns: Any, return_removed: bool) -> list[Hashable]:
    """``dedup``'s ``columns`` (:func:`_carried`): what the removed rows carry, so none
    without ``return_removed`` (the kept rows keep every column: they would do nothing)."""
    cols = _carried(df, columns, "columns")
    if cols and not return_removed:
        raise ValueError(
            f"columns={columns!r} names what the removed rows carry, which only "
            "return_removed=True returns (the kept rows keep every column): pass "
            "return_removed=True, or leave columns out"
        )
    return cols


def dedup(
    df: Any,
    on: str,
    threshold: float,
    *,
    return_removed: bool = False,
    columns: Hashable | Sequence[Hashable] | None = None,
    method: str = "exact",
    n_probe: int | None = None,
    clusters: int | None = None,
) -> Any:
    """See :meth:`dask_cosim.CosimAccessor.dedup`."""
    if not isinstance(return_removed, (bool, np.bool_)):
        raise TypeError(f"return_removed={return_removed!r} must be True or False")
    threshold_value = options.search_threshold(threshold, required=True)
    spec = check_column(df, on)
    cols = removed_columns(df, columns, return_removed)
    dtypes, carried = _pair_columns(df, cols, df, cols)
    how = options.search_method(method, threshold=threshold, n_probe=n_probe, clusters=clusters)
    if return_removed:
        _warn_if_labels_repeat([(df, "the frame", "'left' and 'right'", "columns")] * (not cols))
    if how[0] == "clustered":
        return _clustered("dedup", df, on, threshold_value, how, return_removed=return_removed,
                          columns=cols)  # fmt: skip
    opts = _options()
    build = sg.Builder(dask.is_dask_collection(df))
    cut = sg.pieces(build, df, opts, sg.pairs_of)
    frames = build.cut(build.partitions(df), cut)
    sides = sg.sides(build, df, on, opts, cols, frames, cut)
    lengths = [build(len)(f) for f in frames] if len(frames) > len(sides) else None
    like = sg.meta_of(df)
    budget = _budget(opts, build, "dedup", on, threshold_value, len(sides))
    if return_removed:
        meta = sp.result_meta(like.index, like.index, sp.score_dtype(spec), False, dtypes)
        pair = functools.partial(build(sd.earlier_matches), precision=opts.precision,
                                 budget=budget)  # fmt: skip
        combine: Callable[..., Any] = sd.best_matches
        drop: Callable[..., Any] = sd.drop_matched
    else:
        pair = functools.partial(build(sp.pair_threshold), keep="rows",
                                 precision=opts.precision, budget=budget)  # fmt: skip
        combine, drop = sr.union_positions, sr.drop_rows
    outs, removed = [], []
    for j, (a, b) in enumerate(sg.block_bounds(len(frames), opts.max_blocks)):
        # Rows of block j with an earlier row (in block i <= j) scoring enough.
        found = [
            pair(sides[i], sides[j] if i < j else None, threshold_value, opts.tile_bytes)
            for i in range(j + 1)
        ]
        dropped = build.tree(found, combine, opts.split_every)
        for m in range(a, b):
            # The block's positions, shifted to partition m's own rows.
            before = lengths[a:m] if lengths is not None else []
            outs.append(build(drop)(frames[m], dropped, *before))
        if return_removed:
            removed.append(build(sd.finish_removed)(dropped, meta, carried, like))
    divisions = df.divisions if dask.is_dask_collection(df) else None
    kept = build.collect(build.rejoin(outs, cut), like, divisions)
    if not return_removed:
        return kept
    removed = build.rejoin(removed, cut, renumber=True)
    return kept, build.collect(removed, backends.frame_like(meta, like))


def _clustered(
    what: str, df: Any, on: str, threshold: Any, how: tuple[Any, ...], **extra: Any
) -> Any:
    """``method="clustered"``: k-means first, exact search within clusters
    (:mod:`dask_cosim.clustered`); ``extra``: ``columns``, dedup's ``return_removed``."""
    from dask_cosim import clustered

    _, n_probe, clusters = how
    run = clustered.neighbors if what == "neighbors" else clustered.dedup
    return run(df, on, threshold=float(threshold), clusters=clusters, n_probe=n_probe, **extra)


def groups(df: Any, on: str, threshold: float, *, name: Hashable = "group") -> Any:
    """See :meth:`dask_cosim.CosimAccessor.groups`."""
    threshold_value = options.search_threshold(threshold, required=True)
    check_column(df, on)
    name = "group" if name is None else name
    if not errors.is_label(name):
        raise TypeError(f"name={name!r} must be a column label, the new column's: e.g. 'group'")
    if name in sg.meta_of(df).columns:
        raise ValueError(f"name={name!r} is a column of the frame already; pick another name")
    opts = _options()
    build = sg.Builder(dask.is_dask_collection(df))
    cut = sg.pieces(build, df, opts, sg.pairs_of)
    frames = build.cut(build.partitions(df), cut)
    sides = sg.sides(build, df, on, opts, frames=frames, cut=cut)
    n = len(sides)
    budget = _budget(opts, build, "groups", on, threshold_value, n)
    edge = functools.partial(build(sd.earlier_matches), precision=opts.precision, edges=True,
                             budget=budget)  # fmt: skip
    edges = [
        edge(sides[i], sides[j] if j > i else None, threshold_value, opts.tile_bytes)
        for i in range(n)
        for j in range(i, n)
    ]
    rows = [build(sd.side_rows)(side) for side in sides]
    # One task holds the whole graph (the components need it), the merges before it
    # a forest each: at most the rows.
    check = build.checked(edges, budget, "a merge of groups' edges", tree=(opts.split_every, rows))
    all_edges = build.tree(edges, sd.merged_forest, opts.split_every, check)
    found = build.shared(build(sd.components, nout=n)(rows, all_edges))
    lengths = [build(len)(f) for f in frames] if len(frames) > n else None
    outs = []
    for j, (a, b) in enumerate(sg.block_bounds(len(frames), opts.max_blocks)):
        for m in range(a, b):
            # The block's group ids, sliced to partition m's own rows.
            before = lengths[a:m] if lengths is not None else []
            outs.append(build(sd.with_group)(frames[m], found[j], name, *before))
    meta = sd.with_group(sg.meta_of(df).iloc[:0], np.zeros(0, dtype=np.int64), name)
    divisions = df.divisions if dask.is_dask_collection(df) else None
    return build.collect(build.rejoin(outs, cut), meta, divisions)


def prepare(df: Any, on: str) -> Any:
    """See :meth:`dask_cosim.CosimAccessor.prepare`."""
    check_column(df, on)
    opts = _options()
    fn = functools.partial(sp.prepare_columns, column=on, device=opts.device)
    if not dask.is_dask_collection(df):
        return fn(df)
    # Without dask's metadata enforcement, which gives an empty partition the meta itself:
    # dask's placeholder category as data where a categorical's categories are unknown.
    return df.map_partitions(fn, meta=fn(df._meta), token="cosim-prepare", enforce_metadata=False)


def topk(
    df: Any,
    queries: Any,
    on: str,
    k: int = 10,
    *,
    columns: Hashable | Sequence[Hashable] | None = None,
) -> Any:
    """See :meth:`dask_cosim.CosimAccessor.topk`."""
    k_value = options.search_k(k, required=True)
    if isinstance(queries, str) and not errors.is_label(on):
        raise errors.arguments_swapped("topk", "queries", "queries", queries)
    spec = check_column(df, on)
    columns = _carried(df, columns, "columns")
    _warn_if_labels_repeat([(df, "the frame", "'match'", "columns")] * (not columns))
    check_topk_columns(
        columns, f"columns={columns!r}", "rename them first (df.rename(columns=...))"
    )
    opts = _options()
    queries, by_position = _topk_queries(queries, on, spec.dim)
    query = sp.query_side(queries, opts.eps)
    _check_dims(spec, f"column {on!r}", query.prep.dim, "the queries")
    if not by_position and not query.labels.is_unique:
        repeated = query.labels[query.labels.duplicated()].unique().tolist()
        warnings.warn(errors.query_labels_repeat(repeated), stacklevel=errors.caller_stacklevel())
    for labels, zero in zip(sp.unusable_queries(query), (False, True)):
        if labels:
            warnings.warn(
                errors.queries_unusable(labels, by_position, zero),
                stacklevel=errors.caller_stacklevel(),
            )
    score_dtype = sp.score_dtype(spec, backends.VectorSpec(None, _numpy_dtype(query)))
    build = sg.Builder(dask.is_dask_collection(df))
    q = build.value(query, "cosim-queries")
    pair = build(sp.join_pair_topk)
    cut = sg.pieces(build, df, opts, lambda n: n)
    pieces = [
        pair(q, r, k_value, None, opts.tile_bytes, opts.precision)
        for r in sg.sides(build, df, on, opts, columns, cut=cut)
    ]
    merged = build.tree(pieces, _combine(k_value), opts.split_every)
    result = build(sr.finish_topk)(merged, sg.meta_of(df), columns, score_dtype)
    if not build.lazy:
        return result
    try:
        return result.compute()
    except RuntimeError as err:  # dask's: an asynchronous Client cannot compute here
        if "asynchronous Client" not in str(err):
            raise
        raise RuntimeError(
            "topk computes its result when called, which an asynchronous Client cannot "
            "do (dask.compute is synchronous); a join of the queries is the same search, "
            f"lazy: await client.compute(queries.cosim.join(df, {on!r}, k={k_value})), "
            f"queries a pandas frame holding them in column {on!r} (its columns 'left', "
            "'right', 'score' and 'rank' are topk's 'query', 'match', 'score' and 'rank')"
        ) from None


def _topk_queries(queries: Any, on: str, dim: int | None) -> tuple[Any, bool]:
    """``topk``'s queries as :func:`~dask_cosim.search_partition.query_side` takes them,
    and whether they are named by position (not a Series): a dask collection computed
    (``topk`` is eager and sends its queries whole to every worker); a frame with
    columns that are not numbers refused, naming the Series to give (a frame of numbers
    is an (n, D) array, one column per dimension); a list of none (no queries: an
    empty (0, ``dim``) array), or of vectors some of them None or of other lengths (a
    Series of them, whose rows are checked as a column's: None is a null query, a
    vector of another length the row's error)."""
    lazy = dask.is_dask_collection(queries)
    meta = sg.meta_of(queries)
    columns = getattr(meta, "columns", None)
    if columns is not None and not all(getattr(d, "kind", "O") in "biuf" for d in meta.dtypes):
        raise errors.queries_frame(list(columns), backends.shown_vector_columns(meta), on)
    queries = queries.compute() if lazy else queries
    by_position = not backends.is_vector_series(queries)
    if isinstance(queries, (list, tuple)):
        if len(queries) == 0:
            return np.zeros((0, dim or 0), dtype=np.float32), by_position
        vectors = [q for q in queries if q is not None]
        if all(np.ndim(q) == 1 for q in vectors) and (
            len(vectors) < len(queries) or len({len(q) for q in vectors}) > 1
        ):
            import pandas as pd

            return pd.Series(list(queries), dtype=object), by_position
    return queries, by_position


def _numpy_dtype(side: sp.Side) -> np.dtype | None:
    """The queries' dtype as numpy names it (None for bfloat16, which numpy lacks)."""
    name = str(side.prep.raw.dtype).removeprefix("torch.")
    return None if name == "bfloat16" else np.dtype(name)
