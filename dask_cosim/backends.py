"""Columns <-> tensors, per dataframe library: the only module that knows pandas from cudf.

Dispatchers keyed on the Series (or DataFrame) type:

- ``vector_spec(meta_series, column)``: what a (possibly empty) column holds, from its dtype
  alone, or a ``TypeError`` saying what is wrong and how to fix it;
- ``to_vectors(series, column)``: the column's rows as (N, D) tensors, zero-copy where the
  layout allows;
- ``make_result(like, values, null, name)``: a Series of the library of ``like``;

and ``frame_from_arrow(table, backend)``, which picks the library by name ("pandas" or
"cudf", dask's ``dataframe.backend``) because a table read from a file has no library yet
(and cudf has no fixed-size list type to receive it).  A partition goes to Arrow through
dask's own ``to_pyarrow_table_dispatch``.

pandas is registered here; cudf lazily (``register_lazy("cudf")``) so cudf is imported only
when the user already has cudf objects.
"""

from __future__ import annotations

import difflib
import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import torch
from dask.utils import Dispatch

__all__ = [
    "ACCEPTED",
    "VectorSpec",
    "Vectors",
    "arrow_vector_types",
    "column_not_found",
    "cudf_read_parquet",
    "cudf_write_parquet",
    "cudf_writer_takes",
    "did_you_mean",
    "frame_from_arrow",
    "make_result",
    "stack_object_column",
    "to_vectors",
    "vector_spec",
]

ACCEPTED = (
    "Arrow fixed_size_list or list of floats (pd.ArrowDtype(pa.list_(pa.float32(), D))), "
    "an object column holding one numpy array or torch tensor per row, "
    "or a cudf list column"
)


@dataclass(frozen=True)
class VectorSpec:
    """What the metadata says about an embedding column.

    ``dim`` is None when only the data can tell (variable lists, object columns);
    ``dtype`` (numpy) is None for object columns.
    """

    dim: int | None
    dtype: np.dtype | None


@dataclass
class Vectors:
    """A column's rows as tensors.

    ``blocks`` are (rows, dim) tensors covering the rows in order (one per Arrow chunk, so
    no chunk is concatenated); ``null`` marks null rows (numpy bool on the host, or a
    device tensor for cudf) or is None when there are none.
    """

    blocks: list[torch.Tensor]
    null: Any
    dim: int
    length: int


vector_spec = Dispatch("vector_spec")
to_vectors = Dispatch("to_vectors")
make_result = Dispatch("make_result")


# --------------------------------------------------------------------------- errors


def did_you_mean(name: Any, candidates: Iterable[Any]) -> str:
    """ "; did you mean 'embeds_b'?" for the closest of ``candidates``, or ""."""
    by_text = {str(c): c for c in candidates}
    close = difflib.get_close_matches(str(name), list(by_text), n=1)
    return f"; did you mean {by_text[close[0]]!r}?" if close else ""


def column_not_found(column: Any, available: Iterable[Any], what: str = "column") -> KeyError:
    """KeyError("column 'embed_b' not found; did you mean 'embeds_b'? available: [...]")."""
    available = list(available)
    hint = did_you_mean(column, available)
    return KeyError(f"{what} {column!r} not found{hint or ';'} available: {available!r}")


def string_column_error(column: str, dtype: Any) -> TypeError:
    return TypeError(
        f"column {column!r} holds strings ({dtype}), not vectors. dd.from_pandas turns "
        "object columns of arrays or tensors into text such as '[0.1 0.2 ...]' (dask's "
        "'dataframe.convert-string'), truncated. Build the dask frame with "
        "dask_cosim.from_pandas(pdf) instead: it stores them as Arrow vectors. "
        "(dask.config.set({'dataframe.convert-string': False}) before dd.from_pandas keeps "
        "them too, as Python objects that dask hashes one by one: about 200x slower in "
        "benchmarks/from_pandas.py.)"
    )


