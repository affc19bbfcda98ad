"""Lazy results as dask users take them downstream: each partition computes the columns,
dtypes and index of the result's meta, known divisions bound the partitions, and common
operations (projections, merges, groupbys, concat, persist, Parquet, a cluster) give what
the computed result gives."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pandas as pd
import pytest
from dask.dataframe.utils import has_known_categories

import dask_cosim
from tests.helpers import search_frame, search_vectors, split_frame

N, D = 40, 8


def removed(df: Any, cols: list[Any], method: str = "exact") -> Any:
    """What ``dedup(return_removed=True)`` removed."""
    return df.cosim.dedup("emb", 0.4, return_removed=True, columns=cols, method=method)[1]


# Each lazy search with carried columns, as a function of the frame (dask or pandas): what
# a user writes, and what the same call gives on the pandas frame.
SEARCHES: dict[str, Callable[[Any, list[Any]], Any]] = {
    "join_k": lambda df, cols: df.cosim.join(df, "emb", k=3, columns=cols),
    "neighbors_threshold": lambda df, cols: df.cosim.neighbors("emb", threshold=0.3, columns=cols),
    "neighbors_k": lambda df, cols: df.cosim.neighbors("emb", k=2, columns=cols),
    "dedup_removed": removed,
    "neighbors_clustered": lambda df, cols: df.cosim.neighbors(
        "emb", threshold=0.3, columns=cols, method="clustered"
    ),
    "dedup_clustered_removed": lambda df, cols: removed(df, cols, "clustered"),
}


def frame(n: int = N) -> pd.DataFrame:
    """The search tests' frame (emb, id, text; index "key") with a categorical column."""
    pdf = search_frame(search_vectors(n, D))
    return pdf.assign(kind=pd.Categorical([f"k{i % 3}" for i in range(n)]))


def as_values(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with categoricals as their values (objects): dtypes aside, what a user reads."""
    return df.astype(
        {c: object for c in df.columns if isinstance(df[c].dtype, pd.CategoricalDtype)}
    )


def read_back(pdf: pd.DataFrame, tmp_path: Path) -> Any:
    """``pdf`` written by dask_cosim.to_parquet and read back: its categoricals (columns and
    index) come back with unknown categories in the meta, as dask reads categoricals."""
    dask_cosim.to_parquet(dask_cosim.from_pandas(pdf, npartitions=3), tmp_path / "in")
    return dask_cosim.read_parquet(str(tmp_path / "in"))


@pytest.mark.parametrize("search", sorted(SEARCHES))
@pytest.mark.parametrize("where", ["column", "index"])
def test_categoricals_of_unknown_categories_keep_their_values(
    tmp_path: Path, search: str, where: str
) -> None:
    pdf = frame()
    if where == "index":
        pdf.index = pd.CategoricalIndex([f"r{i:02d}" for i in range(N)], name="key")
    df = read_back(pdf, tmp_path)
    assert not has_known_categories(df._meta.index if where == "index" else df._meta["kind"])
    cols = ["id", "kind"]
    with dask.config.set(scheduler="sync"):
        got = SEARCHES[search](df, cols).compute()
    want = SEARCHES[search](pdf, cols)
    assert len(want) and got["left_kind"].notna().all() and got["left"].notna().all()
    pd.testing.assert_frame_equal(
        as_values(got).reset_index(drop=True), as_values(want).reset_index(drop=True),
        check_dtype=False,
    )  # fmt: skip


@pytest.mark.parametrize("where", ["column", "index"])
def test_topk_of_unknown_categories_keeps_their_values(tmp_path: Path, where: str) -> None:
    pdf = frame()
    if where == "index":
        pdf.index = pd.CategoricalIndex([f"r{i:02d}" for i in range(N)], name="key")
    df = read_back(pdf, tmp_path)
    queries = np.random.default_rng(1).standard_normal((3, D)).astype(np.float32)
    with dask.config.set(scheduler="sync"):
        got = df.cosim.topk(queries, "emb", k=4, columns=["id", "kind"])
    want = pdf.cosim.topk(queries, "emb", k=4, columns=["id", "kind"])
    assert got["kind"].notna().all() and got["match"].notna().all()
    pd.testing.assert_frame_equal(as_values(got), as_values(want), check_dtype=False)


def assert_partitions_match_meta(lazy: Any) -> list[pd.DataFrame]:
    """Every computed partition of ``lazy`` has its meta's columns, dtypes and index
    (dtype and name); known divisions bound each partition's labels.  The partitions."""
    meta = lazy._meta
    parts = list(dask.compute(*lazy.to_delayed(), scheduler="sync"))
    for i, part in enumerate(parts):
        assert list(part.columns) == list(meta.columns), i
        assert part.dtypes.to_dict() == meta.dtypes.to_dict(), (i, part.dtypes, meta.dtypes)
        assert part.index.dtype == meta.index.dtype and part.index.name == meta.index.name, i
        if lazy.known_divisions and len(part):
            lo, hi = lazy.divisions[i], lazy.divisions[i + 1]
            last = i == len(parts) - 1
            assert lo <= part.index.min() and (
                part.index.max() <= hi if last else part.index.max() < hi
            ), i
    return parts


@pytest.mark.parametrize("layout", ["binary", "list"])
def test_prepared_frame_of_unit_rows_writes_and_reads_back(tmp_path: Path, layout: str) -> None:
    """Rows already of norm 1 store no unit rows (nulls), nor does an empty partition: the
    prepared frame still has the meta's dtypes in every partition, writes in either layout
    and reads back prepared, with the same answers."""
    x = search_vectors(N, D).astype(np.float64)
    x[: N // 2] /= np.linalg.norm(x[: N // 2], axis=1, keepdims=True)  # the first partition
    pdf = search_frame(x.astype(np.float32))
    prepared = split_frame(pdf, [N // 2, 0, N - N // 2]).cosim.prepare("emb")
    assert_partitions_match_meta(prepared)
    dask_cosim.to_parquet(prepared, tmp_path / "prepared", layout=layout)
    back = dask_cosim.read_parquet(str(tmp_path / "prepared"))
    assert_partitions_match_meta(back)
    with dask.config.set(scheduler="sync"):
        got = back.cosim.neighbors("emb", k=3, columns="id").compute()
    want = pdf.cosim.neighbors("emb", k=3, columns="id")
    pd.testing.assert_frame_equal(got.reset_index(drop=True), want)
