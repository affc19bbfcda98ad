"""topk / join / neighbors / dedup on dask and pandas frames against a float64 brute
force: every input format with null, NaN and zero rows, queries of every kind, carried
columns in their own dtypes, any partitioning, exact ties (parallel rows score exactly
1), Arrow columns of several chunks, and object vector columns kept as vectors."""

from __future__ import annotations

import warnings

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

import dask_cosim
from dask_cosim.errors import QueryWarning
from tests.helpers import (
    FORMATS,
    as_column,
    assert_pairs_equal,
    brute,
    expected_pairs,
    reference_dedup,
    to_dask,
)
from tests.helpers import search_frame as frame
from tests.helpers import search_vectors as vectors

N, D = 97, 12


# --------------------------------------------------------------------------- topk


@pytest.mark.parametrize("fmt", FORMATS)
def test_topk_every_format_with_null_nan_and_zero_rows(fmt: str) -> None:
    x = vectors()
    x[7] = np.nan
    x[8] = 0.0
    null = np.zeros(N, bool)
    null[9] = True
    pdf = frame(x, fmt, null)
    queries = vectors(5, seed=9)
    queries[2] = x[5]
    s = brute(queries, x)
    s[:, 9] = -np.inf
    want = expected_pairs(s, 4, None, pd.RangeIndex(5), pdf.index)
    for df in (pdf, to_dask(pdf, 4)):
        got = df.cosim.topk(queries, "emb", k=4, columns=["id", "text"])
        assert isinstance(got, pd.DataFrame)
        assert list(got.columns) == ["query", "rank", "match", "score", "id", "text"]
        assert got["score"].dtype == np.float32
        renamed = got.rename(columns={"query": "left", "match": "right"})[
            ["left", "right", "score", "rank"]
        ]
        assert_pairs_equal(renamed, want)
        assert (got["id"].to_numpy() == (got["match"].to_numpy() - 3) // 10).all()
        assert (got["text"] == [f"row {i}" for i in got["id"]]).all()
    # The duplicates of row 5 come in frame order, the row itself first.
    assert got[got["query"] == 2]["id"].tolist() == [5, 40, 41, 42]


def test_topk_queries_as_series_tensor_and_bad_shapes() -> None:
    x = vectors()
    pdf = frame(x)
    series = pd.Series(as_column(x[[3, 11]], "object_numpy"), index=["a", "b"])
    got = pdf.cosim.topk(series, "emb", k=1)
    assert got["query"].tolist() == ["a", "b"] and got["match"].tolist() == [33, 113]
    got = pdf.cosim.topk(torch.from_numpy(x[[11]]).double(), "emb", k=2)
    assert got["match"].tolist()[0] == 113 and got["score"].dtype == np.float32
    with pytest.raises(ValueError, match=r"queries has shape \(12,\); give a 2-D array"):
        pdf.cosim.topk(x[0], "emb")
    with pytest.raises(
        ValueError, match="column 'emb' holds vectors of 12 values and the queries of 5"
    ):
        pdf.cosim.topk(np.ones((2, 5)), "emb")
    with pytest.raises(ValueError, match=r"columns=\['score'\] would overwrite"):
        pdf.assign(score=1).cosim.topk(x[:1], "emb", columns=["score"])
    assert len(pdf.cosim.topk(np.zeros((0, D)), "emb")) == 0


def test_topk_queries_from_dask_and_from_frames() -> None:
    """A dask Series of vectors is computed and taken as a Series (labels name the
    queries); a frame of numbers is an (n, D) array; a frame with a vector column is
    refused, naming the Series to give."""
    x = vectors()
    pdf = frame(x)
    series = pd.Series(as_column(x[[3, 11]], "object_numpy"), index=["a", "b"])
    want = pdf.cosim.topk(series, "emb", k=2)
    by_array = pdf.cosim.topk(x[[3, 11]], "emb", k=2)
    queries = pd.DataFrame({"t": ["a", "b"], "vec": series}, index=["a", "b"])
    with_nan = queries.assign(vec=[x[3], np.full(D, np.nan)])
    for df in (pdf, to_dask(pdf, 3)):
        got = df.cosim.topk(to_dask(queries, 2)["vec"], "emb", k=2)
        pd.testing.assert_frame_equal(got.reset_index(drop=True), want.reset_index(drop=True))
        with pytest.warns(QueryWarning, match=r"1 query \(label 'b'\) with NaN"):
            got = df.cosim.topk(to_dask(with_nan, 2)["vec"], "emb", k=2)
        assert got["query"].tolist() == ["a", "a"]
        numbers = pd.DataFrame(x[[3, 11]])
        for q in (numbers, dd.from_pandas(numbers, npartitions=2)):
            got = df.cosim.topk(q, "emb", k=2)
            pd.testing.assert_frame_equal(
                got.reset_index(drop=True), by_array.reset_index(drop=True)
            )
        for q in (queries, dask_cosim.from_pandas(queries, npartitions=2)):
            with pytest.raises(
                TypeError,
                match=r"queries is a DataFrame \(columns \['t', 'vec'\]\); give the Series "
                r"of its embedding column, e\.g\. df\.cosim\.topk\(queries\['vec'\], 'emb'",
            ):
                df.cosim.topk(q, "emb", k=2)


def test_topk_read_only_queries_warn_nothing() -> None:
    # Read-only arrays are common queries (np.load(mmap_mode="r"), pandas 3's to_numpy);
    # torch.from_numpy warns on them, once per process.
    x = vectors()
    queries = x[[3, 11]].copy()
    queries.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = frame(x).cosim.topk(queries, "emb", k=1)
    assert got["match"].tolist() == [33, 113]


@pytest.mark.parametrize("npartitions", [1, 2])
def test_topk_carries_columns_in_their_own_dtypes(npartitions: int) -> None:
    """Int64 with nulls (ids past 2**53 exact), categories, strings and booleans keep
    their dtypes, as join and neighbors keep them, whether the result is empty or not."""
    x = np.eye(4, dtype=np.float32)
    pdf = pd.DataFrame({
        "emb": as_column(x, "fixed_size_list"),
        "id": pd.array([2**53 + 1, None, 2**53 + 3, 4], dtype="Int64"),
        "cat": pd.Categorical(list("abab")),
        "s": pd.array(list("wxyz"), dtype="string"),
        "b": pd.array([True, None, False, True], dtype="boolean"),
    })  # fmt: skip
    cols = ["id", "cat", "s", "b"]
    ddf = to_dask(pdf, npartitions)
    for queries in (x, x[:0]):
        got = ddf.cosim.topk(queries, "emb", k=2, columns=cols)
        assert got[cols].dtypes.to_dict() == pdf[cols].dtypes.to_dict()
    best = ddf.cosim.topk(x, "emb", k=1, columns=cols)
    pd.testing.assert_frame_equal(best[cols], pdf[cols].reset_index(drop=True))


def test_topk_same_for_every_partitioning() -> None:
    x = vectors(300, seed=3)
    x[200:230] = x[17]
    pdf = frame(x)
    base = pdf.cosim.topk(x[[17, 18, 19]], "emb", k=12, columns=["id"])
    with dask.config.set(scheduler="sync"):
        for npartitions in (2, 5, 13):
            got = to_dask(pdf, npartitions).cosim.topk(x[[17, 18, 19]], "emb", k=12, columns=["id"])
            pd.testing.assert_frame_equal(got, base)


# --------------------------------------------------------------------------- join


@pytest.mark.parametrize(("k", "thr"), [(3, None), (None, 0.5), (5, 0.3)])
@pytest.mark.parametrize(("nl", "nr"), [(1, 1), (3, 1), (4, 7)])
def test_join_equals_brute_force_and_ignores_partitioning(
    k: int | None, thr: float | None, nl: int, nr: int
) -> None:
    xl, xr = vectors(61, seed=1), vectors()
    pl, pr = frame(xl, "list"), frame(xr, "object_numpy")
    want = expected_pairs(brute(xl, xr), k, thr, pl.index, pr.index)
    with dask.config.set(scheduler="sync", **{"cosim.search.split-every": 2}):
        result = to_dask(pl, nl).cosim.join(to_dask(pr, nr), "emb", k=k, threshold=thr)
        assert isinstance(result, dd.DataFrame) and result.npartitions == nl
        got = result.compute().reset_index(drop=True)
    assert_pairs_equal(got, want)
    eager = pl.cosim.join(pr, "emb", k=k, threshold=thr)
    pd.testing.assert_frame_equal(eager, got)


def test_join_right_on_meta_and_laziness() -> None:
    pl = frame(vectors(20, seed=1))
    pr = frame(vectors(30)).rename(columns={"emb": "vec"})
    calls = []

    def counting_get(graph, keys, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(keys)
        return dask.get(graph, keys, **kwargs)

    with dask.config.set(scheduler=counting_get):
        result = to_dask(pl, 2).cosim.join(to_dask(pr, 3), "emb", right_on="vec", k=2)
        assert calls == []
        assert dict(result.dtypes) == {
            "left": np.dtype("int64"),
            "right": np.dtype("int64"),
            "score": np.dtype("float32"),
            "rank": np.dtype("int64"),
        }
        got = result.compute()
    assert len(calls) == 1 and len(got) == 40
    # A pandas right side joins a dask left side (sent once, as one key).
    mixed = to_dask(pl, 2).cosim.join(pr, "emb", right_on="vec", k=2).compute(scheduler="sync")
    pd.testing.assert_frame_equal(mixed, got)


def test_float64_inputs_give_float64_scores() -> None:
    x = vectors(30).astype(np.float64)
    got = frame(x).cosim.join(frame(x), "emb", k=1)
    assert got["score"].dtype == np.float64
    assert (got["left"] == got["right"]).all()


# --------------------------------------------------------------------------- neighbors / dedup


@pytest.mark.parametrize("npartitions", [1, 4, 9])
def test_neighbors_k_and_threshold(npartitions: int) -> None:
    x = vectors()
    pdf = frame(x, "fixed_size_list")
    s = brute(x, x)
    np.fill_diagonal(s, -np.inf)
    ddf = to_dask(pdf, npartitions)
    with dask.config.set(scheduler="sync"):
        got_k = ddf.cosim.neighbors("emb", k=3).compute().reset_index(drop=True)
        got_t = ddf.cosim.neighbors("emb", threshold=0.45).compute().reset_index(drop=True)
        got_kt = ddf.cosim.neighbors("emb", k=3, threshold=0.6).compute().reset_index(drop=True)
    assert_pairs_equal(got_k, expected_pairs(s, 3, None, pdf.index, pdf.index))
    assert_pairs_equal(got_kt, expected_pairs(s, 3, 0.6, pdf.index, pdf.index))
    upper = np.where(np.triu(np.ones_like(s, bool), 1), s, -np.inf)
    assert_pairs_equal(got_t, expected_pairs(upper, None, 0.45, pdf.index, pdf.index))
    assert (got_t["left"] < got_t["right"]).all()  # each unordered pair once, earlier left


@pytest.mark.parametrize("npartitions", [1, 3, 8])
def test_dedup_drops_every_row_with_an_earlier_match(npartitions: int) -> None:
    rng = np.random.default_rng(5)
    base = rng.standard_normal((40, 16)).astype(np.float32)
    copies = base[rng.integers(0, 40, 60)] + 0.05 * rng.standard_normal((60, 16)).astype(np.float32)
    x = np.concatenate([base, copies])[rng.permutation(100)]
    x[13] = np.nan  # never a duplicate, never dropped
    pdf = frame(x)
    keep = reference_dedup(x, 0.95)
    assert 40 <= keep.sum() < 70
    ddf = to_dask(pdf, npartitions)
    result = ddf.cosim.dedup("emb", 0.95)
    assert result.divisions == ddf.divisions and list(result.columns) == list(pdf.columns)
    got = result.compute(scheduler="sync")
    pd.testing.assert_frame_equal(got, pdf[keep])
    pd.testing.assert_frame_equal(pdf.cosim.dedup("emb", 0.95), pdf[keep])


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize("npartitions", [1, 3])
def test_parallel_rows_score_exactly_one(dtype: type, npartitions: int) -> None:
    """Exact copies and copies scaled by a power of two have cos = 1 exactly: threshold
    1.0 finds every pair of them, dedup(1.0) keeps the first of each, and their ties go
    by frame order.  Without the snap to 1, about half the pairs score 1 - 2**-52 or so
    (the rounding of their float64 products) and are missed."""
    x = np.random.default_rng(0).standard_normal((30, 300)).astype(dtype)
    rows = np.concatenate([x, 4 * x, x])  # row i, its scaled copy i + 30, its copy i + 60
    pdf, ddf = frame(rows), to_dask(frame(rows), npartitions)
    pairs = ddf.cosim.neighbors("emb", threshold=1.0).compute()
    pos = lambda labels: (np.asarray(labels) - 3) // 10  # noqa: E731  (frame's index)
    want = {(i, i + 30) for i in range(30)} | {(i, i + 60) for i in range(30)}
    want |= {(i + 30, i + 60) for i in range(30)}
    assert set(zip(pos(pairs["left"]), pos(pairs["right"]))) == want
    assert (pairs["score"] == 1.0).all()
    kept = ddf.cosim.dedup("emb", 1.0).compute()
    pd.testing.assert_frame_equal(kept, pdf.iloc[:30])
    kept = ddf.cosim.dedup("emb", 1.0, method="clustered", clusters=4).compute()
    pd.testing.assert_frame_equal(kept, pdf.iloc[:30])
    best = ddf.cosim.neighbors("emb", k=2).compute()
    best["right"] = pos(best["right"])
    assert best.groupby("left", sort=True)["right"].agg(list).tolist() == (
        [[i + 30, i + 60] for i in range(30)]
        + [[i, i + 60] for i in range(30)]
        + [[i, i + 30] for i in range(30)]
    )


def test_rows_of_one_value_score_their_sign() -> None:
    """D = 1: every pair of positive rows has cos = 1, so dedup names the first row as
    the match of every later one (the tie rule), and threshold 1.0 finds every pair."""
    v = np.array([[1.5965988636016846], [0.4360102713108063], [1.9081202745437622]], np.float32)
    pdf = frame(v)
    assert len(pdf.cosim.neighbors("emb", threshold=1.0)) == 3
    kept, removed = pdf.cosim.dedup("emb", 0.5, return_removed=True)
    assert len(kept) == 1 and kept.index.tolist() == [3]
    assert removed["left"].tolist() == [3, 3] and (removed["score"] == 1.0).all()  # row 0


# --------------------------------------------------------------------------- column layouts


def test_arrow_chunked_partitions() -> None:
    """A column of several Arrow chunks (as read from Parquet row groups) is one side."""
    x = vectors()
    t = pa.list_(pa.float32(), D)
    chunked = pa.chunked_array([pa.array(list(x[:50]), t), pa.array(list(x[50:]), t)])
    pdf = pd.DataFrame({"emb": pd.array(chunked, dtype=pd.ArrowDtype(t))})
    got = pdf.cosim.neighbors("emb", k=1)
    s = brute(x, x)
    np.fill_diagonal(s, -np.inf)
    assert_pairs_equal(got, expected_pairs(s, 1, None, pdf.index, pdf.index))


@pytest.mark.parametrize("method", ["exact", "clustered"])
def test_object_vector_columns_stay_vectors_in_results(method: str) -> None:
    """A dask frame built with dask's string conversion off keeps its per-row arrays in an
    object column; the rows dedup keeps, and the carried columns of its removed rows,
    are those arrays still (the exact method's results went through dd.from_delayed,
    which turned them into text under the default conversion)."""
    x = np.random.default_rng(0).standard_normal((60, 8)).astype(np.float32)
    x[30:40] = x[:10]
    pdf = pd.DataFrame({"emb": list(x), "id": np.arange(60), "doc": list(x)})
    df = to_dask(pdf, 3)
    opts = {"method": method, "clusters": 3} if method == "clustered" else {}
    kept, removed = df.cosim.dedup("emb", 0.99, return_removed=True, columns=["doc"], **opts)
    assert kept._meta["doc"].dtype == object and removed._meta["left_doc"].dtype == object
    kept, removed = dask.compute(kept, removed)
    assert kept["id"].tolist() == list(range(30)) + list(range(40, 60))
    assert isinstance(kept["emb"].iloc[0], np.ndarray)
    np.testing.assert_array_equal(np.stack(removed["left_doc"]), x[:10])