def binary_column_error(column: str, dtype: Any, row: Any = None) -> TypeError:
    """Raw bytes: our "binary" Parquet layout read by a reader that knows nothing of it."""
    where = f"column {column!r}" if row is None else f"column {column!r}: row {row!r}"
    return TypeError(
        f"{where} holds bytes ({dtype}), not vectors: Parquet written by "
        "dask_cosim.to_parquet stores each vector as raw bytes (layout='binary'), which "
        "other readers such as pd.read_parquet and dd.read_parquet return as they are. "
        "Read the files with dask_cosim.read_parquet(path), or write them with "
        "dask_cosim.to_parquet(df, path, layout='list') for other tools."
    )


def not_vectors_error(column: str, dtype: Any) -> TypeError:
    return TypeError(
        f"column {column!r} has dtype {dtype}, which is not a column of vectors; "
        f"expected {ACCEPTED}"
    )


def ragged_error(column: str, label: Any, length: int, first_label: Any, dim: int) -> ValueError:
    return ValueError(
        f"column {column!r}: row {label!r} has {length} values but row {first_label!r} "
        f"has {dim}; every row of an embedding column needs the same length"
    )


def row_label(index: Any, position: int) -> Any:
    """The index label at ``position``, as a plain Python value (for error messages)."""
    if hasattr(index, "to_pandas"):  # cudf: only on the error path, so a copy is fine
        index = index.to_pandas()
    label = index[position]
    return label.item() if hasattr(label, "item") else label


# --------------------------------------------------------------------------- numpy -> torch


def _as_tensor(array: np.ndarray) -> torch.Tensor:
    """Zero-copy numpy -> torch view of ``array``.

    DLPack rather than ``torch.from_numpy``: Arrow buffers are read-only, and from_numpy
    warns on those, while DLPack shares them silently (nothing here writes to an input).
    numpy before 2.1 cannot export a read-only array through DLPack: from_numpy then,
    without its warning.
    """
    try:
        return torch.from_dlpack(array)
    except BufferError:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return torch.from_numpy(array)


# --------------------------------------------------------------------------- pandas meta


def _arrow_value_spec(column: str, dtype: pd.ArrowDtype) -> VectorSpec:
    t = dtype.pyarrow_dtype
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        raise string_column_error(column, dtype)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        raise binary_column_error(column, dtype)
    if pa.types.is_fixed_size_list(t):
        dim: int | None = t.list_size
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        dim = None
    else:
        raise not_vectors_error(column, dtype)
    value = t.value_type
    if pa.types.is_floating(value) or pa.types.is_integer(value):
        return VectorSpec(dim, np.dtype(value.to_pandas_dtype()))
    if _is_list_type(value):
        raise TypeError(
            f"column {column!r} holds nested lists ({dtype}); flatten each row to one "
            "list of D numbers (pyarrow.compute.list_flatten, or reshape(-1) before writing)"
        )
    raise not_vectors_error(column, dtype)


@vector_spec.register(pd.Series)
def _pandas_vector_spec(meta: pd.Series, column: str) -> VectorSpec:
    dtype = meta.dtype
    if isinstance(dtype, pd.ArrowDtype):
        return _arrow_value_spec(column, dtype)
    if pd.api.types.is_object_dtype(dtype):
        return VectorSpec(None, None)
    if pd.api.types.is_string_dtype(dtype):
        raise string_column_error(column, dtype)
    raise not_vectors_error(column, dtype)


# --------------------------------------------------------------------------- pandas data


