"""The index range of each file :func:`~dask_cosim.to_parquet` writes, and the folder's
divisions, in the manifest: encoded when written, decoded when read.

Numbers and strings are JSON values: the manifest's ``divisions`` holds them as they are,
which is how readers of the format's first version take them.  Timestamps (any unit, with
or without a time zone), durations and dates are Arrow's integers in their unit, under
``index_type`` (the kind, unit and time zone, once) and ``encoded_divisions``; their
``divisions`` is null, so that those readers see no divisions rather than integers.  A
reader turns the integers back into labels through the files' own index type and the
conversion their data goes through (pandas metadata, then dask's ``convert-string``), so
the divisions are of the type, unit and time zone of the labels it reads, or None when
they would not be (an encoding it does not know, a type that does not match).

Other indexes get no divisions: decimals, bytes, booleans, times of day, categoricals
(ordered by their categories, not their values), intervals and periods.
"""

from __future__ import annotations

import itertools
from typing import Any

import pyarrow as pa
from dask.dataframe._pyarrow import to_pyarrow_string
from dask.dataframe.utils import pyarrow_strings_enabled

from dask_cosim import backends
from dask_cosim.backends.pandas import is_string_type

__all__ = ["index_range", "manifest_divisions", "manifest_entries"]

# A file's range: [first, last] as JSON values, or {"type": ..., "range": [first, last]}
# encoded (``type``: what ``index_type`` holds), or None.
Range = list[Any] | dict[str, Any] | None


def index_range(index: Any) -> Range:
    """[first, last] of a sorted pandas or cudf index of numbers or strings; for
    timestamps, durations and dates, their encoding; else None."""
    if len(index) == 0 or not index.is_monotonic_increasing:
        return None
    pair = index[[0, -1]]
    try:  # cudf's own conversion, or the one pyarrow.Table.from_pandas makes
        bounds = pair.to_arrow() if hasattr(pair, "to_arrow") else pa.array(pair)
    except (pa.ArrowException, TypeError, ValueError):
        return None
    if bounds.null_count:
        return None
    kind = _type_of(bounds.type)
    if kind is not None:
        storage = pa.int32() if pa.types.is_date32(bounds.type) else pa.int64()
        return {"type": kind, "range": bounds.cast(storage).to_pylist()}
    t = bounds.type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or is_string_type(t):
        values = bounds.to_pylist()
        if all(isinstance(v, (int, float, str)) for v in values):
            return values
    return None


def manifest_entries(ranges: list[Range]) -> tuple[list[Range], dict[str, Any]]:
    """Each file's range as the manifest holds it, and the manifest's ``divisions`` (with
    ``index_type`` and ``encoded_divisions`` for encoded labels), from the files' ranges
    in order: divisions when every file has a range of one type, each past the last."""
    encoded = [r for r in ranges if isinstance(r, dict)]
    if not encoded:
        return ranges, {"divisions": _divisions(ranges)}
    kind = encoded[0]["type"]
    if len(encoded) < len(ranges) or any(r["type"] != kind for r in encoded):
        return [None] * len(ranges), {"divisions": None}
    bounds: list[Range] = [r["range"] for r in encoded]
    return bounds, {"divisions": None, "index_type": kind, "encoded_divisions": _divisions(bounds)}


def manifest_divisions(
    manifest: dict[str, Any] | None, schema: pa.Schema, meta: Any
) -> list[Any] | None:
    """The divisions of a folder read with ``manifest``, whose first file has ``schema``
    and whose frame has ``meta`` (before dask's string conversion), or None."""
    if manifest is None:
        return None
    if "index_type" not in manifest:
        return manifest.get("divisions")  # numbers and strings, JSON's own
    kind, values = manifest["index_type"], manifest.get("encoded_divisions")
    t = _arrow_type(kind)
    names = (schema.pandas_metadata or {}).get("index_columns") or []
    if t is None or not isinstance(values, list) or len(names) != 1:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return None
    if not isinstance(names[0], str) or names[0] not in schema.names:
        return None
    field = schema.field(names[0])
    stored = _type_of(field.type)
    if stored is None or _sort(stored) != _sort(kind):
        return None  # the files' index is of another kind, or zone, than the labels'
    try:  # into the files' unit (a timestamp in s is stored in ms), only where exact
        labels = pa.array(values, type=t).cast(field.type, safe=True)
    except (pa.ArrowException, OverflowError):
        return None
    table = pa.Table.from_arrays([labels], schema=pa.schema([field], metadata=schema.metadata))
    index = backends.frame_from_arrow(table, "pandas").index
    if str(index.dtype) != str(meta.index.dtype):
        return None
    if pyarrow_strings_enabled() and not backends.is_device_frame(meta):
        index = to_pyarrow_string(index)  # what dask does to the data's index (dates)
    if not index.is_monotonic_increasing or not index[:-1].is_unique:
        return None
    return index.tolist()


def _divisions(ranges: list[Any]) -> list[Any] | None:
    """dask divisions from each file's [first, last] index, if they line up in order."""
    if not ranges or any(not isinstance(r, list) for r in ranges):
        return None
    if any(prev[1] >= nxt[0] for prev, nxt in itertools.pairwise(ranges)):
        return None
    return [r[0] for r in ranges] + [ranges[-1][1]]


def _type_of(t: pa.DataType) -> dict[str, Any] | None:
    """``index_type`` for an Arrow type whose labels are encoded, else None."""
    if pa.types.is_timestamp(t):
        return {"kind": "timestamp", "unit": t.unit, "tz": t.tz}
    if pa.types.is_duration(t):
        return {"kind": "duration", "unit": t.unit}
    if pa.types.is_date32(t) or pa.types.is_date64(t):
        return {"kind": str(t).split("[")[0]}
    return None


def _sort(kind: dict[str, Any]) -> dict[str, Any]:
    """``index_type`` without its unit: dates of either width alike (Parquet stores a
    date64 index as date32, and the reader gives it back as date64)."""
    return {**kind, "unit": None, "kind": str(kind.get("kind")).replace("date64", "date32")}


_UNITS = ("s", "ms", "us", "ns")


def _arrow_type(kind: Any) -> pa.DataType | None:
    """The Arrow type an ``index_type`` describes; None for one this reader does not know."""
    if not isinstance(kind, dict):
        return None
    name, unit, tz = kind.get("kind"), kind.get("unit"), kind.get("tz")
    try:
        if name == "timestamp" and unit in _UNITS and (tz is None or isinstance(tz, str)):
            return pa.timestamp(unit, tz)
    except (pa.ArrowException, ValueError):
        return None  # a time zone pyarrow does not know
    if name == "duration" and unit in _UNITS:
        return pa.duration(unit)
    if name in ("date32", "date64"):
        return pa.date32() if name == "date32" else pa.date64()
    return None
