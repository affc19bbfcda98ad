"""On a distributed cluster a search cuts partitions that are too few for its threads into
ranges of rows (``search_graph.pieces``): every thread gets tasks, and the results are
those of the eager search, with the input's partitions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from distributed import Client

import dask_cosim
from dask_cosim import search_graph as sg
from dask_cosim.errors import ResultTooLargeError
from dask_cosim.io import vectors_to_arrow
from dask_cosim.search import _options
from tests.helpers import cli_here


def _frame(n: int = 203, d: int = 8) -> pd.DataFrame:
    """Rows with exact duplicates and near-ties across the ranges a partition is cut into
    (and across partitions), a zero row and a NaN row; labels not in order."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((n, d)).astype(np.float32)
    x[[50, 51, 101, 152, 202]] = x[49]  # a row and its copies in every range
    x[100] = x[99] * 1.0000001
    x[7] = 0.0
    x[8, 3] = np.nan
    return pd.DataFrame(
        {"emb": vectors_to_arrow(x), "id": np.arange(n)},
        index=pd.Index(rng.permutation(n) * 3, name="key"),
    )


def _pair_tasks(result: Any) -> int:
    keys = dict(result.__dask_graph__())
    return sum(1 for k in keys if "pair_threshold" in str(k) or "self_pair_topk" in str(k))


@pytest.mark.parametrize(("npartitions", "cut"), [(1, 4), (2, 2)])
def test_few_partitions_are_searched_in_ranges(
    shared_client: Client, npartitions: int, cut: int
) -> None:
    """Two one-thread workers: a self-search needs 4 sides for 8 pair tasks (1 partition
    in 4 ranges, 2 in 2 each); the pairs, kept and removed rows and groups are the eager
    search's, in the input's partitions."""
    pdf = _frame()
    ddf = dd.from_pandas(pdf, npartitions=npartitions, sort=False)
    assert ddf.npartitions == npartitions
    assert sg.pieces(sg.Builder(True), ddf, _options(), sg.pairs_of) == cut
    with dask.config.set(scheduler="sync"):  # a local scheduler: never cut
        assert sg.pieces(sg.Builder(True), ddf, _options(), sg.pairs_of) == 1

    pairs = ddf.cosim.neighbors("emb", threshold=0.5, columns="id")
    sides = npartitions * cut
    assert _pair_tasks(pairs) == sides * (sides + 1) // 2
    assert pairs.npartitions == npartitions
    want = pdf.cosim.neighbors("emb", threshold=0.5, columns="id")
    pd.testing.assert_frame_equal(pairs.compute().reset_index(drop=True), want)
    # Each partition of the result is numbered 0, 1, ... (as without ranges).
    first = pairs.partitions[0].compute()
    pd.testing.assert_index_equal(first.index, pd.RangeIndex(len(first)), exact=True)

    best = ddf.cosim.neighbors("emb", k=3, columns="id").compute().reset_index(drop=True)
    pd.testing.assert_frame_equal(best, pdf.cosim.neighbors("emb", k=3, columns="id"))

    kept, removed = ddf.cosim.dedup("emb", 0.9, return_removed=True, columns="id")
    assert kept.npartitions == npartitions and kept.divisions == ddf.divisions
    want_kept, want_removed = pdf.cosim.dedup("emb", 0.9, return_removed=True, columns="id")
    pd.testing.assert_frame_equal(kept.compute(), want_kept)
    pd.testing.assert_frame_equal(removed.compute().reset_index(drop=True), want_removed)
    assert len(want_removed) >= 5  # the copies of row 49 and the near-tie

    groups = ddf.cosim.groups("emb", 0.9)
    assert groups.npartitions == npartitions
    pd.testing.assert_frame_equal(groups.compute(), pdf.cosim.groups("emb", 0.9))


