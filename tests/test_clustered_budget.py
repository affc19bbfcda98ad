"""method="clustered" holds its pairs to cosim.search.max-result-bytes as the exact
search does: a task searching blocks, or one holding the pairs gathered into a
partition of the frame, that finds more than the budget stops with ResultTooLargeError
naming the step and the fixes that help there; within the budget the result is the
exact method's."""

from __future__ import annotations

import math
import re
from typing import Any

import dask
import numpy as np
import pandas as pd
import pytest
from distributed import Client, LocalCluster

from dask_cosim.errors import ResultTooLargeError
from dask_cosim.search_budget import CLUSTERED_AUTO_SHARE, PAIR_BYTES, Budget
from tests.helpers import search_frame, to_dask

# 400 rows around one direction, every pair scoring about 0.92: 79,800 pairs at 0.5.
ROWS, DIM, THRESHOLD = 400, 16, 0.5
PAIRS = ROWS * (ROWS - 1) // 2
# A block of the clustered search holds rows of DIM * 12 + 64 bytes (float32 rows):
# 50 rows a block, so that the 400 rows are searched in many small block tasks.
SMALL_BLOCKS = 50 * (DIM * 12 + 64)
# More than any task searching those small blocks finds (a few thousand pairs), less
# than the pairs gathered into the 2-partition frame's busier partition (59,900).
BETWEEN = 30_000
BLOCKS = "the search of the blocks of routing-shuffle partition"
GATHER = "the pairs gathered into partition"


@pytest.fixture(scope="module")
def pdf() -> pd.DataFrame:
    rng = np.random.default_rng(3)
    centre = rng.standard_normal(DIM)
    x = centre / np.linalg.norm(centre) + 0.3 * rng.standard_normal((ROWS, DIM)) / math.sqrt(DIM)
    return search_frame(x.astype(np.float32))


def _search(df: Any, op: str, method: str = "clustered", columns: Any = None) -> Any:
    how: dict[str, Any] = {"method": method, "columns": columns}
    if method == "clustered":
        how["clusters"] = 2
    if op == "neighbors":
        return df.cosim.neighbors("emb", threshold=THRESHOLD, **how)
    if op == "dedup":
        return df.cosim.dedup("emb", THRESHOLD, **how)
    return df.cosim.dedup("emb", THRESHOLD, return_removed=True, **how)[1]


def _settings(pairs: int, small_blocks: bool = False) -> dict[str, Any]:
    settings: dict[str, Any] = {"cosim.search.max-result-bytes": pairs * PAIR_BYTES}
    if small_blocks:
        settings["cosim.search.clustered.block-bytes"] = SMALL_BLOCKS
    return settings


def _raised(df: Any, op: str, settings: dict[str, Any], columns: Any = None) -> str:
    """The message of the error the search raises, from the call (eager frames) or the
    computation (sync scheduler)."""
    with dask.config.set(settings), pytest.raises(ResultTooLargeError) as caught:
        result = _search(df, op, columns=columns)
        dask.compute(result, scheduler="sync")
    return str(caught.value)


def _assert_names(message: str, op: str, pairs: int) -> None:
    name = op.split("-")[0]
    assert message.startswith(
        f"{name}(threshold={THRESHOLD}, method='clustered') on column 'emb': "
    ), message
    assert f"cosim.search.max-result-bytes={pairs * PAIR_BYTES}" in message
    assert "raise the threshold" in message
    assert message.endswith('(docs/clustered.md, "Memory")')
    # Neither applies to the clustered method: it takes no k, nor max-blocks.
    assert "give k=" not in message
    assert "max-blocks" not in message


@pytest.mark.parametrize("op", ["neighbors", "dedup", "dedup-removed"])
@pytest.mark.parametrize("npartitions", [None, 2])
def test_a_block_task_past_its_budget_names_the_cause(
    pdf: pd.DataFrame, op: str, npartitions: int | None
) -> None:
    df = pdf if npartitions is None else to_dask(pdf, npartitions)
    message = _raised(df, op, _settings(100))
    _assert_names(message, op, 100)
    assert re.search(rf"{BLOCKS} \d+ \([\d,]+ routed rows in \d+ blocks?\) found", message)
    assert "smaller cosim.search.clustered.block-bytes" in message
    assert "more partitions" not in message  # the frame's partitions: not these tasks'


