"""Search results that name their rows: carried columns, the warning when labels may
repeat, what dedup removed and groups of near-duplicates (against a float64 brute force),
queries that cannot match, text where vectors were expected."""

from __future__ import annotations

import itertools
import re
import sys
import warnings
from pathlib import Path

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dask_cosim
from dask_cosim import search_kernels
from dask_cosim.errors import QueryWarning, RepeatedLabelsWarning
from dask_cosim.io import vectors_to_arrow
from tests.helpers import brute

THR = 0.9


def vectors(n: int = 90, d: int = 6, seed: int = 0) -> np.ndarray:
    """Random rows with planted near-duplicates, exact duplicates (ties) and chains."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    if n < 61:
        return x
    x[30:40] = x[:10] + 0.05 * rng.standard_normal((10, d)).astype(np.float32)
    x[40:45] = x[30:35] + 0.05 * rng.standard_normal((5, d)).astype(np.float32)
    x[50:53] = x[3]  # ties: equal scores with row 3 and 33's copies
    x[60] = np.nan
    return x


def frame(x: np.ndarray) -> pd.DataFrame:
    n = len(x)
    return pd.DataFrame({"id": np.arange(n) * 10 + 1, "emb": vectors_to_arrow(x)})


def repeating(pdf: pd.DataFrame, parts: int = 3) -> dd.DataFrame:
    """Partitions each numbered from 0 (as dd.read_parquet reads plain files): unknown
    divisions, repeated labels."""
    bounds = np.linspace(0, len(pdf), parts + 1).astype(int)
    pieces = [pdf.iloc[a:b].reset_index(drop=True) for a, b in itertools.pairwise(bounds)]
    return dd.from_map(lambda p: p, pieces, meta=pdf.iloc[:0], enforce_metadata=False)


def as_frames(pdf: pd.DataFrame) -> dict[str, object]:
    return {
        "pandas": pdf,
        "dask, 1 partition": dask_cosim.from_pandas(pdf, npartitions=1),
        "dask, repeated labels": repeating(pdf),
    }


def computed(obj: object) -> pd.DataFrame:
    return obj.compute(scheduler="sync") if dask.is_dask_collection(obj) else obj  # type: ignore[attr-defined, no-any-return]


# --------------------------------------------------------------------------- carried columns


def test_join_and_neighbors_carry_columns_that_name_the_rows() -> None:
    x = vectors()
    pdf = frame(x)
    ids = pdf["id"].to_numpy()
    s = brute(x, x)
    upper = np.triu(s >= THR, 1)
    want = sorted((ids[i], ids[j]) for i, j in zip(*np.nonzero(upper)))
    for name, df in as_frames(pdf).items():
        got = computed(df.cosim.neighbors("emb", threshold=THR, columns=["id"]))
        assert list(got.columns) == ["left", "right", "score", "left_id", "right_id"], name
        assert sorted(zip(got["left_id"], got["right_id"])) == want, name
        np.testing.assert_allclose(
            got["score"], s[(got["left_id"] - 1) // 10, (got["right_id"] - 1) // 10], atol=1e-6
        )
        top = computed(df.cosim.join(df, "emb", k=2, columns=["id"]))
        assert list(top.columns) == ["left", "right", "score", "rank", "left_id", "right_id"]
        best = np.argsort(-np.where(np.isfinite(s), s, -2), axis=1, kind="stable")[:, :2]
        valid = np.isfinite(x).all(1)
        want_top = np.stack([ids[best[i]] for i in np.flatnonzero(valid)]).reshape(-1)
        assert top["right_id"].tolist() == want_top.tolist(), name
    # Different columns on each side, dtypes kept, an empty result keeps them too.
    other = pdf.assign(doc=[f"d{i}" for i in range(len(pdf))])
    got = pdf.cosim.join(other, "emb", threshold=1.0, columns=["id"], right_columns=["doc"])
    assert list(got.columns)[-2:] == ["left_id", "right_doc"]
    assert got["right_doc"].dtype == other["doc"].dtype


def test_labels_keep_the_index_dtype() -> None:
    """The labels of every result have the searched frame's index dtype: a categorical
    index gives categorical labels in topk's match as in join's left and right."""
    x = vectors(30)
    pdf = frame(x).set_index(pd.CategoricalIndex([f"r{i}" for i in range(30)], name="key"))
    for name, df in as_frames(pdf).items():
        if name == "dask, repeated labels":
            continue  # numbered from 0 there
        want = pdf.index.dtype
        assert computed(df.cosim.topk(x[:2], "emb", k=3))["match"].dtype == want, name
        got = computed(df.cosim.neighbors("emb", k=2))
        assert got["left"].dtype == got["right"].dtype == want, name


def test_carried_columns_are_checked() -> None:
    df = frame(vectors())
    with pytest.raises(KeyError, match=r"columns: column 'idd' not found; did you mean 'id'"):
        df.cosim.neighbors("emb", k=1, columns=["idd"])
    with pytest.raises(KeyError, match=r"right_columns: column 'doc' not found"):
        df.cosim.join(df, "emb", k=1, right_columns=["doc"])
    # columns= go to both sides where right_columns= is not given: named as columns=.
    with pytest.raises(KeyError, match=r"^.columns \(the right frame's too: right_columns="):
        df.cosim.join(df[["emb"]], "emb", k=1, columns=["id"])
    with pytest.raises(ValueError, match=r"columns=\['id', 'id'\] names a column twice"):
        df.cosim.neighbors("emb", k=1, columns=["id", "id"])
    # Two labels, one result name: the second column overwrote the first, silently.
    both = df.assign(**{"1": df["id"] * 10}).rename(columns={"id": 1})
    clash = r"columns 1 and '1' would both be carried as 'left_1'; rename one of them"
    for call in (
        lambda: both.cosim.neighbors("emb", k=1, columns=[1, "1"]),
        lambda: both.cosim.neighbors("emb", threshold=THR, columns=[1, "1"], method="clustered"),
        lambda: both.cosim.join(both, "emb", threshold=THR, columns=[1, "1"]),
        lambda: both.cosim.dedup("emb", THR, return_removed=True, columns=[1, "1"]),
    ):
        with pytest.raises(ValueError, match=clash):
            call()
    clash = r"columns 1 and '1' would both be carried as 'right_1'"
    with pytest.raises(ValueError, match=clash):
        both.cosim.join(both, "emb", k=1, columns=[], right_columns=[1, "1"])


def test_labels_that_may_repeat_are_warned_once_naming_the_fix(tmp_path: Path) -> None:
    pdf = frame(vectors())
    df = repeating(pdf)
    with pytest.warns(RepeatedLabelsWarning) as caught:
        df.cosim.join(df, "emb", k=1)
    assert len(caught) == 1 and caught[0].filename == __file__  # the caller's line
    # Called as a function, too (the fixed stack level pointed a frame above the caller).
    queries = pd.Series(list(vectors()[:2]), index=["a", "a"])
    with pytest.warns(UserWarning) as seen:
        line = sys._getframe().f_lineno + 1
        dask_cosim.search.join(df, df, "emb", k=1)
    assert [(w.filename, w.lineno) for w in seen] == [(__file__, line)]
    with pytest.warns(UserWarning) as seen:
        line = sys._getframe().f_lineno + 1
        dask_cosim.search.topk(pdf, queries, "emb", k=1)
    assert [(w.filename, w.lineno) for w in seen] == [(__file__, line)]
    text = str(caught[0].message)
    assert "3 partitions and unknown divisions" in text and "columns=['id']" in text
    # Reading with dask_cosim.read_parquet is the fix for dask's read alone (a frame
    # of reset_index, concat or merge was told it too).
    assert "dask_cosim.read_parquet" not in text and "reset_index, concat and merge" in text
    for i, part in enumerate((pdf.iloc[:20], pdf.iloc[20:])):  # no pandas metadata:
        table = pa.Table.from_pandas(part, preserve_index=False).replace_schema_metadata()
        pq.write_table(table, tmp_path / f"{i}.parquet")  # dask's reader fails on its dtype
    with pytest.warns(RepeatedLabelsWarning, match=r"dd.read_parquet numbers each file from 0"):
        dd.read_parquet(tmp_path).cosim.neighbors("emb", k=1)
    for call in (
        lambda: df.cosim.neighbors("emb", threshold=THR),
        lambda: df.cosim.topk(vectors()[:2], "emb", k=1),
        lambda: df.cosim.dedup("emb", THR, return_removed=True),
    ):
        with pytest.warns(RepeatedLabelsWarning):
            call()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RepeatedLabelsWarning)
        df.cosim.neighbors("emb", threshold=THR, columns=["id"])
        df.cosim.dedup("emb", THR)  # the kept rows are the frame's own rows
        dask_cosim.from_pandas(pdf, npartitions=3).cosim.neighbors("emb", k=1)  # divisions
        pdf.cosim.neighbors("emb", k=1)
    # The right side's fix is right_columns; an eager frame whose labels repeat warns too
    # (it was silent, and merging the result back on labels doubled its rows); queries of
    # a Series whose labels repeat, which 'query' cannot tell apart, too.
    with pytest.warns(RepeatedLabelsWarning, match=r"right frame .*right_columns=\['id'\]"):
        df.cosim.join(df, "emb", k=1, columns=["id"], right_columns=[])
    twice = pd.concat([pdf, pdf])
    with pytest.warns(RepeatedLabelsWarning, match="the frame's index labels repeat"):
        twice.cosim.neighbors("emb", k=1)
    # The same frame in dask's memory, known divisions or one partition, an assign and a
    # selection over it: its labels are in memory to see (the dask frames were silent).
    for parts in (1, 2):
        held = dask_cosim.from_pandas(twice, npartitions=parts)
        for df in (held, held.assign(x=1)[["emb", "x"]]):
            with pytest.warns(RepeatedLabelsWarning, match="the frame's index labels repeat"):
                df.cosim.neighbors("emb", k=1)
    with warnings.catch_warnings():  # labels made anew, or rows dropped: nothing sure
        warnings.simplefilter("error", RepeatedLabelsWarning)
        dask_cosim.from_pandas(twice.reset_index(drop=True), 2).cosim.neighbors("emb", k=1)
        held = dask_cosim.from_pandas(twice, 2)
        # (A filter may drop the repeats, and says so only once computed.)
        held[held["id"] < 40].cosim.neighbors("emb", k=1)
        numbered = twice.assign(n=np.arange(len(twice)))
        dask_cosim.from_pandas(numbered, 2).set_index("n").cosim.neighbors("emb", k=1)
    queries = pd.Series(list(vectors()[:3]), index=["a", "a", "b"])
    with pytest.warns(QueryWarning, match=r"the queries' index labels repeat \('a'\)"):
        pdf.cosim.topk(queries, "emb", k=1)


# --------------------------------------------------------------------------- dedup


def brute_removed(s: np.ndarray) -> dict[int, tuple[int, float]]:
    """Each dropped row -> (its earlier match of highest score, ties to the earliest;
    that score)."""
    out = {}
    for r in range(len(s)):
        scores = s[r, :r]
        hits = np.flatnonzero(scores >= THR)
        if len(hits):
            best = hits[np.lexsort((hits, -scores[hits]))[0]]
            out[r] = (int(best), float(scores[best]))
    return out


def test_dedup_returns_what_it_removed() -> None:
    x = vectors()
    pdf = frame(x)
    ids = pdf["id"].to_numpy()
    want = brute_removed(brute(x, x))
    assert want[51][0] == 3 and want[52][0] == 3  # ties go to the earliest row
    for name, df in as_frames(pdf).items():
        kept, removed = df.cosim.dedup("emb", THR, return_removed=True, columns=["id"])
        if dask.is_dask_collection(kept):
            kept, removed = dask.compute(kept, removed, scheduler="sync")
        assert list(removed.columns) == ["left", "right", "score", "left_id", "right_id"]
        rows = (removed["right_id"].to_numpy() - 1) // 10
        assert rows.tolist() == sorted(want), name  # frame order
        assert [want[r][0] for r in rows] == ((removed["left_id"] - 1) // 10).tolist(), name
        np.testing.assert_allclose(removed["score"], [want[r][1] for r in rows], atol=1e-6)
        pd.testing.assert_frame_equal(
            kept.reset_index(drop=True), computed(df.cosim.dedup("emb", THR)).reset_index(drop=True)
        )
        # Following left from removed row to removed row ends at a kept row.
        left_of = dict(zip(removed["right_id"], removed["left_id"]))
        for row_id in removed["right_id"]:
            while row_id in left_of:
                row_id = left_of[row_id]
            assert row_id in set(kept["id"]) and row_id in ids


def union_find_groups(s: np.ndarray) -> np.ndarray:
    parent = list(range(len(s)))

    def root(a: int) -> int:
        while parent[a] != a:
            a = parent[a]
        return a

    for i, j in zip(*np.nonzero(np.triu(s >= THR, 1))):
        ri, rj = root(int(i)), root(int(j))
        parent[max(ri, rj)] = min(ri, rj)
    return np.array([root(i) for i in range(len(s))])


def test_groups_are_the_components_of_the_threshold_graph() -> None:
    x = vectors()
    pdf = frame(x)
    want = union_find_groups(brute(x, x))
    assert len(set(want)) < len(want) - 10  # chains and ties make real groups
    for name, df in as_frames(pdf).items():
        got = computed(df.cosim.groups("emb", THR))
        assert list(got.columns) == ["id", "emb", "group"], name
        assert got["group"].tolist() == want.tolist(), name
    assert want[60] == 60  # the NaN row is a group of its own
    with pytest.raises(ValueError, match="name='id' is a column of the frame already"):
        pdf.cosim.groups("emb", THR, name="id")
    # Any label, as pairwise's name (an int gave "keywords must be strings"), not a list.
    for name, df in as_frames(pdf).items():
        got = computed(df.cosim.groups("emb", THR, name=7))
        assert list(got.columns) == ["id", "emb", 7] and got[7].tolist() == want.tolist(), name
    with pytest.raises(TypeError, match=r"^name=\['g'\] must be a column label"):
        pdf.cosim.groups("emb", THR, name=["g"])


# --------------------------------------------------------------------------- traps


def test_nan_and_zero_queries_are_reported() -> None:
    x = vectors()
    pdf = frame(x)
    q = x[:5].copy()
    q[1, 2] = np.nan
    q[3] = 0
    with pytest.warns(QueryWarning) as caught:
        got = pdf.cosim.topk(q, "emb", k=2)
    messages = [str(w.message) for w in caught]
    assert messages[0].startswith("1 query (position 1) with NaN, inf or null values")
    assert messages[1].startswith("1 query (position 3) of zero vectors")
    assert 1 not in set(got["query"]) and (got[got["query"] == 3]["score"] == 0).all()
    series = pd.Series(vectors_to_arrow(q), index=list("abcde"))
    with pytest.warns(QueryWarning) as caught:
        dask_cosim.from_pandas(pdf, npartitions=2).cosim.topk(series, "emb", k=2)
    assert [str(w.message)[:24] for w in caught] == [
        "1 query (label 'b') with",
        "1 query (label 'd') of z",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error", QueryWarning)
        pdf.cosim.topk(x[:3], "emb", k=2)


def test_text_is_told_apart_from_vectors_written_as_text() -> None:
    pdf = frame(vectors(20)).assign(text=[f"document {i}" for i in range(20)])
    for df in (pdf, dask_cosim.from_pandas(pdf, npartitions=2)):
        with pytest.raises(TypeError) as raised:
            df.cosim.topk(vectors(2), "text")
        text = str(raised.value)
        assert text.startswith("column 'text' holds text (")
        assert "such as 'document 0'" in text and "SentenceTransformer" in text
        assert "from_pandas" not in text and "vector columns: ['emb']" in text
    written = pdf.assign(text=[str(v) for v in vectors(20)])  # '[ 0.12 -1.3 ...]'
    with pytest.raises(TypeError, match=r"holds strings .*dask_cosim.from_pandas\(pdf\)"):
        written.cosim.neighbors("text", k=1)


def test_threshold_scores_are_within_the_documented_bound() -> None:
    """docs/similarity-search.md: float32 threshold scores are within margin(D) of the
    float64 ones (D = 384, near-parallel rows: the largest scores, the largest errors)."""
    rng = np.random.default_rng(3)
    base = rng.standard_normal((40, 384)).astype(np.float32)
    x = np.concatenate([base, base + 0.02 * rng.standard_normal(base.shape).astype("f4")])
    got = frame(x).cosim.neighbors("emb", threshold=0.5)
    s = brute(x, x)
    err = np.abs(got["score"].to_numpy(np.float64) - s[got["left"], got["right"]])
    assert len(got) >= 40 and err.max() <= search_kernels.margin(384)
    assert re.search(r"\(D \+ 8\) · 2⁻²⁴", open_docs("similarity-search.md"))


def test_docs_quote_the_bounds_the_code_computes() -> None:
    """The figures docs/similarity-search.md gives for the float32 margin and the float64
    re-score's error are what search_kernels computes (a reader compares with them)."""
    docs = " ".join(open_docs("similarity-search.md").split())

    def written(x: float) -> str:  # as the docs write it: 2.3e-5
        return re.sub(r"e-0*", "e-", f"{x:.1e}")

    for dim, words in [(384, "384"), (1536, "1,536")]:
        assert f"{written(search_kernels.margin(dim))} at D = {words}" in docs
    assert f"2⁻⁵³, {written(search_kernels.rescore_error(384))} at D = 384" in docs


