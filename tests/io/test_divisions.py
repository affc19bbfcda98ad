"""Divisions through a Parquet round trip: every sorted index whose values can be ordered
and written to the manifest without loss reads back with the divisions dask gives its data
(same type, value, unit and time zone); other indexes, and encodings a reader does not
know, read back with none."""

from __future__ import annotations

import datetime
import decimal
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dask_cosim
from dask_cosim.io import MANIFEST, cudf_parquet
from dask_cosim.io.divisions import manifest_divisions
from dask_cosim.io.files import parquet_files
from dask_cosim.io.read import _gpu_pieces

N = 40
HOURS = np.arange(N) * (3600 * 10**9 + 7)  # hours and 7 ns: lost by any coarser unit
DAYS = [datetime.date(2023, 12, 30) + datetime.timedelta(days=i) for i in range(N)]

# name -> (the index, the dtype it reads back with, a date string for .loc or None)
INDEXES: dict[str, tuple[Callable[[], pd.Index], str, str | None]] = {
    "datetime64[ns]": (
        lambda: pd.DatetimeIndex(np.datetime64("2024-01-01", "ns") + HOURS),
        "datetime64[ns]",
        "2024-01-02",
    ),
    "datetime64[us]": (
        lambda: pd.date_range("2024-01-01", periods=N, freq="h", unit="us"),
        "datetime64[us]",
        "2024-01-02",
    ),
    "datetime64[s]": (  # Parquet has no seconds: read back in ms, the same instants
        lambda: pd.date_range("2024-01-01", periods=N, freq="h", unit="s"),
        "datetime64[ms]",
        "2024-01-02",
    ),
    "datetime64[ns, UTC]": (
        lambda: pd.DatetimeIndex(np.datetime64("2024-01-01", "ns") + HOURS).tz_localize("UTC"),
        "datetime64[ns, UTC]",
        "2024-01-02",
    ),
    "datetime64[ms, Europe/Berlin]": (
        lambda: pd.date_range("2024-03-30", periods=N, freq="h", tz="Europe/Berlin", unit="ms"),
        "datetime64[ms, Europe/Berlin]",
        "2024-03-31",
    ),
    "datetime64[us, UTC+05:30]": (
        lambda: pd.date_range(
            "2024-01-01",
            periods=N,
            freq="h",
            unit="us",
            tz=datetime.timezone(datetime.timedelta(hours=5, minutes=30)),
        ),
        "datetime64[us, UTC+05:30]",
        "2024-01-02",
    ),
    "timestamp[ns, tz=UTC][pyarrow]": (  # read back as numpy datetimes, like any timestamp
        lambda: pd.Index(
            pd.array(
                pd.date_range("2024", periods=N, freq="h", tz="UTC"),
                dtype="timestamp[ns, tz=UTC][pyarrow]",
            )
        ),
        "datetime64[ns, UTC]",
        "2024-01-02",
    ),
    "timedelta64[ns]": (lambda: pd.TimedeltaIndex(HOURS), "timedelta64[ns]", None),
    "timedelta64[s]": (
        lambda: pd.timedelta_range("1s", periods=N, freq="s", unit="s"),
        "timedelta64[s]",
        None,
    ),
    "date32[pyarrow]": (  # read back as written (no longer as strings)
        lambda: pd.Index(pd.array(DAYS, dtype="date32[pyarrow]")),
        "date32[day][pyarrow]",
        None,
    ),
    "int64": (lambda: pd.Index(np.arange(N) * 3 - 50), "int64", None),
    "uint64": (lambda: pd.Index(np.arange(N, dtype="uint64") + 2**63), "uint64", None),
    "float32": (lambda: pd.Index(np.arange(N, dtype="float32") / 3), "float32", None),
    "str": (lambda: pd.Index([f"k{i:03d}" for i in range(N)], dtype="str"), "string", None),
}


