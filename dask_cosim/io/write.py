"""Writing frames to a folder of Parquet files, atomically, with a manifest (through pyarrow,
or cudf's GPU writer in :mod:`.cudf_parquet` for cudf partitions bound for local files)."""

from __future__ import annotations

import inspect
import itertools
import json
import os
import re
from collections.abc import Sequence
from typing import Any

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
from dask.dataframe.dispatch import to_pyarrow_table_dispatch

from dask_cosim import backends, errors
from dask_cosim.io import categories, cudf_parquet
from dask_cosim.io.convert import from_pandas, futures_of, held_where_it_is, vector_columns
from dask_cosim.io.files import (
    Staging,
    check_open,
    check_replaceable,
    commit,
    discard,
    exists,
    filesystem,
    location,
    new_staging,
    open_staging,
)
from dask_cosim.io.layouts import (
    check_layout,
    encode_column,
    list_columns,
    vector_field,
)
from dask_cosim.io.manifest import WRITTEN_META, write_manifest, written_row
from dask_cosim.io.vector_dims import FileWriter, sized_files, stored_vectors


def frame_to_table(
    df: Any,
    *,
    layout: str = "binary",
    vectors: Sequence[str] | None = None,
    preserve_index: bool | None = None,
) -> pa.Table:
    """One pandas or cudf frame -> the Arrow table :func:`to_parquet` writes.

    Vector columns (``vectors``; default every list column) are read as ``pairwise`` reads
    them (so object columns of tensors work, and ragged rows raise naming the row), then
    encoded in ``layout``; the other columns and the index as pyarrow writes them.
    """
    check_layout(layout)
    vectors = list(vectors) if vectors is not None else list_columns(df)
    others = [c for c in df.columns if c not in vectors]
    # dask's own dispatch: pandas -> pa.Table.from_pandas, cudf -> DataFrame.to_arrow.
    table = to_pyarrow_table_dispatch(
        _index_named_as_pyarrow(df[others], preserve_index, vectors),
        preserve_index=preserve_index,
    )
    table = categories.typed_dictionaries(table)
    fields, arrays = list(table.schema), list(table.columns)
    positions = {c: i for i, c in enumerate(df.columns)}
    # In column order, so each lands where it was (index columns stay last).
    for column in sorted(vectors, key=positions.__getitem__):
        try:
            field, array = encode_column(df[column], str(column), layout)
        except errors.RaggedError as error:
            # Every list column by default: token ids, say, are lists of other lengths.
            raise errors.RaggedError(
                f"{error}. If {column!r} holds no embeddings, name the columns that do: "
                f"vectors=[...] (the others are written as they are)"
            ) from None
        fields.insert(positions[column], field)
        arrays.insert(positions[column], array)
    # From arrays, not add_column: a table of the index alone may have no columns, and
    # then pyarrow gives it 0 rows.
    metadata = _pandas_metadata(table.schema.metadata, df.index.name)
    metadata = categories.recorded(table, metadata)
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata))


