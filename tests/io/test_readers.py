"""Folders written by ``to_parquet`` read back whole in every reader: pandas, dask, pyarrow
datasets, DuckDB and ours (cudf on a GPU), whatever index or partitioning the frame has."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dask_cosim
from dask_cosim.io import vectors_to_arrow
from tests.helpers import READERS, assert_same

D = 4


def source(n: int = 40, seed: int = 0, nulls: bool = False) -> pd.DataFrame:
    """id, text, score and a vector column emb; with ``nulls``, null cells in each."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, D)).astype(np.float32)
    null = rng.random(n) < 0.25 if nulls else np.zeros(n, bool)
    text = pd.array([None if m else f"row {i}" for i, m in enumerate(null)], dtype="str")
    score = np.where(null, np.nan, rng.random(n))
    emb = vectors_to_arrow(x, null)
    return pd.DataFrame({"id": np.arange(n) * 7, "text": text, "score": score, "emb": emb})


def _from_parts(parts: list[pd.DataFrame]) -> dd.DataFrame:
    return dd.from_map(lambda p: p, parts, meta=parts[0].iloc[:0], enforce_metadata=False)


def split(pdf: pd.DataFrame, parts: int) -> list[pd.DataFrame]:
    bounds = np.linspace(0, len(pdf), parts + 1).astype(int)
    return [pdf.iloc[a:b] for a, b in itertools.pairwise(bounds)]


def _repeating(pdf: pd.DataFrame) -> dd.DataFrame:
    """Each partition numbered from 0, as dd.read_parquet reads a folder of plain files."""
    return _from_parts([p.reset_index(drop=True) for p in split(pdf, 4)])


def _with_empty(pdf: pd.DataFrame) -> dd.DataFrame:
    half = len(pdf) // 2
    return _from_parts([pdf.iloc[:0], pdf.iloc[:half], pdf.iloc[half:half], pdf.iloc[half:]])


FRAMES: dict[str, Callable[[pd.DataFrame], dd.DataFrame]] = {
    "range index, one partition": lambda p: dask_cosim.from_pandas(p, npartitions=1),
    "range index, many partitions": lambda p: dask_cosim.from_pandas(p, npartitions=3),
    "range index from 5, one partition": lambda p: dask_cosim.from_pandas(
        p.iloc[5:], npartitions=1
    ),
    "named index": lambda p: dask_cosim.from_pandas(
        p.set_index(pd.Index(np.arange(len(p)) * 10 + 3, name="key")), npartitions=3
    ),
    "unnamed index, unsorted": lambda p: dask_cosim.from_pandas(
        p.set_index(pd.Index(np.arange(len(p))[::-1] * 2)), npartitions=3, sort=False
    ),
    "unnamed string index": lambda p: dask_cosim.from_pandas(
        p.set_index(pd.Index([f"r{i:03d}" for i in range(len(p))], dtype="str")), npartitions=2
    ),
    "index set from a column": lambda p: dask_cosim.from_pandas(p, npartitions=3).set_index("id"),
    "index named like the vector column": lambda p: dask_cosim.from_pandas(
        p.set_index(pd.Index(np.arange(len(p)) * 2, name="emb")), npartitions=3
    ),
    "a column named as pyarrow names an unnamed index": lambda p: dask_cosim.from_pandas(
        p.rename(columns={"text": "__index_level_0__"}).set_index(pd.Index(np.arange(len(p)) * 2)),
        npartitions=3,
    ),
    "names with spaces, dots, slashes and '='": lambda p: dask_cosim.from_pandas(
        p.rename(columns={"id": "my id", "text": "a.b/c=d", "score": "__score é"}).set_index(
            pd.Index(np.arange(len(p)) * 2, name="k=v/x y")
        ),
        npartitions=3,
    ),
    "per-partition range indexes that repeat": _repeating,
    "empty partitions": _with_empty,
}


# dask's reader refuses any file whose index is named like one of its columns, pandas'
# own files too ("cannot insert emb, already exists"); the others read them.
NOT_BY_DASK = {"index named like the vector column"}


def check_every_reader(
    ddf: dd.DataFrame, folder: Path, layout: str = "list", skip: Collection[str] = ()
) -> None:
    want = ddf.compute()
    dask_cosim.to_parquet(ddf, folder, layout=layout)
    readers = READERS if layout == "list" else {"dask_cosim": READERS["dask_cosim"]}
    for reader, read in readers.items():
        if reader not in skip:
            assert_same(read(folder), want, reader)


@pytest.mark.parametrize("nulls", [False, True], ids=["values", "nulls"])
@pytest.mark.parametrize("frame", list(FRAMES))
def test_every_reader_gets_the_folder_back_whole(tmp_path: Path, frame: str, nulls: bool) -> None:
    skip = {"dask"} if frame in NOT_BY_DASK else set()
    with dask.config.set(scheduler="sync"):
        check_every_reader(FRAMES[frame](source(nulls=nulls)), tmp_path / "out", skip=skip)


@pytest.mark.parametrize("frame", list(FRAMES))
def test_binary_layout_in_our_reader(tmp_path: Path, frame: str) -> None:
    with dask.config.set(scheduler="sync"):
        check_every_reader(FRAMES[frame](source(nulls=True)), tmp_path / "out", "binary")