def written(tmp_path: Path, index: pd.Index, npartitions: int = 3) -> tuple[Any, Any]:
    """(dask's frame of ``index``, the frame read back from its folder)."""
    pdf = pd.DataFrame({"x": np.arange(len(index))}, index=index.rename("when"))
    ddf = dd.from_pandas(pdf, npartitions=npartitions)
    dask_cosim.to_parquet(ddf, tmp_path / "out")
    return ddf, dask_cosim.read_parquet(tmp_path / "out")


def data_divisions(ddf: Any) -> tuple[Any, ...]:
    """The divisions dask gives the frame's data: each partition's first label, and the
    last one, as dask takes them (``tolist``: Python and pandas scalars)."""
    parts = [ddf.get_partition(i).compute().index for i in range(ddf.npartitions)]
    return (*(p[:1].tolist()[0] for p in parts), parts[-1][-1:].tolist()[0])


def zone_name(tz: Any) -> str:
    """``str(tz)``, a pytz fixed offset (pandas 2 reads Arrow's '+05:30' as
    ``pytz.FixedOffset(330)``, as its own ``read_parquet`` does) named as pandas 3 names
    the same zone ('UTC+05:30')."""
    if type(tz).__name__ == "_FixedOffset":
        return str(datetime.timezone(tz.utcoffset(None)))
    return str(tz)


def dtype_name(dtype: Any) -> str:
    """``str(dtype)``, its zone named by :func:`zone_name`."""
    if isinstance(dtype, pd.DatetimeTZDtype):
        return f"datetime64[{dtype.unit}, {zone_name(dtype.tz)}]"
    return str(dtype)


def same_zone(a: Any, b: Any) -> bool:
    """``a == b``, or both the same pytz zone (pandas 2): a pytz timestamp's zone is
    localised to its time ('CET+1:00:00 STD') and unequal to the dtype's ('LMT+0:53:00')."""
    return bool(a == b) or (hasattr(a, "zone") and hasattr(b, "zone") and a.zone == b.zone)


