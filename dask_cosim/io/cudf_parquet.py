"""Parquet on the GPU: cudf's reader and writer, for the cudf backend of :mod:`dask_cosim.io`.

:func:`read_files` decodes local files on the device, turning our binary layout into cudf
list columns over the decoded bytes; :func:`write_file` writes one cudf partition with
cudf's writer under the Arrow schema pyarrow would store, so either reader reads it back.
cudf, cupy and pylibcudf are imported inside the functions: this module is imported with
:mod:`dask_cosim.io`, on machines without them.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dask_cosim import backends

__all__ = [
    "MAX_BINARY_WIDTH",
    "footer_ranges",
    "manifest_ranges",
    "range_positions",
    "read_files",
    "write_file",
    "writer_takes",
]


# Each file's RangeIndex, for files read together: (index name, [(start, rows, step)]).
Ranges = tuple[Any, list[tuple[int, int, int]]]


def read_files(
    files: list[str],
    *,
    row_groups: list[int] | None,
    columns: list[str] | None,
    filters: Any,
    vectors: dict[str, tuple[int, str]],
    ranges: Ranges | None = None,
) -> Any:
    """Parquet files (or some row groups of one) decoded on the GPU by cudf's reader, as
    one frame.

    List columns stay cudf list columns on the device.  ``vectors`` names the columns of
    our binary layout (FIXED_LEN_BYTE_ARRAY, D * itemsize bytes a row) with their
    (D, dtype): cudf reads such a column as bytes (a strings column, or lists of uint8),
    and each becomes a list column of D numbers over those same device bytes, without a
    copy or a trip through the host.  The index is restored from the pandas metadata,
    as cudf does; for several files stored with a RangeIndex each (cudf numbers their
    rows from 0), their ranges one after another: from ``ranges`` when the caller knows
    them (our manifest: :func:`manifest_ranges`), else from the files' footers.
    """
    import cudf

    df = cudf.read_parquet(
        files[0] if len(files) == 1 else files,
        columns=columns,
        row_groups=None if row_groups is None else [row_groups],
        filters=filters,
    )
    if len(files) > 1:
        ranges = ranges if ranges is not None else footer_ranges(files)
        if ranges is not None:
            df.index = _range_index(*ranges)
    wanted = [c for c in df.columns if c in vectors]
    if not wanted:
        return df
    table, metadata = df.to_pylibcudf()
    plc_columns = list(table.columns())
    for i, name in enumerate(df.columns):
        if name in vectors:
            plc_columns[i] = _bytes_to_lists(plc_columns[i], str(name), *vectors[name])
    import pylibcudf as plc

    return cudf.DataFrame.from_pylibcudf(plc.Table(plc_columns), metadata)


def footer_ranges(files: list[str]) -> Ranges | None:
    """Each file's RangeIndex from its footer's pandas metadata and row count, or None
    when a file stores its index otherwise (as columns, or none)."""
    name, ranges = None, []
    for i, file in enumerate(files):
        parquet = pq.ParquetFile(file)
        stored = _stored_range(parquet.schema_arrow)
        if stored is None:
            return None
        if i == 0:
            name = stored.get("name")
        ranges.append((int(stored["start"]), parquet.metadata.num_rows, int(stored["step"])))
    return name, ranges


def manifest_ranges(schema: pa.Schema, manifest: dict[str, Any] | None) -> Ranges | None:
    """Each file's RangeIndex in our folder, from the manifest's row counts and index
    bounds and the first file's schema: what :func:`footer_ranges` would read from the
    footers, known when the graph is built.

    None unless the first file stores a RangeIndex (pandas metadata) and every file's
    bounds are those of a range of its rows with that step (so that a file storing its
    index as a column, or a manifest without bounds or with encoded ones, falls back to
    the footers).
    """
    stored = _stored_range(schema)
    if stored is None or manifest is None or "index_type" in manifest:
        return None  # (index_type: the bounds are timestamps' integers, not labels)
    step = int(stored["step"])
    ranges = []
    for entry in manifest.get("files", []):
        rows, bounds = entry.get("rows"), entry.get("index")
        if not (isinstance(rows, int) and rows > 0 and isinstance(bounds, list)):
            return None
        first, last = bounds
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (first, last)):
            return None
        if last != first + (rows - 1) * step:
            return None
        ranges.append((first, rows, step))
    if not ranges or ranges[0][0] != int(stored["start"]):
        return None
    return stored.get("name"), ranges


def _stored_range(schema: pa.Schema) -> dict[str, Any] | None:
    """The pandas metadata's RangeIndex entry of a schema, or None."""
    index_columns = (schema.pandas_metadata or {}).get("index_columns") or [None]
    first = index_columns[0]
    if len(index_columns) == 1 and isinstance(first, dict) and first.get("kind") == "range":
        return first
    return None