def test_binary_layout_elsewhere_after_the_documented_conversion(tmp_path: Path) -> None:
    """docs/parquet.md: convert to the list layout, or decode the bytes per cell."""
    ddf = FRAMES["named index"](source(nulls=True))
    want = ddf.compute()
    with dask.config.set(scheduler="sync"):
        dask_cosim.to_parquet(ddf, tmp_path / "binary")
        converted = dask_cosim.read_parquet(tmp_path / "binary")
        dask_cosim.to_parquet(converted, tmp_path / "list", layout="list")
    for reader, read in READERS.items():
        assert_same(read(tmp_path / "list"), want, reader)
    raw = pd.read_parquet(tmp_path / "binary")
    raw["emb"] = [None if b is None else np.frombuffer(b, "<f4") for b in raw["emb"]]
    assert_same(raw, want, "pandas, bytes decoded")


def test_read_with_index_then_write_keeps_the_index(tmp_path: Path) -> None:
    """The recipe of a folder of plain files: read_parquet(..., index="id"), to_parquet."""
    pdf = source(60)
    src = tmp_path / "src"
    src.mkdir()
    for i, part in enumerate(split(pdf, 3)):
        part.to_parquet(src / f"part-{i}.parquet", index=False)
    ddf = dask_cosim.read_parquet(src, index="id")
    with dask.config.set(scheduler="sync"):
        check_every_reader(ddf, tmp_path / "out")
        assert pd.read_parquet(tmp_path / "out").index.name == "id"


@st.composite
def frames(draw: Any) -> dd.DataFrame:
    n = draw(st.integers(0, 30))
    pdf = source(n, seed=draw(st.integers(0, 2**16)), nulls=draw(st.booleans()))
    kind = draw(st.sampled_from(["range", "named", "unnamed", "strings", "from column"]))
    if kind == "named":
        pdf.index = pd.Index(np.arange(n) * 3 - 5, name="key")
    elif kind == "unnamed":
        pdf.index = pd.Index(draw(st.permutations(list(range(n)))), dtype="int64")
    elif kind == "strings":
        pdf.index = pd.Index([f"k{i}" for i in range(n)], dtype="str", name="s")
    elif kind == "range":
        start = draw(st.integers(0, 3))
        pdf.index = pd.RangeIndex(start, start + n)
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=3)))
    parts = [pdf.iloc[a:b] for a, b in zip([0, *cuts], [*cuts, n])]
    if draw(st.booleans()):  # each partition numbered from 0
        parts = [p.reset_index(drop=True) for p in parts]
    ddf = _from_parts(parts)
    return ddf.set_index("id") if kind == "from column" and n else ddf


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ddf=frames())
def test_random_frames_read_back_whole(tmp_path_factory: pytest.TempPathFactory, ddf: Any) -> None:
    with dask.config.set(scheduler="sync"):
        check_every_reader(ddf, tmp_path_factory.mktemp("random") / "out")


@pytest.mark.gpu
@pytest.mark.parametrize("frame", list(FRAMES))
def test_cudf_reads_the_folder_back_whole(tmp_path: Path, frame: str) -> None:
    cudf = pytest.importorskip("cudf")
    ddf = FRAMES[frame](source(nulls=True))
    with dask.config.set(scheduler="sync"):
        dask_cosim.to_parquet(ddf, tmp_path / "out", layout="list")
    got = cudf.read_parquet(str(tmp_path / "out")).to_pandas()
    assert_same(got, ddf.compute(), "cudf")


def _plain(value: Any) -> Any:
    """A cell as plain Python (dicts, lists, None), however the reader gave it."""
    if value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v) for v in value]
    return value


