"""Categoricals through two round trips of ``to_parquet`` and ``read_parquet``: what the
first read gives, a second write stores and reads back alike, whether the frame has rows
or not, and whether its categories are strings or numbers; then categoricals of numbers
and stored categoricals (unknown categories) from our folders and other writers' files."""

from __future__ import annotations

from pathlib import Path

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dask_cosim


@pytest.mark.parametrize("rows", [0, 6], ids=["no rows", "rows"])
@pytest.mark.parametrize(
    "kind",
    [
        pd.Categorical(["a", "b", "c", "a", "b", None], categories=list("cba")),
        pd.Categorical([3, 1, 2, 3, 1, None], categories=[3, 1, 2], ordered=True),
        pd.Categorical([1.5, 2.0, None, 1.5, 2.0, 2.0], categories=[2.0, 1.5]),
    ],
    ids=["strings", "ordered integers", "floats"],
)
@pytest.mark.parametrize("partitions", [1, 2])
def test_categoricals_survive_a_second_round_trip(
    tmp_path: Path, rows: int, kind: pd.Categorical, partitions: int
) -> None:
    """A zero-row frame's categorical of strings read back with categories of no type
    (object), which pyarrow then wrote as a dictionary of nulls: the second read gave a
    ``string`` column, not a categorical."""
    pdf = pd.DataFrame({"kind": kind, "x": range(6)}).iloc[:rows]
    df = dd.from_pandas(pdf, npartitions=partitions, sort=False)
    dask_cosim.to_parquet(df, tmp_path / "a")
    first = dask_cosim.read_parquet(tmp_path / "a")
    dask_cosim.to_parquet(first, tmp_path / "b")
    second = dask_cosim.read_parquet(tmp_path / "b")
    for back in (first, second):
        assert isinstance(back._meta["kind"].dtype, pd.CategoricalDtype)
        assert back._meta["kind"].dtype.ordered == kind.ordered
        got = back.compute()["kind"]
        assert isinstance(got.dtype, pd.CategoricalDtype)
        assert got.isna().tolist() == pdf["kind"].isna().tolist()
        assert got.dropna().tolist() == pdf["kind"].dropna().tolist()
    # Categories as the first read gave them: of numbers, as written (recorded); of
    # strings, those the rows use (Parquet keeps no others), of the stored type.
    assert second.compute()["kind"].dtype == first.compute()["kind"].dtype
    if kind.categories.dtype.kind in "iuf":  # (strings: str on pandas 3, object on 2)
        assert second.compute()["kind"].dtype == kind.dtype
    for file in (tmp_path / "b").glob("*.parquet"):  # stored typed, as other readers see it
        stored = pq.read_schema(file).field("kind").type
        assert not pa.types.is_null(getattr(stored, "value_type", stored))


def test_categories_of_no_type_are_stored_as_strings(tmp_path: Path) -> None:
    """What pandas 2 reads back for a categorical of strings no row uses (categories: an
    empty object index), built by hand so that pandas 3 tests it too: pyarrow alone
    stores a dictionary of nulls, and the next read gives a ``string`` column."""
    untyped = pd.CategoricalDtype(pd.Index([], dtype=object))
    index = pd.CategoricalIndex([], dtype=untyped, name="tag")
    pdf = pd.DataFrame({"kind": pd.Series([], dtype=untyped, index=index), "x": 1.0})
    assert pa.types.is_null(pa.Table.from_pandas(pdf).schema.field("kind").type.value_type)
    dask_cosim.to_parquet(dd.from_pandas(pdf, npartitions=1), tmp_path / "a")
    for name in ("kind", "tag"):
        stored = pq.read_schema(next((tmp_path / "a").glob("*.parquet"))).field(name).type
        assert stored == pa.dictionary(pa.int8(), pa.string())
    back = dask_cosim.read_parquet(tmp_path / "a").compute()
    assert isinstance(back["kind"].dtype, pd.CategoricalDtype) and len(back) == 0
    assert isinstance(back.index.dtype, pd.CategoricalDtype) and back.index.name == "tag"