@pytest.mark.parametrize("columns", [None, ["id"]])
def test_the_pairs_gathered_into_a_partition_are_held_to_the_budget(
    pdf: pd.DataFrame, columns: Any
) -> None:
    """Each task searching blocks finds a few thousand pairs, but the 2-partition
    frame's partition 0 gathers the 59,900 pairs of its left rows, partition 1 those of
    its right rows (with columns, which gathers by the right row first)."""
    message = _raised(to_dask(pdf, 2), "neighbors", _settings(BETWEEN, small_blocks=True),
                      columns)  # fmt: skip
    _assert_names(message, "neighbors", BETWEEN)
    last = columns is not None
    found = re.search(rf"{GATHER} {int(last)} of the frame found ([\d,]+) pairs", message)
    assert found, message
    assert int(found.group(1).replace(",", "")) == 59_900
    assert "split the frame into more partitions" in message
    assert "block-bytes" not in message


@pytest.mark.parametrize("columns", [None, ["id"]])
def test_dedup_removed_rows_gather_a_pair_a_row(pdf: pd.DataFrame, columns: Any) -> None:
    """The same small blocks and budget: dedup's removed rows gather, of every block's
    pairs (members' and probes'), each later row's best alone, at most a row each (they
    gathered 30,000 to 59,900 pairs, past the budget), and are the exact method's."""
    ddf = to_dask(pdf, 2)
    want = _search(ddf, "dedup-removed", method="exact", columns=columns)
    with dask.config.set(_settings(BETWEEN, small_blocks=True)):
        got = _search(ddf, "dedup-removed", columns=columns)
    want, got = dask.compute(want, got, scheduler="sync")
    pd.testing.assert_frame_equal(got.reset_index(drop=True), want.reset_index(drop=True))


def test_within_the_budget_the_result_is_the_exact_methods(pdf: pd.DataFrame) -> None:
    """Small blocks and a budget that holds every pair: the exact method's result; two
    budgets give two graphs (the option is part of the keys)."""
    ddf = to_dask(pdf, 2)
    names = []
    for op in ("neighbors", "dedup", "dedup-removed"):
        want = _search(ddf, op, method="exact").compute(scheduler="sync")
        with dask.config.set(_settings(PAIRS, small_blocks=True)):
            got = _search(ddf, op)
        names.append(got._name)
        got = got.compute(scheduler="sync")
        if op == "dedup":
            assert list(got.index) == list(want.index)
            continue
        assert len(want) == (PAIRS if op == "neighbors" else ROWS - 1)
        pd.testing.assert_frame_equal(
            got.reset_index(drop=True)[["left", "right"]],
            want.reset_index(drop=True)[["left", "right"]],
        )
        np.testing.assert_allclose(got["score"], want["score"], atol=2e-6)
        with dask.config.set(_settings(2 * PAIRS, small_blocks=True)):
            assert _search(ddf, op)._name != names[-1]
    assert len(set(names)) == 3
    with dask.config.set({"cosim.search.max-result-bytes": "lots"}):
        with pytest.raises(ValueError, match=r"cosim\.search\.max-result-bytes='lots' must be"):
            _search(ddf, "neighbors")


def _auto_budget() -> int:
    return Budget("auto", "neighbors", "emb", THRESHOLD, method="clustered").allowed()[0]


def test_the_error_reaches_the_client_from_a_worker(pdf: pd.DataFrame, loop: object) -> None:
    """On worker processes (dask's p2p shuffles): the block tasks of neighbors and of
    dedup, and the gathering of neighbors' pairs.  "auto" is the clustered method's
    share of the worker's memory limit (smaller than the exact method's: its shuffles
    hold memory beside its tasks)."""
    limit = 3 * 2**29
    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit=limit,
                      processes=True, loop=loop, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:  # fmt: skip
        assert client.submit(_auto_budget).result() == int(limit * CLUSTERED_AUTO_SHARE)
        ddf = to_dask(pdf, 2)
        for op in ("neighbors", "dedup"):
            with dask.config.set(_settings(100)):
                result = _search(ddf, op)
            with pytest.raises(ResultTooLargeError, match=rf"^{op}\(.*: {BLOCKS} \d"):
                result.compute()
        with dask.config.set(_settings(BETWEEN, small_blocks=True)):
            result = _search(ddf, "neighbors")
        with pytest.raises(ResultTooLargeError, match=f"{GATHER} 0 of the frame found 59,900"):
            result.compute()


def _identical_rows() -> Any:
    """600 rows in 2 partitions: 300 copies of one row (scaled), 100 rows near it and 200
    near an orthogonal direction (two clusters, no probes at 0.9)."""
    rng = np.random.default_rng(8)
    e1, e2 = np.eye(DIM)[0], np.eye(DIM)[1]
    x = np.concatenate([
        e1 * rng.uniform(0.5, 2.0, size=(300, 1)),
        e1 + 0.2 * rng.standard_normal((100, DIM)),
        e2 + 0.2 * rng.standard_normal((200, DIM)),
    ]).astype(np.float32)  # fmt: skip
    return to_dask(search_frame(x[rng.permutation(len(x))]), 2)