def _list_chunk_values(
    chunk: pa.Array, column: str, index: Any, row0: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """One Arrow list chunk -> ((rows, D) numpy view or copy, null mask or None)."""
    n = len(chunk)
    null = chunk.is_null().to_numpy(zero_copy_only=False) if chunk.null_count else None
    if pa.types.is_fixed_size_list(chunk.type):
        dim = chunk.type.list_size
        # .values ignores the chunk's slice offset; .flatten() would drop null rows.
        values = chunk.values.slice(chunk.offset * dim, n * dim)
        return _float_values(values).reshape(n, dim), null

    offsets = chunk.offsets.to_numpy()
    lengths = np.diff(offsets)
    valid_lengths = lengths if null is None else lengths[~null]
    if len(valid_lengths) == 0:  # every row null; the value type still sets the result's
        return np.zeros((n, 0), dtype=chunk.type.value_type.to_pandas_dtype()), null
    dim = int(valid_lengths[0])
    bad = np.flatnonzero(lengths != dim)
    if null is not None:
        bad = bad[~null[bad]]
    if len(bad):
        first_valid = 0 if null is None else int(np.flatnonzero(~null)[0])
        raise ragged_error(
            column,
            row_label(index, row0 + int(bad[0])),
            int(lengths[bad[0]]),
            row_label(index, row0 + first_valid),
            dim,
        )
    values = chunk.values  # the whole child array: offsets index into it
    if (offsets[-1] - offsets[0]) == n * dim:
        # Every row, null ones included, is D long: the values are evenly strided.
        start = int(offsets[0])
        return _float_values(values.slice(start, n * dim)).reshape(n, dim), null
    # Null rows of length 0 break the stride: gather the valid rows (one vectorised copy).
    flat = _float_values(values)
    out = np.zeros((n, dim), dtype=flat.dtype)
    assert null is not None  # a stride break comes only from null rows of length 0
    valid = np.flatnonzero(~null)
    out[valid] = flat[offsets[valid][:, None] + np.arange(dim)]
    return out, null


def _float_values(values: pa.Array) -> np.ndarray:
    """Arrow numeric values -> numpy, zero-copy unless they hold nulls (which become NaN)."""
    if values.null_count:
        # A null inside a vector makes the whole row NaN, like NaN itself.
        return values.cast(pa.float64() if values.type == pa.float64() else pa.float32()).to_numpy(
            zero_copy_only=False
        )
    return values.to_numpy(zero_copy_only=True)


def _is_null_cell(x: Any) -> bool:
    return x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x))


def stack_object_column(
    values: np.ndarray, index: Any, column: str
) -> tuple[np.ndarray | torch.Tensor, np.ndarray | None]:
    """An object column of per-row vectors -> ((N, D) array or tensor, null mask or None).

    Cells may be numpy arrays, torch tensors or sequences of numbers, of any shape with D
    elements (a (300, 1) tensor is a 300-vector); None/NaN cells are null rows. Ragged rows
    and cells that are not vectors of real numbers (strings, scalars, bool or complex
    values) raise, naming the column and the row label. One vectorised stack
    for the whole column: torch tensors stay torch (no numpy round trip), all else numpy.
    """
    n = len(values)
    null_list = [_is_null_cell(x) for x in values]
    null = np.array(null_list, dtype=bool) if any(null_list) else None
    positions = np.arange(n) if null is None else np.flatnonzero(~null)
    cells = values if null is None else values[positions]
    if len(cells) == 0:
        return np.zeros((n, 0), dtype=np.float32), null
    if isinstance(cells[0], str):
        # A text column, or vectors that became text: pandas before 3.0 keeps strings in
        # object columns, so this is where they are first seen.
        raise string_column_error(column, values.dtype)

    dense = _stack_uniform(cells)
    if dense is None:
        dense = _stack_checked(cells, positions, index, column)
    if null is None:
        return dense, None
    # Null rows become zero rows (masked out of the result later).
    if isinstance(dense, torch.Tensor):
        full_t = dense.new_zeros((n, dense.shape[1]))
        full_t[torch.from_numpy(positions)] = dense
        return full_t, null
    full = np.zeros((n, dense.shape[1]), dtype=dense.dtype)
    full[positions] = dense
    return full, null


def _stack_uniform(cells: np.ndarray) -> np.ndarray | torch.Tensor | None:
    """The common case in one stack: every cell a tensor (or every cell an ndarray) of one
    shape and numeric dtype.  None when the cells differ, so the checked path decides."""
    kinds = {(type(x), getattr(x, "shape", None), getattr(x, "dtype", None)) for x in cells}
    if len(kinds) != 1:
        return None
    first: tuple[type, Any, Any] = next(iter(kinds))
    kind, shape, dtype = first
    if shape == ():  # a scalar per row is not a vector: the checked path names the row
        return None
    if issubclass(kind, torch.Tensor) and not dtype.is_complex and dtype != torch.bool:
        with torch.no_grad():  # cells that require grad must not build a graph
            return torch.stack(list(cells)).reshape(len(cells), -1)
    if issubclass(kind, np.ndarray) and dtype.kind in "fiu":
        return np.stack(list(cells)).reshape(len(cells), -1)
    return None


