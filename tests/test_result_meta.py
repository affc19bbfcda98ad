"""Lazy results as dask users take them downstream: each partition computes the columns,
dtypes and index of the result's meta, known divisions bound the partitions, and common
operations (projections, merges, groupbys, concat, persist, Parquet, a cluster) give what
the computed result gives."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dask.dataframe.utils import UNKNOWN_CATEGORIES, assert_eq, has_known_categories

import dask_cosim
from tests.helpers import (
    as_column,
    no_computes,
    search_frame,
    search_vectors,
    split_frame,
    to_dask,
)

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


def same_dtype(meta: Any, got: Any) -> bool:
    """Whether a partition's ``got`` dtype is the meta's: equal, or categorical where the
    meta's categories are unknown (dask's meta of a categorical read from Parquet)."""
    if isinstance(meta, pd.CategoricalDtype) and not has_known_categories(pd.Index([], dtype=meta)):
        return isinstance(got, pd.CategoricalDtype) and got.ordered == meta.ordered
    return bool(meta == got)


def assert_partitions_match_meta(lazy: Any) -> list[Any]:
    """Every computed partition of ``lazy`` (a frame or Series) has its meta's columns (in
    order), dtypes and index (dtype and name); known divisions bound each partition's
    labels.  Returns the partitions."""
    meta = lazy._meta
    parts = list(dask.compute(*lazy.to_delayed(), scheduler="sync"))
    for i, part in enumerate(parts):
        if isinstance(meta, pd.Series):
            assert part.name == meta.name and same_dtype(meta.dtype, part.dtype), i
        else:
            assert list(part.columns) == list(meta.columns), i
            for c in meta.columns:
                assert same_dtype(meta[c].dtype, part[c].dtype), (i, c, part[c].dtype)
        assert same_dtype(meta.index.dtype, part.index.dtype), (i, part.index.dtype)
        assert part.index.name == meta.index.name, i
        if lazy.known_divisions and len(part):
            first, last = min(part.index.tolist()), max(part.index.tolist())
            lo, hi = lazy.divisions[i], lazy.divisions[i + 1]
            assert lo <= first and (last <= hi if i == len(parts) - 1 else last < hi), i
    return parts


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


def test_dictionary_columns_of_plain_parquet_keep_their_values(tmp_path: Path) -> None:
    """A dictionary column of plain Parquet (pyarrow or polars wrote it, no pandas
    metadata): dask's meta says its categories are known, and lists none.  Every
    search cast its carried values, and a categorical index's labels, to that meta, and
    all became null."""
    pdf = frame().reset_index(drop=True)
    table = pa.Table.from_pandas(pdf, preserve_index=False).replace_schema_metadata(None)
    (tmp_path / "plain").mkdir()
    for i, rows in enumerate(np.array_split(np.arange(N), 3)):
        pq.write_table(table.take(rows), tmp_path / "plain" / f"{i}.parquet")
    df = dask_cosim.read_parquet(tmp_path / "plain")
    assert has_known_categories(df._meta["kind"]) and len(df._meta["kind"].cat.categories) == 0
    with dask.config.set(scheduler="sync"):
        for search in ("join_k", "neighbors_threshold", "dedup_removed"):
            got = SEARCHES[search](df, ["kind"]).compute()
            want = SEARCHES[search](pdf, ["kind"])
            assert len(want) and got["left_kind"].notna().all(), search
            pd.testing.assert_frame_equal(
                as_values(got).reset_index(drop=True), as_values(want).reset_index(drop=True),
                check_dtype=False,
            )  # fmt: skip
        queries = search_vectors(3, D, seed=1)
        got = df.cosim.topk(queries, "emb", k=4, columns=["kind"])
        want = pdf.cosim.topk(queries, "emb", k=4, columns=["kind"])
        pd.testing.assert_frame_equal(as_values(got), as_values(want), check_dtype=False)
        with pytest.warns(dask_cosim.errors.RepeatedLabelsWarning):  # (they do repeat)
            by_kind = df.set_index("kind", sort=False).cosim.topk(queries, "emb", k=4)
        assert by_kind["match"].astype(object).tolist() == want["kind"].astype(object).tolist()


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


# Every lazy result: the searches above carrying "id", "text" (str), "kind" (categorical)
# and "when" (datetime), and those that carry nothing.
CARRIED = ["id", "text", "kind", "when"]
LAZY: dict[str, Callable[[Any], Any]] = {
    **{name: lambda df, run=run: run(df, CARRIED) for name, run in SEARCHES.items()},
    "pairwise": lambda df: df.cosim.pairwise("emb", "emb"),
    "prepare": lambda df: df.cosim.prepare("emb"),
    "join_threshold": lambda df: df.cosim.join(df, "emb", threshold=0.3, columns=CARRIED),
    "dedup": lambda df: df.cosim.dedup("emb", 0.4),
    "groups": lambda df: df.cosim.groups("emb", 0.4),
    "dedup_clustered": lambda df: df.cosim.dedup("emb", 0.4, method="clustered"),
}


SOURCES = ["from_pandas", "parquet", "empty_partitions", "zero_rows"]


def source(name: str, tmp_path: Path) -> Any:
    """A dask frame of the test rows (a str index, a datetime column "when"): from pandas,
    read from Parquet, in partitions some empty with null rows and object-of-arrays
    vectors, or of zero rows."""
    pdf = frame().assign(when=pd.date_range("2024-01-01", periods=N, freq="D"))
    pdf.index = pd.Index([f"r{i:02d}" for i in range(N)], name="key")
    if name == "parquet":
        return read_back(pdf, tmp_path)
    if name == "empty_partitions":
        null = np.zeros(N, bool)
        null[[3, 17]] = True
        objects = pdf.assign(emb=as_column(search_vectors(N, D), "object_numpy", null))
        return split_frame(objects, [0, 15, 0, N - 15])
    return to_dask(pdf.iloc[:0] if name == "zero_rows" else pdf, 1 if name == "zero_rows" else 3)


def vectorless(df: Any) -> Any:
    """``df`` without its vector columns, which dask's assert_eq cannot hash."""
    meta = df._meta if dask.is_dask_collection(df) else df
    if isinstance(meta, pd.Series):
        return df
    return df.drop(columns=[c for c in meta.columns if str(c).startswith("emb")])


