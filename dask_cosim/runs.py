"""Parquet in, Parquet out: the runs the command line starts, as plain functions.

Each run is split in two: everything that can be checked without a cluster (files are
Parquet, columns exist and hold vectors, the output may be written) is checked and the
graph built when the run is prepared; the returned function computes it on whatever
scheduler is active and writes the output atomically (:func:`dask_cosim.to_parquet`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dask_cosim import backends, errors, io
from dask_cosim.backends import VectorSpec
from dask_cosim.io.files import check_replaceable, location
from dask_cosim.search import check_column
from dask_cosim.summary import Summary, summarize

__all__ = [
    "Written",
    "check_columns",
    "check_output",
    "check_query_dims",
    "check_removed",
    "pairwise",
    "read_inputs",
    "read_queries",
    "write",
    "write_all",
]


@dataclass(frozen=True)
class Written:
    """What a run wrote: its rows (None when unknown), the seconds from the start of the
    computation to the committed output, the summary of a pairwise result and the bytes
    of embeddings it read (None when the metadata cannot tell)."""

    rows: int | None
    seconds: float
    summary: Summary | None = None
    embedding_bytes: int | None = None


def _paths(inputs: str | os.PathLike[str] | Sequence[str]) -> list[str]:
    """``inputs`` as a list of paths: one path (a string iterated would be its letters,
    "/" among them, a listing of the whole filesystem) or several."""
    if isinstance(inputs, (str, os.PathLike)):
        return [os.fspath(inputs)]
    return [os.fspath(p) for p in inputs]


def read_inputs(inputs: str | os.PathLike[str] | Sequence[str], reads: str) -> Any:
    """The Parquet ``inputs`` (a path, or several: files, folders, globs) as one dask
    frame; a local file that is not Parquet raises first, saying how to convert it
    (``reads``: what the caller reads, for the message)."""
    listed = _paths(inputs)
    io.check_parquet_inputs(listed, reads)
    return io.read_parquet(listed if len(listed) > 1 else listed[0])


def check_columns(df: Any, columns: Sequence[str], what: str) -> None:
    """KeyError naming the first of ``columns`` not in ``df`` (``what`` it is), with the
    closest column."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise errors.column_not_found(missing[0], df.columns, what)


def check_output(output: str, overwrite: bool, inputs: Sequence[str] = ()) -> None:
    """Before any work: FileExistsError when ``output`` exists and not ``overwrite``: a
    local folder in any spelling (a ``file://`` URL too); ValueError when it is one of
    ``inputs`` or holds one (with ``overwrite`` the write would replace the rows it read:
    lost, where a typo asked for it), when it is inside a local folder among ``inputs`` (a
    later read of that folder would take the output's files for rows of its own), or,
    with ``overwrite``, when it holds the working directory
    (:func:`~dask_cosim.io.files.check_replaceable`).  An object-store output is left to
    the write, which refuses it then (making its filesystem here could cost requests)."""
    where = location(output)
    if "://" in where:
        return
    for path in inputs:
        folder = location(path)
        if folder == where or folder.startswith(where.rstrip("/") + "/"):
            what = "is the input" if folder == where else "holds the input"
            raise ValueError(
                f"{output!r} {what} {path!r}: writing it would replace the rows read, which "
                "would be lost; write the output elsewhere"
            )
        if where.startswith(folder.rstrip("/") + "/") and os.path.isdir(folder):
            raise ValueError(
                f"{output!r} is inside the input folder {path!r}: a later read of that "
                "folder would take the output's files for rows of its own; write it "
                "elsewhere"
            )
    if os.path.exists(where):
        if not overwrite:
            raise FileExistsError(f"{output!r} exists; pass --overwrite to replace it")
        check_replaceable(output)


def check_removed(removed: str, output: str, overwrite: bool, inputs: Sequence[str] = ()) -> None:
    """dedup's ``--removed`` folder: not ``--output``, not inside it and not holding it (the
    two are renamed into place one after the other, so one would replace or land in the
    other after the whole run), and as :func:`check_output` checks an output.  The two are
    compared by :func:`~dask_cosim.io.files.location`: a relative path, a symbolic link
    or a ``file://`` URL of the same folder is the same folder."""
    kept, gone = location(output), location(removed)
    how = f"give --removed a folder of its own, e.g. {output.rstrip('/') + '-removed'!r}"
    if kept == gone:
        raise ValueError(f"--removed {removed!r} is the --output folder {output!r}; {how}")
    if gone.startswith(kept + "/"):
        raise ValueError(f"--removed {removed!r} is inside --output {output!r}; {how}")
    if kept.startswith(gone + "/"):
        raise ValueError(f"--output {output!r} is inside --removed {removed!r}; {how}")
    check_output(removed, overwrite, inputs)


def write(
    result: Any,
    output: str,
    *,
    overwrite: bool,
    progress: bool,
    layout: str = "binary",
    index: bool = True,
    vectors: Collection[str] = (),
) -> Written:
    """Compute ``result`` (a dask or pandas frame, or a function returning one: results
    that are computed eagerly, like ``topk``'s) and write it to ``output`` in ``layout``,
    with its index unless ``index`` is False (search results, numbered per partition).
    Its columns named in ``vectors`` are stored as vectors; other list columns (tags,
    token ids: rows of any length) as they are."""
    return write_all([(result, output, index)], overwrite=overwrite, progress=progress,
                     layout=layout, vectors=vectors)[0]  # fmt: skip