def _stack_checked(
    cells: np.ndarray, positions: np.ndarray, index: Any, column: str
) -> np.ndarray | torch.Tensor:
    """Cell by cell: mixed shapes, lists, mixed types; raises naming the first bad row."""
    all_torch = all(isinstance(x, torch.Tensor) for x in cells)
    if all_torch:
        for pos, t in zip(positions, cells):
            if t.ndim == 0 or t.is_complex() or t.dtype == torch.bool:
                raise _cell_error(column, index, pos, t)
        flat_cells: list[Any] = [t.detach().reshape(-1) for t in cells]
        sizes = [t.numel() for t in flat_cells]
    else:
        flat_cells = []
        for pos, x in zip(positions, cells):
            try:
                arr = _cell_array(x)
            except (TypeError, ValueError):  # e.g. nested lists of different lengths
                raise _cell_error(column, index, pos, x) from None
            if arr.ndim == 0 or arr.dtype.kind not in "fiu":
                raise _cell_error(column, index, pos, x)
            flat_cells.append(arr.reshape(-1))
        sizes = [a.size for a in flat_cells]
    dim = sizes[0]
    bad = next((i for i, s in enumerate(sizes) if s != dim), None)
    if bad is not None:
        raise ragged_error(
            column,
            row_label(index, int(positions[bad])),
            sizes[bad],
            row_label(index, int(positions[0])),
            dim,
        )
    if all_torch:
        return torch.stack([t.cpu() for t in flat_cells])
    return np.stack(flat_cells)


def _cell_array(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return (x.float() if x.dtype == torch.bfloat16 else x).numpy()  # numpy has no bf16
    return np.asarray(x)


def _cell_error(column: str, index: Any, position: Any, cell: Any) -> TypeError:
    if isinstance(cell, (bytes, bytearray, memoryview)):
        return binary_column_error(column, "object", row_label(index, int(position)))
    return TypeError(
        f"column {column!r}: row {row_label(index, int(position))!r} holds "
        f"{type(cell).__name__} {_short(cell)}, not a vector of numbers; expected one "
        "numpy array, torch tensor or list of numbers per row"
    )


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."


@to_vectors.register(pd.Series)
def _pandas_to_vectors(s: pd.Series, column: str) -> Vectors:
    n = len(s)
    if isinstance(s.dtype, pd.ArrowDtype):
        spec = _arrow_value_spec(column, s.dtype)  # same checks as at graph time
        chunked = pa.array(s.array)
        chunks = chunked.chunks if isinstance(chunked, pa.ChunkedArray) else [chunked]
        blocks, nulls, row0, dims = [], [], 0, []
        for chunk in chunks:
            if len(chunk) == 0:
                continue
            values, null = _list_chunk_values(chunk, column, s.index, row0)
            blocks.append(values)
            nulls.append(np.zeros(len(chunk), bool) if null is None else null)
            if values.shape[1] or null is None or not null.all():
                dims.append((row0, values.shape[1]))
            row0 += len(chunk)
        dim = _check_chunk_dims(dims, column, s.index)
        blocks = [b if b.shape[1] == dim else np.zeros((len(b), dim), b.dtype) for b in blocks]
        if not blocks:  # no rows: an empty block still carries the value dtype
            blocks = [np.zeros((0, dim), spec.dtype)]
        null_all = np.concatenate(nulls) if nulls else np.zeros(0, bool)
        return Vectors(
            [_as_tensor(b) for b in blocks], null_all if null_all.any() else None, dim, n
        )
    if pd.api.types.is_object_dtype(s.dtype):
        stacked, null = stack_object_column(s.to_numpy(), s.index, column)
        tensor = stacked if isinstance(stacked, torch.Tensor) else _as_tensor(stacked)
        return Vectors([tensor], null, tensor.shape[1], n)
    vector_spec(s, column)  # raises the right TypeError
    raise not_vectors_error(column, s.dtype)


def _check_chunk_dims(dims: list[tuple[int, int]], column: str, index: Any) -> int:
    """Chunks of a variable list column must agree on D too."""
    if not dims:
        return 0
    first_row, dim = dims[0]
    for row, d in dims[1:]:
        if d != dim:
            raise ragged_error(column, row_label(index, row), d, row_label(index, first_row), dim)
    return dim


@make_result.register(pd.Series)
def _pandas_make_result(like: pd.Series, values: torch.Tensor, null: Any, name: Any) -> pd.Series:
    array = values.detach().cpu().numpy()
    if null is not None:
        array[np.asarray(null)] = np.nan
    return pd.Series(array, index=like.index, name=name, copy=False)


def arrow_vector_types(arrow_type: pa.DataType) -> pd.ArrowDtype | None:
    """``types_mapper`` for ``Table.to_pandas``: list columns stay Arrow, all else default.

    Mapping them explicitly also keeps pandas from parsing the dtype string it wrote into
    the file's metadata, which it cannot do for fixed_size_list ("Passing pyarrow type
    specific parameters ([300]) in the string is not supported").
    """
    return pd.ArrowDtype(arrow_type) if _is_list_type(arrow_type) else None


def _is_list_type(t: pa.DataType) -> bool:
    return pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t)


