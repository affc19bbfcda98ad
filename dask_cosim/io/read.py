"""Reading Parquet into dask frames whose embedding columns stay vectors (what a read would
give is described by :mod:`.describe`)."""

from __future__ import annotations

import re
from typing import Any, overload

import dask
import dask.config
import dask.dataframe as dd
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from dask_cosim import backends, errors, options
from dask_cosim.backends import arrow_vector_types
from dask_cosim.io import categories, cudf_parquet, hive, positions
from dask_cosim.io.convert import TARGET_PARTITION_BYTES
from dask_cosim.io.divisions import manifest_divisions
from dask_cosim.io.files import naming_non_parquet, parquet_files
from dask_cosim.io.layouts import (
    binary_layout,
    binary_vectors,
    restore_frame_vectors,
    restore_vectors,
)


@overload
def read_parquet(path: Any, columns: str, **kwargs: Any) -> dd.Series: ...
@overload
def read_parquet(path: Any, columns: Any = None, **kwargs: Any) -> dd.DataFrame: ...
def read_parquet(path: Any, columns: Any = None, **kwargs: Any) -> dd.DataFrame | dd.Series:
    """Read Parquet into a dask DataFrame whose embedding columns stay vectors.

    Files are decoded by ``pyarrow.parquet.read_table`` on pyarrow's own filesystem, one
    partition per file (files over 256 MiB are split by row groups), which is faster than
    dask's dataset scanner and fsspec file objects (benchmarks/NOTES.md, "Reading
    Parquet").  pandas backend: list columns come back as Arrow list types
    (``fixed_size_list`` when stored so), not object columns of numpy arrays; with dask's
    ``dataframe.backend`` set to "cudf", cudf list columns.

    A folder written by :func:`to_parquet` (any layout) has its vectors restored without
    a copy, and divisions from its manifest when the index was sorted.

    Files that store no index (plain pyarrow, pandas with ``index=False``, Spark, DuckDB)
    are numbered across the read: row ``i`` (files in the natural order of their paths,
    then rows) is labelled ``i``, as ``pandas.read_parquet`` labels a folder, with known
    divisions, from the footers alone; rows a filter drops keep their numbers out of the
    sequence.  One file whose pandas metadata holds a RangeIndex keeps it.  (dask's own
    reader numbers each file from 0, so labels repeat across partitions.)  An index that
    dask's ``to_parquet`` stored unnamed (as "__null_dask_index__") is named None, as
    dask's reader names it.

    Hive-partitioned folders (``key=value/`` subfolders) are read so too (:mod:`.hive`),
    each key a categorical column after the files' own, as dask's reader gives it; a
    filter on keys leaves out whole folders unread.  With the cudf backend they go to
    dask's reader.

    Parameters
    ----------
    path : str, path-like or list of them
        A file, a folder of files, a local glob (``**`` matches folders at any depth),
        or a URL pyarrow or fsspec knows.  A glob's wildcards match no name starting
        with "_" or "." (``_SUCCESS``, ``_metadata``, a manifest, hidden files), as a
        folder's listing skips them.
    columns : list or str, optional
        Columns to read (the index comes along), by label or by the files' field names
        (pandas stores a column labelled 0 as the field "0": ``[0]`` or ``["0"]``).  One
        name as a string reads that column as a Series, as dask's reader does; a tuple or
        an Index is taken as a list.
        Columns that later steps never use are not read either (dask's column
        projection): ``df[[]].map_partitions(len)`` reads the index alone (``len(df)`` is
        dask's own, which reads every column).
    filters : list or pyarrow expression, optional
        Row filters, as in ``pyarrow.parquet.read_table``; they may compare columns that
        ``columns`` (or dask's projection) leaves out, named as ``columns`` names them.
    **kwargs
        Anything else (and globs in URLs) goes to ``dask.dataframe.read_parquet``, with
        list columns still kept as Arrow lists and our binary layout's vectors restored,
        but with that reader's ways: each file numbered from 0, and its filters' (``!=``
        keeps nulls, which pyarrow's drops).  ``engine="pyarrow"`` (or "auto") is no
        reason to: this reader is pyarrow's.
    """
    if isinstance(columns, str):
        # dask's reader gives a Series for one name as a string; listed, it gives a frame.
        return read_parquet(path, [columns], **kwargs)[columns]
    if columns is not None and not isinstance(columns, list):
        columns = list(columns) if isinstance(columns, (tuple, pd.Index)) else [columns]
    backend = dask.config.get("dataframe.backend", "pandas")
    if kwargs.get("engine", "pyarrow") in ("pyarrow", "auto"):
        kwargs.pop("engine", None)
    if set(kwargs) <= {"filters"}:
        found = parquet_files(path)
        # cudf: hive folders stay with dask's reader (GPU decoding; keys untried on cudf).
        if found is not None and not (found.keys is not None and backend == "cudf"):
            return _read_files(
                *found, columns=columns, filters=kwargs.get("filters"), backend=backend
            )
    if backend == "cudf":
        return dd.read_parquet(path, columns=columns, **kwargs)
    arrow_to_pandas = dict(kwargs.pop("arrow_to_pandas", None) or {})
    arrow_to_pandas.setdefault("types_mapper", arrow_vector_types)
    kwargs["arrow_to_pandas"] = arrow_to_pandas
    return _binary_restored(dd.read_parquet(path, columns=columns, **kwargs), path)


