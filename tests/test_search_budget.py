"""A threshold search that finds more pairs than a task may hold stops with the cause
(cosim.search.max-result-bytes), from the task, instead of running its worker out of
memory; searches within the budget are unchanged."""

from __future__ import annotations

import re
import time
from typing import Any

import dask
import pandas as pd
import pytest
from dask.callbacks import Callback
from dask.core import get_dependencies
from dask.utils import format_bytes, key_split
from distributed import Client, LocalCluster, get_task_stream

from dask_cosim import search_budget
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


@pytest.mark.parametrize("op", ["neighbors", "join"])
@pytest.mark.parametrize("npartitions", [None, 2])
def test_a_task_past_its_budget_names_the_cause(op: str, npartitions: int | None) -> None:
    """(dedup's and groups' tasks keep a row's worth each, whatever the pairs: they search
    again by blocks past the budget, tests/test_search_reduced.py.)"""
    with dask.config.set({"cosim.search.max-result-bytes": 100 * PAIR_BYTES}):
        with pytest.raises(ResultTooLargeError) as caught:
            _compute(_search(_frame(npartitions), op))  # eager frames raise at the call
    message = str(caught.value)
    name = op.split("-")[0]
    assert re.search(
        rf"^{name}\(threshold=-1\.0\) on column 'emb': the task of "
        + (r"partition \d" if npartitions else "the (left )?frame"),
        message,
    )
    assert f"more than one task may hold, {format_bytes(100 * PAIR_BYTES)}" in message
    assert f"cosim.search.max-result-bytes={100 * PAIR_BYTES}" in message
    assert "raise the threshold" in message
    assert "give k=" in message
    # An eager frame is one partition: it is told to search a dask frame of several.
    assert ("split the frame into more partitions" in message) == (npartitions is not None)
    assert ("dask_cosim.from_pandas(df, npartitions=8)" in message) == (npartitions is None)


def test_at_the_most_blocks_the_advice_is_more_blocks() -> None:
    """A frame searched in as many blocks as cosim.search.max-blocks allows gets no
    smaller tasks from more partitions (they are joined into as many blocks): the error
    said to split it into more partitions; it says to raise max-blocks."""
    budget = {"cosim.search.max-result-bytes": 300 * PAIR_BYTES}
    for op in ("neighbors", "join"):
        with dask.config.set({**budget, "cosim.search.max-blocks": 4}):
            with pytest.raises(ResultTooLargeError) as caught:
                _compute(_search(_frame(4), op))
        message = str(caught.value)
        assert "raise cosim.search.max-blocks (the frame is searched in 4 blocks" in message
        assert "more partitions" in message and "split the frame" not in message
        with dask.config.set({**budget, "cosim.search.max-blocks": 8}):
            with pytest.raises(ResultTooLargeError, match="split the frame into more partitions"):
                _compute(_search(_frame(4), op))


class Started(Callback):
    """The tasks the local scheduler started, with their dependencies."""

    def __init__(self) -> None:
        super().__init__()
        self.deps: dict[Any, set[Any]] = {}

    def _pretask(self, key: Any, dsk: Any, state: dict[str, Any]) -> None:
        self.deps[key] = set(state["dependencies"][key])


# The tasks that find pairs: a merge is a task with two or more of them among its inputs.
PAIR_TASKS = ("pair_threshold", "earlier_matches")


@pytest.mark.parametrize(
    ("op", "where"),
    [
        ("neighbors", r"the merge of output partition [012] \(the pairs of (\d of )?its "
                      r"[234] pair tasks(, finished before the rest)?\)"),
        ("join", r"the merge of output partition \d \(the pairs of (\d of )?its 4 pair "
                 r"tasks(, finished before the rest)?\)"),
        ("groups", r"a merge of groups' edges \(the edges of at most 8 tasks\)"),
    ],
)  # fmt: skip
def test_the_pieces_of_a_merge_past_the_budget_never_meet(op: str, where: str) -> None:
    """4 partitions of 25 and 24 rows: each pair task finds at most 600 pairs, within
    the budget, but the output partitions of neighbors gather 2,100, 1,428 and 852 (the
    last, 276, comes from one task), those of join 24 or 25 x 97; groups' tasks give 23
    to 48 edges (a forest of their pairs: 378 in all), the first of its merges 8 tasks'
    (308), past a budget of 300: the check of their counts stops the search before any
    merge receives them."""
    df = _frame(4)
    most = 300 if op == "groups" else 700
    with dask.config.set({"cosim.search.max-result-bytes": most * PAIR_BYTES}):
        result = _search(df, op)
    with Started() as started, pytest.raises(ResultTooLargeError) as caught:
        result.compute(scheduler="sync")
    message = str(caught.value)
    assert re.search(rf"^{op}\(threshold=-1\.0\) on column 'emb': {where} found [\d,]+ pairs",
                     message)  # fmt: skip
    assert f"more than one task may hold, {format_bytes(most * PAIR_BYTES)}" in message
    assert ("more partitions" in message) == (op != "groups")
    assert _merges(started.deps) == []