def test_arrow_columns_pandas_cannot_read_back_are_read_by_every_reader(tmp_path: Path) -> None:
    """Arrow-backed struct, list-of-string, map, fixed_size_binary and dictionary columns:
    pandas records their dtypes as text it cannot parse back (pandas-dev/pandas#53011),
    and pandas and dask failed on the whole folder ("data type 'struct<a: int64>[pyarrow]'
    not understood").  Every reader now reads the values; ours keeps them Arrow, also
    from a file pandas wrote itself, which pandas cannot read.  Bytes that are not UTF-8
    read back as they are (dask's convert-string made text of them, and failed)."""
    import pyarrow as pa

    table = pa.table(
        {
            "emb": pa.array([[0.5, 1.0], [2.0, 3.0], None], pa.list_(pa.float32(), 2)),
            "meta": pa.array([{"a": 1, "tags": ["x"]}, None, {"a": 3, "tags": []}]),
            "tags": pa.array([["x", "y"], [], None]),
            "pairs": pa.array([[("k", 1)], [], None], pa.map_(pa.string(), pa.int64())),
            "raw": pa.array([b"\xff\x00", None, b"ok"]),
            "code": pa.array([b"ab", b"\xfe\xff", None], pa.binary(2)),
            "kind": pa.array(["x", None, "y"]).dictionary_encode(),
        }
    )
    pdf = table.to_pandas(types_mapper=pd.ArrowDtype)
    plain = ("meta", "tags", "pairs", "raw", "code", "kind")
    want = {c: [_plain(v) for v in pdf[c].tolist()] for c in plain}
    dask_cosim.to_parquet(pdf, tmp_path / "ours", layout="list")
    pdf.to_parquet(tmp_path / "by-pandas.parquet")
    with pytest.raises((TypeError, ValueError, NotImplementedError)):
        pd.read_parquet(tmp_path / "by-pandas.parquet")  # pandas' own file: why this exists
    for reader, read in READERS.items():
        got = read(tmp_path / "ours")
        for column, values in want.items():
            if not (reader == "duckdb" and column == "pairs"):  # DuckDB: {key: [...], ...}
                assert [_plain(v) for v in got[column].tolist()] == values, (reader, column)
    for folder in (tmp_path / "ours", tmp_path / "by-pandas.parquet"):
        got = dask_cosim.read_parquet(folder).compute()
        for column, values in want.items():
            assert [_plain(v) for v in got[column].tolist()] == values, (folder, column)
        arrow = ("meta", "tags", "pairs", "raw", "code")
        assert all(isinstance(got[c].dtype, pd.ArrowDtype) for c in arrow), got.dtypes
        np.testing.assert_array_equal(np.stack(got["emb"].iloc[:2].to_numpy()), [[0.5, 1], [2, 3]])


def test_a_partition_with_no_value_in_an_object_column_is_stored_with_its_type(
    tmp_path: Path,
) -> None:
    """An object column (bytes, decimals, booleans beside None) with no value in one
    partition: pyarrow gives that file the type null, and pandas and pyarrow datasets
    then refused the folder ("Unsupported cast from binary to null"); the file is written
    again with the type the other files store, so every file has one schema."""
    import decimal

    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    pdf = pd.DataFrame(
        {
            "blob": pd.Series([None, None, None, b"a", b"b", b"c"], dtype=object),
            "price": pd.Series([None] * 3 + [decimal.Decimal("1.5")] * 3, dtype=object),
            "emb": vectors_to_arrow(np.ones((6, 2), "f4")),
        }
    )
    folder = tmp_path / "out"
    dask_cosim.to_parquet(dask_cosim.from_pandas(pdf, npartitions=2, sort=False), folder)
    schemas = {str(pq.read_schema(f).remove_metadata()) for f in folder.glob("*.parquet")}
    assert len(schemas) == 1, schemas
    for got in (pd.read_parquet(folder), ds.dataset(folder).to_table().to_pandas()):
        assert got["blob"].tolist() == [None] * 3 + [b"a", b"b", b"c"]
        assert got["price"].tolist()[3] == decimal.Decimal("1.5")
    assert dask_cosim.read_parquet(folder).compute()["blob"].tolist()[3:] == [b"a", b"b", b"c"]


def test_an_object_column_of_other_types_in_other_partitions_is_stored_with_one(
    tmp_path: Path,
) -> None:
    """pyarrow takes an object column's type from each partition's values: decimals of
    two precisions, ints beside floats, empty lists beside lists of strings gave files
    of two schemas, which pandas, pyarrow datasets and our reader refused ("Decimal value
    does not fit in precision 2").  The files are written with the type the files' types
    unify to; types that do not unify (numbers and text) fail the write, naming both."""
    import decimal

    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    prices = [decimal.Decimal(x) for x in ("1.5", "2.5", "10.5", "20.5")]
    pdf = pd.DataFrame(
        {
            "price": pd.Series(prices, dtype=object),
            "count": pd.Series([1, 2, 3.5, 4.5], dtype=object),
            "tags": pd.Series([[], [], ["a"], ["b", "c"]], dtype=object),
            "emb": vectors_to_arrow(np.ones((4, 2), "f4")),
        }
    )
    pdf.loc[:1, "count"] = pd.Series([1, 2], dtype=object)  # ints in the first partition
    for layout in ("binary", "list"):
        folder = tmp_path / layout
        df = dask_cosim.from_pandas(pdf, npartitions=2, sort=False)
        dask_cosim.to_parquet(df, folder, layout=layout)
        schemas = {str(pq.read_schema(f).remove_metadata()) for f in folder.glob("*.parquet")}
        assert len(schemas) == 1, schemas
        readers = [pd.read_parquet(folder), ds.dataset(folder).to_table().to_pandas()]
        for got in [*readers, dask_cosim.read_parquet(folder).compute()]:
            assert got["price"].tolist() == prices
            assert got["count"].tolist() == [1.0, 2.0, 3.5, 4.5]
            assert [list(t) for t in got["tags"]] == [[], [], ["a"], ["b", "c"]]

    mixed = pdf.assign(count=pd.Series([1, 2, "three", "four"], dtype=object))
    with pytest.raises(ValueError, match=r"column 'count' holds int64 in part\.00000.* and "
                       r"string in part\.00001.*give the column one type"):  # fmt: skip
        dask_cosim.to_parquet(dask_cosim.from_pandas(mixed, 2, sort=False), tmp_path / "m")
    assert not (tmp_path / "m").exists()