def _binary_restored(ddf: dd.DataFrame, path: Any) -> dd.DataFrame:
    """``ddf`` (dask's read of ``path``) with the columns that the first file stores in
    our binary layout as vectors (dask's reader gives their bytes); as it is where that
    file cannot be found here (a URL that needs dask's storage options)."""
    try:
        found = parquet_files(path)
        schema = None if found is None else _read_schema(found.files[0], found.fs)
    except (OSError, ValueError, IndexError, pa.ArrowException):
        return ddf
    binary = {} if schema is None else binary_vectors(schema)
    binary = {c: stored for c, stored in binary.items() if c in ddf.columns}
    if not binary:
        return ddf
    meta = restore_frame_vectors(ddf._meta.copy(), binary)
    return ddf.map_partitions(restore_frame_vectors, binary, meta=meta)


# Files larger than this are split into partitions of about TARGET_PARTITION_BYTES.
_SPLIT_FILE_BYTES = 2 * TARGET_PARTITION_BYTES


def _read_files(
    fs: pafs.FileSystem,
    files: list[str],
    sizes: list[int],
    manifest: dict[str, Any] | None,
    keys: hive.Keys | None = None,
    version: str = "",
    *,
    columns: list[str] | None,
    filters: Any,
    backend: str,
) -> dd.DataFrame:
    schema = _known_types(_read_schema(files[0], fs), files[1:], fs)
    given_filters = filters
    columns, filters = _field_names(columns), _named_filters(filters)
    dictionaries = keys.dictionaries if keys is not None else {}
    names = list(dict.fromkeys([*schema.names, *dictionaries, *_index_columns(schema)]))
    if columns is not None:
        missing = [c for c in columns if c not in names]
        if missing:
            raise errors.column_not_found(missing, names, "columns", where=files[0])
    key_fields = [
        pa.field(name, pa.dictionary(pa.int32(), d.type)) for name, d in dictionaries.items()
    ]
    _check_filters(filters, given_filters, names, files[0], pa.schema([*schema, *key_fields]))
    # The meta comes from the schema alone: no data is read to build the graph.
    empty = _projected(schema, hive.file_columns(columns, dictionaries)).empty_table()
    empty = _in_order(hive.add_keys(empty, dictionaries, {}, columns), columns)
    meta = categories.as_meta(backends.frame_from_arrow(restore_vectors(empty), backend), schema)
    # The columns as the frame labels them (pandas' metadata may make "0" the label 0).
    labels = None if columns is None else list(meta.columns)
    divisions = manifest_divisions(manifest, schema, meta)
    binary = binary_vectors(schema)
    pieces: list[tuple[Any, ...]] = []
    if backend == "cudf" and filters is None and gpu_reads(fs, filters) and keys is None:
        ranges = cudf_parquet.manifest_ranges(schema, manifest)
        pieces, divisions = _gpu_pieces(fs, files, sizes, divisions, ranges)
    else:
        for file, size in zip(files, sizes):
            pieces += _split(fs, file) if size > _SPLIT_FILE_BYTES else [(file, None)]
    kept = hive.kept(keys, filters) if keys is not None else None  # by folder names
    keep = None if kept is None else {i for i, p in enumerate(pieces) if p[0] in kept}
    numbering = positions.numbering(schema, len(files), manifest)
    if numbering is not None:
        chosen, numbered, divisions = positions.numbered_pieces(fs, pieces, numbering, keep)
        firsts: list[positions.Numbering | None] = list(numbered)
    else:
        chosen = list(range(len(pieces))) if keep is None else sorted(keep) or [0]
        firsts = [None] * len(chosen)
    pieces = [pieces[i] for i in chosen]
    meta = positions.label(meta, numbering)
    return dd.from_map(
        _read_piece,
        pieces,
        firsts,
        [None if keys is None else keys.values[p[0]] for p in pieces],
        fs=fs,
        keys=dictionaries,
        columns=labels,
        filters=filters,
        backend=backend,
        first_file=(files[0], restore_vectors(schema.empty_table()).schema),
        # Read when the graph is built, so that it travels with it to remote workers.
        memory_map=_memory_map(schema),
        in_batches=not binary,
        binary_vectors=binary,
        meta=meta,
        divisions=tuple(divisions) if divisions else None,
        label="cosim-read-parquet",
        enforce_metadata=False,
        # In the graph keys: a file rewritten in place under its name is read anew.
        version=version,
    )