@pytest.mark.parametrize("search", sorted(LAZY))
@pytest.mark.parametrize("kind", SOURCES)
def test_partitions_match_the_meta(tmp_path: Path, kind: str, search: str) -> None:
    df = source(kind, tmp_path)
    result = LAZY[search](df)
    parts = assert_partitions_match_meta(result)
    with dask.config.set(scheduler="sync"):
        whole = result.compute()
        assert len(result) == len(whole) == sum(len(p) for p in parts)
        assert_eq(vectorless(result), vectorless(whole))
        # (dask warns where the first partition has fewer rows: all partitions are read.)
        head = result.head(3, npartitions=-1)
        assert_eq(vectorless(head), vectorless(whole.head(3)))


@pytest.mark.parametrize("search", ["neighbors_threshold", "dedup_removed", "dedup", "groups"])
def test_downstream_operations_give_what_the_computed_result_gives(
    tmp_path: Path, search: str
) -> None:
    """What dask users do next, built without computing anything, gives on the lazy result
    what it gives on the computed one: projections (which dask pushes into the graph),
    merges with the searched frame, groupbys, concat, persist, repartition, ``.loc`` where
    the divisions are known, a pickled graph, and Parquet through dask's writer and ours."""
    df = source("from_pandas", tmp_path)
    result = LAZY[search](df)
    with dask.config.set(scheduler="sync"):
        whole = result.compute()
    by = "left" if "left" in whole.columns else "id"
    # The searched frame's rows, joined on the labels the result names (its own index).
    text = df[["text"]].rename(columns={"text": "text_of"})
    how: dict[str, Any] = {"left_on": "left"} if by == "left" else {"left_index": True}
    with no_computes():
        projected = result[[by, "id" if by == "id" else "score"]]
        merged = result.merge(text, right_index=True, how="left", **how)
        grouped = result.groupby(by).size()
        doubled = dd.concat([result, result])
        single = result.repartition(npartitions=1)
    with dask.config.set(scheduler="sync"):
        assert_eq(projected, whole[list(projected.columns)])
        want = whole.merge(text.compute(), right_index=True, how="left", **how)
        assert_eq(vectorless(merged), vectorless(want))
        assert_eq(grouped, whole.groupby(by).size())
        assert_eq(vectorless(doubled), vectorless(pd.concat([whole, whole])))
        assert_eq(vectorless(single), vectorless(whole))
        assert_eq(vectorless(result.persist()), vectorless(whole))
        if result.known_divisions:
            label = whole.index[len(whole) // 2]
            assert_eq(vectorless(result.loc[label]), vectorless(whole.loc[[label]]))
        graph = cloudpickle.loads(cloudpickle.dumps(result.__dask_graph__()))
        assert set(graph) == set(result.__dask_graph__())
        vectorless(result).to_parquet(tmp_path / "dask")
        back = dd.read_parquet(tmp_path / "dask")
        assert_eq(back, vectorless(whole), check_divisions=False, check_index=by != "left")
        dask_cosim.to_parquet(result, tmp_path / "ours")
        back = dask_cosim.read_parquet(str(tmp_path / "ours")).compute()
        assert_eq(vectorless(back), vectorless(whole), check_index=by != "left")


def test_on_a_cluster_of_processes(tmp_path: Path, client: Any) -> None:
    """On distributed's worker processes, each partition of a search of a Parquet read
    has the meta's dtypes, and the result is the one the local scheduler computes."""
    df = source("parquet", tmp_path)
    for search in ("join_k", "neighbors_threshold", "dedup_removed", "groups"):
        result = LAZY[search](df)
        parts = client.gather(client.compute(result.to_delayed()))
        local = assert_partitions_match_meta(result)
        for got, want in zip(parts, local, strict=True):
            assert got.dtypes.to_dict() == want.dtypes.to_dict(), search
            pd.testing.assert_frame_equal(vectorless(got), vectorless(want), obj=search)


@pytest.mark.parametrize("removed_rows", [False, True])
def test_clustered_partitions_without_pairs_hold_no_placeholder_category(
    tmp_path: Path, removed_rows: bool
) -> None:
    """dask's map_partitions gave a partition without pairs its meta, whose categoricals
    of unknown categories hold dask's placeholder category as data, where the exact
    method's empty partitions have their own (no) categories."""
    pdf = frame()
    pdf.index = pd.CategoricalIndex([f"r{i:02d}" for i in range(N)], name="key")
    df = read_back(pdf, tmp_path)
    if removed_rows:
        lazy = df.cosim.dedup(
            "emb", 0.9, return_removed=True, columns=["kind"], method="clustered"
        )[1]
    else:
        lazy = df.cosim.neighbors("emb", threshold=0.9, columns=["kind"], method="clustered")
    parts = assert_partitions_match_meta(lazy)
    assert any(len(p) == 0 for p in parts)
    for part in parts:
        for values in (part["left"], part["left_kind"], part["right_kind"]):
            assert UNKNOWN_CATEGORIES not in values.cat.categories


def test_prepare_of_an_empty_partition_holds_no_placeholder_category(tmp_path: Path) -> None:
    """As above, for ``prepare`` (one partition in, one out, the user's columns kept)."""
    df = read_back(frame(), tmp_path)
    parts = assert_partitions_match_meta(df[df.id >= 30].cosim.prepare("emb"))
    assert [len(p) for p in parts] == [0, 0, 10]
    assert all(UNKNOWN_CATEGORIES not in p["kind"].cat.categories for p in parts)