def test_the_ranges_of_a_partition_are_rejoined_within_the_budget(shared_client: Client) -> None:
    """The output of a partition searched in ranges is their pairs together: a merge, which
    the result budget bounds as every other (it was not checked: 10,330 pairs in one task
    where 5,120 may be, each range's own within it)."""
    pdf = _frame()
    ddf = dd.from_pandas(pdf, npartitions=1, sort=False)
    with dask.config.set({"cosim.search.max-result-bytes": "200KiB"}):
        for search in (
            lambda: ddf.cosim.neighbors("emb", threshold=0.0),
            lambda: ddf.cosim.join(ddf, "emb", threshold=0.3),
        ):
            with pytest.raises(ResultTooLargeError, match="the merge of output partition 0"):
                search().compute()
    assert len(ddf.cosim.neighbors("emb", threshold=0.0).compute()) == 10_330


def test_topk_cuts_a_corpus_of_few_partitions(shared_client: Client) -> None:
    """topk has one task per side: 8 for two one-thread workers (1 partition in 8
    ranges); the matches, ties among the copies of a row included, are the eager
    search's."""
    pdf = _frame()
    ddf = dd.from_pandas(pdf, npartitions=1, sort=False)
    assert sg.pieces(sg.Builder(True), ddf, _options(), lambda n: n) == 8
    # Partitions enough: as they are.
    four = dd.from_pandas(pdf, npartitions=4, sort=False)
    assert sg.pieces(sg.Builder(True), four, _options(), sg.pairs_of) == 1
    queries = np.stack([np.asarray(pdf["emb"].iloc[i]) for i in (49, 3, 120)])
    got = ddf.cosim.topk(queries, "emb", k=4)
    pd.testing.assert_frame_equal(got, pdf.cosim.topk(queries, "emb", k=4))
    assert dask_cosim.__name__ == "dask_cosim"


def test_join_cuts_a_left_side_of_few_partitions(shared_client: Client) -> None:
    """join has a task per (left side, right side): 1 left partition against 2 right ones
    is cut into 4 ranges on two one-thread workers (8 tasks), against a pandas right side
    into 8; the pairs and each left row's k best are the eager join's, one partition per
    left partition."""
    pdf = _frame()
    left = dd.from_pandas(pdf.iloc[:60], npartitions=1, sort=False)
    right = dd.from_pandas(pdf, npartitions=2, sort=False)
    assert sg.pieces(sg.Builder(True), left, _options(), lambda n: n * 2) == 4
    assert sg.pieces(sg.Builder(True), left, _options(), lambda n: n) == 8
    for other in (right, pdf):
        pairs = left.cosim.join(other, "emb", threshold=0.5, columns="id")
        assert pairs.npartitions == 1
        want = pdf.iloc[:60].cosim.join(pdf, "emb", threshold=0.5, columns="id")
        pd.testing.assert_frame_equal(pairs.compute().reset_index(drop=True), want)
        best = left.cosim.join(other, "emb", k=3, columns="id").compute()
        want = pdf.iloc[:60].cosim.join(pdf, "emb", k=3, columns="id")
        pd.testing.assert_frame_equal(best.reset_index(drop=True), want)


def test_the_command_line_cuts_for_the_cluster_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command builds its search before the cluster starts (errors first), then again
    on it, where the search sees the cluster's threads: two partitions, two one-thread
    workers, 2 ranges each; the warning of the first build (labels may repeat: the
    partitions' labels are not in order) is said once."""
    pdf = _frame()
    folder = tmp_path / "emb"
    dask_cosim.to_parquet(dd.from_pandas(pdf, npartitions=2, sort=False), folder)
    seen: list[int] = []
    pieces = sg.pieces

    def counted(*args: Any, **kwargs: Any) -> int:
        seen.append(pieces(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(sg, "pieces", counted)
    out = tmp_path / "pairs"
    proc = cli_here("neighbors", str(folder), "--on", "emb", "--threshold", "0.5", "-o",
                    str(out), "--workers", "2", "--quiet")  # fmt: skip
    assert proc.returncode == 0, proc.stdout
    assert seen == [1, 2]
    assert proc.stdout.count("may not name rows uniquely") == 1, proc.stdout
    got = dask_cosim.read_parquet(out).compute().reset_index(drop=True)
    pd.testing.assert_frame_equal(got, pdf.cosim.neighbors("emb", threshold=0.5))