# Files past the first whose footers are read for the type of a column that the first
# file holds no value of (Arrow null), at most.
NULL_TYPE_LOOKAHEAD = 16


def _known_types(schema: pa.Schema, files: list[str], fs: pafs.FileSystem) -> pa.Schema:
    """``schema`` (the read's first file's) with each column of Arrow type null (no value
    in that file: what pyarrow writes for an empty or all-None object column) given the
    type of the first of the next :data:`NULL_TYPE_LOOKAHEAD` ``files`` that has values
    in it, as pyarrow's datasets unify null with the other files' type.  Taken from the
    first file alone, the type made every later file with values there fail its cast."""
    nulls = [f.name for f in schema if pa.types.is_null(f.type)]
    found: dict[str, pa.Field] = {}
    for file in files[:NULL_TYPE_LOOKAHEAD] if nulls else []:
        other = _read_schema(file, fs)
        for name in nulls:
            i = other.get_field_index(name)
            if name not in found and i >= 0 and not pa.types.is_null(other.field(i).type):
                found[name] = other.field(i)
        if len(found) == len(nulls):
            break
    if not found:
        return schema
    return pa.schema([found.get(f.name, f) for f in schema], metadata=schema.metadata)


def _read_schema(file: str, fs: pafs.FileSystem) -> pa.Schema:
    """The file's schema; a file that is not Parquet is named (:func:`naming_non_parquet`)."""
    with naming_non_parquet(file):
        return pq.read_schema(file, filesystem=fs)


def _gpu_pieces(
    fs: pafs.FileSystem,
    files: list[str],
    sizes: list[int],
    divisions: list[Any] | None,
    ranges: cudf_parquet.Ranges | None = None,
) -> tuple[list[tuple[Any, ...]], list[Any] | None]:
    """Partitions for cudf's reader: consecutive whole files together up to about
    ``cosim.read.gpu-partition-bytes`` (a tuple of files), larger files split by row groups
    to about that size; the divisions (one per file, from the manifest) kept at the
    partitions' boundaries.  Where ``ranges`` gives each file's RangeIndex (our manifest),
    a piece of several files carries theirs, so that no worker reads the footers again."""
    limit = options.gpu_partition_bytes()
    if not all(sizes):  # our folders list their files without sizes: ask the filesystem
        sizes = [info.size for info in fs.get_file_info(files)]
    pieces: list[tuple[Any, ...]] = []
    starts: list[int] = []  # the first file of each partition
    group: list[int] = []
    group_bytes = 0

    def close_group() -> None:
        nonlocal group, group_bytes
        if len(group) == 1:
            pieces.append((files[group[0]], None))
        elif group:
            piece: tuple[Any, ...] = (tuple(files[i] for i in group), None)
            if ranges is not None:
                piece += ((ranges[0], [ranges[1][i] for i in group]),)
            pieces.append(piece)
        group, group_bytes = [], 0

    for i, size in enumerate(sizes):
        if size > limit:
            close_group()
            split = _split(fs, files[i], limit)
            starts += [i] * len(split)
            pieces += split
            continue
        if group and group_bytes + size > limit:
            close_group()
        if not group:
            starts.append(i)
        group.append(i)
        group_bytes += size
    close_group()
    if divisions is None or len(divisions) != len(files) + 1 or len(set(starts)) != len(starts):
        return pieces, None
    return pieces, [divisions[i] for i in starts] + [divisions[-1]]