def test_categoricals_of_numbers_read_back_as_written(tmp_path: Path) -> None:
    """pyarrow gives a categorical of numbers back as plain numbers (strings only come back
    categorical), and Parquet keeps neither unused categories nor their order: our folders
    record them, and read back as written, meta agreeing; other files' categoricals come
    back categorical, their values sorted as categories, unordered (as dask's reader gives
    a column); the meta's categories are unknown (dask's convention), and a categorical
    index has no divisions."""
    ordered = pd.CategoricalDtype(pd.Index([5, 1, 2, 3], dtype="int32"), ordered=True)
    pdf = pd.DataFrame(
        {
            "x": np.arange(6.0),
            "c": pd.Categorical([10, 20, None, 30, 10, 20], categories=[40, 30, 20, 10]),
            "s": pd.Categorical(list("abcabc"), categories=list("zcba"), ordered=True),
        },
        index=pd.CategoricalIndex([3, 1, 2, 3, 1, 2], dtype=ordered, name="k"),
    )
    dask_cosim.to_parquet(dd.from_pandas(pdf, npartitions=3, sort=False), tmp_path / "ours")
    back = dask_cosim.read_parquet(tmp_path / "ours")
    dd.utils.assert_eq(back, pdf)
    assert back._meta.index.dtype.ordered and not back.known_divisions
    assert [back._meta[c].dtype.ordered for c in ("c", "s")] == [False, True]
    assert not dd.utils.has_known_categories(back["c"])
    assert back["c"].cat.as_known().compute().dtype == pdf["c"].dtype
    assert back[["x"]].compute().index.dtype == ordered  # the index comes along

    pdf.to_parquet(tmp_path / "pandas.parquet")
    other = dask_cosim.read_parquet(tmp_path / "pandas.parquet")
    got = other.compute()
    dd.utils.assert_eq(other, got)
    theirs = dd.read_parquet(tmp_path / "pandas.parquet").compute()
    pd.testing.assert_series_equal(got["c"], theirs["c"], check_index=False)
    assert got.index.dtype == pd.CategoricalDtype(pd.Index([1, 2, 3], dtype="int32"))
    assert got.index.tolist() == pdf.index.tolist() and got.index.name == "k"
    pd.testing.assert_series_equal(got["s"], pdf["s"], check_index=False)
    assert not dd.utils.has_known_categories(other["s"])  # the meta said [] known


def test_stored_categoricals_read_back_with_unknown_categories(tmp_path: Path) -> None:
    """Each file stores its own dictionary, so the categories of a stored categorical
    column or index are unknown until read, as dask's reader marks them (the meta said
    known and empty: ``as_known`` kept none, and ``dd.get_dummies`` made no columns in
    the meta where the data had five)."""
    pdf = pd.DataFrame(
        {"id": np.arange(20), "cat": pd.Categorical([f"c{i % 5}" for i in range(20)])},
        index=pd.CategoricalIndex([f"k{i % 3}" for i in range(20)], name="k"),
    )
    dask_cosim.to_parquet(dd.from_pandas(pdf, npartitions=2, sort=False), tmp_path / "ours")
    pdf.to_parquet(tmp_path / "one.parquet")
    for path in (tmp_path / "ours", tmp_path / "one.parquet"):
        df = dask_cosim.read_parquet(path)
        assert not df["cat"].cat.known and not df.index.cat.known
        assert sorted(df["cat"].cat.as_known().cat.categories) == [f"c{i}" for i in range(5)]
        dummies = dd.get_dummies(df.categorize(columns=["cat"]), columns=["cat"])
        assert list(dummies.columns) == list(dummies.compute().columns)
        pd.testing.assert_frame_equal(df.compute(), pdf, check_categorical=False)