def write_all(
    results: Sequence[tuple[Any, str, bool]],
    *,
    overwrite: bool,
    progress: bool,
    layout: str,
    vectors: Collection[str] = (),
) -> list[Written]:
    """:func:`write` for several (result, output, index), computed together: work they
    share (dedup's pairs, for the kept and the removed rows) is done once.  The outputs
    are committed together (:func:`dask_cosim.io.to_parquet_together`): a failure, of
    the computation or of any output's commit, leaves every output as it was.  The
    columns named in ``vectors`` are each result's vectors (a column of lists of other
    lengths was refused as a ragged embedding column)."""
    t0 = time.perf_counter()
    frames = [(r() if callable(r) else r, out, index) for r, out, index in results]
    writes = [
        (frame, out,
         {"layout": layout, "write_index": None if index else False, "overwrite": overwrite,
          "vectors": [c for c in frame.columns if c in vectors]})
        for frame, out, index in frames
    ]  # fmt: skip
    manifests = io.to_parquet_together(writes, progress=progress)
    seconds = time.perf_counter() - t0
    return [Written(manifest["rows"], seconds) for manifest in manifests]


def read_queries(path: str, query_on: str | None, on: str) -> Any:
    """The queries of ``topk``: a .npy array (N, D) (queries named by position), the
    column ``query_on`` (default ``on``) of Parquet, as a lazy Series (named by label), or
    that of a CSV or JSON Lines file, read now (named by position: each block of a text
    file numbers its rows from 0)."""
    if Path(path).suffix.lower() == ".npy":
        if query_on is not None:
            raise ValueError(
                f"--query-on {query_on!r} names a column of Parquet, CSV or JSON Lines "
                f"queries; {path!r} is one .npy array: leave --query-on out"
            )
        return io.numpy_vectors(path)
    text = io.is_text_file(path)
    if text:
        queries = io.read_text(path)
    else:
        queries = read_inputs(
            [path], "--queries reads a .npy array of shape (N, D), CSV, JSON Lines or Parquet"
        )
    column = on if query_on is None else query_on
    # --on's name, where no --query-on names the queries' own: say which is missing.
    what = f"--query-on column (in {path!r})" if query_on else (
        f"--queries {path!r} has no column --on {on!r} and no --query-on is given: column"
    )  # fmt: skip
    backends.check_column_name(queries._meta, column, "query_on", what)
    check_column(queries, column, "query_on")
    if text:
        return queries[column].compute().reset_index(drop=True)
    return queries[column]


def check_query_dims(spec: VectorSpec, on: str, queries: Any) -> None:
    """Before a cluster starts: ValueError where a .npy's shape or the metadata tells that
    the vectors of ``queries`` (:func:`read_queries`) and of ``on`` (``spec``: what
    :func:`~dask_cosim.search.check_column` found) differ in length (topk finds it too,
    but on the cluster, once it has started)."""
    if hasattr(queries, "shape") and len(queries.shape) == 2:  # a .npy's array
        dim = queries.shape[1]
    else:
        dim = check_column(queries.to_frame(), queries.name, "query_on").dim
    if spec.dim is not None and dim is not None and spec.dim != dim:
        raise errors.dims_differ(f"column {on!r}", spec.dim, "the queries", dim)


def pairwise(
    inputs: str | os.PathLike[str] | Sequence[str],
    a: str,
    b: str,
    output: str,
    *,
    keep: Sequence[str] = (),
    name: str = "cos",
    overwrite: bool = False,
    layout: str = "binary",
    **kwargs: Any,
) -> Callable[[bool], Written]:
    """cos(A[i], B[i]) for every row of the Parquet ``inputs``, into the folder ``output``
    with the ``keep`` columns (vector columns among them stored in ``layout``); ``kwargs``
    (eps, dtype, device) go to ``pairwise``.

    Checks and builds now; the returned function (taking ``progress``) writes, then
    summarises the written column (what the user got, without a second pass over the
    inputs).
    """
    listed = _paths(inputs)
    df = read_inputs(listed, "pairwise reads Parquet files or folders of them")
    check_columns(df, keep, "--keep column")
    if name in keep:
        raise ValueError(
            f"--keep {name} would overwrite the result column {name!r} (--name); keep "
            "others, or give the result another --name"
        )
    cos = df.cosim.pairwise(a, b, name=name, **kwargs)
    out = df[list(keep)].assign(**{name: cos}) if keep else cos.to_frame()
    check_output(output, overwrite, listed)
    spec = check_column(df, a)

    def run(progress: bool = False) -> Written:
        written = write(out, output, overwrite=overwrite, progress=progress, layout=layout,
                        vectors=(a, b))  # fmt: skip
        summary = summarize(io.read_parquet(output, columns=[name])[name])
        embedding_bytes = None
        if spec.dim is not None and spec.dtype is not None:
            embedding_bytes = 2 * summary.rows * spec.dim * spec.dtype.itemsize
        return Written(summary.rows, written.seconds, summary, embedding_bytes)

    return run