def _split(
    fs: pafs.FileSystem, file: str, target: int | None = None
) -> list[tuple[str, list[int] | None]]:
    """A big file as groups of row groups of about ``target`` bytes each (default
    TARGET_PARTITION_BYTES)."""
    target = target or TARGET_PARTITION_BYTES
    metadata = pq.ParquetFile(file, filesystem=fs).metadata
    groups: list[tuple[str, list[int] | None]] = []
    current: list[int] = []
    size = 0
    for i in range(metadata.num_row_groups):
        current.append(i)
        size += metadata.row_group(i).total_byte_size
        if size >= target:
            groups.append((file, current))
            current, size = [], 0
    if current or not groups:
        groups.append((file, current))
    return groups


def _read_piece(
    piece: tuple[Any, ...],
    first: positions.Numbering | None,
    values: dict[str, Any] | None,
    fs: pafs.FileSystem,
    keys: dict[str, pa.Array],
    columns: list[str] | None,
    filters: Any = None,
    backend: str = "pandas",
    memory_map: bool = False,
    in_batches: bool = True,
    binary_vectors: dict[str, tuple[int, str]] | None = None,
    first_file: tuple[str, pa.Schema] | None = None,
    version: str = "",
) -> Any:
    """One partition: a file (or some of its row groups), vectors restored without a copy.
    (``version``, the files' :func:`~dask_cosim.io.files.stamp`, is only for the keys.)

    ``columns`` is filled in by dask's column projection: a parameter without a default,
    so that dask passes every projection, the empty one (``df[[]]``, the index alone:
    counting rows) included; every column of the frame when it projects none.  pyarrow's
    path and cudf's read the columns ``filters`` compare besides, and drop them once the
    rows are filtered; cudf's reader reads every column for an empty projection, then
    keeps none, so that each partition has the meta's columns.

    With the cudf backend, local files are decoded on the GPU by cudf's reader, several at
    a time where the piece is a tuple of files (``binary_vectors``: the columns of our
    binary layout, as (D, dtype); a third item of the piece, their RangeIndexes from our
    manifest); other files by pyarrow, then copied to the GPU.  ``first``: how the
    piece's first row is labelled, for files that store no index (:mod:`.positions`);
    rows a filter drops take their labels with them.  None: the stored index, unnamed
    where dask stored it unnamed.  ``values``: a hive folder's file's keys, appended as
    columns over the dictionaries ``keys`` (:func:`.hive.add_keys`); None for other files.
    ``first_file``: the read's first file and its schema (vectors restored), whose types
    the meta has (:func:`_as_first`; pyarrow's path).
    """
    file, row_groups, *ranges = piece
    labels, columns = columns, _field_names(columns)
    read = _filtered_columns(columns, filters)
    # Labels that survive a filter need the rows before it: pyarrow's path, then.
    gpu = values is None and (first is None or filters is None)
    if backend == "cudf" and gpu_reads(fs, filters) and gpu:
        df = cudf_parquet.read_files(
            [file] if isinstance(file, str) else list(file),
            row_groups=row_groups,
            # An empty selection is untried with cudf's reader: every column, then none.
            columns=read or None,
            filters=filters,
            vectors=binary_vectors or {},
            ranges=ranges[0] if ranges else None,
        )
        if labels is not None:
            df = df[list(labels)]  # the meta's columns: no filter's, none for df[[]]
        return positions.label(df, first)
    # Local files: memory-mapped or through a 1 MiB buffer (see _memory_map); pyarrow maps
    # only when given no filesystem.
    where: dict[str, Any] = {"filesystem": fs}
    if isinstance(fs, pafs.LocalFileSystem):
        where = {"memory_map": memory_map}
    stored = hive.file_columns(read, keys)
    with naming_non_parquet(file):  # (stray files: as in their footers; a file gone)
        if in_batches:
            table = _read_batches(file, row_groups, stored, where)
        elif row_groups is None:
            # Our binary layout: pyarrow decodes the columns in parallel, and decoding is
            # a copy per column, so the whole-table read is faster than batches and peaks
            # no higher (benchmarks/NOTES.md, section 6).
            table = _read_whole(file, stored, where)
        else:
            table = pq.ParquetFile(file, **where).read_row_groups(
                row_groups, columns=stored, use_pandas_metadata=True
            )
    # The first file too where a column of no value there takes a later file's type.
    if first_file is not None and (
        file != first_file[0] or any(pa.types.is_null(t) for t in table.schema.types)
    ):
        table = _as_first(restore_vectors(table), stored, file, *first_file)
    if values is not None:
        table = hive.add_keys(table, keys, values, read)
    kept = None  # the labels of the rows a filter keeps, where the files store none
    if filters is not None:
        table, kept = positions.filtered(table, pq.filters_to_expression(filters), first)
    if read != columns or values is not None:
        table = _in_order(table, columns)
    df = backends.frame_from_arrow(restore_vectors(table), backend)
    df = categories.as_stored(df, table.schema)
    return positions.label(df, first, kept)


