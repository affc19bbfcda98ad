"""The clustered neighbours and dedup against the all-pairs search: the exact mode on
adversarial data (float16 to float64, bfloat16 tiles, ties at the threshold, dask
partitions, partitions routed in pieces, generated embeddings), the recall of the
n_probe mode against a brute-force count, bad arguments and empty frames, and a run on
worker processes with the routing shuffle's method.  The kernels under it:
tests/test_clustered_kernels.py."""

from __future__ import annotations

import shutil
import tempfile
import types

import dask
import numpy as np
import pandas as pd
import psutil
import pytest
from distributed import Client

import dask_cosim
from dask_cosim import clustered, clustered_recall
from dask_cosim import search_kernels as sk
from dask_cosim.datasets import make_embeddings
from tests.clustered_data import adversarial, frame
from tests.helpers import to_dask


def assert_same(got: pd.DataFrame, want: pd.DataFrame, exact_scores: bool) -> None:
    got, want = got.reset_index(drop=True), want.reset_index(drop=True)
    assert list(got.columns) == list(want.columns) == ["left", "right", "score"]
    assert got.dtypes.to_dict() == want.dtypes.to_dict()
    assert len(got) == len(want), (len(got), len(want))
    assert (got["left"].to_numpy() == want["left"].to_numpy()).all()
    assert (got["right"].to_numpy() == want["right"].to_numpy()).all()
    if exact_scores:
        assert (got["score"].to_numpy() == want["score"].to_numpy()).all()
    else:  # all-pairs keeps float32 tile scores away from the threshold
        np.testing.assert_allclose(got["score"], want["score"], atol=2e-6)


# --------------------------------------------------------------------------- exact mode


