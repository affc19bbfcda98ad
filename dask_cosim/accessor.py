"""``df.cosim``: the accessor on dask, pandas and cudf DataFrames.

On a dask DataFrame it validates against ``_meta`` (never by computing), derives the result
meta from the input meta (cudf in, cudf out) and builds the lazy result: ``pairwise`` one
``map_partitions`` call (on the frame narrowed to its two columns where that narrows a
read: :func:`_narrowed`), the searches their graphs of partition (pair) tasks
(:mod:`dask_cosim.search`; ``method="clustered"`` computes its plan first,
:mod:`dask_cosim.clustered`).  On an eager frame it runs the same partition functions.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import dask
import torch

from dask_cosim import backends, errors, options, partition, search

__all__ = ["CosimAccessor"]


class CosimAccessor:
    """Cosine similarity between embedding columns: ``df.cosim.pairwise("a", "b")``.

    The searches (``topk``, ``join``, ``neighbors``, ``dedup``, ``groups``) decide on
    float64 scores; ``score`` columns are float64 where both sides' columns are float64
    by their dtype (the metadata: an object column of arrays shows none, and gives
    float32 even when eager, unlike ``pairwise``), else float32.  A zero vector scores
    0.0 with every row: it has matches with ``k`` (the first valid rows in frame order)
    and at a threshold of 0 or below.  Null rows and rows holding NaN or inf never
    match.  docs/similarity-search.md, "Semantics", has the whole contract.
    """

    def __init__(self, obj: Any) -> None:
        # Only a reference: dask-expr swaps a collection's expression in place, so nothing
        # derived from it may be cached here.
        self._obj = obj

    def pairwise(
        self,
        a: str,
        b: str,
        *,
        eps: float | None = None,
        dtype: Any = None,
        device: str | None = None,
        name: Hashable | None = None,
    ) -> Any:
        """res[i] = cos(df[a][i], df[b][i]), one value per row.

        Parameters
        ----------
        a, b : str
            Embedding columns: Arrow ``fixed_size_list``/``list`` of floats, object columns
            holding one numpy array or torch tensor per row (any shape with D elements),
            or cudf list columns.  ``a == b`` is allowed.
        eps : float, default config ``cosim.eps`` (1e-8)
            ``cos = (a / max(|a|, eps)) . (b / max(|b|, eps))``, any finite ``eps >= 0``:
            a zero vector gives 0.0 for ``eps > 0``, NaN (0/0) for ``eps=0``.
        dtype : {None, "float32", "float64"}, default config ``cosim.dtype`` (None)
            None: float64 when both columns are float64, else float32.  A dask frame
            decides from its metadata, before any partition is read: an object column
            (an array or tensor per row) shows no vector dtype there and gives float32
            even where every row is float64.  An eager frame decides from its data:
            object columns of float64 arrays give float64.  Accumulation is float32 at
            least (fp16/bf16 are upcast).
        device : {"auto", "cpu", "cuda", "cuda:N"}, default config ``cosim.device``
            "auto" computes each partition where it finishes first
            (:mod:`dask_cosim.placement`): cudf partitions on their GPU; pandas
            partitions on the CPU unless the process computing them has a GPU and the
            staged copy there takes less time than the host kernel.  With the default
            rates (config ``cosim.placement``) that is never where the fused kernel
            (numba: float32 or float64 of one dtype) applies, and where only the torch
            kernel does (float16, bfloat16, integers, mixed dtypes) above about 2.2 MB of
            vectors in the partition (both columns).  "cuda" moves pandas partitions to
            the GPU through pinned staging buffers.
        name : hashable, default "cos"
            Name of the result Series (None: "cos").

        Returns
        -------
        Series
            Lazy dask Series (dask input; same index and divisions, pandas- or
            cudf-backed like the input) or eager pandas/cudf Series.  Null rows give
            NaN (pandas) or null (cudf); NaN/inf in a row gives NaN.

        Raises
        ------
        KeyError
            A column is not in the frame.
        TypeError
            A column does not hold vectors (strings, scalars, ...), or ``name`` is no
            label (a list, an array).
        ValueError
            The fixed vector sizes of ``a`` and ``b`` differ, or a bad option.  At compute
            time: ragged rows or rows of different lengths in ``a`` and ``b``.
        """
        obj = self._obj
        lazy = dask.is_dask_collection(obj)
        meta = obj._meta if lazy else obj
        eps = options.eps(eps)
        device = options.device(device)
        dtype = options.torch_dtype(dtype)
        name = "cos" if name is None else name
        if not errors.is_label(name):
            raise TypeError(f"name={name!r} must be a label, the result Series': e.g. 'cos'")

        for argument, column in (("a", a), ("b", b)):
            # Named by argument, as the searches name on=: "b: column 'x' not found".
            backends.check_column_name(meta, column, argument, f"{argument}: column")
        spec_a = backends.column_spec(obj, a)
        spec_b = backends.column_spec(obj, b)
        if spec_a.dim is not None and spec_b.dim is not None and spec_a.dim != spec_b.dim:
            raise errors.dims_differ(f"column {a!r}", spec_a.dim, f"column {b!r}", spec_b.dim)
        kwargs: dict[str, Any] = {
            "eps": eps,
            "device": device,
            "name": name,
            "chunk_bytes": options.chunk_bytes(),
            # Read here, not in the task: dask's config does not travel to workers.
            "rates": options.placement_rates() if device == "auto" else None,
        }
        if not lazy:
            return partition.pairwise_partition(obj, a, b, dtype=dtype, **kwargs)

        if dtype is None:
            # Decided here, from the metadata, so that every partition agrees with the
            # meta (object columns reveal their dtype only at compute time: float32).
            dtype = partition.default_result_dtype([spec_a.dtype, spec_b.dtype])
        meta_out = backends.make_result(meta[a], torch.empty(0, dtype=dtype), None, name)
        columns = [a] if backends.same_label(a, b) else [a, b]
        return _narrowed(obj, columns).map_partitions(
            partition.pairwise_partition,
            a,
            b,
            dtype=dtype,
            meta=meta_out,
            token="cosim-pairwise",
            **kwargs,
        )

    # ----------------------------------------------------------------- search (search.py)

    def prepare(self, on: str) -> Any:
        """The frame with the numbers a search of ``on`` would compute from its vectors on
        every call, computed once: a frame to persist (or write) and search many times.

        Adds three columns beside ``on``: ``{on}.cosim.inv`` and ``{on}.cosim.norm``
        (float64: each row's range factor, 1 over its largest magnitude, and the norm of
        the row times that factor: the row's own norm is ``norm / inv``) and
        ``{on}.cosim.unit`` (its rows divided by their norms, float32 lists; null in
        every row of a partition of float32 rows all of norm 1 already, so vectors
        written normalised in float32, as most embedding models write them, take no more
        memory; float64 rows keep their float32 copy, half their size again; null too for
        float16/bfloat16 rows and on GPUs, where a search redoes them).  ``topk``,
        ``join``, ``neighbors`` and ``dedup`` then read these instead of normalising,
        with the same results.  The columns follow the rows through filters,
        repartitions and Parquet; prepare again after changing the vectors of ``on``: a
        search checks a few rows of each partition and, for a column assigned again,
        warns (:class:`~dask_cosim.errors.StalePreparedWarning`, where the task runs and,
        on a distributed cluster, in the client too) and normalises the vectors itself,
        but rows changed one by one may escape that check and be scored with their old
        norms.  Lazy for a dask frame, else eager.
        """
        return search.prepare(self._obj, on)

    def topk(
        self,
        queries: Any,
        on: str,
        k: int = 10,
        *,
        columns: Hashable | list[Hashable] | None = None,
    ) -> Any:
        """The ``k`` rows of the frame most similar to each query (exact, eager).

        Parameters
        ----------
        queries : array-like or Series
            A 2-D numpy/cupy array or torch tensor (n, D), a list of vectors (None for a
            missing one, as in a Series), or a Series of vectors in any format ``on``
            accepts (a dask Series is computed first).  A DataFrame of
            numbers counts as an (n, D) array; a DataFrame with other columns is refused
            (give its embedding column).
        on : str
            The frame's embedding column.
        k : int, default 10
            Matches per query (fewer when the frame has fewer valid rows).
        columns : str or list, optional
            Columns of the matched rows to copy into the result (a string names one).

        Returns
        -------
        DataFrame
            pandas (cudf for a cudf frame), one row per (query, hit), in the queries' order
            then by rank: ``query`` (the query's position, or its index label for a Series),
            ``rank`` (0-based), ``match`` (the hit's index label), ``score``, then
            ``columns``.  Ties are broken by frame order.  Null or NaN queries and rows
            never match; no queries or an empty frame give an empty result.

        Warns
        -----
        QueryWarning
            Queries holding NaN, inf or null (they match no row), zero queries (they score
            0.0 with every row: their matches are the first valid rows in frame order,
            not similar rows), or a Series of queries whose index labels repeat
            (``query`` cannot tell those queries apart); each names the queries.
        RepeatedLabelsWarning
            No ``columns`` are carried and the frame is a dask frame of several partitions
            with unknown divisions, or an eager frame (or a dask frame of one in memory)
            whose labels repeat: ``match`` may not name rows uniquely, and the warning
            names the fix.

        Raises
        ------
        KeyError
            ``on`` or one of ``columns`` is not a column.
        TypeError
            ``on`` does not hold vectors (:class:`~dask_cosim.errors.StringColumnError`
            for text); ``queries`` holds no numbers, or is a DataFrame with columns of
            other types.
        ValueError
            ``k < 1``, vector lengths differ, queries not 2-D, or ``columns`` names a
            column of the frame called as a result column is (``query``, ``rank``,
            ``match``, ``score``).
        """
        return search.topk(self._obj, queries, on, k, columns=columns)

    def join(
        self,
        right: Any,
        on: str,
        *,
        right_on: str | None = None,
        k: int | None = None,
        threshold: float | None = None,
        columns: Hashable | list[Hashable] | None = None,
        right_columns: Hashable | list[Hashable] | None = None,
    ) -> Any:
        """Similarity join: for each row its ``k`` best rows of ``right``, or every pair
        scoring at least ``threshold`` (both: the ``k`` best among those).

        Parameters
        ----------
        right : DataFrame
            dask, pandas or cudf.
        on : str
            Embedding column of this frame (and of ``right`` unless ``right_on``).
        right_on : str, optional
            Embedding column of ``right``.
        k : int, optional
            Matches kept per left row, >= 1.
        threshold : float, optional
            Lowest score kept, in [-1, 1].
        columns : str or list, optional
            Columns of this frame to carry into the result as ``left_<column>`` (an id
            column names the rows whatever their index labels), and of ``right`` as
            ``right_<column>`` unless ``right_columns`` is given; a string names one.
        right_columns : str or list, optional
            Columns of ``right`` to carry as ``right_<column>`` (default: ``columns``).

        Returns
        -------
        DataFrame
            Lazy dask DataFrame when either side is a dask collection (one partition per
            left block of partitions, at most ``cosim.search.max-blocks``; unknown
            divisions), else pandas.  Columns ``left`` and
            ``right`` (index labels), ``score``, ``rank`` (0-based) when ``k`` is given,
            then the carried columns.  Sorted by left row, then with ``k`` by rank (score
            descending, ties broken by frame order), else by right row (frame order).
            Null or NaN rows never match.

        Warns
        -----
        RepeatedLabelsWarning
            A side carries no columns and is a dask frame of several partitions with
            unknown divisions, or an eager frame (or a dask frame of one in memory) whose
            labels repeat: its labels may repeat, and the warning names the fix.

        Raises
        ------
        KeyError
            A column is not in its frame (with the closest name).
        ValueError
            Neither ``k`` nor ``threshold``, ``k < 1``, threshold outside [-1, 1], or
            vector lengths that differ (known from the metadata).
        TypeError
            ``right`` is not a DataFrame (an array of vectors, a Series).
        """
        return search.join(self._obj, right, on, right_on=right_on, k=k, threshold=threshold,
                           columns=columns, right_columns=right_columns)  # fmt: skip

    def neighbors(
        self,
        on: str,
        *,
        k: int | None = None,
        threshold: float | None = None,
        columns: Hashable | list[Hashable] | None = None,
        method: str = "exact",
        n_probe: int | None = None,
        clusters: int | None = None,
    ) -> Any:
        """The self-join: :meth:`join` of the frame with itself, never pairing a row with
        itself.  With ``threshold`` alone each unordered pair appears once, the earlier
        row (frame order) as ``left``; with ``k`` every row gets its own ``k`` best.

        Parameters
        ----------
        on : str
            The embedding column.
        k : int, optional
            Matches kept per row, >= 1 (never the row itself).
        threshold : float, optional
            Lowest score kept, in [-1, 1] (both: the ``k`` best among those).
        columns : str or list, optional
            Columns carried from both rows of each pair as ``left_<c>`` and ``right_<c>``
            (an id column names the rows whatever their index labels); a string names
            one.
        method : {"exact", "clustered"}, default "exact"
            "exact" scores all pairs.  "clustered" (``threshold`` in (0, 1], no ``k``)
            clusters the rows first and searches within clusters, for frames of millions
            of rows: the same result, columns and dtypes (carried ``columns`` included);
            it computes the clustering when called (see :meth:`dedup`).
        n_probe, clusters : int, optional
            With "clustered": as for :meth:`dedup`.

        Returns
        -------
        DataFrame
            Lazy dask DataFrame for a dask frame (unknown divisions; one partition per
            block of partitions, at most ``cosim.search.max-blocks``, with "exact", one
            per partition of the frame with "clustered"), else eager.  Columns ``left``
            and ``right`` (index labels), ``score``, ``rank`` (0-based) when ``k`` is
            given, then the carried columns, every ``left_<c>`` before the ``right_<c>``.
            Sorted by left row, then with ``k`` by rank, else by right row.  Null or NaN
            rows never match.

        Warns
        -----
        RepeatedLabelsWarning
            No ``columns`` are carried and the frame is a dask frame of several partitions
            with unknown divisions, or an eager frame (or a dask frame of one in memory)
            whose labels repeat: ``left`` and ``right`` may not name rows uniquely, and
            the warning names the fix.
        UserWarning
            With "clustered": the plan expects exact all-pairs to cost no more (it then
            runs instead: the same pairs), or, with ``n_probe=None``, copies each row to
            many blocks (``n_probe=2`` bounds that).

        Raises
        ------
        KeyError
            ``on`` or one of ``columns`` is not a column (with the closest name).
        TypeError
            ``on`` does not hold vectors (:class:`~dask_cosim.errors.StringColumnError`
            for text).
        ValueError
            Neither ``k`` nor ``threshold``, ``k < 1``, threshold outside [-1, 1], a
            ``method`` other than "exact" or "clustered", ``n_probe`` or ``clusters``
            without "clustered", "clustered" with ``k`` or a threshold <= 0; when called,
            "clustered" on a dask frame whose routing shuffle has no room for the rows'
            copies.
        ResultTooLargeError
            ``threshold`` without ``k``, at compute time (when called, for an eager
            frame): a task found more pairs than ``cosim.search.max-result-bytes`` lets it
            hold.
        """
        return search.neighbors(self._obj, on, k=k, threshold=threshold, columns=columns,
                                method=method, n_probe=n_probe, clusters=clusters)  # fmt: skip

    def dedup(
        self,
        on: str,
        threshold: float,
        *,
        return_removed: bool = False,
        columns: Hashable | list[Hashable] | None = None,
        method: str = "exact",
        n_probe: int | None = None,
        clusters: int | None = None,
    ) -> Any:
        """The frame (all columns) without every row that has an earlier row (frame
        order) scoring at least ``threshold`` with it.

        A row is dropped even when the earlier row it matches is itself dropped (the
        edges are those of :meth:`neighbors`; chains are not followed).  Null and NaN rows
        are kept.  Lazy for a dask frame (same partitions and divisions), else eager.

        Parameters
        ----------
        on : str
            The embedding column.
        threshold : float
            Score at which two rows are duplicates, in [-1, 1].
        return_removed : bool, default False
            Also return what was removed: one row per dropped row, in frame order, with
            ``left`` (the earlier row it duplicates: of the earlier rows scoring at least
            ``threshold`` with it, the one of highest float64 score, ties to the earliest),
            ``right`` (the dropped row), ``score``, then ``left_<c>``/``right_<c>`` for
            ``columns``.  That earlier row may be dropped too: it then has its own row,
            and following ``left`` from row to row ends at a kept row.  As NeMo
            Curator's ``id, max_id, cosine_sim_score``: ``columns=["id"]``, then
            ``right_id``, ``left_id``, ``score``.
        columns : str or list, optional
            Columns to carry into the removed rows (an id column names the rows whatever
            their index labels); a string names one.  Only with ``return_removed``
            (ValueError without it: the kept rows keep every column).
        method : {"exact", "clustered"}, default "exact"
            "exact" scores all pairs (rows x rows / 2: up to a few hundred thousand rows
            on a CPU).  "clustered" runs spherical k-means on a sample, then the exact
            kernels within each cluster and across the cluster boundaries that the skip
            rule cannot rule out (docs/clustered.md): for millions of rows; it computes
            the clustering when called; ``threshold`` must be in (0, 1].  Where its plan
            expects exact all-pairs to cost no more, that runs instead, with a warning;
            where the routing shuffle has no room for the rows' copies, ValueError.
        n_probe : int, optional
            With "clustered": None (the default) probes every cluster that may hold a
            match, so the result equals "exact" (recall 1); an integer probes at most
            that many clusters per row beyond its own (faster where clusters overlap,
            recall measured by :func:`dask_cosim.clustered_recall.sample_truth`); 0
            compares each row with its own cluster only (NeMo Curator's semantic dedup).
        clusters : int, optional
            With "clustered": the number of k-means clusters (default about sqrt(rows)).

        Returns
        -------
        DataFrame, or (DataFrame, DataFrame) with ``return_removed``
            The kept rows, and the removed ones (computing both together, e.g.
            ``dask.compute(kept, removed)``, scans the pairs once).

        Warns
        -----
        RepeatedLabelsWarning
            With ``return_removed`` and no ``columns``: the frame is a dask frame of
            several partitions with unknown divisions, or an eager frame (or a dask frame
            of one in memory) whose labels repeat, so ``left`` and ``right`` may not name
            rows uniquely; the warning names the fix.  (The kept rows are the frame's own:
            nothing is said without ``return_removed``.)
        UserWarning
            With "clustered": the plan expects exact all-pairs to cost no more (it then
            runs instead), or, with ``n_probe=None``, copies each row to many blocks.

        Raises
        ------
        KeyError
            ``on`` or one of ``columns`` is not a column (with the closest name).
        TypeError
            ``on`` does not hold vectors (:class:`~dask_cosim.errors.StringColumnError`
            for text), or ``return_removed`` is not True or False.
        ValueError
            ``threshold`` missing or outside [-1, 1] (outside (0, 1] with "clustered"), a
            ``method`` other than "exact" or "clustered", ``n_probe`` or ``clusters``
            without "clustered", ``columns`` without ``return_removed``; when called,
            "clustered" on a dask frame whose routing shuffle has no room for the rows'
            copies.
        ResultTooLargeError
            With "clustered", at compute time (when called, for an eager frame): a task
            found more pairs than ``cosim.search.max-result-bytes`` lets it hold.  The
            exact method's tasks keep one row a match of those pairs whatever their
            number (a task past that budget, all pairs of many identical rows, searches
            its rows again by blocks, keeping the matched rows block by block).
        """
        return search.dedup(self._obj, on, threshold, return_removed=return_removed,
                            columns=columns, method=method, n_probe=n_probe,
                            clusters=clusters)  # fmt: skip

    def groups(self, on: str, threshold: float, *, name: Hashable = "group") -> Any:
        """The frame with a column ``name``: each row's group of near-duplicates, the
        connected component of the graph whose edges are the pairs scoring at least
        ``threshold`` (those of :meth:`neighbors`), named by the frame position (0-based,
        over all partitions) of its first row.  A row with no such pair, and a null or
        NaN row, is a group of its own.

        Lazy for a dask frame (same partitions and divisions), else eager.  The pairs are
        found partition pair by partition pair as :meth:`neighbors` finds them, and each
        pair task keeps of them only edges that connect its rows as they do, fewer than
        its rows (a task past ``cosim.search.max-result-bytes`` searches its rows again
        by blocks, keeping those edges block by block); merges of
        ``cosim.search.split-every`` tasks' edges reduce them to such edges again (at
        most one a row), and the components are computed by
        ``scipy.sparse.csgraph.connected_components`` in one task, which holds the last
        merge's edges (about 40 bytes each) and 16 bytes per row.

        Parameters
        ----------
        on : str
            The embedding column.
        threshold : float
            Score at which two rows are in one group, in [-1, 1].
        name : hashable, default "group"
            Name of the new column (any label, as ``pairwise``'s ``name``; None: "group");
            not a column of the frame already.

        Returns
        -------
        DataFrame
            The frame (all columns) with ``name`` added: int64 group ids.

        Raises
        ------
        KeyError
            ``on`` is not a column (with the closest name).
        TypeError
            ``on`` does not hold vectors (:class:`~dask_cosim.errors.StringColumnError`
            for text), or ``name`` is no column label (a list, an array).
        ValueError
            ``threshold`` missing or outside [-1, 1], or ``name`` is a column already.
        ResultTooLargeError
            At compute time (when called, for an eager frame): the edges a merge of
            ``cosim.search.split-every`` pair tasks' edges (or merges') would receive
            are more than ``cosim.search.max-result-bytes`` lets it hold (each merge
            gives at most one edge a row).
        """
        return search.groups(self._obj, on, threshold, name=name)


def _narrowed(obj: Any, columns: list[str]) -> Any:
    """``obj[columns]`` where dask pushes that projection into ``obj``'s graph (a Parquet
    read of those columns alone, a narrower ``from_pandas``), else ``obj`` itself.

    distributed runs each expression of a graph as a task of its own (it fuses none), so a
    projection left standing over its input (a frame persisted in worker memory, a
    filter of one, the output of a ``map_partitions``) is one more task per partition, a
    few ms of scheduler and worker time each, that narrows nothing: the partition
    function reads its two columns by name either way.  Decided from the simplified
    expressions (what the optimizer does first), which touches no data.  ``obj`` itself
    too for a column named None or NaN, which a list of columns cannot select.
    """
    if any(c is None or c != c for c in columns):
        return obj
    projected = obj[columns]
    base = obj.expr.simplify()._name
    left_standing = [d._name for d in projected.expr.simplify().dependencies()] == [base]
    return obj if left_standing else projected
