"""Categoricals that a Parquet read does not give back by itself.

pyarrow writes a categorical as a dictionary column and records it in the pandas metadata
(``pandas_type`` "categorical", ``ordered``, ``num_categories``), but reads back only
dictionaries of strings as categoricals: one of numbers comes back as plain numbers, and
Parquet keeps neither the categories no row uses nor their order.  So:

- :func:`recorded`: our writer records the categories of a categorical of numbers (column
  or index) in its pandas metadata entry (``metadata.categories``), beside pyarrow's own
  keys, which other readers ignore;
- :func:`as_stored`: each partition read gets its categoricals of numbers back, with the
  recorded categories and order where the file has them, else (files of other writers)
  the values the partition holds, sorted and unordered, as dask's reader gives a column
  (the stored order of categories is not known, so comparisons are not offered); and
  where no row holds a value, a categorical of strings pyarrow gave back with categories
  of no type (object) gets them typed as stored where pandas has a type for strings
  (``str``, pandas 3; on pandas 2 they stay object, and :func:`typed_dictionaries`
  stores them as strings);
- :func:`as_meta`: the frame's meta has every stored categorical with unknown categories
  (dask's convention: partitions may hold different ones) and the stored ``ordered``;
- :func:`typed_dictionaries`: on the way to a file, a categorical whose categories have
  no type (pandas 2 reads strings as object, so a categorical of strings with no
  categories is one) is stored as a dictionary of strings, not of nulls.

pandas frames only: cudf frames are left as cudf reads them.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd
import pyarrow as pa
from dask.dataframe.utils import UNKNOWN_CATEGORIES

__all__ = ["as_meta", "as_stored", "recorded", "typed_dictionaries"]


def recorded(table: pa.Table, metadata: dict[bytes, bytes] | None) -> dict[bytes, bytes] | None:
    """``metadata`` (``table``'s, as it will be written) with the categories of each
    categorical of integers or finite floats recorded in its pandas metadata entry."""
    if not metadata or b"pandas" not in metadata:
        return metadata
    pandas_meta = json.loads(metadata[b"pandas"])
    for entry in _categorical_entries(pandas_meta, table.column_names):
        described = entry.get("metadata") or {}
        column = table.column(entry["field_name"])
        t = column.type
        if not pa.types.is_dictionary(t) or column.num_chunks != 1:
            continue
        if not _numbers(t.value_type):
            continue  # strings come back by themselves; other types are not JSON numbers
        categories = column.chunk(0).dictionary.to_pylist()
        # A dictionary that is not the whole set of categories (a writer that leaves out
        # those unused) is not recorded: the read would lose rows' values to NaN.
        if len(categories) != described.get("num_categories"):
            continue
        if all(isinstance(c, int) or math.isfinite(c) for c in categories):
            entry["metadata"] = {**described, "categories": categories}
    return {**metadata, b"pandas": json.dumps(pandas_meta).encode()}


def typed_dictionaries(table: pa.Table) -> pa.Table:
    """``table`` (as it will be written) with each categorical stored as a dictionary of
    nulls made a dictionary of strings.

    pyarrow gives a dictionary of nulls to a categorical whose categories are an empty
    object index.  pandas 2 reads strings as object, so that is what a categorical of
    strings becomes where no row holds a value (a zero-row partition, as the first read
    gives it back): stored so, the next read gives a ``string`` column, and the folder's
    files disagree on the column's type.  Categories of numbers are typed even when empty
    (:func:`as_stored`), so object categories of no type are taken as strings, which is
    what pandas 3 gives them."""
    described = table.schema.pandas_metadata or {}
    categorical = {e["field_name"] for e in _categorical_entries(described, table.column_names)}
    for i, field in enumerate(table.schema):
        t = field.type
        if field.name not in categorical or not pa.types.is_dictionary(t):
            continue
        if not pa.types.is_null(t.value_type):
            continue
        typed = pa.dictionary(t.index_type, pa.string(), t.ordered)
        chunks = [
            pa.DictionaryArray.from_arrays(c.indices, pa.array([], pa.string()), ordered=t.ordered)
            for c in table.column(i).chunks
        ]
        table = table.set_column(i, field.with_type(typed), pa.chunked_array(chunks, typed))
    return table


def as_stored(df: Any, schema: pa.Schema) -> Any:
    """``df`` (read from a file of ``schema``) with its stored categoricals that pyarrow
    gave back as plain values made categorical again (see the module's docstring)."""
    for target, entry in _categoricals(df, schema):
        values = df.index if target is None else df[target]
        t = schema.field(entry["field_name"]).type
        if isinstance(values.dtype, pd.CategoricalDtype):
            restored = _typed_categories(values, t)
        elif not _numbers(t):
            continue  # strings came back categorical; other types stay as pyarrow reads them
        else:
            restored = _numbers_restored(values, t, entry)
        if target is None:
            df.index = restored
        else:
            df[target] = restored
    return df


def _typed_categories(values: Any, t: pa.DataType) -> Any:
    """A categorical pyarrow gave back: with no categories (no row holds a value), those
    are of no type (object), so they get the type pyarrow gives the values, where that is
    not object too (strings on pandas 2: :func:`typed_dictionaries` types them on write)."""
    categories = values.dtype.categories
    if len(categories) or not pa.types.is_dictionary(t):
        return values
    typed = pd.Index(pa.array([], t.value_type).to_pandas())
    if typed.dtype == categories.dtype:
        return values
    return values.astype(pd.CategoricalDtype(typed, values.dtype.ordered))


def _numbers_restored(values: Any, t: pa.DataType, entry: dict[str, Any]) -> Any:
    """A categorical of numbers pyarrow gave back as plain numbers, made categorical: the
    recorded categories and order where the file has them, else the values, sorted."""
    stored = pd.api.types.pandas_dtype(t.to_pandas_dtype())  # (values: float with nulls)
    described = entry.get("metadata") or {}
    if "categories" in described:
        categories = pd.Index(described["categories"], dtype=stored)
        ordered = bool(described.get("ordered"))
    else:  # unknown to the file: the values here, in order (dask's reader's way)
        categories = pd.Index(values.dropna().unique()).astype(stored).sort_values()
        ordered = False
    return values.astype(pd.CategoricalDtype(categories, ordered))


def as_meta(meta: Any, schema: pa.Schema) -> Any:
    """The meta (``meta``: an empty frame read from ``schema``) of a read: each stored
    categorical with unknown categories and its stored order (see :func:`as_stored`)."""
    meta = as_stored(meta, schema)
    for target, _ in _categoricals(meta, schema):
        values = meta.index if target is None else meta[target]
        if isinstance(values.dtype, pd.CategoricalDtype):
            unknown = pd.CategoricalDtype([UNKNOWN_CATEGORIES], values.dtype.ordered)
            if target is None:
                meta.index = values.astype(unknown)
            else:
                meta[target] = values.astype(unknown)
    return meta


def _categorical_entries(described: dict[str, Any], names: list[str]) -> list[dict[str, Any]]:
    """The entries of pandas metadata ``described`` that are categoricals stored in one of
    the fields ``names``."""
    return [
        e for e in described.get("columns", [])
        if e.get("pandas_type") == "categorical" and e.get("field_name") in names
    ]  # fmt: skip


def _numbers(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _categoricals(df: Any, schema: pa.Schema) -> list[tuple[Any, dict[str, Any]]]:
    """(column name, or None for the index, pandas metadata entry) of each categorical
    the file stores that ``df`` holds (an index of one level only)."""
    if not isinstance(df, pd.DataFrame):
        return []
    described = schema.pandas_metadata or {}
    index = [n for n in described.get("index_columns", []) if isinstance(n, str)]
    found = []
    for entry in _categorical_entries(described, schema.names):
        if entry["field_name"] in index:
            if len(index) == 1 and df.index.nlevels == 1:
                found.append((None, entry))
        elif entry.get("name") in df.columns:
            found.append((entry["name"], entry))
    return found
