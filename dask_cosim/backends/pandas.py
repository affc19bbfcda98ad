"""pandas (and numpy) behind the dispatchers of :mod:`dask_cosim.backends`.

Vector columns of a pandas frame: Arrow ``fixed_size_list``/``list`` columns (and
``large_list`` and the list views; ``pd.ArrowDtype``), read chunk by chunk as zero-copy
views, and object columns holding one numpy array, torch tensor or list of numbers per
row, stacked once.  Registered when :mod:`dask_cosim.backends` is imported.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import torch
from dask.base import tokenize

from dask_cosim import errors
from dask_cosim.backends import (
    Vectors,
    VectorSpec,
    add_columns,
    boolean_mask,
    data_token,
    dense_tensor,
    frame_like,
    make_result,
    row_label,
    take_to_pandas,
    tensor_view,
    tensors_by_value,
    to_host_tensor,
    to_numbers,
    to_vectors,
    vector_spec,
)

__all__ = [
    "arrow_dtype_parses",
    "arrow_value_spec",
    "arrow_vector_types",
    "frame_from_arrow",
    "stack_object_column",
]


# --------------------------------------------------------------------------- pandas meta


def arrow_value_spec(column: str, dtype: pd.ArrowDtype) -> VectorSpec:
    t = dtype.pyarrow_dtype
    if pa.types.is_null(t):  # no value at all (read from a file that had none): null rows
        return VectorSpec(None, None)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        raise errors.string_column(column, dtype)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        raise errors.binary_column(column, dtype)
    if pa.types.is_fixed_size_list(t):
        dim: int | None = t.list_size
    elif _is_list_type(t):
        dim = None
    else:
        raise errors.not_vectors(column, dtype)
    value = t.value_type
    if pa.types.is_floating(value) or pa.types.is_integer(value):
        return VectorSpec(dim, np.dtype(value.to_pandas_dtype()))
    if _is_list_type(value):
        raise errors.nested_lists(column, dtype, "pyarrow.compute.list_flatten")
    raise errors.not_vectors(column, dtype)


@vector_spec.register(pd.Series)
def _pandas_vector_spec(meta: pd.Series, column: str) -> VectorSpec:
    dtype = meta.dtype
    if isinstance(dtype, pd.ArrowDtype):
        return arrow_value_spec(column, dtype)
    if pd.api.types.is_object_dtype(dtype):
        return VectorSpec(None, None)
    if pd.api.types.is_string_dtype(dtype):
        raise errors.string_column(column, dtype)
    raise errors.not_vectors(column, dtype)


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

    # A list's n + 1 offsets bound its rows; a list view's n offsets each start a row of
    # its own size (rows may share values or come in any order).
    view = _is_list_view(chunk.type)
    offsets = chunk.offsets.to_numpy()
    lengths = chunk.sizes.to_numpy() if view else np.diff(offsets)
    valid_lengths = lengths if null is None else lengths[~null]
    if len(valid_lengths) == 0:  # every row null; the value type still sets the result's
        return np.zeros((n, 0), dtype=chunk.type.value_type.to_pandas_dtype()), null
    odd = ragged_rows(valid_lengths)
    if odd is not None:
        valid = np.arange(n) if null is None else np.flatnonzero(~null)
        bad, usual = (int(valid[i]) for i in odd)
        raise errors.ragged(
            column,
            row_label(index, row0 + bad),
            int(lengths[bad]),
            row_label(index, row0 + usual),
            int(lengths[usual]),
        )
    dim = int(valid_lengths[0])
    other_length = lengths != dim
    values = chunk.values  # the whole child array: offsets index into it
    start = int(offsets[0])
    # Every row, null ones included, D long and one after the other (a list's offsets say
    # so by its lengths alone; a list view's rows may come in any order): a strided view.
    strided = not other_length.any() and (
        not view or np.array_equal(offsets, start + dim * np.arange(n))
    )
    if strided:
        return _float_values(values.slice(start, n * dim)).reshape(n, dim), null
    # Null rows of another length, or list views out of order, break the stride: gather
    # the valid rows (one vectorised copy).
    flat = _float_values(values)
    out = np.zeros((n, dim), dtype=flat.dtype)
    valid = np.arange(n) if null is None else np.flatnonzero(~null)
    out[valid] = flat[offsets[valid][:, None] + np.arange(dim)]
    return out, null


def _float_values(values: pa.Array) -> np.ndarray:
    """Arrow numeric values -> numpy, zero-copy unless they hold nulls (which become NaN):
    then floats keep their type and integers become float64, as they would without
    nulls (their search and ``dtype="float64"`` read them exactly up to 2**53)."""
    if values.null_count:
        # A null inside a vector makes the whole row NaN, like NaN itself.  Integers
        # beyond 2**53 round, as torch rounds them without nulls (Arrow's safe cast
        # would raise).
        wide = values.type if pa.types.is_floating(values.type) else pa.float64()
        return values.cast(wide, safe=False).to_numpy(zero_copy_only=False)
    return values.to_numpy(zero_copy_only=True)


def _is_null_cell(x: Any) -> bool:
    """None, NA, NaT or a NaN scalar (numpy's too): a row without a vector."""
    return (
        x is None
        or x is pd.NA
        or x is pd.NaT
        or (isinstance(x, (float, np.floating)) and math.isnan(x))
    )


def stack_object_column(
    values: np.ndarray, index: Any, column: str
) -> tuple[np.ndarray | torch.Tensor, np.ndarray | None]:
    """An object column of per-row vectors -> ((N, D) array or tensor, null mask or None).

    Cells may be numpy arrays, torch tensors (sparse ones are made dense) or sequences of
    numbers, of any shape with D elements (a (300, 1) tensor is a 300-vector);
    None/NA/NaT/NaN cells are null rows; longdouble values are read as float64.  Ragged
    rows and cells that are not vectors of real numbers (strings, scalars, bool or
    complex values) raise, naming the column and the row label, and so do cells that all
    hold no values (D = 0, null rows aside); a column whose every non-null cell is a
    string raises :class:`~dask_cosim.errors.StringColumnError` instead (text, or vectors
    written as text).  One vectorised stack for the whole column: torch tensors stay
    torch (no numpy round trip), all else numpy.
    """
    n = len(values)
    null_list = [_is_null_cell(x) for x in values]
    null = np.array(null_list, dtype=bool) if any(null_list) else None
    positions = np.arange(n) if null is None else np.flatnonzero(~null)
    cells = values if null is None else values[positions]
    if len(cells) == 0:
        return np.zeros((n, 0), dtype=np.float32), null
    if isinstance(cells[0], str) and all(isinstance(x, str) for x in cells):
        # A text column, or vectors that became text: pandas before 3.0 keeps strings in
        # object columns, so this is where they are first seen.  A string among vectors
        # (a placeholder such as 'missing') is one bad row, whichever row holds it: the
        # checked stack names it.
        raise errors.string_column(column, values.dtype, cells[0])

    dense = _stack_uniform(cells)
    if dense is None:
        dense = _stack_checked(cells, positions, index, column)
    if dense.shape[1] == 0:  # every vector empty (ragged rows raised above): no D at all
        raise errors.empty_vectors(column, row_label(index, int(positions[0])))
    if isinstance(dense, np.ndarray) and dense.dtype.kind == "f" and dense.dtype.itemsize > 8:
        dense = dense.astype(np.float64)  # numpy's longdouble: torch has no such type
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
    shape, numeric dtype and layout (sparse tensors are made dense).  None when the cells
    differ, so the checked path decides."""
    kinds = {
        (type(x), getattr(x, "shape", None), getattr(x, "dtype", None), getattr(x, "layout", None))
        for x in cells
    }
    if len(kinds) != 1:
        return None
    first: tuple[type, Any, Any, Any] = next(iter(kinds))
    kind, shape, dtype, layout = first
    if shape == ():  # a scalar per row is not a vector: the checked path names the row
        return None
    if issubclass(kind, torch.Tensor) and not dtype.is_complex and dtype != torch.bool:
        with torch.no_grad():  # cells that require grad must not build a graph
            rows = list(cells) if layout == torch.strided else [dense_tensor(t) for t in cells]
            return torch.stack(rows).reshape(len(cells), -1)
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
        flat_cells: list[Any] = [dense_tensor(t.detach()).reshape(-1) for t in cells]
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
    odd = ragged_rows(np.asarray(sizes))
    if odd is not None:
        bad, usual = odd
        raise errors.ragged(
            column,
            row_label(index, int(positions[bad])),
            sizes[bad],
            row_label(index, int(positions[usual])),
            sizes[usual],
        )
    if all_torch:
        return torch.stack([t.cpu() for t in flat_cells])
    return np.stack(flat_cells)


def _cell_array(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = dense_tensor(x.detach().cpu())
        return (x.float() if x.dtype == torch.bfloat16 else x).numpy()  # numpy has no bf16
    arr = np.asarray(x)
    if arr.dtype == object and arr.ndim == 1 and any(_is_null_value(v) for v in arr):
        # A null inside a vector (a JSON null read into a list, pandas' NA): NaN, as in an
        # Arrow list.
        numbers = all(_is_null_value(v) or _is_number(v) for v in arr)
        if numbers:
            return np.array([np.nan if _is_null_value(v) else v for v in arr], np.float64)
    return arr


def _is_null_value(v: Any) -> bool:
    """None or pandas' NA: a value missing inside a vector (NaN is a number already)."""
    return v is None or v is pd.NA


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def _cell_error(column: str, index: Any, position: Any, cell: Any) -> TypeError:
    row = row_label(index, int(position))
    if isinstance(cell, (bytes, bytearray, memoryview)):
        return errors.binary_column(column, "object", row)
    return errors.cell_not_vector(column, row, cell)


@to_vectors.register(pd.Series)
def _pandas_to_vectors(s: pd.Series, column: str) -> Vectors:
    n = len(s)
    if isinstance(s.dtype, pd.ArrowDtype) and pa.types.is_null(s.dtype.pyarrow_dtype):
        s = s.astype(object)  # None in every row: as an object column of null rows
    if isinstance(s.dtype, pd.ArrowDtype):
        spec = arrow_value_spec(column, s.dtype)  # same checks as at graph time
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
        # No rows (or only null rows of a variable list): D from the dtype where it says.
        dim = _check_chunk_dims(dims, column, s.index) if dims else (spec.dim or 0)
        blocks = [b if b.shape[1] == dim else np.zeros((len(b), dim), b.dtype) for b in blocks]
        if not blocks:  # no rows: an empty block still carries the value dtype
            blocks = [np.zeros((0, dim), spec.dtype)]
        null_all = np.concatenate(nulls) if nulls else np.zeros(0, bool)
        if dim == 0 and dims:  # rows that are not null, all empty: as an object column's
            first = int(np.flatnonzero(~null_all)[0])
            raise errors.empty_vectors(column, row_label(s.index, first))
        return Vectors(
            [tensor_view(b) for b in blocks], null_all if null_all.any() else None, dim, n
        )
    if pd.api.types.is_object_dtype(s.dtype):
        stacked, null = stack_object_column(s.to_numpy(), s.index, column)
        tensor = stacked if isinstance(stacked, torch.Tensor) else tensor_view(stacked)
        return Vectors([tensor], null, tensor.shape[1], n)
    vector_spec(s, column)  # raises the right TypeError
    raise errors.not_vectors(column, s.dtype)


def ragged_rows(lengths: np.ndarray) -> tuple[int, int] | None:
    """Where ``lengths`` (of a column's rows) differ: (the first row of another length
    than the most common one, the first row of the most common length; on a tie, the
    earliest row's length counts as the common one), or None when all agree.  Against
    the first row alone, one odd row that came first (a partition, or a range of one,
    that starts at it) named every other row as the odd one."""
    if not len(lengths) or (lengths == lengths[0]).all():  # every read: one comparison
        return None
    values, first, counts = np.unique(lengths, return_index=True, return_counts=True)
    if len(values) < 2:
        return None
    usual = np.lexsort((first, -counts))[0]
    return int(np.flatnonzero(lengths != values[usual])[0]), int(first[usual])


def _check_chunk_dims(dims: list[tuple[int, int]], column: str, index: Any) -> int:
    """Chunks of a variable list column must agree on D too."""
    if not dims:
        return 0
    first_row, dim = dims[0]
    for row, d in dims[1:]:
        if d != dim:
            raise errors.ragged(column, row_label(index, row), d, row_label(index, first_row), dim)
    return dim


@make_result.register(pd.Series)
def _pandas_make_result(like: pd.Series, values: torch.Tensor, null: Any, name: Any) -> pd.Series:
    array = values.detach().cpu().numpy()
    if null is not None:
        array[np.asarray(null)] = np.nan
    return pd.Series(array, index=like.index, name=name, copy=False)


def arrow_vector_types(arrow_type: pa.DataType) -> pd.ArrowDtype | None:
    """``types_mapper`` for ``Table.to_pandas``: list columns stay Arrow, and so do the
    other nested types (struct, map, union) and bytes (binary types); all else default.

    Mapping them explicitly also keeps pandas from parsing the dtype string it wrote into
    the file's metadata, which it cannot do for nested types ("Passing pyarrow type
    specific parameters ([300]) in the string is not supported" for fixed_size_list,
    "data type 'struct<a: int64>[pyarrow]' not understood": pandas-dev/pandas#53011).
    Bytes as Python objects would be an object column, which dask's ``convert-string``
    turns into text: it failed on bytes that are not UTF-8.
    """
    return pd.ArrowDtype(arrow_type) if _kept_arrow(arrow_type) else None


def _kept_arrow(t: pa.DataType) -> bool:
    return (
        pa.types.is_nested(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or pa.types.is_binary_view(t)
    )


def _is_list_type(t: pa.DataType) -> bool:
    return (
        pa.types.is_fixed_size_list(t)
        or pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or _is_list_view(t)
    )


def _is_list_view(t: pa.DataType) -> bool:
    """Arrow's list views (offset and size per row), which some engines write; without
    them in the reader's types mapper, dask made text of them (object -> string)."""
    return pa.types.is_list_view(t) or pa.types.is_large_list_view(t)


def frame_from_arrow(table: pa.Table) -> pd.DataFrame:
    """An Arrow table -> a pandas frame whose list columns stay Arrow (zero-copy).

    The index is of the dtype it was written with where pyarrow's own conversion loses it
    (:func:`_index_as_stored`); the columns are as pyarrow converts them, but those that
    pandas described as Arrow-backed in text it cannot parse back, which stay Arrow
    (:func:`_as_written`).
    """
    df = _described_columns_only(table).to_pandas(types_mapper=_as_written(table))
    return _index_as_stored(df, table)


def arrow_dtype_parses(text: Any) -> bool:
    """Whether pandas makes a dtype of ``text``, a dtype as its Parquet metadata records
    it (any text but an Arrow-backed dtype's counts: pyarrow parses the others itself).
    pandas records ``str(dtype)``, which it cannot parse back for nested and parametrised
    Arrow types ("struct<a: int64>[pyarrow]", "fixed_size_binary[4][pyarrow]",
    "dictionary<...>[pyarrow]": pandas-dev/pandas#53011), and pyarrow then fails on the
    whole file."""
    if not isinstance(text, str) or not text.endswith("[pyarrow]"):
        return True
    try:
        pd.api.types.pandas_dtype(text)
    # pandas' own refusals: NotImplementedError for a parametrised type
    # ("fixed_size_binary[4]"), TypeError for a nested one; ValueError from numpy's parse.
    except (TypeError, ValueError, NotImplementedError):
        return False
    return True


def _as_written(table: pa.Table) -> Any:
    """``types_mapper`` for ``table``: :func:`arrow_vector_types`; Arrow-backed for the
    types of the columns whose pandas metadata records an Arrow-backed dtype pandas cannot
    parse back (:func:`arrow_dtype_parses`), as they were written; and for the types
    pyarrow gives as Python objects (:func:`_objects`), the dtype the metadata records
    for every column of that type where it records one (pandas' "boolean", a numpy bool,
    "date64[ms][pyarrow]"), else Arrow-backed (a types mapper maps types, not columns: a
    numpy bool column beside a "boolean" one reads as two "bool[pyarrow]" columns).

    An object column is what dask's ``convert-string`` turns into text, whatever it
    holds: it made 'False' (a true value) of a boolean beside a null, '2020-01-01' of a
    date, '1.00' of a decimal (in the data, where the meta said bool)."""
    described = table.schema.pandas_metadata or {}
    recorded: dict[str, Any] = {
        name: column.get("numpy_type")
        for column in described.get("columns", [])
        if (name := column.get("field_name", column.get("name"))) in table.schema.names
    }
    by_type: dict[pa.DataType, set[Any]] = {}
    for field in table.schema:
        by_type.setdefault(field.type, set()).add(recorded.get(field.name))
    written = {t for t, texts in by_type.items() if not all(map(arrow_dtype_parses, texts))}

    def mapper(t: pa.DataType) -> Any:
        if t in written:
            return pd.ArrowDtype(t)
        if _objects(t):
            texts = by_type.get(t, set())
            if len(texts) == 1 and (text := next(iter(texts))) is not None:
                dtype = pd.api.types.pandas_dtype(text)
                if isinstance(dtype, pd.api.extensions.ExtensionDtype):
                    return dtype
                if text == "bool":  # a numpy bool column: it has no nulls
                    return None
            return pd.ArrowDtype(t)
        return arrow_vector_types(t)

    return mapper


def _objects(t: pa.DataType) -> bool:
    """Whether pyarrow converts ``t`` into Python objects (booleans only beside a null,
    which the schema does not tell; null into None), bytes and nested types aside."""
    return (
        pa.types.is_null(t)
        or pa.types.is_boolean(t)
        or pa.types.is_date(t)
        or pa.types.is_time(t)
        or pa.types.is_decimal(t)
    )


def _index_as_stored(df: pd.DataFrame, table: pa.Table) -> pd.DataFrame:
    """``df`` (``table`` converted) with a one-column index of the dtype it was stored as.

    pyarrow restores the pandas dtypes its metadata records for columns but not for the
    index: a ``date32[pyarrow]`` (or ``date64``) index came back as ``datetime.date``
    objects, which dask's ``convert-string`` then turned into strings; it is Arrow-backed
    again, as dask's reader gives it.  (An index written as ``datetime.date`` objects
    stays so.)  And with a ``types_mapper``, pyarrow gives an empty string index object
    dtype where the same index with rows comes back strings: the frame's meta then said
    object where its data held strings; it is given the dtype of the data.
    """
    described = table.schema.pandas_metadata or {}
    names = [n for n in described.get("index_columns", []) if isinstance(n, str)]
    if len(names) != 1 or names[0] not in table.schema.names:
        return df
    t = table.schema.field(names[0]).type
    stored = {c.get("field_name"): c.get("numpy_type") for c in described.get("columns", [])}
    dtype = str(stored.get(names[0]))
    if pa.types.is_date32(t) and dtype in ("date32[day][pyarrow]", "date64[ms][pyarrow]"):
        # (Parquet stores date64 as date32: cast back, as pyarrow does a column.)
        column = table.column(names[0]).cast(pd.api.types.pandas_dtype(dtype).pyarrow_dtype)
        df.index = pd.Index(pd.arrays.ArrowExtensionArray(column), name=df.index.name)
    elif df.index.dtype == object and len(df) == 0 and is_string_type(t):
        df.index = df.index.astype(pa.array([], t).to_pandas().dtype)
    return df


def is_string_type(t: pa.DataType) -> bool:
    """Whether ``t`` is one of Arrow's string types (string, large_string, string_view)."""
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _described_columns_only(table: pa.Table) -> pa.Table:
    """``table`` with the dtypes its pandas metadata gives the columns it lacks cleared.

    A read of some columns keeps the file's whole description, and pyarrow parses the
    dtype string of every column described there, read or not; pandas cannot parse its
    own for a fixed_size_list column (see :func:`arrow_vector_types`), so a read that
    left such a column out failed on it.
    """
    meta = table.schema.metadata or {}
    if b"pandas" not in meta:
        return table
    described = json.loads(meta[b"pandas"])
    names = set(table.schema.names)
    absent = [
        c
        for c in described.get("columns", [])
        if c.get("field_name", c.get("name")) not in names and c.get("numpy_type") != "object"
    ]
    if not absent:
        return table
    for column in absent:
        column["numpy_type"] = "object"
    schema = table.schema.with_metadata({**meta, b"pandas": json.dumps(described).encode()})
    # Not replace_schema_metadata, which gives a table of no column no rows.
    return pa.Table.from_batches(table.to_batches(), schema=schema)


@boolean_mask.register(pd.DataFrame)
def _pandas_boolean_mask(df: pd.DataFrame, keep: np.ndarray) -> pd.DataFrame:
    return df[keep]


@take_to_pandas.register((pd.DataFrame, pd.Series, pd.Index))
def _pandas_take(obj: Any, positions: np.ndarray) -> Any:
    return obj.take(positions)


@frame_like.register((pd.DataFrame, pd.Series))
def _pandas_frame_like(pdf: pd.DataFrame, like: Any) -> pd.DataFrame:
    return pdf


@to_numbers.register(pd.Series)
def _pandas_to_numbers(series: pd.Series) -> torch.Tensor:
    values = series.to_numpy(dtype=np.float64, na_value=np.nan)
    return tensor_view(np.ascontiguousarray(values))


@add_columns.register(pd.DataFrame)
def _pandas_add_columns(df: pd.DataFrame, pdf: pd.DataFrame) -> pd.DataFrame:
    # The arrays, not the Series: ``pdf``'s index need not be ``df``'s.
    return df.assign(**{str(c): pdf[c].array for c in pdf.columns})


@data_token.register(pd.DataFrame)
def _pandas_data_token(df: pd.DataFrame) -> str:
    objects = (df.dtypes == np.dtype(object)).to_numpy()
    cells = [tensors_by_value(df.iloc[:, i].to_numpy()) for i in np.flatnonzero(objects)]
    return tokenize(df.iloc[:, ~objects], list(df.columns), cells)


@to_host_tensor.register(torch.Tensor)
def _tensor_to_host_tensor(array: torch.Tensor) -> torch.Tensor:
    return array.detach().cpu()


@to_host_tensor.register(object)
def _array_to_host_tensor(array: Any) -> torch.Tensor:
    """numpy arrays and anything ``np.asarray`` takes (nested lists); a C-contiguous numpy
    array is shared, not copied (read-only ones too, without torch's warning)."""
    values = np.asarray(array)
    if values.dtype.kind not in "fiu":
        raise TypeError(
            f"queries of dtype {values.dtype} are not vectors of numbers; give a 2-D "
            "numpy/cupy array or torch tensor (n, D), or a Series of vectors"
        )
    return tensor_view(np.ascontiguousarray(values))