def assert_identical(got: tuple[Any, ...], want: tuple[Any, ...]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert type(g) is type(w) and g == w, (g, w)
        if isinstance(w, (pd.Timestamp, pd.Timedelta)):
            assert g.unit == w.unit, (g, w)
        if isinstance(w, pd.Timestamp):  # (UTC: datetime's or zoneinfo's, as read)
            assert zone_name(g.tz) == zone_name(w.tz), (g, w)


@pytest.mark.parametrize("name", list(INDEXES))
def test_sorted_index_keeps_its_divisions(tmp_path: Path, name: str) -> None:
    make, dtype, day = INDEXES[name]
    ddf, back = written(tmp_path, make())
    assert dtype_name(back._meta.index.dtype) == dtype and back.known_divisions
    assert back.npartitions == ddf.npartitions
    assert_identical(back.divisions, data_divisions(back))
    if isinstance(back._meta.index.dtype, pd.DatetimeTZDtype):  # the data's own zone
        assert all(same_zone(d.tz, back._meta.index.tz) for d in back.divisions)
    if str(ddf._meta.index.dtype) == dtype:  # read back as written: dask's own divisions
        assert_identical(back.divisions, ddf.divisions)
    else:  # the same labels, in the unit or type the data reads back in
        assert list(back.divisions) == [type(d)(w) for d, w in zip(back.divisions, ddf.divisions)]
    want = back.compute()
    label = want.index[N // 2]
    pd.testing.assert_frame_equal(back.loc[label:].compute(), want.loc[label:])
    if day is not None:  # a day of timestamps, or one label of strings
        expected = want.loc[day] if want.index.dtype.kind == "M" else want.loc[[day]]
        pd.testing.assert_frame_equal(back.loc[day].compute(), expected)
        assert len(expected)


@pytest.mark.parametrize("convert_string", [True, False], ids=["strings", "dates"])
def test_dates_keep_divisions_of_the_type_they_read_back_in(
    tmp_path: Path, convert_string: bool
) -> None:
    """An index of ``datetime.date`` objects is stored as dates and read back as dates,
    or as their ISO strings under dask's ``dataframe.convert-string`` (order kept): the
    divisions are of that type."""
    with dask.config.set({"dataframe.convert-string": convert_string}):
        _, back = written(tmp_path, pd.Index(DAYS, dtype=object))
        assert back.known_divisions
        assert_identical(back.divisions, data_divisions(back))
        first = back.divisions[0]
        assert first == ("2023-12-30" if convert_string else datetime.date(2023, 12, 30))
        label = back.divisions[1]
        got = back.loc[label:].compute()
        assert got.index[0] == label and len(got) == N - DAYS.index(
            label if isinstance(label, datetime.date) else datetime.date.fromisoformat(label)
        )


@pytest.mark.parametrize("convert_string", [True, False])
@pytest.mark.parametrize("arrow", ["date32", "date64"])
def test_arrow_dates_read_back_as_arrow_dates(
    tmp_path: Path, convert_string: bool, arrow: str
) -> None:
    """A ``date32[pyarrow]`` index and column read back as written, with divisions of
    ``datetime.date``s, under either setting of ``convert-string`` (the index came back as
    strings with it, as ``datetime.date`` objects without)."""
    dates = pd.array(DAYS, dtype=f"{arrow}[pyarrow]")
    pdf = pd.DataFrame({"x": np.arange(N), "day": dates}, index=pd.Index(dates, name="when"))
    with dask.config.set({"dataframe.convert-string": convert_string}):
        dask_cosim.to_parquet(dd.from_pandas(pdf, npartitions=3), tmp_path / "out")
        back = dask_cosim.read_parquet(tmp_path / "out")
        got = back.compute()
    pd.testing.assert_frame_equal(got, pdf)
    assert back._meta.index.dtype == pdf.index.dtype
    assert back.known_divisions and back.divisions[0] == DAYS[0]
    assert all(type(d) is datetime.date for d in back.divisions)
    assert len(back.loc[DAYS[7] :].compute()) == N - 7


UNORDERED = {
    # Their labels read back as strings under dask's convert-string, where order differs
    # (and, strings or not, Decimals of one scale and bytes are rare as an index).
    "Decimal": lambda: pd.Index([decimal.Decimal(i) / 4 for i in range(N)], dtype=object),
    "bytes": lambda: pd.Index([b"k%03d" % i for i in range(N)], dtype=object),
    # Sorted by its categories' order, not its values'.
    "categorical": lambda: pd.CategoricalIndex(
        [f"k{i:03d}" for i in range(N)], categories=[f"k{i:03d}" for i in range(N)][::-1]
    )[::-1],
    "bool": lambda: pd.Index([False] * (N // 2) + [True] * (N // 2)),
}


@pytest.mark.parametrize("name", list(UNORDERED))
def test_indexes_without_a_lossless_order_get_no_divisions(tmp_path: Path, name: str) -> None:
    index = UNORDERED[name]()
    assert index.is_monotonic_increasing
    pdf = pd.DataFrame({"x": np.arange(N)}, index=index)
    for parts in (1, 2):
        with dask.config.set({"dataframe.convert-string": False}):
            ddf = dd.from_pandas(pdf, npartitions=parts, sort=False)
            manifest = dask_cosim.to_parquet(ddf, tmp_path / f"{parts}")
        assert manifest["divisions"] is None and "index_type" not in manifest


def test_older_readers_see_no_divisions_and_unknown_encodings_give_none(tmp_path: Path) -> None:
    """Readers of the format's first version take ``divisions`` as they are: the manifest
    keeps them for numbers and strings only (its version unchanged, so that those readers
    still read the folder).  A manifest whose index encoding this reader does not know,
    or that does not match the files' index, reads back without divisions."""
    index = pd.date_range("2024-01-01", periods=N, freq="h", tz="UTC", unit="us")
    ddf, back = written(tmp_path, index)
    path = tmp_path / "out" / MANIFEST
    manifest = json.loads(path.read_text())
    assert manifest["version"] == 1 and manifest["divisions"] is None
    assert manifest["index_type"] == {"kind": "timestamp", "unit": "us", "tz": "UTC"}
    assert manifest["encoded_divisions"][0] == index[0].value // 1000
    assert back.known_divisions
    for change in [{"kind": "interval"}, {"kind": "duration", "unit": "us"}, {"kind": 3}]:
        path.write_text(json.dumps({**manifest, "index_type": change}))
        again = dask_cosim.read_parquet(tmp_path / "out")
        assert not again.known_divisions
        pd.testing.assert_frame_equal(again.compute(), ddf.compute(), check_freq=False)
    path.write_text(json.dumps({**manifest, "encoded_divisions": ["2024-01-01"] * 4}))
    assert not dask_cosim.read_parquet(tmp_path / "out").known_divisions


def test_gpu_reads_keep_the_decoded_divisions(tmp_path: Path) -> None:
    """The cudf backend's manifest reading: no RangeIndex ranges from encoded bounds, and
    the decoded divisions kept at the boundaries of files read together."""
    index = pd.DatetimeIndex(np.datetime64("2024-01-01", "ns") + HOURS, tz="UTC")
    _, back = written(tmp_path, index, npartitions=4)
    assert back.divisions == (index[0], index[10], index[20], index[30], index[39])
    found = parquet_files(tmp_path / "out")
    assert found is not None
    files, sizes, manifest = found.files, found.sizes, found.manifest
    assert cudf_parquet.manifest_ranges(pq.read_schema(files[0]), manifest) is None
    assert manifest["files"][1]["index"] == [index[10].value, index[19].value]
    largest = max(Path(f).stat().st_size for f in files)
    with dask.config.set({"cosim.read.gpu-partition-bytes": 2 * largest + 1}):
        schema = pq.read_schema(files[0])  # as _read_files decodes, for either backend
        decoded = manifest_divisions(manifest, schema, back._meta)
        pieces, divisions = _gpu_pieces(pafs.LocalFileSystem(), files, sizes, decoded)
    assert len(pieces) == 2 and divisions is not None
    assert_identical(tuple(divisions), (index[0], index[20], index[39]))


@st.composite
def timestamps(draw: Any) -> pd.DatetimeIndex:
    unit = draw(st.sampled_from(["ns", "us", "ms"]))
    scale = {"ns": 1, "us": 10**3, "ms": 10**6}[unit]
    values = draw(st.lists(st.integers(-(2**62) // scale, 2**62 // scale), min_size=1,
                           max_size=30))  # fmt: skip
    index = pd.DatetimeIndex(np.sort(np.array(values, dtype=f"datetime64[{unit}]")))
    tz = draw(st.sampled_from([None, "UTC", "America/New_York", "Asia/Kolkata"]))
    return index if tz is None else index.tz_localize("UTC").tz_convert(tz)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(index=timestamps(), npartitions=st.integers(1, 4))
def test_random_timestamps_keep_dasks_divisions(
    tmp_path_factory: pytest.TempPathFactory, index: pd.DatetimeIndex, npartitions: int
) -> None:
    with dask.config.set(scheduler="sync"):
        ddf, back = written(tmp_path_factory.mktemp("ts"), index, npartitions)
        assert_identical(back.divisions, ddf.divisions)
        pd.testing.assert_frame_equal(back.compute(), ddf.compute(), check_freq=False)


def test_encoded_bounds_are_no_range_index() -> None:
    """A manifest whose bounds are encoded labels gives the GPU reader no RangeIndex, even
    beside RangeIndex metadata: those integers are not row labels."""
    meta = {"index_columns": [{"kind": "range", "name": None, "start": 0, "stop": 5, "step": 1}]}
    schema = pa.schema([("x", pa.int64())], metadata={b"pandas": json.dumps(meta).encode()})
    manifest: dict[str, Any] = {"files": [{"path": "p0", "rows": 5, "index": [0, 4]}]}
    assert cudf_parquet.manifest_ranges(schema, manifest) == (None, [(0, 5, 1)])
    manifest["index_type"] = {"kind": "timestamp", "unit": "ns", "tz": None}
    assert cudf_parquet.manifest_ranges(schema, manifest) is None