def frame_from_arrow(table: pa.Table, backend: str = "pandas") -> Any:
    """An Arrow table (vectors as fixed_size_list) -> a pandas or cudf DataFrame.

    pandas: vector columns become ``pd.ArrowDtype`` columns sharing the table's buffers;
    the index is restored from the pandas metadata.  cudf: one host-to-device copy.
    """
    if backend == "cudf":
        import cudf

        # cudf has no fixed-size list type: its list columns carry offsets.
        fields = [
            pa.field(f.name, pa.list_(f.type.value_type), f.nullable, f.metadata)
            if pa.types.is_fixed_size_list(f.type)
            else f
            for f in table.schema
        ]
        return cudf.DataFrame.from_arrow(table.cast(pa.schema(fields, table.schema.metadata)))
    return table.to_pandas(types_mapper=arrow_vector_types)


def cudf_read_parquet(
    files: list[str],
    *,
    row_groups: list[int] | None,
    columns: list[str] | None,
    filters: Any,
    vectors: dict[str, tuple[int, str]],
) -> Any:
    """Parquet files (or some row groups of one) decoded on the GPU by cudf's reader, as
    one frame.

    List columns stay cudf list columns on the device.  ``vectors`` names the columns of
    our binary layout (FIXED_LEN_BYTE_ARRAY, D * itemsize bytes a row) with their
    (D, dtype): cudf reads such a column as bytes (a strings column, or lists of uint8),
    and each becomes a list column of D numbers over those same device bytes, without a
    copy or a trip through the host.  The index is restored from the pandas metadata,
    as cudf does (several files with RangeIndex metadata: their ranges, one after another).
    """
    import cudf

    df = cudf.read_parquet(
        files[0] if len(files) == 1 else files,
        columns=columns,
        row_groups=None if row_groups is None else [row_groups],
        filters=filters,
    )
    if len(files) > 1:
        df = _files_range_index(df, files)
    wanted = [c for c in df.columns if c in vectors]
    if not wanted:
        return df
    table, metadata = df.to_pylibcudf()
    plc_columns = list(table.columns())
    for i, name in enumerate(df.columns):
        if name in vectors:
            plc_columns[i] = _cudf_bytes_to_lists(plc_columns[i], str(name), *vectors[name])
    import pylibcudf as plc

    return cudf.DataFrame.from_pylibcudf(plc.Table(plc_columns), metadata)


