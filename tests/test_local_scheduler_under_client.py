"""A local scheduler (``scheduler="sync"``, dask's advice for debugging with pdb, or
``"threads"``) under an active distributed client: graphs that name data dask_cosim
scattered to the workers (``from_pandas``'s partitions, join's eager side) give what the
client gives, and the client's path still scatters."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pandas as pd
import pytest
from dask._task_spec import convert_legacy_graph
from distributed import Client
from distributed.utils_test import config_for_cluster_tests

import dask_cosim
from tests.helpers import search_frame, search_vectors

SCHEDULERS = ["sync", "threads"]


@pytest.fixture
def frames(shared_client: Client) -> tuple[Any, pd.DataFrame]:
    """A frame that from_pandas scattered to the client's workers (3 partitions, with
    duplicates and a near-duplicate), and an eager right side."""
    pdf = search_frame(search_vectors(97, 12, seed=0))
    right = search_frame(search_vectors(30, 12, seed=1))
    return dask_cosim.from_pandas(pdf, npartitions=3), right


SEARCHES: dict[str, Callable[[Any, pd.DataFrame], Any]] = {
    "the frame": lambda df, right: df,
    "pairwise": lambda df, right: df.cosim.pairwise("emb", "emb"),
    "join, eager right": lambda df, right: df.cosim.join(right, "emb", k=2, columns="id"),
    "join, scattered right": lambda df, right: df.cosim.join(
        dask_cosim.from_pandas(right, npartitions=2), "emb", threshold=0.3
    ),
    "neighbors": lambda df, right: df.cosim.neighbors("emb", k=3),
    "dedup": lambda df, right: df.cosim.dedup("emb", 0.99),
    "dedup, removed": lambda df, right: df.cosim.dedup("emb", 0.99, return_removed=True)[1],
    "groups": lambda df, right: df.cosim.groups("emb", 0.99),
}


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("search", list(SEARCHES))
def test_a_local_scheduler_gives_what_the_client_gives(
    frames: tuple[Any, pd.DataFrame], search: str, scheduler: str
) -> None:
    df, right = frames
    result = SEARCHES[search](df, right)
    expected = result.compute()
    pd.testing.assert_frame_equal(
        pd.DataFrame(result.compute(scheduler=scheduler)), pd.DataFrame(expected)
    )


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_topk_under_a_local_scheduler(frames: tuple[Any, pd.DataFrame], scheduler: str) -> None:
    df, right = frames
    queries = np.stack(right["emb"].to_numpy()[:4])
    expected = df.cosim.topk(queries, "emb", k=3, columns="id")
    with dask.config.set(scheduler=scheduler):
        got = df.cosim.topk(queries, "emb", k=3, columns="id")
    pd.testing.assert_frame_equal(got, expected)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_to_parquet_under_a_local_scheduler(
    frames: tuple[Any, pd.DataFrame], scheduler: str, tmp_path: Path
) -> None:
    df, _ = frames
    expected = df.compute()
    later = dask_cosim.to_parquet(df, tmp_path / "later", compute=False)
    assert later.compute(scheduler=scheduler)["rows"] == len(expected)
    with dask.config.set(scheduler=scheduler):
        assert dask_cosim.to_parquet(df, tmp_path / "now")["rows"] == len(expected)
    for name in ("later", "now"):
        back = dask_cosim.read_parquet(tmp_path / name).compute(scheduler="sync")
        np.testing.assert_array_equal(
            np.stack(back["emb"].to_numpy()), np.stack(expected["emb"].to_numpy())
        )
        assert back.index.equals(expected.index) and back["id"].tolist() == list(range(97))


def test_the_eager_side_is_still_scattered_and_named_by_the_graph(shared_client: Client) -> None:
    """The report's call: a frame whose data is in its graph joins an eager one.  The
    eager side is on the workers, under a key the graph names without holding it, a new
    one per call; a local computation leaves the graph as it was."""
    pdf = search_frame(search_vectors(60, 8, seed=2))
    with dask.config.set(scheduler="sync"):  # no client in sight: the data in the graph
        left = dask_cosim.from_pandas(pdf, npartitions=2)
    right = pdf.iloc[::3]
    pairs = left.cosim.join(right, "emb", k=1)
    outside = _named_not_held(pairs)
    assert len(outside) == 1 and outside[0].startswith("cosim-frame-")
    assert outside[0] in shared_client.who_has()
    assert _named_not_held(left.cosim.join(right, "emb", k=1)) != outside
    expected = pairs.compute()
    pd.testing.assert_frame_equal(pairs.compute(scheduler="sync"), expected)
    assert _named_not_held(pairs) == outside
    pd.testing.assert_frame_equal(pairs.compute(), expected)


def test_a_closed_client_is_named_with_the_fix(shared_cluster: str) -> None:
    pdf = search_frame(search_vectors(20, 8, seed=3))
    with config_for_cluster_tests(), Client(shared_cluster):
        df = dask_cosim.from_pandas(pdf, npartitions=2)
    with pytest.raises(RuntimeError, match=r"scattered to the workers.*Compute with that client"):
        df.cosim.pairwise("emb", "emb").compute(scheduler="sync")


def _named_not_held(collection: Any) -> list[str]:
    """The keys ``collection``'s graph depends on without holding them, sorted."""
    graph = convert_legacy_graph(dict(collection.__dask_graph__()))
    named = set().union(*(node.dependencies for node in graph.values()))
    return sorted(str(key) for key in named - set(graph))
