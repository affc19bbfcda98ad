"""How a vector column is stored in Parquet, and how it is restored.

Two layouts for a column of D-long vectors:

- "binary" (the default of :func:`~dask_cosim.io.to_parquet`): each vector is one Parquet
  FIXED_LEN_BYTE_ARRAY value of D * itemsize bytes, no dictionary, no compression.
  pyarrow decodes it with one copy; other readers see opaque bytes.  The field metadata
  (``dask_cosim.dim``, ``dask_cosim.dtype``) says how to read them back.
- "list": Arrow fixed_size_list<D>, stored as a Parquet LIST.  Every Parquet reader
  understands it.

A column no row of which tells D (no rows, or only null ones, of a variable list) is
stored as a variable list of nulls in either layout (see :mod:`.vector_dims`).

Read speeds of both are in benchmarks/NOTES.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from dask_cosim import backends

LAYOUTS = ("binary", "list")


# Field metadata on a binary vector column: how to turn its bytes back into vectors.
_DIM_KEY = b"dask_cosim.dim"


_DTYPE_KEY = b"dask_cosim.dtype"


def vectors_to_arrow(
    values: np.ndarray | torch.Tensor, null: np.ndarray | None = None
) -> pd.arrays.ArrowExtensionArray:
    """(N, D) numbers -> an Arrow fixed_size_list<D> extension array (null rows masked).

    bfloat16, which numpy and Arrow lack, becomes float32.
    """
    return pd.arrays.ArrowExtensionArray(encode_vectors(values, null, "list"))


def encode_vectors(
    values: np.ndarray | torch.Tensor, null: np.ndarray | None = None, layout: str = "list"
) -> pa.Array:
    """(N, D) numbers -> one Arrow array in ``layout``: "list" gives fixed_size_list<D>,
    "binary" gives fixed_size_binary(D * itemsize).  No copy of contiguous host data."""
    values = _host_array(values)
    n, dim = values.shape
    flat = pa.array(values.reshape(-1))
    validity = None
    if null is not None and np.asarray(null).any():
        # A bit-packed validity buffer (from_arrays gained mask= only in newer pyarrow).
        validity = pa.array(~np.asarray(null, dtype=bool)).buffers()[1]
    if layout == "binary":
        width = dim * values.itemsize
        return pa.Array.from_buffers(pa.binary(width), n, [validity, flat.buffers()[1]])
    return pa.Array.from_buffers(pa.list_(flat.type, dim), n, [validity], children=[flat])


def _host_array(values: np.ndarray | torch.Tensor) -> np.ndarray:
    """A C-contiguous numpy array on the host; bfloat16 (unknown to numpy/Arrow) -> float32."""
    if isinstance(values, torch.Tensor):
        if values.dtype == torch.bfloat16:
            values = values.float()
        values = values.detach().cpu().contiguous().numpy()
    return np.ascontiguousarray(values)


def _binary_to_list(chunk: pa.Array, value_type: pa.DataType, dim: int) -> pa.Array:
    """fixed_size_binary chunk -> fixed_size_list<D> over the same bytes (no copy)."""
    validity, data = chunk.buffers()
    values = pa.Array.from_buffers(value_type, (chunk.offset + len(chunk)) * dim, [None, data])
    return pa.Array.from_buffers(
        pa.list_(value_type, dim), len(chunk), [validity], children=[values], offset=chunk.offset
    )


def vector_field(name: str, value_type: pa.DataType, dim: int, layout: str) -> pa.Field:
    if layout == "list":
        return pa.field(name, pa.list_(value_type, dim))
    dtype = np.dtype(value_type.to_pandas_dtype()).name
    return pa.field(
        name,
        pa.binary(dim * value_type.bit_width // 8),
        metadata={_DIM_KEY: str(dim).encode(), _DTYPE_KEY: dtype.encode()},
    )


def stored_vector(field: pa.Field) -> tuple[int, str] | None:
    """(D, dtype name) of a vector column as stored, in either layout; None for others."""
    meta = field.metadata or {}
    if pa.types.is_fixed_size_binary(field.type) and _DIM_KEY in meta:
        return int(meta[_DIM_KEY]), meta[_DTYPE_KEY].decode()
    if pa.types.is_fixed_size_list(field.type):
        return field.type.list_size, np.dtype(field.type.value_type.to_pandas_dtype()).name
    return None


def restore_vectors(table: pa.Table) -> pa.Table:
    """Binary vector columns (those carrying our field metadata) -> fixed_size_list<D>.

    No copy: the list's values are the bytes pyarrow read.  Other columns are untouched.
    """
    for i, field in enumerate(table.schema):
        stored = stored_vector(field)
        if stored is None or not pa.types.is_fixed_size_binary(field.type):
            continue
        lists = _as_lists(table.column(i), *stored)
        table = table.set_column(i, pa.field(field.name, lists.type), lists)
    return table


def _as_lists(column: pa.ChunkedArray, dim: int, dtype: str) -> pa.ChunkedArray:
    """A fixed_size_binary column of the binary layout -> fixed_size_list<D> of
    ``dtype`` over the same bytes (no copy)."""
    value_type = pa.from_numpy_dtype(np.dtype(dtype))
    chunks = [_binary_to_list(c, value_type, dim) for c in column.chunks]
    return pa.chunked_array(chunks, pa.list_(value_type, dim))


def restore_frame_vectors(df: pd.DataFrame, binary: dict[str, tuple[int, str]]) -> pd.DataFrame:
    """``df`` (a pandas frame, Arrow-backed columns) with its columns of ``binary``
    ({column: (D, dtype name)}: :func:`binary_vectors`) that hold the binary layout's
    bytes as ``fixed_size_list<D>`` columns (no copy), as :func:`restore_vectors` turns a
    table's: what another reader (dask's) made of our files."""
    for column, (dim, dtype) in binary.items():
        kind = df[column].dtype if column in df.columns else None
        if kind is not None and pd.api.types.is_object_dtype(kind):  # bytes, as pyarrow gives
            width = dim * np.dtype(dtype).itemsize
            stored = pa.chunked_array([pa.array(df[column].to_numpy(), pa.binary(width))])
        elif isinstance(kind, pd.ArrowDtype) and pa.types.is_fixed_size_binary(kind.pyarrow_dtype):
            stored = pa.chunked_array(pa.array(df[column].array))
        else:
            continue
        lists = _as_lists(stored, dim, dtype)
        df[column] = pd.Series(pd.arrays.ArrowExtensionArray(lists), index=df.index)
    return df


def list_columns(meta: Any) -> list[str]:
    """Columns whose dtype alone says they hold vectors (Arrow or cudf lists of numbers)."""
    return backends.vector_columns(meta)


def encode_column(series: Any, column: str, layout: str) -> tuple[pa.Field, pa.ChunkedArray]:
    """One column of a pandas or cudf frame, read as ``pairwise`` reads it -> (field, array)
    in ``layout``."""
    vectors = backends.to_vectors(series, column)
    null = vectors.null
    if isinstance(null, torch.Tensor):
        null = null.cpu().numpy()
    blocks = [_host_array(b) for b in vectors.blocks]
    if blocks:
        dtype = blocks[0].dtype
    else:  # no rows: the dtype and D come from the metadata where it has them
        spec = backends.vector_spec(series.iloc[:0], column)
        dtype = spec.dtype or np.dtype(np.float32)
        blocks = [np.zeros((0, spec.dim or 0), dtype=dtype)]
    if blocks[0].shape[1] == 0:
        return _without_d(column, pa.from_numpy_dtype(dtype), null, sum(map(len, blocks)))
    chunks, row = [], 0
    for block in blocks:
        n = len(block)
        chunks.append(encode_vectors(block, None if null is None else null[row : row + n], layout))
        row += n
    field = vector_field(column, pa.from_numpy_dtype(dtype), blocks[0].shape[1], layout)
    return field, pa.chunked_array(chunks, field.type)


def _without_d(
    column: str, value_type: pa.DataType, null: np.ndarray | None, n: int
) -> tuple[pa.Field, pa.ChunkedArray]:
    """A column no row of which tells D (no rows, or only null ones, of a variable list or
    object column) -> a variable list of ``value_type``, in either layout: nulls need no
    D (the binary layout has no FIXED_LEN_BYTE_ARRAY of 0 bytes), and
    :func:`~dask_cosim.io.vector_dims.sized_files` gives the file the D of the folder's
    other files where one has it."""
    validity = None if null is None else pa.array(~np.asarray(null, dtype=bool)).buffers()[1]
    offsets = pa.array(np.zeros(n + 1, np.int32)).buffers()[1]
    values = pa.array([], value_type)
    array = pa.Array.from_buffers(pa.list_(value_type), n, [validity, offsets], children=[values])
    return pa.field(column, array.type), pa.chunked_array([array])


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}; use one of {LAYOUTS!r}")


def binary_vectors(schema: pa.Schema) -> dict[str, tuple[int, str]]:
    """{column: (D, dtype name)} of the columns stored in our binary layout (FLBA with
    our metadata)."""
    found = {}
    for field in schema:
        stored = stored_vector(field)
        if stored is not None and pa.types.is_fixed_size_binary(field.type):
            found[field.name] = stored
    return found


def binary_layout(schema: pa.Schema) -> bool:
    """Whether the file holds vectors in our binary layout (FLBA with our metadata)."""
    return bool(binary_vectors(schema))
