"""topk / join / neighbors / dedup on dask and pandas frames, against a float64 brute force."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from typing import Any

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from distributed import Client

import dask_cosim
from tests.helpers import FORMATS, as_column, brute, no_computes, to_dask
from tests.helpers import search_frame as frame
from tests.helpers import search_vectors as vectors

N, D = 97, 12


def expected_pairs(
    s: np.ndarray, k: int | None, thr: float | None, li: pd.Index, ri: pd.Index
) -> pd.DataFrame:
    """The brute-force result: per left row, best first (ties by position) with k, else
    by right position."""
    rows = []
    for i in range(s.shape[0]):
        # Ranked lists best first; threshold-only pairs in frame order.
        order = (
            np.lexsort((np.arange(s.shape[1]), -s[i])) if k is not None else np.arange(s.shape[1])
        )
        order = order[np.isfinite(s[i, order])]
        if thr is not None:
            order = order[s[i, order] >= thr]
        if k is not None:
            order = order[:k]
        for rank, j in enumerate(order):
            rows.append((li[i], ri[j], s[i, j], rank))
    out = pd.DataFrame(rows, columns=["left", "right", "score", "rank"])
    return out if k is not None else out.drop(columns="rank")


def assert_pairs_equal(got: pd.DataFrame, want: pd.DataFrame, s: np.ndarray | None = None) -> None:
    assert list(got.columns) == list(want.columns)
    assert len(got) == len(want), (len(got), len(want))
    np.testing.assert_allclose(
        got["score"].to_numpy(np.float64), want["score"].to_numpy(), atol=1e-6
    )
    assert (got["left"].to_numpy() == want["left"].to_numpy()).all()
    assert (got["right"].to_numpy() == want["right"].to_numpy()).all()
    if "rank" in want:
        assert (got["rank"].to_numpy() == want["rank"].to_numpy()).all()


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


def reference_dedup(x: np.ndarray, thr: float) -> np.ndarray:
    s = brute(x, x)
    earlier = np.tril(s >= thr, -1)  # s[i, j] with j < i
    return ~earlier.any(axis=1)


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


# --------------------------------------------------------------------------- errors, empties


def test_errors_at_graph_time() -> None:
    pl = to_dask(frame(vectors()), 3)
    other = to_dask(frame(vectors(10, d=5)), 1)

    with no_computes():
        with pytest.raises(
            KeyError, match=r"on: column 'embs' not found; did you mean 'emb'\? available"
        ):
            pl.cosim.join(pl, "embs", k=1)
        with pytest.raises(KeyError, match=r"right_on: column 'vec' not found"):
            pl.cosim.join(pl, "emb", right_on="vec", k=1)
        with pytest.raises(
            ValueError,
            match="left column 'emb' holds vectors of 12 values and right column 'emb' of 5",
        ):
            pl.cosim.join(other, "emb", k=1)
        with pytest.raises(ValueError, match=r"k=0 must be an integer >= 1"):
            pl.cosim.join(pl, "emb", k=0)
        with pytest.raises(ValueError, match=r"k=True must be an integer"):
            pl.cosim.neighbors("emb", k=True)
        with pytest.raises(ValueError, match=r"give k .*, threshold .*, or both"):
            pl.cosim.join(pl, "emb")
        with pytest.raises(ValueError, match=r"threshold=1.5 must be a number in \[-1, 1\]"):
            pl.cosim.neighbors("emb", threshold=1.5)
        with pytest.raises(ValueError, match=r"threshold=nan must be"):
            pl.cosim.dedup("emb", float("nan"))
        with pytest.raises(TypeError, match=r"column 'text' holds text .* such as 'row 0'"):
            pl.cosim.neighbors("text", k=1)
        with pytest.raises(KeyError, match=r"columns: column 'idd' not found; did you mean 'id'"):
            pl.cosim.topk(np.ones((1, D)), "emb", columns=["idd"])


def test_columns_may_name_one_column_as_a_string() -> None:
    """columns="id" is the column "id" (as pandas takes one label), not "i" and "d"."""
    x = vectors(40)
    pdf = frame(x)
    q = x[:2]
    runs: list[Any] = [
        lambda df, c: df.cosim.topk(q, "emb", k=3, columns=c),
        lambda df, c: df.cosim.join(df, "emb", k=2, columns=c),
        lambda df, c: df.cosim.join(df, "emb", k=2, columns=["text"], right_columns=c),
        lambda df, c: df.cosim.neighbors("emb", threshold=0.3, columns=c),
        lambda df, c: df.cosim.dedup("emb", 0.3, return_removed=True, columns=c)[1],
    ]
    for df in (pdf, dask_cosim.from_pandas(pdf, npartitions=3)):
        for run in runs:
            got, want = dask.compute(run(df, "id"), run(df, ["id"]))
            pd.testing.assert_frame_equal(got, want)
    hits = pdf.cosim.topk(q, "emb", k=3, columns="id")
    assert list(hits.columns) == ["query", "rank", "match", "score", "id"]
    with pytest.raises(KeyError, match=r"columns: column 'ids' not found; did you mean 'id'"):
        pdf.cosim.topk(q, "emb", columns="ids")


def test_an_embedding_column_not_found_suggests_the_vector_columns() -> None:
    """No column name is close to "embedding": the frame's vector columns are suggested
    (the CLI's --on says the same); a close name still comes first."""
    pdf = frame(vectors(5))
    for df in (pdf, dask_cosim.from_pandas(pdf, npartitions=2)):
        with pytest.raises(
            KeyError,
            match=r"^\"on: column 'embedding' not found; did you mean 'emb', the only vector "
            r"column\? available: \['emb', 'id', 'text'\]",
        ):
            df.cosim.neighbors("embedding", k=1)
        with pytest.raises(KeyError, match=r"right_on: .* the vector columns are \['emb', 'v'\];"):
            df.cosim.join(df.assign(v=df["emb"]), "emb", right_on="vector", k=1)
        with pytest.raises(KeyError, match=r"column 'embs' not found; did you mean 'emb'\? "):
            df.cosim.dedup("embs", 0.9)
        # Carried columns need not hold vectors: no such suggestion.
        with pytest.raises(KeyError, match=r"columns: column 'embedding' not found; available"):
            df.cosim.topk(vectors(1), "emb", columns=["embedding"])


def test_the_column_given_in_the_wrong_place_is_named() -> None:
    """neighbors and dedup take the column first, topk and join the queries or the right
    frame first: the column given first to topk or join is a TypeError saying the order,
    not pandas' "unhashable type"; any array or frame given as the column says what
    was given."""
    pdf = frame(vectors(5))
    queries = vectors(2)
    for df in (pdf, dask_cosim.from_pandas(pdf, npartitions=2)):
        with pytest.raises(TypeError, match=r"^df.cosim.topk takes the queries first, then the "
                           r"column: df.cosim.topk\(queries, 'emb', k=10\)$"):  # fmt: skip
            df.cosim.topk("emb", queries)
        with pytest.raises(TypeError, match=r"topk\(queries, 'emb'"):
            df.cosim.topk("emb", torch.from_numpy(queries))
        with pytest.raises(
            TypeError, match=r"join takes the right frame first.*join\(right, 'emb'"
        ):
            df.cosim.join("emb", df, k=1)
        with pytest.raises(TypeError, match=r"^on= must name a column of the frame; got a ndarray"):
            df.cosim.neighbors(queries, k=1)
        with pytest.raises(TypeError, match=r"^on= must name a column of the frame; got a Tensor"):
            df.cosim.topk(queries, torch.from_numpy(queries))


def test_ragged_object_columns_of_different_lengths_fail_at_compute() -> None:
    left = frame(vectors(5), "object_numpy")
    right = frame(vectors(5, d=4), "object_numpy")
    with pytest.raises(
        ValueError,
        match=r"column 'emb' \(partition 0\) holds vectors of 12 values and column 'emb' "
        r"\(partition 0\) of 4",
    ):
        left.cosim.join(right, "emb", k=1)


def test_empty_sides_give_empty_results() -> None:
    pdf = frame(vectors())
    empty = pdf.iloc[:0]
    for left, right in ((pdf, empty), (empty, pdf)):
        got = to_dask(left, 1).cosim.join(to_dask(right, 1), "emb", k=2).compute(scheduler="sync")
        assert len(got) == 0 and list(got.columns) == ["left", "right", "score", "rank"]
        assert got["score"].dtype == np.float32 and got["left"].dtype == np.int64
    assert len(empty.cosim.topk(vectors(2), "emb", k=3)) == 0
    assert len(empty.cosim.dedup("emb", 0.9)) == 0
    all_null = frame(vectors(6), "list", null=np.ones(6, bool))
    assert len(all_null.cosim.neighbors("emb", threshold=-1)) == 0
    assert len(all_null.cosim.dedup("emb", -1)) == 6


# --------------------------------------------------------------------------- clusters, memory


@pytest.mark.slow
def test_search_on_worker_processes(shared_client: Client) -> None:
    assert len(set(shared_client.run(os.getpid).values())) == 2
    x = vectors(300, seed=7)
    pdf = frame(x)
    ddf = dask_cosim.from_pandas(pdf, npartitions=6)
    s = brute(x, x)
    np.fill_diagonal(s, -np.inf)
    got = ddf.cosim.neighbors("emb", k=4).compute().reset_index(drop=True)
    assert_pairs_equal(got, expected_pairs(s, 4, None, pdf.index, pdf.index))
    got = ddf.cosim.topk(x[:3], "emb", k=2, columns=["id"])
    assert got["id"].tolist()[::2] == [0, 1, 2]
    whole = ddf.compute()
    pd.testing.assert_frame_equal(
        ddf.cosim.dedup("emb", 0.9).compute(), whole[reference_dedup(x, 0.9)]
    )
    single = dask_cosim.from_pandas(pdf, npartitions=1)  # a one-partition right: broadcast
    got = ddf.cosim.join(single, "emb", threshold=0.5).compute().reset_index(drop=True)
    assert_pairs_equal(got, expected_pairs(brute(x, x), None, 0.5, pdf.index, pdf.index))


def test_queries_and_eager_frames_go_to_the_workers_outside_the_graph(
    shared_client: Client,
) -> None:
    """topk's queries and an eager right frame of join are scattered to the workers (to
    every one: each pair task needs them), not sent inside the graph ("Sending large
    graph"), and give the same results."""
    x = vectors(2000, 64, seed=3)
    pdf = frame(x)
    ddf = dask_cosim.from_pandas(pdf, npartitions=3)
    with dask.config.set({"distributed.admin.large-graph-warning-threshold": "100kB"}):
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="Sending large graph")
            got = ddf.cosim.topk(x, "emb", k=1)
            pairs = ddf.cosim.join(pdf, "emb", k=1).compute()
    pd.testing.assert_frame_equal(got, pdf.cosim.topk(x, "emb", k=1))
    want = pdf.cosim.join(pdf, "emb", k=1)
    pd.testing.assert_frame_equal(pairs.reset_index(drop=True), want.reset_index(drop=True))