def to_parquet(
    df: Any,
    path: str | os.PathLike[str],
    *,
    layout: str = "binary",
    vectors: Sequence[str] | None = None,
    compression: str | dict[str, str] | None = "snappy",
    row_group_rows: int | None = None,
    write_index: bool | None = None,
    overwrite: bool = False,
    compute: bool = True,
    progress: bool = False,
    **dask_options: Any,
) -> Any:
    """Write a frame to a folder of Parquet files, one per partition, atomically.

    The files go to a hidden folder next to ``path``, which is renamed to ``path`` only
    after every partition is written (a failed or interrupted run leaves ``path`` as it
    was).  The folder holds ``part.00000.<write>.parquet``... files (zero-padded to 5
    digits, more from 100,001 partitions on, so that every reader lists them in order;
    ``<write>`` differs from write to write, so that a reader of the folder an overwrite
    replaced fails rather than mixing the two) and a manifest, ``_dask_cosim.json``
    (layout, each vector column's D and dtype, rows and index range per file), which
    :func:`read_parquet` uses to read the folder back, with divisions when the index was
    sorted.  pandas metadata is written only for the non-vector columns and the index.

    Parameters
    ----------
    df : dask DataFrame or pandas DataFrame
        pandas frames go through :func:`from_pandas` first (``sort=False``: rows are
        written in the frame's order).
    path : str or path-like
        The folder to create: a local path, or a URL pyarrow or fsspec knows.  The final
        rename is atomic on local disks; on object stores it is a copy.
    layout : {"binary", "list"}, default "binary"
        How vector columns are stored (see :mod:`dask_cosim.io.layouts`): "binary" reads several
        times faster with pyarrow; "list" is readable by every Parquet reader.
    vectors : list of str, optional
        Columns to store as vectors; default every Arrow/cudf list column.  Name object
        columns of arrays or tensors here to convert them: left unnamed in a dask frame
        (whose meta cannot tell them), they raise TypeError when written, naming them.
    compression : str, dict or None, default "snappy"
        Codec for the non-vector columns (vector columns are stored uncompressed: float
        embeddings barely compress and decompressing costs more than it saves), or a
        dict per column as in ``pyarrow.parquet.write_table``.
    row_group_rows : int, optional
        Rows per Parquet row group; default pyarrow's (a whole partition up to 1Mi rows).
    write_index : bool, optional
        True stores the index as a column of every file, False stores none.  None (the
        default): as True, except for the default index of a frame of one partition
        (RangeIndex 0, 1, ..., n - 1, unnamed), which is not stored: every reader numbers
        the rows of one file so.  A stored index reads back whole in pandas, dask, pyarrow
        datasets and cudf (DuckDB, which has no index, sees a column).
    overwrite : bool, default False
        Replace an existing ``path`` (after the new folder is complete); not a folder
        that is, or holds, the working directory (ValueError).
    compute : bool, default True
        False returns a ``dask.delayed`` object that writes and commits when computed,
        and writes nothing before (a computation that fails writing a file leaves its
        hidden staging folder behind).
    progress : bool, default False
        Show a progress bar while writing: distributed's with an active Client, else
        dask's local ``dask.diagnostics.ProgressBar`` (on stdout).
    **dask_options
        None is taken: the keywords of dask's ``DataFrame.to_parquet`` that this writer
        has not (``partition_on``, ``append``, ``storage_options``, ...) are refused with
        TypeError, naming what does their work here.

    Returns
    -------
    dict
        The manifest (with ``compute=False``: a Delayed that returns it).
    """
    _check_options(dask_options, "to_parquet")
    options: dict[str, Any] = {
        "layout": layout,
        "vectors": vectors,
        "compression": compression,
        "row_group_rows": row_group_rows,
        "write_index": write_index,
        "overwrite": overwrite,
    }
    if compute:
        return to_parquet_together([(df, path, options)], progress=progress)[0]
    manifest, staging, frame = _stage(df, path, **options)
    # A frame that from_pandas scattered to a client's workers lives only as long as its
    # futures: the Delayed depends on each, so that they are held until it is computed.
    held = [dask.delayed(held_where_it_is, pure=False)(f) for f in futures_of(frame)]
    return dask.delayed(_commit, pure=False)(manifest, staging, held)


def to_parquet_together(
    writes: Sequence[tuple[Any, str | os.PathLike[str], dict[str, Any]]], *, progress: bool = False
) -> list[dict[str, Any]]:
    """Write several frames, each as :func:`to_parquet` would (``(df, path, options)``:
    its keyword arguments but ``compute`` and ``progress``), in one computation, so that
    the work they share is done once, and commit them together: every folder is complete
    before the first rename, the renames run back to back, and a failure of the
    computation or of any rename leaves every ``path`` as it was (see
    :func:`~dask_cosim.io.files.commit`), with no staging folder.  Each ``path`` is a
    folder of its own (not another's, nor inside it: ValueError before any work).
    Returns the manifests.
    """
    _check_apart([path for _, path, _ in writes])
    # (manifest, staging, frame): each frame held until computed, since one that
    # from_pandas scattered to a client's workers holds the futures of its partitions.
    staged: list[tuple[Any, Staging, Any]] = []
    try:
        for df, path, options in writes:
            _check_options(options, "to_parquet_together", allowed=_WRITE_DEFAULTS)
            staged.append(_stage(df, path, **{**_WRITE_DEFAULTS, **options}))
        manifests, stagings = [m for m, _, _ in staged], [s for _, s, _ in staged]
        done = compute_with_progress(*manifests) if progress else dask.compute(*manifests)
        commit(stagings)
    except BaseException:
        discard([s for _, s, _ in staged])
        raise
    return list(done)