def range_positions(ranges: list[tuple[int, int, int]]) -> tuple[int, int, int] | None:
    """(start, stop, step) of one RangeIndex when the files' ranges follow one another
    (one frame written in order), else None (their values are concatenated)."""
    start, _, step = ranges[0]
    at = start
    for first, rows, this_step in ranges:
        if this_step != step or first != at:
            return None
        at += rows * step
    return start, at, step


def _range_index(name: Any, ranges: list[tuple[int, int, int]]) -> Any:
    """The index of files read together, each stored with a RangeIndex."""
    import cudf
    import cupy

    whole = range_positions(ranges)
    if whole is not None:
        return cudf.RangeIndex(*whole, name=name)
    parts = [cupy.arange(s, s + n * step, step) for s, n, step in ranges]
    return cudf.Index(cupy.concatenate(parts), name=name)


def _bytes_to_lists(column: Any, name: str, dim: int, dtype: str) -> Any:
    """A pylibcudf column of fixed-width byte strings -> a LIST column of ``dim`` numbers
    of ``dtype`` per row, viewing the same device memory (only the N+1 offsets are new)."""
    import cupy
    import pylibcudf as plc

    from dask_cosim.backends.cudf import device_bytes

    if column.offset():  # a slice: compact it first, so offsets and mask start at row 0
        column = column.copy()
    kind = column.type().id()
    if kind == plc.TypeId.STRING:
        data, offsets = device_bytes(column.data()), column.child(0)
    elif kind == plc.TypeId.LIST and column.child(1).type().id() in (
        plc.TypeId.UINT8,
        plc.TypeId.INT8,
    ):
        bytes_column = column.child(1)
        offsets = column.child(0)
        data = device_bytes(bytes_column.data())[bytes_column.offset() :]
    else:
        raise TypeError(
            f"column {name!r}: cudf read our binary layout as {kind!r}, not as bytes; "
            "read the folder with dataframe.backend='pandas' and move it to the GPU, or "
            "write it with layout='list'"
        )
    itemsize = np.dtype(dtype).itemsize
    n = column.size()
    if n == 0:
        return plc.Column.from_array(cupy.zeros((0, dim), dtype=dtype))
    valid = n - column.null_count()
    if valid * dim >= 2**31:
        raise ValueError(
            f"column {name!r}: {valid:,} rows of {dim} values exceed what one cudf list "
            "column holds (2**31 - 1 values); write smaller files (to_parquet writes one "
            "per partition) or pass row groups"
        )
    flat = data[: valid * dim * itemsize].view(np.dtype(dtype))
    byte_offsets = device_bytes(offsets.data()).view(
        np.int64 if offsets.type().id() == plc.TypeId.INT64 else np.int32
    )[offsets.offset() : offsets.offset() + n + 1]
    # Unsliced columns start at byte 0: reading offsets[0] would be a device-to-host trip.
    return _plc_list_column(flat, byte_offsets // itemsize, column)


def _plc_list_column(flat: Any, element_offsets: Any, like: Any) -> Any:
    """A pylibcudf LIST column over ``flat`` (cupy, the valid rows' values in order), with
    ``element_offsets`` (cupy, N+1) and the null mask of ``like`` (a column of N rows)."""
    import pylibcudf as plc

    return plc.Column(
        plc.DataType(plc.TypeId.LIST),
        like.size(),
        None,
        like.null_mask(),
        like.null_count(),
        0,
        [plc.Column.from_array(element_offsets.astype(np.int32)), plc.Column.from_array(flat)],
    )


# libcudf 26.10 keeps a FIXED_LEN_BYTE_ARRAY's width in 8 bits when it writes Parquet
# (cudf::io::column_in_metadata::get_type_length returns uint8_t): a vector of 1,024 bytes
# was written with width 0 and no data.  Wider binary vectors are written through pyarrow.
MAX_BINARY_WIDTH = 255


def writer_takes(schema: pa.Schema) -> bool:
    """Whether :func:`write_file` writes a file of ``schema`` correctly: every
    binary vector at most MAX_BINARY_WIDTH bytes wide."""
    return all(
        field.type.byte_width <= MAX_BINARY_WIDTH
        for field in schema
        if pa.types.is_fixed_size_binary(field.type)
    )


def write_file(
    df: Any,
    path: str,
    schema: pa.Schema,
    *,
    vectors: list[str],
    layout: str,
    codec: str,
    row_group_rows: int | None,
) -> dict[str, tuple[int, str]]:
    """Write one cudf frame to one local Parquet file with cudf's GPU writer.

    ``schema`` is the Arrow schema pyarrow would give the file (vector fields in
    ``layout``, the index columns last, pandas metadata); it is stored as the file's
    ``ARROW:schema``, so the file reads back exactly as one written through pyarrow.
    Vector columns are written from the device memory they are in: "list" as a Parquet
    LIST, "binary" as FIXED_LEN_BYTE_ARRAY of D * itemsize bytes; both uncompressed,
    plain-encoded.  ``codec`` (snappy, zstd, ..., or none) compresses the other columns.
    Returns {vector column: (D, dtype name)}.
    """
    import pylibcudf as plc

    columns, stored = [], {}
    for field in schema:
        name = field.name
        if name in vectors:
            column, dim, dtype = _cudf_vector_column(df[name], name, layout)
            stored[name] = (dim, dtype)
        elif name in df.columns:
            column = df[name].to_pylibcudf()[0]
        else:  # the index, stored as a column (pyarrow puts it last)
            column = df.index.to_pylibcudf()[0]
        columns.append(column)
    table = plc.Table(columns)
    metadata = plc.io.types.TableInputMetadata(table)
    encoding = plc.io.types.ColumnEncoding.PLAIN
    for field, column_meta in zip(schema, metadata.column_metadata):
        column_meta.set_name(field.name)
        column_meta.set_nullability(True)  # as pyarrow writes them: optional
        if field.name not in stored:
            continue
        dim, dtype = stored[field.name]
        column_meta.set_skip_compression(True)
        if layout == "binary":
            column_meta.set_output_as_binary(True)
            column_meta.set_type_length(dim * np.dtype(dtype).itemsize)
            column_meta.set_encoding(encoding)
        else:
            element = column_meta.child(1)
            element.set_name("element").set_nullability(True)
            element.set_skip_compression(True)
            element.set_encoding(encoding)
    # As pyarrow stores it: the whole schema, pandas metadata included (readers take the
    # schema's metadata from here).
    arrow_schema = base64.b64encode(schema.serialize().to_pybytes()).decode()
    key_value = {"ARROW:schema": arrow_schema}
    if schema.metadata and b"pandas" in schema.metadata:
        key_value["pandas"] = schema.metadata[b"pandas"].decode()
    try:
        compression = plc.io.types.CompressionType[codec.upper()]
    except KeyError:
        raise ValueError(
            f"compression={codec!r} is not a codec cudf's Parquet writer knows; use one of "
            f"{[c.name.lower() for c in plc.io.types.CompressionType]}"
        ) from None
    options = (
        plc.io.parquet.ParquetWriterOptions.builder(plc.io.SinkInfo([path]), table)
        .metadata(metadata)
        .key_value_metadata([key_value])
        .compression(compression)
        .stats_level(plc.io.types.StatisticsFreq.STATISTICS_ROWGROUP)
        .dictionary_policy(plc.io.types.DictionaryPolicy.ADAPTIVE)
        .write_arrow_schema(False)  # ours, above: cudf's has no fixed-size types
        .build()
    )
    if row_group_rows is not None:
        options.set_row_group_size_rows(row_group_rows)
    plc.io.parquet.write_parquet(options)
    return stored


def _cudf_vector_column(series: Any, name: str, layout: str) -> tuple[Any, int, str]:
    """A cudf list column as ``pairwise`` reads it -> (pylibcudf column in ``layout``, D,
    dtype name): a LIST of D numbers, or a LIST of D * itemsize bytes, over the device
    memory of the values (only offsets are new; null rows are compacted away)."""
    import cupy

    vectors = backends.to_vectors(series, name)
    dense = vectors.blocks[0].contiguous()
    dim = vectors.dim
    dtype = np.dtype(str(dense.dtype).removeprefix("torch."))
    values = cupy.from_dlpack(dense)
    like = series.to_pylibcudf()[0]
    if like.offset():
        like = like.copy()
    n = len(series)
    if vectors.null is not None:
        valid = ~cupy.from_dlpack(vectors.null)
        values = values[valid]  # one device copy, only where there are null rows
        rows = cupy.concatenate([cupy.zeros(1, np.int64), cupy.cumsum(valid, dtype=np.int64)])
    else:
        rows = cupy.arange(n + 1, dtype=np.int64)
    flat = values.reshape(-1)
    if layout == "list":
        if flat.size >= 2**31:
            raise ValueError(
                f"column {name!r}: {flat.size:,} values exceed what one cudf list column "
                "holds (2**31 - 1); write more, smaller partitions"
            )
        return _plc_list_column(flat, rows * dim, like), dim, dtype.name
    # Bytes as libcudf's "binary" (lists of uint8): with a type length, its writer stores
    # them as FIXED_LEN_BYTE_ARRAY (a strings column would become BYTE_ARRAY).
    if flat.nbytes >= 2**31:
        raise ValueError(
            f"column {name!r}: {flat.nbytes:,} bytes of vectors in one partition exceed what "
            "cudf's writer takes as one binary column (2 GiB); write more, smaller "
            "partitions (repartition) or layout='list'"
        )
    width = dim * dtype.itemsize
    return _plc_list_column(flat.view(np.uint8), rows * width, like), dim, dtype.name
