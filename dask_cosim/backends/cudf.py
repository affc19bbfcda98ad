"""cudf (and cupy) behind the dispatchers of :mod:`dask_cosim.backends`.

Imported (and so registered) only when a dispatcher first meets a cudf object: this module
imports cudf, cupy and pylibcudf at its top.  A cudf list column (``ListDtype``, or the
pandas ``ArrowDtype`` cudf keeps from ``cudf.from_pandas``) is read through pylibcudf as
one (N, D) device tensor over its values.
"""

from __future__ import annotations

from typing import Any

import cudf
import cupy
import numpy as np
import pandas as pd
import pyarrow as pa
import pylibcudf as plc
import torch
from dask.base import tokenize

from dask_cosim import errors
from dask_cosim.backends import (
    Vectors,
    VectorSpec,
    add_columns,
    boolean_mask,
    data_token,
    frame_like,
    is_device_frame,
    make_result,
    row_label,
    take_to_pandas,
    to_numbers,
    to_pandas,
    to_vectors,
    vector_spec,
)
from dask_cosim.backends.pandas import arrow_value_spec

__all__ = ["device_bytes", "frame_from_arrow", "plc_numpy_dtype"]

# Everything cudf calls a frame, a Series or an index.
_CUDF_OBJECTS = (cudf.DataFrame, cudf.Series, cudf.Index, cudf.RangeIndex, cudf.MultiIndex)


def device_bytes(span: Any) -> Any:
    """A device buffer (anything with ``__cuda_array_interface__``) as a cupy uint8 array,
    without a copy; cupy keeps the buffer alive."""
    if span is None:
        return cupy.zeros(0, dtype=np.uint8)
    return cupy.asarray(span).view(np.uint8).reshape(-1)


def plc_numpy_dtype(column: Any) -> np.dtype:
    """The numpy dtype of a pylibcudf column of numbers (offsets, list leaves)."""
    name = column.type().id().name.lower()
    if name == "bool8":
        return np.dtype(np.bool_)
    try:
        return np.dtype(name)
    except TypeError:
        raise TypeError(f"a list of {name} values is not a list of numbers") from None


def frame_from_arrow(table: pa.Table) -> Any:
    """An Arrow table -> a cudf frame (one host-to-device copy); fixed-size lists become
    cudf lists, since cudf has no fixed-size list type."""
    fields = [
        pa.field(f.name, pa.list_(f.type.value_type), f.nullable, f.metadata)
        if pa.types.is_fixed_size_list(f.type)
        else f
        for f in table.schema
    ]
    return cudf.DataFrame.from_arrow(table.cast(pa.schema(fields, table.schema.metadata)))


@vector_spec.register(cudf.Series)
def _cudf_vector_spec(meta: Any, column: str) -> VectorSpec:
    dtype = meta.dtype
    if isinstance(dtype, pd.ArrowDtype):
        # cudf keeps pandas' Arrow dtypes (cudf.from_pandas of ArrowDtype columns).
        return arrow_value_spec(column, dtype)
    if isinstance(dtype, cudf.ListDtype):
        leaf = dtype.element_type
        if isinstance(leaf, (cudf.ListDtype, pd.ArrowDtype)):
            raise errors.nested_lists(column, dtype, "Series.list.leaves per row")
        leaf = np.dtype(leaf)
        if leaf.kind in "fiu":
            return VectorSpec(None, leaf)
        raise errors.not_vectors(column, dtype)
    if pd.api.types.is_object_dtype(dtype) or pd.api.types.is_string_dtype(dtype):
        raise errors.string_column(column, dtype)
    raise errors.not_vectors(column, dtype)


@to_vectors.register(cudf.Series)
def _cudf_to_vectors(s: Any, column: str) -> Vectors:
    """The rows of a cudf list column as one (N, D) device tensor, read through pylibcudf
    (whichever dtype cudf shows, ``ListDtype`` or pandas' ``ArrowDtype``): a view of the
    values when no row is null, else one scatter into a dense array."""
    _cudf_vector_spec(s, column)
    n = len(s)
    col = s.to_pylibcudf()[0]
    offsets_col, leaves_col = col.child(0), col.child(1)
    start = col.offset() + offsets_col.offset()
    offsets = device_bytes(offsets_col.data()).view(plc_numpy_dtype(offsets_col))
    offsets = offsets[start : start + n + 1]
    lengths = offsets[1:] - offsets[:-1]
    valid = None
    if col.null_count():
        valid = device_bytes(plc.unary.is_valid(col).data()).view(np.bool_)[:n]
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
        raise errors.ragged(
            column,
            row_label(s.index, first),
            int(lengths[first]),
            row_label(s.index, first_valid),
            dim,
        )
    leaf_dtype = plc_numpy_dtype(leaves_col)
    values = device_bytes(leaves_col.data()).view(leaf_dtype)[leaves_col.offset() :]
    if leaves_col.null_count():  # null numbers inside rows: NaN, as on the CPU
        leaf_valid = device_bytes(plc.unary.is_valid(leaves_col).data()).view(np.bool_)
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


@to_pandas.register(_CUDF_OBJECTS)
def _cudf_to_pandas(obj: Any) -> Any:
    return obj.to_pandas()


@is_device_frame.register(_CUDF_OBJECTS)
def _cudf_is_device_frame(obj: Any) -> bool:
    return True


@boolean_mask.register(cudf.DataFrame)
def _cudf_boolean_mask(df: Any, keep: np.ndarray) -> Any:
    return df[cupy.asarray(keep)]  # cudf takes a device mask


@take_to_pandas.register(_CUDF_OBJECTS)
def _cudf_take(obj: Any, positions: np.ndarray) -> Any:
    # Only the rows asked for leave the device.
    return obj.take(cupy.asarray(positions)).to_pandas()


@frame_like.register((cudf.DataFrame, cudf.Series))
def _cudf_frame_like(pdf: pd.DataFrame, like: Any) -> Any:
    return cudf.DataFrame.from_arrow(pa.Table.from_pandas(pdf, preserve_index=False))


@to_numbers.register(cudf.Series)
def _cudf_to_numbers(series: Any) -> torch.Tensor:
    return torch.from_dlpack(series.astype("float64").fillna(np.nan).values)


@add_columns.register(cudf.DataFrame)
def _cudf_add_columns(df: Any, pdf: pd.DataFrame) -> Any:
    extra = _cudf_frame_like(pdf, df)
    extra.index = df.index
    out = df.copy(deep=False)
    for c in extra.columns:
        out[c] = extra[c]
    return out


@data_token.register(_CUDF_OBJECTS)
def _cudf_data_token(obj: Any) -> str:
    # Every value counts: a token of a few rows would give two frames one graph key.
    return tokenize(type(obj).__name__, obj.to_arrow())
