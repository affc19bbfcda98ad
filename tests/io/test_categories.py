"""Categoricals through two round trips of ``to_parquet`` and ``read_parquet``: what the
first read gives, a second write stores and reads back alike, whether the frame has rows
or not, and whether its categories are strings or numbers."""

from __future__ import annotations

from pathlib import Path

import dask.dataframe as dd
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
    if kind.categories.dtype != "str":
        assert second.compute()["kind"].dtype == kind.dtype
    for file in (tmp_path / "b").glob("*.parquet"):  # stored typed, as other readers see it
        stored = pq.read_schema(file).field("kind").type
        assert not pa.types.is_null(getattr(stored, "value_type", stored))