def _check_apart(paths: Sequence[str | os.PathLike[str]]) -> None:
    """ValueError where two of ``paths`` are one folder (in any spelling:
    :func:`~dask_cosim.io.files.location`) or one is inside the other: renamed into
    place one after the other, one write would replace the other, or land in it."""
    places = [location(os.fspath(p)) for p in paths]
    for (a, here), (b, there) in itertools.combinations(zip(paths, places, strict=True), 2):
        if here == there or there.startswith(here + "/") or here.startswith(there + "/"):
            how = "the same folder as" if here == there else "a folder inside, or holding,"
            raise ValueError(
                f"to_parquet_together: {os.fspath(b)!r} is {how} {os.fspath(a)!r}; give "
                "each write a folder of its own"
            )


# What does the work of dask's to_parquet keywords that this writer has not.
_DASK_OPTIONS = {
    "partition_on": "dask's own df.to_parquet(path, partition_on=[...]) writes key=value "
    "folders (vectors as Arrow lists), which dask_cosim.read_parquet reads back; or write "
    "each group to a folder of its own",
    "append": "write the new rows to a folder of their own and read both: "
    "dask_cosim.read_parquet([old, new])",
    "storage_options": "give a URL pyarrow or fsspec knows; its filesystem takes its "
    "credentials from the environment or its own configuration",
    "name_function": "files are named part.NNNNN.<write>.parquet (the <write> part differs "
    "from write to write, so that a reader of a replaced folder does not mix two writes)",
    "schema": "the types are the frame's: cast columns first (df.astype({...}))",
    "write_metadata_file": "no _metadata file is written: the manifest _dask_cosim.json "
    "records each file's rows and index range",
    "custom_metadata": "the files hold pandas' metadata and ours",
    "ignore_divisions": "divisions are recorded whatever they are",
    "engine": "pyarrow writes every file",
    "compute_kwargs": "compute=False returns a dask.delayed, to compute as you choose",
}


def _check_options(options: Any, caller: str, allowed: Any = ()) -> None:
    """TypeError for a write's ``options`` (a dict) not in ``allowed``: dask's to_parquet
    keywords named with :data:`_DASK_OPTIONS`' alternative, others with the ones taken."""
    if not isinstance(options, dict):
        raise TypeError(
            f"{caller}: each write's options must be a dict of to_parquet's keywords, "
            f"e.g. {{'overwrite': True}}; got {type(options).__name__}"
        )
    for name in options:
        if name in allowed:
            continue
        if name in _DASK_OPTIONS:
            raise TypeError(
                f"{caller} does not take {name!r} (dask's DataFrame.to_parquet does): "
                f"{_DASK_OPTIONS[name]}"
            )
        taken = sorted(allowed or _WRITE_DEFAULTS)
        raise TypeError(
            f"{caller} got an unexpected keyword {name!r}; it takes {taken!r}"
            + errors.did_you_mean(name, taken)
        )


# to_parquet's own defaults, for the options a write of to_parquet_together leaves out.
_WRITE_DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(to_parquet).parameters.items()
    if parameter.kind is parameter.KEYWORD_ONLY and name not in ("compute", "progress")
}