@pytest.mark.parametrize("op", ["neighbors", "join"])
def test_a_threshold_far_too_low_stops_at_the_first_pair_tasks(op: str) -> None:
    """The same 4 partitions, a budget of 700 pairs: any two pair tasks of an output
    partition find more (300 to 625 each). Each merge keeps a running total of its
    tasks' pairs as they finish, and the search stops there, not once all 10 (16) pair
    tasks have found theirs: on workers that memory fills first, dask pauses them, and
    the last check never ran (40,000 x 16 rows at threshold 0.7 on two 1.5 GiB workers,
    spilling or not: the search hung)."""
    with dask.config.set({"cosim.search.max-result-bytes": 700 * PAIR_BYTES}):
        result = _search(_frame(4), op)
    before = dict(search_budget._LEDGERS)
    with Started() as started, pytest.raises(ResultTooLargeError) as caught:
        result.compute(scheduler="sync")
    assert re.search(r"the merge of output partition \d \(the pairs of 2 of its 4 pair tasks, "
                     r"finished before the rest\) found [\d,]+ pairs", str(caught.value))  # fmt: skip
    ran = [k for k in started.deps if key_split(k) in PAIR_TASKS]
    assert len(ran) == 2, ran
    # The search's running totals are dropped with the error, as with the last check.
    assert search_budget._LEDGERS == before


def test_on_a_cluster_the_running_totals_live_and_die_with_the_search(loop: object) -> None:
    """On distributed the running totals are the scheduler's task metadata, under the
    key of the merge's last check, which the scheduler forgets with that task: after a
    search that stopped, and after one within the budget (computed twice, each pair
    task counted once), nothing is left."""

    def ledgers(dask_scheduler: Any) -> list[str]:
        return [k for k in dask_scheduler.task_metadata if "cosim-merge-check" in str(k)]

    with dask.config.set({"cosim.search.max-result-bytes": 700 * PAIR_BYTES}):
        stopped = _search(_frame(4), "neighbors")
    with dask.config.set({"cosim.search.max-result-bytes": ROWS * ROWS * PAIR_BYTES}):
        within = _search(_frame(4), "neighbors")
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, loop=loop,
                      dashboard_address=None) as cluster, Client(cluster) as client:  # fmt: skip
        with pytest.raises(ResultTooLargeError, match=r"the merge of output partition \d"):
            stopped.compute()
        first, again = within.compute(), within.compute()
        pd.testing.assert_frame_equal(first, again)
        assert len(first) == ROWS * (ROWS - 1) // 2
        deadline = time.monotonic() + 10  # the scheduler forgets the keys soon after
        while client.run_on_scheduler(ledgers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.run_on_scheduler(ledgers) == []


def test_groups_merges_reduce_their_edges_to_a_forest() -> None:
    """The same 378 edges, past the budget of 300 together, merged 2 at a time: each
    merge gives a forest of at most the 97 rows (one group here, 96 edges), so none
    receives more than 2 x 96, and groups gives its answer."""
    df = _frame(4)
    config = {"cosim.search.max-result-bytes": 300 * PAIR_BYTES, "cosim.search.split-every": 2}
    with dask.config.set(config):
        result = _compute(_search(df, "groups"))
    assert result["group"].tolist() == [0] * ROWS
    with dask.config.set({**config, "cosim.search.split-every": 8}):
        with pytest.raises(ResultTooLargeError, match="the edges of at most 8 tasks"):
            _compute(_search(df, "groups"))


def _merges(deps: dict[Any, set[Any]]) -> list[Any]:
    """The tasks among ``deps`` (key: its dependencies) with two or more pair tasks
    among their inputs; asserts some pair tasks ran (at least those of the merge that
    was stopped)."""
    pair_tasks = {k for k in deps if key_split(k) in PAIR_TASKS}
    assert len(pair_tasks) >= 2
    return [k for k, inputs in deps.items() if len(inputs & pair_tasks) > 1]


def test_on_a_cluster_the_pieces_past_the_budget_stay_where_they_were_found(
    loop: object,
) -> None:
    """The same on distributed: the scheduler sends a merge its pieces only once every
    input of it is done, the check among them."""
    with dask.config.set({"cosim.search.max-result-bytes": 700 * PAIR_BYTES}):
        result = _search(_frame(4), "neighbors")
    graph = dict(result.__dask_graph__())
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, loop=loop,
                      dashboard_address=None) as cluster, Client(cluster) as client, \
            get_task_stream(client) as stream:  # fmt: skip
        with pytest.raises(ResultTooLargeError, match=r"the merge of output partition \d"):
            result.compute()
    ran = {t["key"] for t in stream.data}
    assert _merges({k: set(get_dependencies(graph, k)) for k in ran}) == []


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
