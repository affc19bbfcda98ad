"""The search's errors and empty cases on dask and pandas frames: what is checked when
the graph is built (columns not found, with the vector columns suggested; widths that
differ; k and threshold out of range; text columns), a column given in the wrong place,
an array or Series given as join's right frame, ``columns=`` naming one column as a
string, ragged object columns (found at compute time), and empty or all-null sides
(empty results of the right columns and dtypes)."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import dask
import numpy as np
import pandas as pd
import pytest
import torch

import dask_cosim
from dask_cosim import clustered
from tests.helpers import no_computes, to_dask
from tests.helpers import search_frame as frame
from tests.helpers import search_vectors as vectors

D = 12  # the width of vectors()'s rows


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


def test_dedup_columns_without_the_removed_rows_are_refused() -> None:
    """dedup's ``columns`` name what the removed rows carry: without return_removed they
    did nothing, silently (the command line refused the same options)."""
    pdf = frame(vectors(40))
    for df in (pdf, to_dask(pdf, 3)):
        for method in ({}, {"method": "clustered", "clusters": 2}):
            with no_computes() if df is not pdf else nullcontext():
                with pytest.raises(ValueError, match=r"columns='id' .* return_removed=True"):
                    df.cosim.dedup("emb", 0.9, columns="id", **method)
    with pytest.raises(ValueError, match=r"columns=\['id'\] names what the removed rows"):
        clustered.dedup(pdf, "emb", 0.9, columns=["id"], clusters=2)


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


def test_a_name_two_columns_share_is_refused_naming_it() -> None:
    """pd.concat(axis=1) of frames with a column in common: the shared name picks a frame,
    not a column (it was "No dispatch for DataFrame"); from_pandas refuses it too."""
    pdf = frame(vectors(4)).assign(other=list(vectors(4)), id=np.arange(4))
    both = pd.concat([pdf, pdf[["other", "id"]]], axis=1)
    repeated = r"column '{}' is the name of 2 columns of the frame, so it names no one column"
    with pytest.raises(ValueError, match=repeated.format("other")):
        both.cosim.pairwise("emb", "other")
    with pytest.raises(ValueError, match=repeated.format("other")):
        both.cosim.dedup("other", threshold=0.9)
    with pytest.raises(ValueError, match="^columns: " + repeated.format("id")):
        both.cosim.topk(vectors(1), "emb", k=1, columns=["id"])
    with pytest.raises(ValueError, match=repeated.format("other")):
        dask_cosim.from_pandas(both)
    # Columns that are not used may share a name.
    assert len(both.cosim.topk(vectors(1), "emb", k=2)) == 2


def test_a_join_with_vectors_or_a_series_on_the_right_says_how_to_make_a_frame() -> None:
    """join's right side is a frame: an array of vectors or a Series (pandas or dask) is a
    TypeError that says how to make one (and, for vectors, names topk), not pandas'
    AttributeError; the frame the advice makes joins."""
    pdf = frame(vectors(5))
    for df in (pdf, dask_cosim.from_pandas(pdf, npartitions=2)):
        with (
            no_computes(),
            pytest.raises(
                TypeError,
                match=r"^join's right side is of type ndarray, not a DataFrame; make one with a "
                r"vector column 'emb', e\.g\. pd\.DataFrame\(\{'emb': list\(vectors\)\}\).*"
                r"df\.cosim\.topk\(vectors, 'emb', k=10\)$",
            ),
        ):
            df.cosim.join(vectors(2), "emb", k=1)
        # A dask Series passed the check for a frame (it has an attribute "columns") and
        # met pandas' AttributeError further on.
        for right in (pdf["emb"], dask_cosim.from_pandas(pdf, npartitions=2)["emb"]):
            with (
                no_computes(),
                pytest.raises(
                    TypeError,
                    match=r"^join's right side is of type Series, not a DataFrame; make it "
                    r"one: right\.to_frame\('emb'\)$",
                ),
            ):
                df.cosim.join(right, "emb", k=1)
            got = df.cosim.join(right.to_frame("emb"), "emb", k=1)
            got = got.compute() if dask.is_dask_collection(got) else got
            assert got["right"].tolist() == got["left"].tolist()


def test_ragged_object_columns_of_different_lengths_fail_at_compute() -> None:
    """Vectors of two lengths in the two frames of a join, found at compute (object
    columns): the error says which frame holds which (it named "column 'emb' (partition
    0)" twice), and the partition of a dask frame (eager frames have none)."""
    left = frame(vectors(5), "object_numpy")
    right = frame(vectors(5, d=4), "object_numpy")
    with pytest.raises(
        ValueError,
        match=r"^left column 'emb' holds vectors of 12 values and right column 'emb' of 4; ",
    ):
        left.cosim.join(right, "emb", k=1)
    with pytest.raises(
        ValueError,
        match=r"^left column 'emb' \(partition [01]\) holds vectors of 12 values and right "
        r"column 'emb' of 4; ",
    ):
        to_dask(left, 2).cosim.join(right, "emb", k=1).compute(scheduler="sync")