def _stage(
    df: Any,
    path: str | os.PathLike[str],
    *,
    layout: str,
    vectors: Sequence[str] | None,
    compression: str | dict[str, str] | None,
    row_group_rows: int | None,
    write_index: bool | None,
    overwrite: bool,
) -> tuple[Any, Staging, dd.DataFrame]:
    """A Delayed that writes ``df``'s files and manifest to a new staging folder for
    ``path`` and returns the manifest, that folder, and the dask frame written (arguments
    checked now, as in to_parquet, whose defaults are :data:`_WRITE_DEFAULTS`)."""
    check_layout(layout)
    if isinstance(df, pd.DataFrame):
        df = from_pandas(df, sort=False)  # the rows in the frame's order, not the index's
    if isinstance(df, (pd.Series, dd.Series)):
        raise TypeError(
            f"to_parquet writes a DataFrame, got a {'dask ' * isinstance(df, dd.Series)}Series "
            f"({df.name!r}): write series.to_frame(), a frame of its one column"
        )
    if not isinstance(df, dd.DataFrame):
        raise TypeError(
            f"to_parquet expects a dask or pandas DataFrame, got {type(df).__name__}; "
            "wrap an eager frame with dask.dataframe.from_pandas(df, npartitions=1)"
        )
    meta = df._meta
    named = vectors is not None
    if vectors is None:
        vectors = list_columns(meta)
    missing = [c for c in vectors if c not in meta.columns]
    if missing:
        raise errors.column_not_found(missing, meta.columns, "vector columns")
    _check_names(meta)
    if write_index is None and df.npartitions > 1:
        # RangeIndex metadata describes one file: readers of a folder take the first
        # file's (pandas, pyarrow datasets: the name lost; dask: a KeyError) or none.  As a
        # column in every file, every reader restores the index, repeated labels included.
        write_index = True
    # None from here on: one partition, its index stored unless it is the default one.
    fs, root = filesystem(path)
    staging = new_staging(fs, root)  # first: it puts back what a killed overwrite moved
    if exists(fs, root):
        if not overwrite:
            raise FileExistsError(f"{str(path)!r} exists; pass overwrite=True to replace it")
        check_replaceable(os.fspath(path))
    files = FileWriter(fs, staging, layout, list(vectors), compression, row_group_rows)
    # The staging folder is made when computed (compute=False makes nothing until then),
    # once, before any partition writes: not by each partition as it begins, since dask
    # reports a failed task while others still run, and one that began after the folder
    # was discarded would make it again, left behind (files.check_open: what a late task
    # does instead).
    opened = dask.delayed(open_staging, pure=False)(fs, staging)
    written = df.map_partitions(
        _write_partition,
        files,
        write_index,
        opened,
        # Digits for every partition's number: names that sort as text sort as numbers.
        digits=max(5, len(str(df.npartitions - 1))),
        named=named,
        partition_info=True,
        meta=WRITTEN_META,
        enforce_metadata=False,
        token="cosim-to-parquet",
    )
    # Files of null vectors get the D of the others, once every file is written.
    sized = dask.delayed(sized_files, pure=False)(written, files)
    manifest = dask.delayed(write_manifest, pure=False)(sized, fs, staging, layout)
    return manifest, Staging(fs, staging, root, overwrite), df


def _check_names(meta: Any) -> None:
    """ValueError for a column or index not named by a string (``0``): Parquet's names
    are strings, so the folder would not read back as written, or not at all."""
    for c in meta.columns:
        if not isinstance(c, str):
            raise ValueError(
                f"the name of column {c!r} is not a string ({type(c).__name__}): Parquet names "
                "columns by strings; rename the columns first, e.g. df.rename(columns=str)"
            )
    for name in meta.index.names:
        if name is not None and not isinstance(name, str):
            raise ValueError(
                f"the index's name {name!r} is not a string ({type(name).__name__}): "
                "Parquet names columns by strings; rename it first, e.g. "
                f"df.rename_axis({str(name)!r})"
            )


def compute_with_progress(*collections: Any) -> tuple[Any, ...]:
    """``dask.compute(*collections)`` under the progress bar of the scheduler that will
    run it: distributed's with an active Client, else dask's local ProgressBar."""
    from distributed import Client
    from distributed import progress as progress_bar

    # dask resolves an active distributed client to its bound ``get``.
    client = getattr(dask.base.get_scheduler(), "__self__", None)
    if isinstance(client, Client):
        futures = client.compute(list(collections))
        progress_bar(futures)
        return tuple(client.gather(futures))
    from dask.diagnostics import ProgressBar

    with ProgressBar():
        return dask.compute(*collections)


