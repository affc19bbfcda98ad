"""Getting embedding frames into dask without losing them.

- :func:`from_pandas`: object columns of per-row arrays/tensors -> Arrow fixed_size_list,
  then ``dd.from_pandas`` (which would otherwise turn them into truncated strings).
- :func:`read_parquet`: list columns stay Arrow lists (pandas) or cudf list columns.
"""

from __future__ import annotations

import math
from typing import Any

import dask.config
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from dask_cosim import backends

__all__ = ["from_pandas", "read_parquet", "vectors_to_arrow", "vector_columns"]

# Partition size from_pandas aims at when neither npartitions nor chunksize is given.
_TARGET_PARTITION_BYTES = 128 * 2**20


def vectors_to_arrow(
    values: np.ndarray | torch.Tensor, null: np.ndarray | None = None
) -> pd.arrays.ArrowExtensionArray:
    """(N, D) numbers -> an Arrow fixed_size_list<D> extension array (null rows masked).

    bfloat16, which numpy and Arrow lack, becomes float32.
    """
    if isinstance(values, torch.Tensor):
        if values.dtype == torch.bfloat16:
            values = values.float()
        values = values.detach().cpu().contiguous().numpy()
    values = np.ascontiguousarray(values)
    n, dim = values.shape
    flat = pa.array(values.reshape(-1))
    validity = None
    if null is not None and null.any():
        # A bit-packed validity buffer (from_arrays gained mask= only in newer pyarrow).
        validity = pa.array(~np.asarray(null, dtype=bool)).buffers()[1]
    array = pa.Array.from_buffers(pa.list_(flat.type, dim), n, [validity], children=[flat])
    return pd.arrays.ArrowExtensionArray(array)


def vector_columns(pdf: pd.DataFrame) -> list[str]:
    """Object columns whose first non-null cell is an array, tensor or list of numbers."""
    found = []
    for column in pdf.columns:
        series = pdf[column]
        if series.dtype != object:
            continue
        first = series.dropna()
        if len(first) and isinstance(first.iloc[0], (np.ndarray, torch.Tensor, list, tuple)):
            found.append(column)
    return found


def from_pandas(
    pdf: pd.DataFrame,
    npartitions: int | None = None,
    chunksize: int | None = None,
    sort: bool = True,
) -> dd.DataFrame:
    """A dask DataFrame from a pandas one, keeping per-row vectors as vectors.

    Object columns holding one numpy array, torch tensor or list of numbers per row (any
    shape with D elements, e.g. (300, 1)) become Arrow ``fixed_size_list<D>`` columns in
    one vectorised stack; other columns pass through unchanged.

    Parameters
    ----------
    pdf : pandas.DataFrame
    npartitions : int, optional
        As in ``dd.from_pandas``.  With neither ``npartitions`` nor ``chunksize``, about
        128 MiB per partition.
    chunksize : int, optional
        Rows per partition, as in ``dd.from_pandas``.
    sort : bool, default True
        As in ``dd.from_pandas``.

    Raises
    ------
    TypeError
        A vector column holds a non-numeric cell (names the column and row label).
    ValueError
        Ragged rows (names the column, the row label and both lengths).
    """
    if not isinstance(pdf, pd.DataFrame):
        raise TypeError(f"from_pandas expects a pandas.DataFrame, got {type(pdf).__name__}")
    converted = pdf.copy(deep=False)
    for column in vector_columns(pdf):
        values, null = backends.stack_object_column(pdf[column].to_numpy(), pdf.index, str(column))
        converted[column] = pd.Series(vectors_to_arrow(values, null), index=pdf.index)
    if npartitions is None and chunksize is None:
        nbytes = int(converted.memory_usage(deep=False, index=True).sum())
        npartitions = max(1, min(len(converted), math.ceil(nbytes / _TARGET_PARTITION_BYTES)))
    return dd.from_pandas(converted, npartitions=npartitions, chunksize=chunksize, sort=sort)


def read_parquet(path: Any, columns: list[str] | None = None, **kwargs: Any) -> dd.DataFrame:
    """Read Parquet into a dask DataFrame whose embedding columns stay vectors.

    pandas backend: list columns come back as Arrow list types (``fixed_size_list`` when
    stored so), through pyarrow's own filesystem for local paths (fsspec file objects cost
    ~5x here), not as object columns of numpy arrays.  With dask's ``dataframe.backend``
    set to "cudf": cudf list columns (dask_cudf).

    Parameters
    ----------
    path : str, list of str or path-like
        File, directory, glob or fsspec URL.
    columns : list of str, optional
    **kwargs
        Passed to ``dask.dataframe.read_parquet`` (they win over the defaults above).
    """
    if dask.config.get("dataframe.backend", "pandas") == "cudf":
        return dd.read_parquet(path, columns=columns, **kwargs)
    arrow_to_pandas = dict(kwargs.pop("arrow_to_pandas", None) or {})
    arrow_to_pandas.setdefault("types_mapper", arrow_vector_types)
    kwargs["arrow_to_pandas"] = arrow_to_pandas
    if "filesystem" not in kwargs and "storage_options" not in kwargs and _all_local(path):
        try:
            return dd.read_parquet(path, columns=columns, filesystem="arrow", **kwargs)
        except (NotImplementedError, TypeError) as err:
            # dask's pyarrow-filesystem reader builds its meta from the pandas metadata in
            # the file, where pandas wrote Arrow list dtypes as strings it cannot parse
            # back ("list<item: float>[pyarrow]", seen with pandas 3.1); the fsspec reader
            # honours our types_mapper instead.
            if "[pyarrow]" not in str(err) and "type specific parameters" not in str(err):
                raise
    return dd.read_parquet(path, columns=columns, **kwargs)


def arrow_vector_types(arrow_type: pa.DataType) -> pd.ArrowDtype | None:
    """``types_mapper`` for ``Table.to_pandas``: list columns stay Arrow, all else default.

    Mapping them explicitly also keeps pandas from parsing the dtype string it wrote into
    the file's metadata, which it cannot do for fixed_size_list ("Passing pyarrow type
    specific parameters ([300]) in the string is not supported").
    """
    if (
        pa.types.is_fixed_size_list(arrow_type)
        or pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
    ):
        return pd.ArrowDtype(arrow_type)
    return None


def _all_local(path: Any) -> bool:
    paths = path if isinstance(path, (list, tuple)) else [path]
    return all("://" not in str(p) or str(p).startswith("file://") for p in paths)