def test_dedup_of_a_cluster_of_identical_rows_keeps_a_row_each() -> None:
    """300 copies of one row (scaled) in one cluster, 2,000 pairs a task: dedup's block
    task keeps the rows it drops, at most its rows, searching the cluster's members again
    by blocks of rows past the budget; it raised ResultTooLargeError (44,850 pairs).
    The rows kept are the exact method's, which does the same."""
    df = _identical_rows()
    want = df.cosim.dedup("emb", 0.9).compute(scheduler="sync")
    with dask.config.set(_settings(2000)):
        got = df.cosim.dedup("emb", 0.9, method="clustered", clusters=2)
        got = got.compute(scheduler="sync")
    assert list(got["id"]) == list(want["id"]) and len(want) < 600 - 299


def test_dedup_removed_rows_of_a_cluster_of_identical_rows() -> None:
    """The same frame with the removed rows: the block task keeps each later member's
    best match alone (searching the members again by blocks past the budget); it raised
    ResultTooLargeError.  The removed rows are the exact method's."""
    df = _identical_rows()
    want = df.cosim.dedup("emb", 0.9, return_removed=True, columns=["id"])
    want = dask.compute(*want, scheduler="sync")
    with dask.config.set(_settings(2000)):
        got = df.cosim.dedup("emb", 0.9, return_removed=True, columns=["id"],
                             method="clustered", clusters=2)  # fmt: skip
        got = dask.compute(*got, scheduler="sync")
    assert list(got[0]["id"]) == list(want[0]["id"])
    pd.testing.assert_frame_equal(got[1].reset_index(drop=True), want[1].reset_index(drop=True))


def test_dedup_removed_rows_keep_a_pair_a_member_within_the_budget() -> None:
    """8 directions of 60 copies each: each cluster's 1,770 pairs are within a budget of
    2,000, but the block task kept them all (14,160) and the gathering raised; each
    later member's best alone is 59 a direction."""
    rng = np.random.default_rng(4)
    x = np.repeat(np.eye(DIM)[:8], 60, axis=0) * rng.uniform(0.5, 2.0, size=(480, 1))
    df = to_dask(search_frame(x[rng.permutation(480)].astype(np.float32)), 1)
    want = dask.compute(*df.cosim.dedup("emb", 0.9, return_removed=True), scheduler="sync")
    with dask.config.set(_settings(2000)):
        got = df.cosim.dedup("emb", 0.9, return_removed=True, method="clustered", clusters=2)
        got = dask.compute(*got, scheduler="sync")
    assert len(got[1]) == 472
    pd.testing.assert_frame_equal(got[1].reset_index(drop=True), want[1].reset_index(drop=True))


def test_dedup_of_near_copies_in_two_clusters_keeps_a_row_each() -> None:
    """150 copies of one row and 150 of another at cosine 0.95 (scaled), each its own
    cluster, and 200 rows elsewhere: the copies of one probe the other's cluster, 22,500
    PROBE pairs, past a budget of 2,000 (it raised ResultTooLargeError).  The block task
    searches them again by blocks of rows, keeping a pair a row; dedup and its removed
    rows are the exact method's."""
    rng = np.random.default_rng(9)
    u, w = np.eye(DIM)[0], np.eye(DIM)[2]
    v = 0.95 * u + math.sqrt(1 - 0.95**2) * np.eye(DIM)[1]
    x = np.concatenate([
        u * rng.uniform(0.5, 2.0, size=(150, 1)),
        v * rng.uniform(0.5, 2.0, size=(150, 1)),
        w + 0.3 * rng.standard_normal((200, DIM)),
    ]).astype(np.float32)  # fmt: skip
    df = to_dask(search_frame(x[rng.permutation(len(x))]), 2)
    want = df.cosim.dedup("emb", 0.9, return_removed=True, columns=["id"])
    want = dask.compute(*want, scheduler="sync")
    settings = {**_settings(2000), "cosim.search.clustered.exact-when-cheaper": False}
    with dask.config.set(settings):
        kept = df.cosim.dedup("emb", 0.9, method="clustered", clusters=3)
        got = df.cosim.dedup("emb", 0.9, return_removed=True, columns=["id"],
                             method="clustered", clusters=3)  # fmt: skip
        kept, got = dask.compute(kept, got, scheduler="sync")
    assert list(kept["id"]) == list(want[0]["id"]) == list(got[0]["id"])
    assert len(want[1]) >= 299  # the copies of both rows, but one
    pd.testing.assert_frame_equal(got[1].reset_index(drop=True), want[1].reset_index(drop=True))