def _write_partition(
    df: Any,
    files: FileWriter,
    write_index: bool | None,
    opened: None = None,
    partition_info: dict[str, Any] | None = None,
    digits: int = 5,
    named: bool = True,
) -> pd.DataFrame:
    """Write partition ``df`` into ``files.staging``, which must exist (``opened``: the
    task that made it), and is still open after the write (:func:`.files.check_open`);
    its number zero-padded to ``digits``.  Where the caller ``named`` no vectors, an
    object column of arrays or tensors (vectors, which the frame's meta could not tell)
    raises, naming it and ``vectors=``: pyarrow failed on tensors, and wrote arrays as
    lists the manifest did not know.  Python lists (tags, token ids) are written as
    lists, as an eager frame's are."""
    number = partition_info["number"] if partition_info else 0
    staging, layout, vectors = files.staging, files.layout, files.vectors
    if not named and isinstance(df, pd.DataFrame):
        unnamed = [c for c in _array_columns(df) if c not in vectors]
        if unnamed:
            raise errors.unnamed_vector_columns(unnamed, [*vectors, *unnamed])
    # Each write's own names (the staging folder's random tail): a reader that listed the
    # files of the folder an overwrite replaced finds them gone, rather than reading the
    # new folder's files of the same name mixed with the old ones it had read.
    name = f"part.{number:0{digits}d}.{staging.rsplit('-', 1)[-1]}.parquet"
    index_stored = write_index is not False  # a default index left out is its positions
    if write_index is None:
        write_index = not _default_index(df.index)
    if _writes_on_gpu(df, files.fs, files.compression):
        schema = _file_schema(df, layout, vectors, write_index)
        if schema is not None and cudf_parquet.writer_takes(schema):
            stored = cudf_parquet.write_file(
                df,
                f"{staging}/{name}",
                schema,
                vectors=vectors,
                layout=layout,
                codec=str(files.compression or "none"),
                row_group_rows=files.row_group_rows,
            )
            check_open(files.fs, staging, name)
            return written_row(name, df, stored, index_stored=index_stored)
    table = frame_to_table(df, layout=layout, vectors=vectors, preserve_index=write_index)
    files.write(table, name)
    check_open(files.fs, staging, name)
    # An object column's type is what pyarrow makes of this partition's values (Arrow
    # null where it holds none, decimal128(2, 1) of 1.5, int64 of ints): made one across
    # the files once all are written (vector_dims.sized_files).
    objects = {str(c) for c in df.columns if df[c].dtype == object} - set(vectors)
    inferred = {
        f.name: str(f.type)
        for f in table.schema
        if f.name in objects or (pa.types.is_null(f.type) and f.name not in vectors)
    }
    stored = stored_vectors(table.schema, vectors)
    return written_row(name, df, stored, inferred, index_stored)


def _array_columns(df: pd.DataFrame) -> list[Any]:
    """The object columns of ``df`` whose first non-null cell is a numpy array or a torch
    tensor of numbers (:func:`~dask_cosim.io.convert.vector_columns`, lists aside)."""
    import torch

    found = []
    for column in vector_columns(df):
        cells = df[column].dropna()
        if len(cells) and isinstance(cells.iloc[0], (np.ndarray, torch.Tensor)):
            found.append(column)
    return found


def _writes_on_gpu(df: Any, fs: pafs.FileSystem, compression: Any) -> bool:
    """cudf partitions bound for local files, with one codec for the non-vector columns,
    are written by cudf's GPU writer where it takes their schema
    (``cudf_parquet.writer_takes``); the rest through pyarrow (one copy to the host)."""
    return (
        backends.is_device_frame(df)
        and isinstance(fs, pafs.LocalFileSystem)
        and not isinstance(compression, dict)
        and getattr(df.index, "nlevels", 1) == 1
    )


def _file_schema(
    df: Any, layout: str, vectors: list[str], write_index: bool | None
) -> pa.Schema | None:
    """The Arrow schema :func:`frame_to_table` would give ``df``, built without reading
    its data: the other columns and the index from an empty slice (through dask's
    dispatch), each vector column's field from its D and dtype; None where a vector
    column's rows tell no D (none, or only nulls: pyarrow writes those, see
    :mod:`.vector_dims`)."""
    others = [c for c in df.columns if c not in vectors]
    empty = to_pyarrow_table_dispatch(
        _index_named_as_pyarrow(df[others].iloc[:0], write_index, vectors),
        preserve_index=write_index,
    )
    schema = _with_range_index(empty.schema, df.index)
    schema = schema.with_metadata(_pandas_metadata(schema.metadata, df.index.name))
    positions = {c: i for i, c in enumerate(df.columns)}
    for column in sorted(vectors, key=positions.__getitem__):
        spec = backends.vector_spec(df[column].iloc[:0], str(column))
        dim = spec.dim or _first_length(df[column])
        if not dim:
            return None
        value_type = pa.from_numpy_dtype(spec.dtype or np.dtype(np.float32))
        field = vector_field(str(column), value_type, dim, layout)
        schema = schema.insert(positions[column], field)
    return schema