def _as_first(
    table: pa.Table, names: list[str] | None, file: str, first: str, schema: pa.Schema
) -> pa.Table:
    """``table``, read from ``file``, with the types the read's first file (``first``,
    ``schema``) gives its columns ``names`` (None: all of them), which the frame's meta
    has: other types cast (int32 to int64, lists to fixed-size lists of their length),
    a column the file lacks null (as pyarrow's datasets read it), one it adds dropped.

    A column that cannot take the first file's type (vectors of another length, text
    for numbers) is a ValueError naming both files: as it was, the partition's column
    became objects (cosines of vectors of two lengths, numbers beside strings), or, for a
    column lacking, a KeyError at compute."""
    # The stored index columns (as the file's pandas metadata names them) as they are.
    index = [n for n in _index_columns(table.schema) if n in table.column_names]
    wanted = [f for f in schema if (names is None or f.name in names) and f.name not in index]
    wanted += [table.schema.field(n) for n in index]
    if list(table.schema) == wanted:
        return table
    columns, fields = [], []
    for field in wanted:
        if field.name not in table.column_names:
            columns.append(pa.nulls(len(table), field.type))
            fields.append(field)
            continue
        column = table.column(field.name)
        if pa.types.is_null(field.type):  # no file looked at had a value there: as it is
            field = table.schema.field(field.name)
        elif column.type != field.type:
            column = _cast_as_first(column, field, file, first)
        columns.append(column)
        fields.append(field)
    return pa.table(columns, schema=pa.schema(fields, metadata=table.schema.metadata))


def _cast_as_first(column: pa.ChunkedArray, field: pa.Field, file: str, first: str) -> Any:
    """``column`` of ``file`` cast to the type ``field`` of the read's ``first`` file has,
    where the two hold values of one kind (:func:`_same_kind`: numbers as numbers, text
    as text, lists of numbers as lists of numbers) and the cast loses none: an integer
    that does not fit, a fraction cast to an integer or a decimal, a number beyond a
    narrower float's range (pyarrow made it inf, or 0), a time of day cast to a date are
    refused (rounding to a narrower float is not: a float32 first file reads float64
    vectors as float32), as is a change of kind (pyarrow parsed text as numbers, "00123"
    as 123, and made timestamps and booleans numbers).  ValueError naming both files and
    the fix."""
    refused = (
        f"column {field.name!r} of {file!r} holds {column.type}, but the first file of the "
        f"read, {first!r}, has {field.type}, which the frame takes from it"
    )
    fix = (
        "read the files of each schema on their own (a list or a glob), or rewrite this "
        "one with the first file's types"
    )
    if not _same_kind(column.type, field.type):
        raise ValueError(f"{refused}: {fix}")
    try:
        cast = column.cast(field.type)  # safe: integers that do not fit, fractions refused
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
        raise ValueError(f"{refused} ({err}): {fix}") from None
    if _kind(_innermost(field.type)) in ("moment", "time", "duration"):
        if not cast.cast(column.type).equals(column):
            # A timestamp's time of day, cast to a date: dropped without a word.
            raise ValueError(f"{refused}, which changes its values: {fix}")
    before, after = _numbers(column), _numbers(cast)
    if after is not None and before is not None and pa.types.is_floating(after.type):
        if _count(pc.is_inf, after) > _count(pc.is_inf, before):  # pyarrow made them inf
            largest = pc.max(pc.abs(pc.filter(before, pc.is_finite(before)))).as_py()
            raise ValueError(
                f"{refused}; its values exceed that type's range (up to {largest!r} in size): {fix}"
            )
        if _count(_is_zero, after) > _count(_is_zero, before):  # ... and made them 0
            raise ValueError(
                f"{refused}; some of its values are too small for that type, which makes "
                f"them 0: {fix}"
            )
    return cast