def _files_range_index(df: Any, files: list[str]) -> Any:
    """``df`` read from ``files``; if each file stores its index as a RangeIndex (pandas
    metadata, no column), the index is those ranges in order, as pyarrow gives them
    file by file.  Only the files' footers are read."""
    import cudf
    import cupy
    import pyarrow.parquet as pq

    ranges, rows = [], []
    for file in files:
        parquet = pq.ParquetFile(file)
        index_columns = (parquet.schema_arrow.pandas_metadata or {}).get("index_columns") or [None]
        if not (isinstance(index_columns[0], dict) and index_columns[0].get("kind") == "range"):
            return df
        ranges.append(index_columns[0])
        rows.append(parquet.metadata.num_rows)
    step = ranges[0]["step"]
    start = ranges[0]["start"]
    contiguous = all(
        r["step"] == step and r["start"] == start + sum(rows[:i]) * step
        for i, r in enumerate(ranges)
    )
    name = ranges[0].get("name")
    if contiguous:
        df.index = cudf.RangeIndex(start, start + sum(rows) * step, step, name=name)
    else:
        parts = [cupy.arange(r["start"], r["start"] + n * r["step"], r["step"])
                 for r, n in zip(ranges, rows)]  # fmt: skip
        df.index = cudf.Index(cupy.concatenate(parts), name=name)
    return df