_GENERATED_INDEX = re.compile(r"__index_level_\d+__")


def _pandas_metadata(metadata: dict[bytes, bytes] | None, name: Any) -> Any:
    """The pandas metadata pyarrow wrote (or none), as every reader can read it back:

    - an index stored as "__index_level_0__" (:func:`_index_named_as_pyarrow`) has
      ``"name"`` the index's own, ``null`` when unnamed (cudf's reader keeps a non-null
      name as is); a column so named keeps its name;
    - an Arrow-backed column whose dtype pandas records as text it cannot parse back
      (:func:`~dask_cosim.backends.arrow_dtype_parses`: nested and parametrised types)
      is recorded as ``object``: with that text, ``pd.read_parquet`` and
      ``dd.read_parquet`` failed on the whole file.  They now give the column's values as
      pyarrow converts them (Python dicts and lists, bytes, categoricals);
      :func:`~dask_cosim.io.read.read_parquet` keeps nested ones Arrow
      (:func:`~dask_cosim.backends.arrow_vector_types`).
    """
    if not metadata or b"pandas" not in metadata:
        return metadata
    pandas_meta = json.loads(metadata[b"pandas"])
    index = {c for c in pandas_meta.get("index_columns", []) if isinstance(c, str)}
    for entry in pandas_meta.get("columns", []):
        if entry.get("field_name") in index and _GENERATED_INDEX.fullmatch(str(entry["name"])):
            entry["name"] = name
        if not backends.arrow_dtype_parses(entry.get("numpy_type")):
            entry["numpy_type"] = "object"
    return {**metadata, b"pandas": json.dumps(pandas_meta).encode()}


def _index_named_as_pyarrow(df: Any, preserve_index: bool | None, vectors: Sequence[Any]) -> Any:
    """``df`` (the frame's columns but its ``vectors``) with an index that will be stored
    as a column named as pyarrow names it where it is unnamed or named like a column,
    "__index_level_0__": cudf would call an unnamed one "index" (readers would give it
    back so named), and pyarrow, which does not see the vector columns, would give an
    index named like one of them that name too, two fields of one name."""
    index = df.index
    stored_as_column = preserve_index is True or (
        preserve_index is None and not type(index).__name__ == "RangeIndex"
    )
    if not stored_as_column or getattr(index, "nlevels", 1) != 1:
        return df
    if index.name is not None and index.name not in vectors:
        return df
    df = df.copy(deep=False)
    df.index = index.rename("__index_level_0__")
    return df


def _default_index(index: Any) -> bool:
    """Whether ``index`` is 0, 1, ..., n - 1, unnamed, as a RangeIndex (pandas or cudf)."""
    return (
        type(index).__name__ == "RangeIndex"
        and index.name is None
        and index.start == 0
        and index.step == 1
    )


def _first_length(series: Any) -> int:
    """D of a variable-length list column: the length of its first non-null row (0 if
    none).  One scalar from the device."""
    lengths = series.list.len().dropna()
    return int(lengths.iloc[0]) if len(lengths) else 0


def _with_range_index(schema: pa.Schema, index: Any) -> pa.Schema:
    """The pandas metadata of an empty slice describes an empty RangeIndex: put back the
    whole frame's start, stop and step."""
    pandas_meta = schema.pandas_metadata
    if not pandas_meta:
        return schema
    for entry in pandas_meta.get("index_columns", []):
        if isinstance(entry, dict) and entry.get("kind") == "range":
            entry.update(start=int(index.start), stop=int(index.stop), step=int(index.step))
    return schema.with_metadata({**schema.metadata, b"pandas": json.dumps(pandas_meta).encode()})


def _commit(manifest: dict[str, Any], staging: Staging, held: Any = ()) -> dict[str, Any]:
    """The last task of ``to_parquet(..., compute=False)``: the staging folder renamed
    (``held``: what :func:`held_where_it_is` gave, nothing); where the rename fails (the
    folder appeared meanwhile, or a second compute found the first one's), the staging
    folder deleted."""
    try:
        commit([staging])
    except BaseException:
        discard([staging])
        raise
    return manifest
