"""Columns <-> tensors, per dataframe library: the only package that knows pandas from cudf.

Every question whose answer depends on the dataframe (or array) library is a dispatcher
here, keyed on the type of its first argument (dask's ``Dispatch``):

- ``vector_spec(meta_series, column)``: what a (possibly empty) column holds, from its dtype
  alone, or a ``TypeError`` saying what is wrong and how to fix it (:func:`column_spec`
  asks it about a frame's column, and tells text from vectors written as text;
  :func:`vector_columns` lists the columns it accepts);
- ``to_vectors(series, column)``: the column's rows as (N, D) tensors, zero-copy where the
  layout allows;
- ``make_result(like, values, null, name)``: a Series of the library of ``like``;
- ``to_pandas(obj)``: a frame, Series or index on the host, as pandas (pandas: itself);
- ``is_device_frame(obj)``: whether ``obj`` is a frame, Series or index of a GPU library;
- ``boolean_mask(df, keep)``: the rows of ``df`` where the numpy bool array ``keep`` is True;
- ``take_to_pandas(obj, positions)``: the rows (or labels) of a frame or index at the numpy
  ``positions``, as pandas: a device object gives only those rows to the host;
- ``frame_like(pdf, like)``: the pandas frame ``pdf`` in the library of ``like``;
- ``data_token(obj)``: a deterministic token of an eager frame's contents, for graph keys
  (torch tensors in its object columns by value: :func:`tensors_by_value`);
- ``to_host_tensor(array)``: an array (numpy, cupy, torch, lists: ``topk``'s queries) as a
  CPU tensor;
- ``to_numbers(series)``: a column of numbers as a float64 tensor (NaN for nulls), on
  the column's device;
- ``add_columns(df, pdf)``: ``df`` with the columns of the pandas frame ``pdf`` (its rows,
  in order) added, in the library of ``df``;

:func:`concat_frames` (dask's ``concat`` dispatch), :func:`tensor_view` (a numpy array
as a tensor, without a copy), and :func:`frame_from_arrow`, which picks the library by
name ("pandas" or "cudf", dask's ``dataframe.backend``) because a table read from a file
has no library yet.  A partition goes to Arrow through dask's own
``to_pyarrow_table_dispatch``.

pandas and numpy are registered by :mod:`.pandas` when this package is imported; cudf and
cupy lazily (``register_lazy``), so :mod:`.cudf` is imported only when the user already
has cudf objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from dask import compute as dask_compute
from dask import is_dask_collection
from dask.base import tokenize
from dask.utils import Dispatch

from dask_cosim.errors import (
    ACCEPTED,
    StringColumnError,
    column_not_found,
    is_label,
    not_a_column_name,
    repeated_column,
    string_column,
)

__all__ = [
    "ACCEPTED",
    "VectorSpec",
    "Vectors",
    "add_columns",
    "arrow_dtype_parses",
    "arrow_vector_types",
    "boolean_mask",
    "check_column_name",
    "check_named_once",
    "column_spec",
    "concat_frames",
    "data_token",
    "dense_tensor",
    "expression_kinds",
    "frame_from_arrow",
    "frame_like",
    "in_memory_index",
    "in_memory_sources",
    "is_device_frame",
    "is_vector_series",
    "make_result",
    "row_label",
    "same_label",
    "shown_vector_columns",
    "stack_object_column",
    "take_to_pandas",
    "tensor_token",
    "tensor_view",
    "tensors_by_value",
    "to_host_tensor",
    "to_numbers",
    "to_pandas",
    "to_vectors",
    "vector_columns",
    "vector_spec",
]


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


vector_spec: Dispatch = Dispatch("vector_spec")
to_vectors: Dispatch = Dispatch("to_vectors")
make_result: Dispatch = Dispatch("make_result")
to_pandas: Dispatch = Dispatch("to_pandas")
is_device_frame: Dispatch = Dispatch("is_device_frame")
boolean_mask: Dispatch = Dispatch("boolean_mask")
take_to_pandas: Dispatch = Dispatch("take_to_pandas")
frame_like: Dispatch = Dispatch("frame_like")
data_token: Dispatch = Dispatch("data_token")
to_host_tensor: Dispatch = Dispatch("to_host_tensor")
to_numbers: Dispatch = Dispatch("to_numbers")
add_columns: Dispatch = Dispatch("add_columns")


@to_pandas.register(object)
def _identity(obj: Any) -> Any:
    return obj


@is_device_frame.register(object)
def _on_host(obj: Any) -> bool:
    return False


@data_token.register(object)
def _dask_token(obj: Any) -> str:
    return tokenize(obj)


def tensor_token(t: torch.Tensor) -> tuple[str, tuple[int, ...], np.ndarray]:
    """What a token of the tensor ``t`` is made of: its dtype (and layout, when sparse),
    shape and bytes (a sparse tensor's as dense).  dask pickles a tensor to tokenize it,
    and the pickle differs from copy to copy and from process to process: equal tensors
    would get other graph keys each time."""
    t = t.detach().cpu()
    kind = str(t.dtype) if t.layout == torch.strided else f"{t.dtype} {t.layout}"
    flat = dense_tensor(t).contiguous().reshape(-1)
    return kind, tuple(t.shape), flat.view(torch.uint8).numpy()


def dense_tensor(t: torch.Tensor) -> torch.Tensor:
    """``t`` in torch's usual (strided) layout: a sparse tensor's values as a dense one
    (sparse tensors can be neither reshaped nor stacked with dense ones)."""
    return t if t.layout == torch.strided else t.to_dense()


def tensors_by_value(cells: np.ndarray) -> np.ndarray:
    """The object array ``cells`` (a column's) with each torch tensor as its
    :func:`tensor_token`, for :func:`data_token`: dask tokenizes an object array by
    pickling it, tensors included."""
    gen = (tensor_token(c) if isinstance(c, torch.Tensor) else c for c in cells)
    return np.fromiter(gen, dtype=object, count=len(cells))


def tensor_view(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor of ``array``'s memory, without a copy (read-only arrays included:
    Arrow columns; nothing in this package writes to an input).

    DLPack rather than ``torch.from_numpy``, which warns on read-only arrays.  numpy before
    2.1 cannot export those through DLPack: from_numpy then, of a view of the same memory
    that numpy calls writable.  (Not ``warnings.catch_warnings`` around it: that swaps the
    process's warning filters, and from many tasks' threads at once one restoring them
    undid what another thread had set meanwhile.)
    """
    try:
        return torch.from_dlpack(array)
    except BufferError:
        return torch.from_numpy(np.asarray(_Writable(array)))


class _Writable:
    """``array``'s memory, marked writable, for ``np.asarray`` to view; the view holds this
    object and this object ``array``, so the memory lives as long as the view."""

    def __init__(self, array: np.ndarray) -> None:
        interface = dict(array.__array_interface__)
        interface["data"] = (interface["data"][0], False)  # (address, read-only)
        self.__array_interface__ = interface
        self.array = array


def check_column_name(meta: Any, column: Any, argument: str, what: str = "column") -> None:
    """Raise when ``column``, given as ``argument``, names no column of the frame
    ``meta``: a TypeError for what is no label at all (an array, a Series: its name to
    pass instead), a KeyError (named ``what``) with the closest column, else the frame's
    vector columns."""
    if not is_label(column):
        raise not_a_column_name(argument, column)
    if column not in meta.columns:
        raise column_not_found(column, meta.columns, what, vectors=shown_vector_columns(meta))


def check_named_once(columns: Any, column: Any, what: str = "column") -> None:
    """Raise when the labels ``columns`` hold ``column`` more than once (named ``what``):
    ``frame[column]`` is then a frame, not a column."""
    count = len(columns.get_indexer_for([column]))
    if count > 1:
        raise repeated_column(column, count, what)


def column_spec(obj: Any, column: Any) -> VectorSpec:
    """:func:`vector_spec` of ``obj[column]`` (a dask, pandas or cudf frame: its metadata),
    except that a column of strings raises saying what they hold, text or vectors written
    as text: for that, and only then, the first rows of the first partitions are read.
    An object column raises so when it is in memory (eager, or behind ``dd.from_pandas``)
    and every non-null cell is a string; one string among vectors is left to the row's
    error when the vectors are read."""
    lazy = is_dask_collection(obj)
    meta = obj._meta if lazy else obj
    check_named_once(meta.columns, column)
    try:
        spec: VectorSpec = vector_spec(meta[column], column)
    except StringColumnError as err:
        sample = _first_string(obj, column)
        source = _pandas_source(obj, column) if lazy and sample is None else None
        empty = source is not None and bool(source.isna().all())
        raise string_column(
            column, err.dtype, sample, shown_vector_columns(meta), lazy, empty
        ) from None
    if spec.dtype is None:
        # An object column could hold anything; pandas before 3.0 keeps text there. Its
        # cells, where reading them computes nothing, tell now rather than at compute.
        cell = _first_cell(obj, column, cells=1000, compute=False)
        if isinstance(cell, str) and _all_strings(obj, column):
            raise string_column(column, meta[column].dtype, cell, shown_vector_columns(meta), lazy)
    return spec


def _all_strings(obj: Any, column: Any) -> bool:
    """Whether every non-null cell of ``obj[column]`` (an eager frame's, or the frame's in
    memory behind a ``dd.from_pandas`` collection) is a string: a column of text.  A
    string among vectors is one bad row, which reading the vectors names instead."""
    series = _pandas_source(obj, column) if is_dask_collection(obj) else obj[column]
    if series is None:
        return False
    return all(isinstance(cell, str) for cell in to_pandas(series).dropna())


def _first_string(obj: Any, column: Any) -> str | None:
    """:func:`_first_cell` of ``obj[column]`` as text (for an error's example)."""
    cell = _first_cell(obj, column)
    return None if cell is None else str(cell)


def _first_cell(
    obj: Any, column: Any, cells: int | None = None, partitions: int = 3, compute: bool = True
) -> Any:
    """The first non-null of the first ``cells`` (None: all) cells of ``obj[column]``: of
    an eager frame, of the frame in memory behind a dask frame made by ``dd.from_pandas``
    (as it was before dask turned it into text), else, with ``compute``, of the first
    ``partitions`` partitions; None when there is none or reading failed."""
    try:
        if not is_dask_collection(obj):
            heads = [obj[column].iloc[:cells].dropna().head(1)]
        elif (source := _pandas_source(obj, column)) is not None:
            heads = [source.iloc[:cells].dropna().head(1)]
        elif compute:
            series = obj[column]
            n = min(series.npartitions, partitions)
            heads = dask_compute(
                *[series.partitions[i].dropna().head(1, npartitions=1, compute=False)
                  for i in range(n)]
            )  # fmt: skip
        else:
            return None
        for head in heads:
            if len(head):
                return to_pandas(head).iloc[0]
    except Exception:  # the error being raised matters more than its example
        return None
    return None


# Expressions whose column is the column of their frame, rows aside.
_PASSING = {
    "Projection", "Filter", "Head", "Tail", "Partitions", "Repartition",
    "RepartitionToFewer", "RepartitionToMore", "ArrowStringConversion",
}  # fmt: skip


def expression_kinds(expr: Any) -> set[str]:
    """The names of the classes of the dask expression ``expr`` (its own and its bases):
    dask's expression classes are not its API, so they are told apart by name."""
    return {c.__name__ for c in type(expr).__mro__}


def _pandas_source(obj: Any, column: Any) -> Any:
    """``column`` of the frame a ``dd.from_pandas`` collection holds in memory, where the
    collection's column is that one (selected, filtered, not computed anew: a column
    that ``df[c] = df[c].map(json.loads, ...)`` made is not the text it was made of),
    or None."""
    data = _in_memory_frame(obj, column)
    return data[column] if column in getattr(data, "columns", ()) else None


def in_memory_index(obj: Any) -> Any:
    """The index of the frame a ``dd.from_pandas`` collection ``obj`` holds in memory,
    where each step above it keeps every row and its label (a column selection,
    ``assign``, a repartition: not a filter, whose rows are fewer, nor ``set_index``),
    or None."""
    data = _in_memory_frame(obj, steps=_EVERY_ROW)
    return None if data is None else getattr(data, "index", None)


_NO_COLUMN = object()
# Expressions whose rows are their frame's, every one, labels and order kept.
_EVERY_ROW = {
    "Projection", "Repartition", "RepartitionToFewer", "RepartitionToMore",
    "ArrowStringConversion", "Assign",
}  # fmt: skip


def _in_memory_frame(
    obj: Any, column: Any = _NO_COLUMN, steps: set[str] = _PASSING | {"Assign"}
) -> Any:
    """The frame (pandas; cudf) a ``dd.from_pandas`` collection holds in memory, where
    each step from it to ``obj`` is of ``steps`` (by default those that keep the rows'
    labels, some of the rows) and, given ``column``, keeps that column (an ``assign`` of
    it makes another); else None."""
    expr = getattr(obj, "expr", None)
    while expr is not None:
        kinds = expression_kinds(expr)
        if "FromPandas" in kinds:
            return getattr(expr.frame, "_data", expr.frame)
        if "Assign" in kinds and column is not _NO_COLUMN and column in getattr(expr, "keys", ()):
            return None
        if not kinds & steps:
            return None
        expr = getattr(expr, "frame", None)
    return None


def in_memory_sources(obj: Any) -> list[Any]:
    """The expressions of the dask collection ``obj`` that hold a frame in memory
    (``dd.from_pandas``'s FromPandas, or a subclass of it); none for another object."""
    expr = getattr(obj, "expr", None)
    if expr is None:
        return []
    return [e for e in expr.walk() if "FromPandas" in expression_kinds(e)]


def vector_columns(meta: Any) -> list[Any]:
    """Columns whose dtype alone says they hold vectors (Arrow or cudf lists of numbers)."""
    found = []
    for column in meta.columns:
        try:
            spec = vector_spec(meta[column], str(column))
        except TypeError:
            continue
        if spec.dtype is not None:  # object columns could hold anything: name them
            found.append(column)
    return found


def shown_vector_columns(frame: Any) -> list[Any]:
    """The columns an error names as the frame's vectors: :func:`vector_columns`, and,
    for a pandas frame with rows (an eager one), its object columns whose first cell
    with values is a vector (:func:`dask_cosim.io.convert.vector_columns`), in the
    frame's order.  A dask frame's meta has no rows: its dtypes alone tell."""
    import pandas as pd

    found = set(vector_columns(frame))
    if isinstance(frame, pd.DataFrame) and len(frame):
        from dask_cosim.io.convert import vector_columns as object_vectors

        found.update(object_vectors(frame))
    return [c for c in frame.columns if c in found]


def same_label(a: Any, b: Any) -> bool:
    """Whether two column labels name one column: equal, or both NaN (which pandas
    matches as one label, though NaN != NaN)."""
    return bool(a == b) or (a != a and b != b)


def is_vector_series(obj: Any) -> bool:
    """Whether ``obj`` is a Series of a library :func:`to_vectors` reads (pandas, cudf)."""
    try:
        to_vectors.dispatch(type(obj))
    except TypeError:
        return False
    return True


def concat_frames(frames: list[Any]) -> Any:
    """Frames of one library, one after the other (dask's ``concat`` dispatch, which
    pandas and cudf both register)."""
    from dask.dataframe.dispatch import concat

    return concat(frames)


def row_label(index: Any, position: int) -> Any:
    """The index label at ``position``, as a plain Python value (for error messages;
    a device index is copied to the host, which only error paths do)."""
    label = to_pandas(index)[position]
    if isinstance(label, tuple):  # a MultiIndex's: each level's value plain too
        return tuple(v.item() if hasattr(v, "item") else v for v in label)
    return label.item() if hasattr(label, "item") else label


def frame_from_arrow(table: pa.Table, backend: str = "pandas") -> Any:
    """An Arrow table (vectors as fixed_size_list) -> a pandas or cudf DataFrame.

    pandas: vector columns become ``pd.ArrowDtype`` columns sharing the table's buffers;
    the index is restored from the pandas metadata.  cudf: one host-to-device copy.
    """
    if backend == "cudf":
        from dask_cosim.backends import cudf as cudf_backend

        return cudf_backend.frame_from_arrow(table)
    return pandas_backend.frame_from_arrow(table)


def _register_cudf() -> None:
    import dask_cosim.backends.cudf  # noqa: F401  (registers the cudf types)


def _register_cupy() -> None:
    import cupy

    @to_host_tensor.register(cupy.ndarray)
    def _cupy_to_host_tensor(array: Any) -> torch.Tensor:
        return torch.as_tensor(array.get())


for _dispatch in (
    vector_spec,
    to_vectors,
    make_result,
    to_pandas,
    is_device_frame,
    boolean_mask,
    take_to_pandas,
    frame_like,
    data_token,
):
    _dispatch.register_lazy("cudf", _register_cudf)
to_host_tensor.register_lazy("cupy", _register_cupy)

# pandas and numpy: registered now (the module registers itself on import).
from dask_cosim.backends import pandas as pandas_backend  # noqa: E402
from dask_cosim.backends.pandas import (  # noqa: E402
    arrow_dtype_parses,
    arrow_vector_types,
    stack_object_column,
)