def open_docs(name: str) -> str:
    from pathlib import Path

    return (Path(dask_cosim.__file__).parents[1] / "docs" / name).read_text()


def test_removed_rows_and_groups_over_blocks_of_partitions() -> None:
    """More partitions than cosim.search.max-blocks: blocks of consecutive partitions are
    searched together, and each partition gets its own rows back."""
    x = vectors()
    pdf = frame(x)
    s = brute(x, x)
    want = brute_removed(s)
    with dask.config.set({"cosim.search.max-blocks": 2}):
        df = repeating(pdf, parts=5)
        kept, removed = df.cosim.dedup("emb", THR, return_removed=True, columns=["id"])
        grouped = df.cosim.groups("emb", THR)
        kept, removed, grouped = dask.compute(kept, removed, grouped, scheduler="sync")
    assert removed["right_id"].tolist() == [10 * r + 1 for r in sorted(want)]
    assert removed["left_id"].tolist() == [10 * want[r][0] + 1 for r in sorted(want)]
    assert sorted(kept["id"]) == sorted(set(pdf["id"]) - set(removed["right_id"]))
    assert grouped["group"].tolist() == union_find_groups(s).tolist()


def test_result_rows_already_in_order_skip_the_sort() -> None:
    """search_results._in_order (which lets a single part's sorted pairs skip the sort)
    says yes only when np.lexsort would leave the rows where they are, and always then
    without NaN (a NaN score it may not vouch for: the rows are then sorted); ties on
    every key, several keys, empty and one-row frames."""
    from dask_cosim.search_results import _in_order

    rng = np.random.default_rng(0)
    for n in range(6):
        for _ in range(300):
            keys = [rng.integers(0, 3, n).astype(float) for _ in range(3)]
            if n and rng.random() < 0.2:
                keys[1][rng.integers(n)] = np.nan
            order = np.lexsort(keys)
            stays = np.array_equal(order, np.arange(n))
            if _in_order(keys):
                assert stays
            elif not np.isnan(keys[1]).any():
                assert not stays
            assert _in_order([k[order] for k in keys]) or np.isnan(keys[1]).any()