@pytest.mark.parametrize(
    ("dtype", "threshold", "clusters", "block_bytes"),
    [
        (np.float32, 0.9, 12, None),
        (np.float32, 0.75, 5, 20_000),  # clusters split into sub-blocks of ~150 rows
        (np.float64, 0.95, 40, 60_000),
        (np.float16, 0.9, 12, 20_000),  # carried through the shuffle as float16
        (np.float32, 0.5, 1, None),  # one cluster: all pairs
        (np.float32, 1.0, 30, None),  # only exact duplicates
    ],
)
@pytest.mark.parametrize("tiles", ["fp32", "bfloat16"])
def test_exact_mode_equals_all_pairs(
    dtype: type, threshold: float, clusters: int, block_bytes: int, tiles: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Blocks searched by float32 tiles, or by bfloat16 ones (as CPUs with bfloat16 units
    search them by default), find the all-pairs answer of float32 tiles."""
    x = adversarial(dtype=dtype)
    null = np.zeros(len(x), bool)
    null[[11, 350]] = True
    pdf = frame(x, null)
    with dask.config.set({"cosim.search.precision": "fp32"}):
        want = pdf.cosim.neighbors("emb", threshold=threshold)
        want_kept = pdf.cosim.dedup("emb", threshold).index
    assert len(want) > 10
    if tiles == "bfloat16":
        monkeypatch.setattr(sk, "cpu_bfloat16", lambda: True)
    opts = {"clusters": clusters, "block_bytes": block_bytes}
    with dask.config.set({"cosim.search.precision": "exact" if tiles == "bfloat16" else "fp32"}):
        got = clustered.neighbors(pdf, "emb", threshold=threshold, **opts)
        kept = clustered.dedup(pdf, "emb", threshold, **opts)
    assert_same(got, want, exact_scores=dtype == np.float64)
    assert kept.index.equals(want_kept)
    assert {113, 3503, 3413} <= set(kept.index)  # null and NaN rows are kept


def test_exact_mode_on_dask_partitions_with_ties_at_the_threshold() -> None:
    x = adversarial(900, d=12, seed=4, dtype=np.float64)
    pdf = frame(x)
    # The threshold is a pair's float64 score itself: that pair is in, one ulp more: out.
    scores = pdf.cosim.neighbors("emb", threshold=0.9)["score"].to_numpy()
    tie = float(np.sort(scores)[len(scores) // 2])
    for threshold in (tie, float(np.nextafter(tie, 2.0))):
        want = pdf.cosim.neighbors("emb", threshold=threshold)
        assert (want["score"] == tie).any() == (threshold == tie)
        ddf = to_dask(pdf, 4)
        with dask.config.set(scheduler="sync"):
            lazy = clustered.neighbors(ddf, "emb", threshold=threshold, clusters=9)
            assert lazy.npartitions == 4
            assert_same(lazy.compute(), want, exact_scores=True)
            kept = clustered.dedup(ddf, "emb", threshold, clusters=9)
            assert kept.divisions == ddf.divisions
            pd.testing.assert_frame_equal(kept.compute(), pdf.cosim.dedup("emb", threshold))


def test_partitions_routed_in_pieces() -> None:
    """Partitions whose routed rows pass route-bytes are routed in pieces (rows keyed by
    partition and position first): the same pairs and kept rows, partitions and
    divisions as the exact search."""
    x = adversarial(900, d=12, seed=7, dtype=np.float64)
    pdf = frame(x)
    ddf = to_dask(pdf, 3)
    want = pdf.cosim.neighbors("emb", threshold=0.9)
    want_kept = pdf.cosim.dedup("emb", 0.9)
    p = clustered.plan(ddf, "emb", 0.9, clusters=9)
    with dask.config.set({"cosim.search.clustered.route-bytes": int(p.routed_bytes / 3 / 4) + 1}):
        pieces, keyed = clustered._pieces(ddf, "emb", p)
        assert keyed
        assert pieces.npartitions == 3 * 4
        with dask.config.set(scheduler="sync"):
            got = clustered.neighbors(ddf, "emb", threshold=0.9, clusters=9)
            assert_same(got.compute(), want, exact_scores=True)
            kept = clustered.dedup(ddf, "emb", 0.9, clusters=9)
            assert kept.divisions == ddf.divisions
            pd.testing.assert_frame_equal(kept.compute(), want_kept)
    assert clustered._pieces(ddf, "emb", p)[0].npartitions == 3  # 256MiB: one piece each


def test_pieces_of_rows_of_norm_1_cut_from_a_partition_with_one_row_that_is_not() -> None:
    """Rows written normalised serve as their own unit rows, with a larger error bound
    than a normalised copy's: a piece of such rows, cut from a partition whose one other
    row made the copy, had a larger delta than the partition's radii were computed with,
    and the route failed ("torch's float32 matrix products here may round their
    inputs...").  Every piece now has the delta of any rows of its D."""
    x = np.random.default_rng(0).standard_normal((2000, 64)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x[-1] *= 3
    pdf = frame(x)
    ddf = to_dask(pdf, 1)
    with dask.config.set(
        {
            "cosim.search.clustered.route-bytes": "64KiB",
            "cosim.search.clustered.exact-when-cheaper": False,
            "scheduler": "sync",
        }
    ):
        assert clustered._pieces(ddf, "emb", clustered.plan(ddf, "emb", 0.5))[0].npartitions > 1
        got = clustered.neighbors(ddf, "emb", threshold=0.5)
        assert_same(got.compute(), pdf.cosim.neighbors("emb", threshold=0.5), True)


def test_generated_embeddings_every_partition_count() -> None:
    pdf, planted = make_embeddings(3000, 24, directions=60, duplicates=0.1, seed=2)
    want = pdf.cosim.neighbors("emb", threshold=0.9)
    # Every planted pair at or above the threshold is among them.
    strong = planted.cosine >= 0.9 + 1e-6
    pairs = set(zip(want["left"], want["right"], strict=True))
    lo = np.minimum(planted.copy, planted.source)[strong]
    hi = np.maximum(planted.copy, planted.source)[strong]
    assert set(zip(lo.tolist(), hi.tolist(), strict=True)) <= pairs
    with dask.config.set(scheduler="sync"):
        for parts in (1, 3):
            # Few dimensions and diffuse clusters: the exact mode says it copies a lot.
            with pytest.warns(UserWarning, match="rules out few clusters here") as seen:
                lazy = clustered.neighbors(to_dask(pdf, parts), "emb", threshold=0.9)
            assert [w.filename for w in seen] == [__file__]  # the caller's line
            assert_same(lazy.compute(), want, exact_scores=False)


def test_results_filter_by_their_own_columns() -> None:
    """A result filtered by one of its columns (``r[r["left_id"] > 900]``) keeps the
    rows the computed result's filter keeps, as the exact method's does.  The results
    with carried columns came from several sources (the input read twice, the
    shuffles): dask lined such a filter up by index, numbered from 0 in each partition,
    and the rows came back in another order under other labels, or the filter failed
    "indices are out-of-bounds"."""
    pdf, _ = make_embeddings(1500, 32, directions=30, duplicates=0.1, seed=5)
    df = dask_cosim.from_pandas(pdf, npartitions=3)
    pairs = clustered.neighbors(df, "emb", threshold=0.9, clusters=8, columns=["id"])
    kept, removed = clustered.dedup(df, "emb", 0.9, clusters=8, return_removed=True, columns=["id"])
    with dask.config.set(scheduler="sync"):
        for result, column in [(pairs, "left_id"), (pairs, "score"), (removed, "left_id"),
                               (kept, "id")]:  # fmt: skip
            whole = result.compute()
            threshold = np.quantile(whole[column], 0.6)
            got = result[result[column] > threshold].compute()
            want = whole[whole[column] > threshold]
            assert len(want) > 5 and got.equals(want), (column, len(got), len(want))


# --------------------------------------------------------------------------- recall


def test_n_probe_recall_against_a_brute_force_count() -> None:
    pdf, _ = make_embeddings(
        4000, 16, directions=80, spread=(0.8, 1.0), duplicates=0.2, cosines=(0.7, 1.0), seed=3
    )
    threshold = 0.75
    exact = pdf.cosim.neighbors("emb", threshold=threshold)
    got = clustered.neighbors(pdf, "emb", threshold=threshold, clusters=60, n_probe=1)
    exact_pairs = set(zip(exact["left"], exact["right"], strict=True))
    found = set(zip(got["left"], got["right"], strict=True))
    assert found < exact_pairs  # n_probe=1 misses some here, and reports no false pair
    # n_probe=0: each row meets its own cluster only (NeMo Curator's way), same clusters.
    alone = clustered.neighbors(pdf, "emb", threshold=threshold, clusters=60, n_probe=0)
    assert set(zip(alone["left"], alone["right"], strict=True)) < found
    truth = clustered_recall.sample_truth(pdf, "emb", 0.7, sample_rows=700, seed=1)
    rec = clustered_recall.neighbors_recall(truth, got, threshold)
    sampled = set(pdf.index[np.sort(np.random.default_rng(1).choice(4000, 700, replace=False))])
    touching = {p for p in exact_pairs if p[0] in sampled or p[1] in sampled}
    assert rec.rows == 700
    assert rec.expected == len(touching)
    assert rec.found == len(touching & found) < rec.expected
    assert rec.extra == 0
    assert rec.recall == rec.found / rec.expected

    kept = clustered.dedup(pdf, "emb", threshold, clusters=60, n_probe=1)
    want = pdf.cosim.dedup("emb", threshold)
    drops = set(pdf.index) - set(want.index)
    missed = set(kept.index) - set(want.index)
    assert missed and set(want.index) <= set(kept.index)
    rec = clustered_recall.dedup_recall(truth, kept, threshold)
    assert rec.expected == len(drops & sampled)
    assert rec.found == len((drops - missed) & sampled)
    assert rec.extra == 0


def test_recall_of_the_exact_mode_is_one_and_labels_must_be_unique() -> None:
    pdf, _ = make_embeddings(1500, 32, directions=30, duplicates=0.1, seed=5)
    ddf = to_dask(pdf, 3)
    with dask.config.set(scheduler="sync"):
        lazy = clustered.neighbors(ddf, "emb", threshold=0.9, clusters=8)
        truth = clustered_recall.sample_truth(ddf, "emb", 0.9, sample_rows=400)
        rec = clustered_recall.neighbors_recall(truth, lazy)
        assert rec.expected > 10 and rec.recall == 1.0 and rec.extra == 0
        kept = clustered.dedup(ddf, "emb", 0.9, clusters=8)
        rec = clustered_recall.dedup_recall(truth, kept)
        assert rec.expected > 5 and rec.recall == 1.0 and rec.extra == 0
        with pytest.raises(ValueError, match=r"below the truth's 0\.9"):
            clustered_recall.dedup_recall(truth, kept, 0.8)
        # A threshold above 1 gave recall 1.0 (nothing expected), and text a TypeError;
        # checked as the searches check theirs.
        for bad in (2, True, "0.95"):
            with pytest.raises(ValueError, match=rf"threshold={bad!r} must be"):
                clustered_recall.neighbors_recall(truth, lazy, bad)
        # numpy's integers count rows; a name two columns share is named, as the searches
        # name it.
        assert (
            len(clustered_recall.sample_truth(ddf, "emb", 0.9, sample_rows=np.int64(5)).labels) == 5
        )
        twice = pd.concat([pdf, pdf[["emb"]]], axis=1)
        with pytest.raises(ValueError, match=r"column 'emb' is the name of 2 columns"):
            clustered_recall.sample_truth(twice, "emb", 0.9)
        # Labels that repeat: a dask frame's reset_index numbers each partition from 0,
        # so the error gives a column that names each row instead, which then serves.
        repeated = to_dask(pdf.set_index(pdf["id"] % 500), 3)
        with pytest.raises(ValueError, match=r"labels must be unique: give a column .*id_col"):
            clustered_recall.sample_truth(repeated, "emb", 0.9, sample_rows=400)
        with pytest.raises(ValueError, match="labels must be unique"):
            clustered_recall.sample_truth(repeated.reset_index(drop=True), "emb", 0.9)
        by_id = clustered_recall.sample_truth(repeated, "emb", 0.9, sample_rows=400, id_column="id")
        assert by_id.labels.tolist() == truth.labels.tolist()  # ddf: labels are the ids
        pairs = clustered.neighbors(repeated, "emb", threshold=0.9, clusters=8, columns=["id"])
        rec = clustered_recall.neighbors_recall(by_id, pairs)
        assert rec.expected > 10 and rec.recall == 1.0 and rec.extra == 0
        unnamed = clustered.neighbors(repeated, "emb", threshold=0.9, clusters=8)
        with pytest.raises(ValueError, match=r"lacks the column 'left_id'.*columns=\['id'\]"):
            clustered_recall.neighbors_recall(by_id, unnamed)
        kept, removed = clustered.dedup(repeated, "emb", 0.9, clusters=8, return_removed=True)
        rec = clustered_recall.dedup_recall(by_id, (kept, removed))  # as dedup returns them
        assert rec.expected > 5 and rec.recall == 1.0 and rec.extra == 0
        # Any of the kept frame's columns: its rows (the index) are what count.
        rec = clustered_recall.dedup_recall(truth, clustered.dedup(ddf, "emb", 0.9)[[]])
        assert rec.expected > 5 and rec.recall == 1.0 and rec.extra == 0
        with pytest.raises(ValueError, match=r"kept must be the frame dedup keeps.*neighbors_r"):
            clustered_recall.dedup_recall(by_id, pairs)
        with pytest.raises(ValueError, match=r"threshold=1\.5 must be a number in \[-1, 1\]"):
            clustered_recall.sample_truth(ddf, "emb", 1.5)
        with pytest.raises(KeyError, match="idx"):
            clustered_recall.sample_truth(ddf, "emb", 0.9, id_column="idx")


# --------------------------------------------------------------------------- errors, edges


def test_bad_arguments_and_empty_frames() -> None:
    pdf = frame(adversarial(400, d=8))
    with pytest.raises(
        ValueError, match=r"threshold=0\.0: method='clustered' needs a threshold in \(0, 1\]"
    ):
        clustered.neighbors(pdf, "emb", threshold=0.0)
    with pytest.raises(ValueError, match=r"n_probe=-1 must be an integer >= 0"):
        clustered.dedup(pdf, "emb", 0.9, n_probe=-1)
    with pytest.raises(ValueError, match=r"clusters=True must be a positive integer"):
        clustered.dedup(pdf, "emb", 0.9, clusters=True)
    with pytest.raises(KeyError, match="did you mean 'emb'"):
        clustered.neighbors(pdf, "emd", threshold=0.9)
    empty = pdf.iloc[:0]
    assert len(clustered.neighbors(empty, "emb", threshold=0.9)) == 0
    assert len(clustered.dedup(empty, "emb", 0.9)) == 0
    only_bad = frame(np.full((5, 8), np.nan, np.float32))
    assert len(clustered.neighbors(only_bad, "emb", threshold=0.9)) == 0
    pd.testing.assert_frame_equal(clustered.dedup(only_bad, "emb", 0.9), only_bad)


# --------------------------------------------------------------------------- a cluster


def test_on_worker_processes(client: Client) -> None:
    pdf, _ = make_embeddings(2500, 16, directions=40, duplicates=0.1, seed=9)
    ddf = to_dask(pdf, 3)
    want = pdf.cosim.neighbors("emb", threshold=0.9)
    got = clustered.neighbors(ddf, "emb", threshold=0.9, clusters=20).compute()
    assert_same(got, want, exact_scores=False)
    kept = clustered.dedup(ddf, "emb", 0.9, clusters=20, n_probe=2).compute()
    assert set(pdf.cosim.dedup("emb", 0.9).index) <= set(kept.index)
    assert dask_cosim.__name__ == "dask_cosim"
    # With a distributed client the routing shuffle is dask's own choice (p2p), whose
    # room is the free space of the workers' local directories: both on this disk, once.
    p = clustered.plan(ddf, "emb", 0.9, clusters=20)
    assert clustered._method(p) is None
    room, where = clustered._room(p)
    assert where == "on the workers' disks"
    free = shutil.disk_usage(tempfile.gettempdir()).free
    assert 0.9 * free < room < 1.1 * free


def test_routing_shuffle_in_memory_where_it_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the local schedulers: the task shuffle when the routed rows fit twice in the
    memory available, else dask's choice (partd's disk shuffle); a method the
    config names always wins."""
    ddf = to_dask(frame(adversarial(600)), 3)
    p = clustered.plan(ddf, "emb", 0.9, clusters=4)
    assert p.routed_bytes > 600 * 16 * 4
    assert clustered._method(p) == "tasks"
    with dask.config.set({"dataframe.shuffle.method": "disk"}):
        assert clustered._method(p) is None
    tight = types.SimpleNamespace(available=int(1.9 * p.routed_bytes))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: tight)
    assert clustered._method(p) is None
    # The pairs' budget ("auto") would read the same tight memory: a size of its own.
    with dask.config.set({"cosim.search.max-result-bytes": "1GiB"}):
        want = ddf.compute().cosim.neighbors("emb", threshold=0.9)
        got = clustered.neighbors(ddf, "emb", threshold=0.9, clusters=4).compute()
    assert_same(got, want, False)