def _innermost(t: pa.DataType) -> pa.DataType:
    """The type of the values of ``t``'s lists (nested) and dictionaries; ``t`` itself
    where it is neither."""
    while _is_list(t) or pa.types.is_dictionary(t):
        t = t.value_type
    return t


def _is_zero(values: pa.Array) -> pa.Array:
    return pc.equal(values, 0)


def _count(test: Any, values: pa.Array) -> int:
    """How many of the numbers ``values`` pass ``test`` (is_inf, :func:`_is_zero`)."""
    return int(pc.sum(test(values)).as_py() or 0)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _same_kind(got: pa.DataType, want: pa.DataType) -> bool:
    """Whether values of type ``got`` are what a column of type ``want`` holds, as
    :func:`_cast_as_first` lets pyarrow cast them: numbers and numbers (but floats as
    decimals, which pyarrow rounds), text and bytes, dates and timestamps, lists of such
    (any list layout), dictionaries as their values; no value (Arrow null, at any depth:
    pandas stores a column of empty lists as list<null>) as anything.  Structs, maps and
    other nested types are left to pyarrow's cast."""
    if pa.types.is_null(got) or pa.types.is_null(want):
        return True
    if pa.types.is_dictionary(got) or pa.types.is_dictionary(want):
        return _same_kind(_values_type(got), _values_type(want))
    if _is_list(got) or _is_list(want):
        return _is_list(got) and _is_list(want) and _same_kind(got.value_type, want.value_type)
    if pa.types.is_floating(got) and pa.types.is_decimal(want):
        return False
    return _kind(got) == _kind(want)


def _kind(t: pa.DataType) -> str:
    """What a value of the flat type ``t`` is: "number" (integers, floats, decimals),
    "text" (and bytes), "boolean", "moment" (dates and timestamps), "time", "duration";
    "other" for the rest (structs, maps, unions: left to pyarrow's cast)."""
    for kind, test in (
        ("number", lambda t: pa.types.is_integer(t) or pa.types.is_floating(t)
         or pa.types.is_decimal(t)),
        # (Bytes cast to text are checked as UTF-8 by pyarrow.)
        ("text", lambda t: pa.types.is_string(t) or pa.types.is_large_string(t)
         or pa.types.is_binary(t) or pa.types.is_large_binary(t)
         or pa.types.is_fixed_size_binary(t)),
        ("boolean", pa.types.is_boolean),
        ("moment", lambda t: pa.types.is_timestamp(t) or pa.types.is_date(t)),
        ("time", pa.types.is_time), ("duration", pa.types.is_duration),
    ):  # fmt: skip
        if test(t):
            return kind
    return "other"


def _numbers(column: Any) -> Any:
    """The numbers of ``column``: its values (those of its lists, nested; a dictionary's
    decoded), as one array, decimals as float64; None where it holds something else."""
    values = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    while True:
        if pa.types.is_dictionary(values.type):
            values = values.dictionary_decode()
        elif _is_list(values.type):
            values = values.flatten()
        else:
            break
    if pa.types.is_decimal(values.type):
        return values.cast(pa.float64())
    if pa.types.is_integer(values.type) or pa.types.is_floating(values.type):
        return values
    return None


def _field_names(columns: list[Any] | None) -> list[str] | None:
    """Column labels as the files name their fields: pandas stores a column labelled
    ``0`` as "0", and its pandas metadata makes the label 0 again when it is read."""
    return None if columns is None else [c if isinstance(c, str) else str(c) for c in columns]


def _named_filters(filters: Any) -> Any:
    """Filters in list form (one conjunction of (column, op, value), or a list of them, as
    pyarrow reads them) as a list of conjunctions naming columns as the files name their
    fields (:func:`_field_names`: the label 0 as "0", as ``columns`` may name it); a
    pyarrow expression as it is."""
    if not isinstance(filters, (list, tuple)) or not filters:
        return filters
    # pyarrow tells the forms apart by a column name first; a label need not be a str.
    first = filters[0]
    nested = isinstance(first, (list, tuple)) and (not first or isinstance(first[0], (list, tuple)))
    conjunctions = filters if nested else [filters]
    return [
        [(c if isinstance(c, str) else str(c), *rest) for c, *rest in conjunction]
        for conjunction in conjunctions
    ]