def test_peak_memory_of_a_pair_task_is_bounded_by_the_tile() -> None:
    """1,000 x 100,000 scores would take 400 MB; the task stays within inputs + tiles."""
    code = textwrap.dedent(
        """
        import resource, torch, pandas as pd
        from dask_cosim import search_partition as search
        torch.manual_seed(0)
        def side(n):
            prep = search.sk.prepare(torch.randn(n, 16), eps=1e-8)
            return search.Side(prep, pd.RangeIndex(n), 0, "v", None)
        q, r = side(1000), side(100000)
        tiles = {"cpu": 8 << 20, "cuda": 8 << 20}
        search.join_pair_topk(q, r, 10, None, tiles)  # warm up the allocator and BLAS
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = search.join_pair_topk(q, r, 10, None, tiles)
        search.pair_threshold(q, r, 0.8, tiles)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert len(out) == 10000
        print(before, after, (after - before) * 1024)
        """
    )
    # Every allocation above 1 MiB gets its own mapping, returned when freed, so the peak
    # RSS follows the live tensors rather than what glibc's per-thread arenas keep cached.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    growth = int(out.stdout.split()[-1])
    assert growth < 100e6, out.stdout


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


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_kernels_on_cuda_give_the_cpu_answer() -> None:
    from dask_cosim import search_kernels as sk

    x = torch.from_numpy(vectors(500, seed=11))
    results = []
    for device in ("cpu", "cuda"):
        p = sk.prepare(x, eps=1e-8, device=device)
        res, _ = sk.topk(p, p, 5, tile_bytes=1 << 16, same=True)
        i, j, _ = sk.threshold_pairs(p, p, 0.5, tile_bytes=1 << 16, mode="upper")
        results.append((res.index.cpu(), res.score.cpu(), set(zip(i.tolist(), j.tolist()))))
    (ia, sa, pa_), (ib, sb, pb) = results
    assert torch.equal(ia, ib) and pa_ == pb
    torch.testing.assert_close(sa, sb, atol=1e-12, rtol=0)


@pytest.mark.gpu
def test_cudf_frames_give_the_pandas_answer() -> None:
    cudf = pytest.importorskip("cudf")
    dask_cudf = pytest.importorskip("dask_cudf")
    x = vectors(200, seed=12)
    pdf = frame(x, "list")[["emb", "id"]]
    gdf = cudf.from_pandas(pdf)
    ddf = dask_cudf.from_cudf(gdf, npartitions=3)
    want = pdf.cosim.neighbors("emb", k=3)
    got = ddf.cosim.neighbors("emb", k=3).compute()
    assert isinstance(got, cudf.DataFrame)  # cudf in, cudf out
    pd.testing.assert_frame_equal(got.to_pandas().reset_index(drop=True), want)
    kept = ddf.cosim.dedup("emb", 0.6).compute()
    assert kept["id"].to_pandas().tolist() == pdf.cosim.dedup("emb", 0.6)["id"].tolist()
    hits = gdf.cosim.topk(x[:2], "emb", k=2, columns=["id"])
    assert isinstance(hits, cudf.DataFrame) and hits["id"].to_pandas().tolist()[::2] == [0, 1]


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
