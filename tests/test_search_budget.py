"""A threshold search that finds more pairs than a task may hold stops with the cause
(cosim.search.max-result-bytes), from the task, instead of running its worker out of
memory; searches within the budget are unchanged."""

from __future__ import annotations

import re
from typing import Any

import dask
import pandas as pd
import pytest
from dask.utils import format_bytes
from distributed import Client, LocalCluster

from dask_cosim.errors import ResultTooLargeError
from dask_cosim.search_budget import AUTO_SHARE, PAIR_BYTES, Budget
from tests.helpers import search_frame, search_vectors, to_dask

# 97 rows: 4,656 unordered pairs, every one at threshold=-1.
ROWS = 97


def _frame(npartitions: int | None = None) -> Any:
    pdf = search_frame(search_vectors(ROWS, 8))
    return pdf if npartitions is None else to_dask(pdf, npartitions)


def _search(df: Any, op: str) -> Any:
    if op == "neighbors":
        return df.cosim.neighbors("emb", threshold=-1.0)
    if op == "join":
        return df.cosim.join(df, "emb", threshold=-1.0)
    if op == "groups":
        return df.cosim.groups("emb", -1.0)
    return df.cosim.dedup("emb", -1.0, return_removed=op == "dedup-removed")


def _compute(result: Any) -> Any:
    return dask.compute(result, scheduler="sync")[0]  # eager results come back as they are


@pytest.mark.parametrize("op", ["neighbors", "join", "dedup", "dedup-removed", "groups"])
@pytest.mark.parametrize("npartitions", [None, 2])
def test_a_task_past_its_budget_names_the_cause(op: str, npartitions: int | None) -> None:
    with dask.config.set({"cosim.search.max-result-bytes": 100 * PAIR_BYTES}):
        with pytest.raises(ResultTooLargeError) as caught:
            _compute(_search(_frame(npartitions), op))  # eager frames raise at the call
    message = str(caught.value)
    name = op.split("-")[0]
    assert re.search(
        rf"^{name}\(threshold=-1\.0\) on column 'emb': the task of partition \d", message
    )
    assert f"more than one task may hold, {format_bytes(100 * PAIR_BYTES)}" in message
    assert f"cosim.search.max-result-bytes={100 * PAIR_BYTES}" in message
    assert "raise the threshold" in message
    assert ("give k=" in message) == (name in ("join", "neighbors"))
    assert ("more partitions" in message) == (name != "groups")


def test_the_merge_of_an_output_partition_is_held_to_the_budget() -> None:
    """Each pair task finds at most 25 x 25 pairs, but partition 0's output gathers
    those of four tasks (300 + 325 of them here): the merge stops, not the finish."""
    df = _frame(4)
    with dask.config.set({"cosim.search.max-result-bytes": 700 * PAIR_BYTES}):
        pairs = df.cosim.neighbors("emb", threshold=-1.0)
        with pytest.raises(ResultTooLargeError, match="the merge of one output partition's"):
            pairs.compute(scheduler="sync")
        with pytest.raises(ResultTooLargeError, match="the merge of every pair, which groups"):
            df.cosim.groups("emb", -1.0).compute(scheduler="sync")


def test_within_the_budget_nothing_changes() -> None:
    """The default, and a budget of exactly the pairs found, give the same result; two
    budgets give two graphs (the option is part of the keys)."""
    df = _frame(3)
    expected = _frame().cosim.neighbors("emb", threshold=-1.0)
    assert len(expected) == ROWS * (ROWS - 1) // 2
    found = df.cosim.neighbors("emb", threshold=-1.0)
    with dask.config.set({"cosim.search.max-result-bytes": len(expected) * PAIR_BYTES}):
        exact = df.cosim.neighbors("emb", threshold=-1.0)
        _same(exact, expected)
    _same(found, expected)
    assert found._name != exact._name
    with pytest.raises(ValueError, match=r"cosim\.search\.max-result-bytes='lots' must be"):
        with dask.config.set({"cosim.search.max-result-bytes": "lots"}):
            df.cosim.neighbors("emb", threshold=0.5)


def _same(pairs: Any, expected: pd.DataFrame) -> None:
    got = pairs.compute(scheduler="sync").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected.reset_index(drop=True))


def _auto_budget() -> int:
    return Budget("auto", "neighbors", "emb", 0.5).allowed()[0]


def test_auto_without_a_worker_sees_a_containers_memory_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A container's limit (cgroups), as distributed reads it at import: the host's
    # available memory may be far more.
    from distributed import system

    monkeypatch.setattr(system, "MEMORY_LIMIT", 2**26)
    assert _auto_budget() <= int(2**26 * AUTO_SHARE)


def test_auto_is_a_share_of_the_workers_memory_limit_and_the_error_reaches_the_client(
    loop: object,
) -> None:
    limit = 2**30
    with LocalCluster(n_workers=1, threads_per_worker=2, memory_limit=limit, processes=True,
                      loop=loop, host="127.0.0.1", dashboard_address=None) as cluster, \
            Client(cluster) as client:  # fmt: skip
        assert client.submit(_auto_budget).result() == int(limit * AUTO_SHARE / 2)
        with dask.config.set({"cosim.search.max-result-bytes": 100 * PAIR_BYTES}):
            pairs = _frame(2).cosim.neighbors("emb", threshold=-1.0)
        with pytest.raises(ResultTooLargeError, match=r"found [\d,]+ pairs"):
            pairs.compute()