def _check_filters(
    filters: Any, given: Any, names: list[str], where: str, schema: pa.Schema
) -> None:
    """Filters (:func:`_named_filters` of ``given``, the caller's) checked when the graph
    is built, as pyarrow and dask check those in list form: ValueError for a malformed
    one or an operator pyarrow has not ("is"), KeyError for a column ``names`` (of the
    first file ``where``) lacks; they failed only inside ``compute``.  A value that
    cannot be compared with its column's type in ``schema`` (the first file's, and the
    hive keys': "1" with an int64 column, a date string with a timestamp) is a TypeError
    naming the column, its type and the value to give; pyarrow raised "Function 'equal'
    has no kernel matching input types" inside ``compute`` (on a key: when the graph was
    built).  An expression is tried likewise, as a whole."""
    if filters is None:
        return
    # One row of nulls, which each comparison is tried on (see _check_compares).
    row = pa.table({f.name: pa.nulls(1, f.type) for f in schema})
    if not isinstance(filters, list):
        _check_compares(row, filters, f"filters={given!r}", where=where)
        return
    try:
        pq.filters_to_expression(filters)
    except (ValueError, TypeError, IndexError) as error:
        raise ValueError(
            f"filters={given!r}: {error} (filters are as pyarrow.parquet.read_table takes "
            "them: [(column, op, value), ...], or a list of such lists for OR)"
        ) from None
    compared = [term[0] for conjunction in filters for term in conjunction]
    missing = [c for c in dict.fromkeys(compared) if c not in names]
    if missing:
        raise errors.column_not_found(missing, names, "filters", where=where)
    for term in (term for conjunction in filters for term in conjunction):
        _check_compares(row, pq.filters_to_expression([term]), f"filters={given!r}", term)


def _check_compares(
    row: pa.Table,
    expression: Any,
    what: str,
    term: tuple[Any, ...] | None = None,
    where: str | None = None,
) -> None:
    """Raise TypeError where pyarrow cannot evaluate ``expression`` (one ``term`` of
    filters in list form, or a whole expression) on ``row``, one row of nulls of the
    read's columns (on no rows, pyarrow let a naive timestamp pass for a column with a
    time zone, which failed inside ``compute``).  An expression naming no column (of the
    file ``where``) is a KeyError, as filters in list form are."""
    schema = row.schema
    try:
        row.filter(expression)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as error:
        missing = re.match(r"No match for FieldRef\.Name\((.*?)\) in ", str(error))
        if term is None and missing:
            raise errors.column_not_found(
                [missing.group(1)], schema.names, "filters", where=where
            ) from None
        if term is None:
            types = ", ".join(f"{f.name}: {_values_type(f.type)}" for f in schema)
            raise TypeError(
                f"{what}: pyarrow cannot evaluate it on the columns ({types}): "
                + str(error).splitlines()[0]
            ) from None
        name, _, value = term
        kind = _values_type(schema.field(name).type)
        raise TypeError(
            f"{what}: column {name!r} holds {kind}, which pyarrow cannot compare with "
            f"{value!r} ({type(value).__name__}): {error}; give {_value_like(kind, value)}"
        ) from None


def _values_type(kind: pa.DataType) -> pa.DataType:
    """The type of a column's values: a categorical's (dictionary's) categories'."""
    return kind.value_type if pa.types.is_dictionary(kind) else kind


def _value_like(kind: pa.DataType, value: Any) -> str:
    """How to write a filter's ``value`` for a column of type ``kind`` (a hint)."""
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return f"text, e.g. {str(value)!r}" if not isinstance(value, (list, set)) else "text"
    if pa.types.is_timestamp(kind) and kind.tz is not None:
        return (
            f"a pandas.Timestamp with a time zone, e.g. pd.Timestamp('2024-01-31', tz={kind.tz!r})"
        )
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        return "a pandas.Timestamp or datetime, e.g. pd.Timestamp('2024-01-31')"
    if pa.types.is_decimal(kind):
        return "a float or decimal.Decimal, e.g. 1.0"
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return "a number, e.g. 1 rather than '1'"
    return f"a value of type {kind}"