def test_ragged_queries_are_named_by_their_series_or_as_the_queries() -> None:
    """An unnamed Series of queries with rows of two lengths was "column 'None'"."""
    pdf = frame(vectors(5, d=3))
    for name, shown in ((None, "queries"), ("q", "q")):
        queries = pd.Series([[1.0, 0.0, 0.0], [0.0, 1.0]], name=name)
        with pytest.raises(
            ValueError, match=rf"^column '{shown}': row 1 has 2 values but row 0 has 3; "
        ):
            pdf.cosim.topk(queries, "emb", k=1)
        with pytest.raises(TypeError, match=rf"^column '{shown}': row 1 holds str 'x', "):
            pdf.cosim.topk(pd.Series([[1.0, 0.0, 0.0], "x"], name=name), "emb", k=1)


def test_queries_as_lists_of_rows() -> None:
    """A list of queries, some None or of another length (numpy raised "setting an array
    element with a sequence"), is checked as a Series of them: None a null query (it
    warns, by position), a row of another length the row's error; an empty list is no
    queries (it said "queries has shape (0,)")."""
    pdf = frame(vectors(5, d=3))
    with pytest.raises(ValueError, match=r"^column 'queries': row 1 has 2 values but row 0 has 3"):
        pdf.cosim.topk([[1.0, 0.0, 0.0], [0.0, 1.0]], "emb", k=1)
    with pytest.warns(dask_cosim.errors.QueryWarning, match=r"1 query \(position 1\) with NaN"):
        got = pdf.cosim.topk([[1.0, 0.0, 0.0], None], "emb", k=1)
    want = pdf.cosim.topk([[1.0, 0.0, 0.0]], "emb", k=1)
    assert got["match"].tolist() == want["match"].tolist() and got["query"].tolist() == [0]
    for df in (pdf, to_dask(pdf, 2)):
        empty = df.cosim.topk([], "emb", k=2)
        assert len(empty) == 0 and list(empty.columns) == ["query", "rank", "match", "score"]


def test_bad_names_and_flags_are_refused_at_the_call() -> None:
    """pandas' "Series.name must be a hashable type" from inside pairwise, groups(name=None)
    adding a column labelled NaN, and dedup(return_removed="no") returning a tuple."""
    pdf = frame(vectors(5, d=3))
    with pytest.raises(TypeError, match=r"^name=\['x'\] must be a label"):
        pdf.cosim.pairwise("emb", "emb", name=["x"])
    for df in (pdf, to_dask(pdf, 2)):
        got = df.cosim.groups("emb", 0.9, name=None)
        assert list(got.columns)[-1] == "group"
        with pytest.raises(TypeError, match=r"^return_removed='no' must be True or False"):
            df.cosim.dedup("emb", 0.9, return_removed="no")


@pytest.mark.parametrize("label", [np.nan, None])
def test_a_column_named_nan_or_none(label: Any) -> None:
    """pairwise of a dask frame's column named NaN (NaN != NaN: projected twice, then
    "No dispatch for DataFrame") or None (pandas cannot select it by a list) gives what
    the eager frame gives."""
    pdf = frame(vectors(6, d=3)).rename(columns={"emb": label})
    want = pdf.cosim.pairwise(label, label)
    got = to_dask(pdf, 2).cosim.pairwise(label, label).compute(scheduler="sync")
    np.testing.assert_allclose(got.to_numpy(), want.to_numpy(), rtol=1e-6)


def test_a_column_of_none_made_strings_by_dask_is_named_so() -> None:
    """dd.from_pandas makes an object column of None a string column; the error said to
    embed its text. It says the column holds no values, and how to keep it."""
    import dask.dataframe as dd

    pdf = pd.DataFrame({"emb": pd.Series([None] * 4, dtype=object), "id": range(4)})
    with pytest.raises(TypeError, match=r"^column 'emb' holds no values, every row null, "
                       r"which dask made a column of strings .*dask_cosim\.from_pandas"):  # fmt: skip
        dd.from_pandas(pdf, npartitions=2).cosim.neighbors("emb", k=1)
    assert len(dask_cosim.from_pandas(pdf, npartitions=2).cosim.neighbors("emb", k=1)) == 0


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


def test_an_eager_frames_object_columns_of_vectors_are_named_as_its_vectors() -> None:
    """An eager frame's object column of arrays is a vector column to suggest, as an
    Arrow one is (its first cell tells): a text column given as the embedding, and a
    column name with no close match, named no vector column there."""
    pdf = pd.DataFrame({"text": ["a b", "c d"], "emb": list(np.ones((2, 4), np.float32))})
    with pytest.raises(TypeError, match=r"holds text .* The frame's vector columns: \['emb'\]"):
        pdf.cosim.pairwise("text", "emb")
    with pytest.raises(KeyError, match=r"did you mean 'emb', the only vector column\?"):
        pdf.cosim.neighbors("embedding", k=1)