def _cudf_bytes_to_lists(column: Any, name: str, dim: int, dtype: str) -> Any:
    """A pylibcudf column of fixed-width byte strings -> a LIST column of ``dim`` numbers
    of ``dtype`` per row, viewing the same device memory (only the N+1 offsets are new)."""
    import cupy
    import pylibcudf as plc

    if column.offset():  # a slice: compact it first, so offsets and mask start at row 0
        column = column.copy()
    kind = column.type().id()
    if kind == plc.TypeId.STRING:
        data, offsets = _device_bytes(column.data()), column.child(0)
    elif kind == plc.TypeId.LIST and column.child(1).type().id() in (
        plc.TypeId.UINT8,
        plc.TypeId.INT8,
    ):
        bytes_column = column.child(1)
        offsets = column.child(0)
        data = _device_bytes(bytes_column.data())[bytes_column.offset() :]
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
    byte_offsets = _device_bytes(offsets.data()).view(
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
CUDF_WRITER_MAX_BINARY_WIDTH = 255


def cudf_writer_takes(schema: pa.Schema) -> bool:
    """Whether :func:`cudf_write_parquet` writes a file of ``schema`` correctly: every
    binary vector at most CUDF_WRITER_MAX_BINARY_WIDTH bytes wide."""
    return all(
        field.type.byte_width <= CUDF_WRITER_MAX_BINARY_WIDTH
        for field in schema
        if pa.types.is_fixed_size_binary(field.type)
    )


def cudf_write_parquet(
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
    import base64

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

    vectors = to_vectors(series, name)
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


def _plc_numpy_dtype(column: Any) -> np.dtype:
    """The numpy dtype of a pylibcudf column of numbers (offsets, list leaves)."""
    name = column.type().id().name.lower()
    if name == "bool8":
        return np.dtype(np.bool_)
    try:
        return np.dtype(name)
    except TypeError:
        raise TypeError(f"a list of {name} values is not a list of numbers") from None


def _device_bytes(span: Any) -> Any:
    """A device buffer (anything with ``__cuda_array_interface__``) as a cupy uint8 array,
    without a copy; cupy keeps the buffer alive."""
    import cupy

    if span is None:
        return cupy.zeros(0, dtype=np.uint8)
    return cupy.asarray(span).view(np.uint8).reshape(-1)


# --------------------------------------------------------------------------- cudf (lazy)


@vector_spec.register_lazy("cudf")
@to_vectors.register_lazy("cudf")
@make_result.register_lazy("cudf")
def _register_cudf() -> None:
    import cudf

    @vector_spec.register(cudf.Series)
    def _cudf_vector_spec(meta: Any, column: str) -> VectorSpec:
        dtype = meta.dtype
        if isinstance(dtype, pd.ArrowDtype):
            # cudf keeps pandas' Arrow dtypes (cudf.from_pandas of ArrowDtype columns).
            return _arrow_value_spec(column, dtype)
        if isinstance(dtype, cudf.ListDtype):
            leaf = dtype.element_type
            if isinstance(leaf, (cudf.ListDtype, pd.ArrowDtype)):
                raise TypeError(
                    f"column {column!r} holds nested lists ({dtype}); flatten each row to "
                    "one list of D numbers (Series.list.leaves per row, or reshape(-1) "
                    "before writing)"
                )
            leaf = np.dtype(leaf)
            if leaf.kind in "fiu":
                return VectorSpec(None, leaf)
            raise not_vectors_error(column, dtype)
        if pd.api.types.is_object_dtype(dtype) or pd.api.types.is_string_dtype(dtype):
            raise string_column_error(column, dtype)
        raise not_vectors_error(column, dtype)

    @to_vectors.register(cudf.Series)
    def _cudf_to_vectors(s: Any, column: str) -> Vectors:
        """The rows of a cudf list column as one (N, D) device tensor, read through
        pylibcudf (whichever dtype cudf shows, ``ListDtype`` or pandas' ``ArrowDtype``):
        a view of the values when no row is null, else one scatter into a dense array."""
        import cupy
        import pylibcudf as plc

        _cudf_vector_spec(s, column)
        n = len(s)
        col = s.to_pylibcudf()[0]
        offsets_col, leaves_col = col.child(0), col.child(1)
        start = col.offset() + offsets_col.offset()
        offsets = _device_bytes(offsets_col.data()).view(_plc_numpy_dtype(offsets_col))
        offsets = offsets[start : start + n + 1]
        lengths = offsets[1:] - offsets[:-1]
        null_count = col.null_count()
        valid = None
        if null_count:
            valid = _device_bytes(plc.unary.is_valid(col).data()).view(np.bool_)[:n]
        valid_lengths = lengths if valid is None else lengths[valid]
        if valid_lengths.size == 0:
            return Vectors([torch.zeros((n, 0), device="cuda")], None, 0, n)
        dim = int(valid_lengths[0])
        bad = (
            cupy.flatnonzero(lengths != dim)
            if valid is None
            else cupy.flatnonzero(valid & (lengths != dim))
        )
        if bad.size:
            first = int(bad[0])
            first_valid = 0 if valid is None else int(cupy.flatnonzero(valid)[0])
            raise ragged_error(
                column,
                row_label(s.index, first),
                int(lengths[first]),
                row_label(s.index, first_valid),
                dim,
            )
        leaf_dtype = _plc_numpy_dtype(leaves_col)
        values = _device_bytes(leaves_col.data()).view(leaf_dtype)[leaves_col.offset() :]
        if leaves_col.null_count():  # null numbers inside rows: NaN, as on the CPU
            leaf_valid = _device_bytes(plc.unary.is_valid(leaves_col).data()).view(np.bool_)
            float_type = np.float64 if leaf_dtype == np.float64 else np.float32
            values = cupy.where(leaf_valid, values.astype(float_type), float_type(np.nan))
        # Unsliced columns start at value 0; a slice's first offset costs one small read.
        first_value = int(offsets[0]) if start else 0
        if valid is None:
            dense = values[first_value : first_value + n * dim].reshape(n, dim)
        else:
            # Null rows may hold no values or D of them: gather the valid rows by offset.
            dense = cupy.zeros((n, dim), dtype=values.dtype)
            rows = offsets[:-1][valid][:, None] + cupy.arange(dim, dtype=offsets.dtype)
            dense[valid] = values[rows]
        tensor = torch.from_dlpack(dense)
        null = None if valid is None else torch.from_dlpack(~valid)
        return Vectors([tensor], null, dim, n)

    @make_result.register(cudf.Series)
    def _cudf_make_result(like: Any, values: torch.Tensor, null: Any, name: Any) -> Any:
        import cupy

        if values.numel() == 0:
            # Also builds the meta on the client: touch no GPU there.
            return cudf.Series(
                [], dtype=str(values.dtype).replace("torch.", ""), index=like.index, name=name
            )
        if values.device.type != "cuda":
            # A cudf frame computed on the CPU (device="cpu"): back to the GPU, once.
            values = values.cuda()
        out = cudf.Series(cupy.from_dlpack(values.contiguous()), index=like.index, name=name)
        if null is not None:
            # Null rows stay null (not NaN), so cudf reductions skip them as pandas skips NaN.
            out = out.mask(cudf.Series(cupy.from_dlpack(null), index=like.index))
        return out