def _filtered_columns(columns: list[str] | None, filters: Any) -> list[str] | None:
    """The columns to read for ``columns`` and ``filters`` (:func:`_named_filters`): with
    those that filters in list form compare added; all (None) for a pyarrow expression,
    which names none."""
    if columns is None or filters is None:
        return columns
    if not isinstance(filters, list):
        return None
    compared = [term[0] for conjunction in filters for term in conjunction]
    return list(dict.fromkeys([*columns, *compared]))


def gpu_reads(fs: pafs.FileSystem, filters: Any) -> bool:
    """Whether a cudf-backed read decodes on the GPU: local files, with no filter or
    filters in the list-of-tuples form cudf takes (a pyarrow expression goes through
    pyarrow).  Remote files go through pyarrow's filesystem, then one copy to the GPU."""
    return isinstance(fs, pafs.LocalFileSystem) and (filters is None or isinstance(filters, list))


def _memory_map(schema: pa.Schema) -> bool:
    """Config ``cosim.read.memory-map``: "auto" maps local files of the binary layout only.

    Mapped pages count in a worker's RSS (what dask pauses on).  For the binary layout
    decoding is a copy from the page cache and mapping pays; list decoding costs the same
    either way, so there mapping only adds memory (measured in benchmarks/NOTES.md,
    section 6).
    """
    choice = options.memory_map()
    if choice == "auto":
        return binary_layout(schema)
    return bool(choice)


_BATCH_BYTES = 16 * 2**20


_READ_BUFFER = 2**20


def _read_whole(file: str, columns: list[str] | None, where: dict[str, Any]) -> pa.Table:
    """The file's ``columns`` by ``pq.read_table``; those it lacks left out (as
    :func:`_read_batches` leaves them, for :func:`_as_first` to fill with nulls), where
    read_table refused the read ("No match for FieldRef": a later folder's file without
    a column of the first's)."""
    try:
        return pq.read_table(file, columns=columns, use_pandas_metadata=True, **where)
    except pa.ArrowInvalid as error:
        if columns is None or "No match for FieldRef" not in str(error):
            raise
    held = pq.ParquetFile(file, **where).schema_arrow.names
    present = [c for c in columns if c in held]
    return pq.read_table(file, columns=present, use_pandas_metadata=True, **where)


def _read_batches(
    file: str, row_groups: list[int] | None, columns: list[str] | None, where: dict[str, Any]
) -> pa.Table:
    """Decoded in batches of about _BATCH_BYTES, through a _READ_BUFFER.

    pq.read_table decodes a list column into one buffer that grows by doubling, so a
    list-layout partition peaks at about twice its size in Arrow memory; batches also
    decode faster (benchmarks/NOTES.md, section 6).  Batches are
    allocated once each and become chunks, which the backends turn into one tensor block
    each, without concatenating.
    """
    parquet = pq.ParquetFile(file, buffer_size=_READ_BUFFER, pre_buffer=False, **where)
    batches = list(
        parquet.iter_batches(
            batch_size=_batch_rows(parquet.metadata),
            row_groups=row_groups,
            columns=columns,
            use_pandas_metadata=True,
        )
    )
    if batches:
        return pa.Table.from_batches(batches)
    return _projected(parquet.schema_arrow, columns).empty_table()


def _batch_rows(metadata: pq.FileMetaData) -> int:
    """Rows per decoded batch: about _BATCH_BYTES, judged from the file's row groups."""
    rows = metadata.num_rows
    size = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
    return max(1024, min(1 << 20, _BATCH_BYTES * rows // max(size, 1)))


def _projected(schema: pa.Schema, columns: list[str] | None) -> pa.Schema:
    """``columns`` and the pandas index columns, as pyarrow's readers select them."""
    if columns is None:
        return schema
    names = list(columns) + [c for c in _index_columns(schema) if c not in columns]
    return pa.schema([schema.field(n) for n in names], metadata=schema.metadata)


def _in_order(table: pa.Table, columns: list[str] | None) -> pa.Table:
    """``table``'s ``columns`` (None: all) in that order, then its index columns."""
    if columns is None:
        return table
    kept = [*columns, *_index_columns(table.schema)]
    return table.select([c for c in dict.fromkeys(kept) if c in table.column_names])


def _index_columns(schema: pa.Schema) -> list[str]:
    pandas_meta = schema.pandas_metadata or {}
    return [c for c in pandas_meta.get("index_columns", []) if isinstance(c, str)]
