"""The search graphs have deterministic keys: the same call built twice gives the same
graph, and another input or option gives another one (dask can then recognise, reuse and
cache the work)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
import torch
from dask.callbacks import Callback

import dask_cosim
from dask_cosim import search_graph
from dask_cosim.io import vectors_to_arrow
from dask_cosim.search_graph import Builder
from tests.helpers import as_column, graph_bytes, spy_on_reads


def _frame(seed: int = 0, n: int = 40, d: int = 8) -> pd.DataFrame:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return pd.DataFrame({"emb": vectors_to_arrow(x), "id": np.arange(n)})


def _tensors(seed: int) -> pd.DataFrame:
    """``_frame(seed)`` with its vectors as torch tensors in an object column."""
    x = np.random.default_rng(seed).standard_normal((40, 8)).astype(np.float32)
    return pd.DataFrame({"emb": as_column(x, "object_torch_300x1"), "id": np.arange(40)})


def _dask(pdf: pd.DataFrame) -> dd.DataFrame:
    return dd.from_pandas(pdf, npartitions=3, sort=False)


def _graph_keys(build: Callable[[], Any]) -> set[Any]:
    """The keys of the graph ``build()`` returns, or of the graphs it computes (topk)."""
    seen: set[Any] = set()
    with Callback(start=lambda dsk: seen.update(dsk)), dask.config.set(scheduler="sync"):
        result = build()
    if dask.is_dask_collection(result):
        seen.update(dict(result.__dask_graph__()))
    assert seen
    return seen


QUERIES = np.random.default_rng(9).standard_normal((5, 8)).astype(np.float32)

# name -> (the call, the same call with another input or option)
CALLS: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
    "neighbors": (
        lambda: _dask(_frame()).cosim.neighbors("emb", k=3),
        lambda: _dask(_frame()).cosim.neighbors("emb", k=4),
    ),
    "neighbors threshold": (
        lambda: _dask(_frame()).cosim.neighbors("emb", threshold=0.5),
        lambda: _dask(_frame()).cosim.neighbors("emb", threshold=0.6),
    ),
    "join with an eager right": (
        lambda: _dask(_frame()).cosim.join(_frame(1), "emb", k=2),
        lambda: _dask(_frame()).cosim.join(_frame(2), "emb", k=2),
    ),
    # dask's token of a torch tensor differs from copy to copy: a frame of tensors is
    # named by their values.
    "join with an eager right of tensors": (
        lambda: _dask(_frame()).cosim.join(_tensors(1), "emb", k=2),
        lambda: _dask(_frame()).cosim.join(_tensors(2), "emb", k=2),
    ),
    "join with an eager left": (
        lambda: _frame(1).cosim.join(_dask(_frame()), "emb", threshold=0.2),
        lambda: _frame(1).cosim.join(_dask(_frame(3)), "emb", threshold=0.2),
    ),
    "dedup": (
        lambda: _dask(_frame()).cosim.dedup("emb", 0.5),
        lambda: _dask(_frame()).cosim.dedup("emb", 0.4),
    ),
    "topk numpy": (
        lambda: _dask(_frame()).cosim.topk(QUERIES, "emb", 3),
        lambda: _dask(_frame()).cosim.topk(QUERIES[::-1].copy(), "emb", 3),
    ),
    "topk torch": (
        lambda: _dask(_frame()).cosim.topk(torch.from_numpy(QUERIES.copy()), "emb", 3),
        lambda: _dask(_frame()).cosim.topk(torch.from_numpy(QUERIES + 1), "emb", 3),
    ),
    "topk Series": (
        lambda: _dask(_frame()).cosim.topk(_frame(4)["emb"], "emb", 3),
        lambda: _dask(_frame()).cosim.topk(_frame(4)["emb"], "emb", 3, columns=["id"]),
    ),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_the_same_call_gives_the_same_keys(name: str) -> None:
    call, other = CALLS[name]
    first = _graph_keys(call)
    assert _graph_keys(call) == first
    assert _graph_keys(other) != first


def test_eager_inputs_are_named_by_their_contents() -> None:
    """An eager frame beside a dask one, and the queries, are one key each, named by a
    token of their data: equal data, equal names."""
    keys = _graph_keys(lambda: _dask(_frame()).cosim.join(_frame(1), "emb", k=2))
    frames = [k for k in keys if isinstance(k, str) and k.startswith("cosim-frame-")]
    assert len(frames) == 1
    keys = _graph_keys(lambda: _dask(_frame()).cosim.topk(QUERIES, "emb", 3))
    queries = {k for k in keys if isinstance(k, str) and k.startswith("cosim-queries-")}
    assert len(queries) == 1
    same = _graph_keys(lambda: _dask(_frame()).cosim.topk(QUERIES.copy(), "emb", 3))
    assert queries <= same


def _objects(seed: int, n: int = 40) -> pd.DataFrame:
    """``_frame(seed)`` with its vectors as numpy arrays in an object column (a row null)."""
    x = np.random.default_rng(seed).standard_normal((n, 8)).astype(np.float32)
    pdf = pd.DataFrame({"emb": as_column(x, "object_numpy"), "id": np.arange(n)})
    pdf.loc[3, "emb"] = None
    return pdf


def test_an_eager_side_of_numpy_cells_travels_as_arrow() -> None:
    """A join's pandas side whose vectors are numpy arrays in an object column goes into
    the graph (and to the workers) as the Arrow column from_pandas makes: hashing and
    pickling an object column cell by cell took 4 s to build a join against 100,000 x 64
    rows, 16.7 s under a client. The same result; carried as a column of the result, the
    vectors stay what they were; rows that cannot be stacked are left for the search to
    name."""
    left = _dask(_frame())
    right = _objects(1)
    expected = _frame().cosim.join(right, "emb", k=2)
    graph = dict(left.cosim.join(right, "emb", k=2).__dask_graph__())
    (key,) = [k for k in graph if isinstance(k, str) and k.startswith("cosim-frame-")]
    frame = dask.get(graph, key)
    assert isinstance(frame["emb"].dtype, pd.ArrowDtype)
    got = left.cosim.join(right, "emb", k=2).compute(scheduler="sync")
    pd.testing.assert_frame_equal(got.reset_index(drop=True), expected.reset_index(drop=True))
    carried = left.cosim.join(right, "emb", k=2, right_columns=["emb"]).compute(scheduler="sync")
    assert carried["right_emb"].dtype == object
    assert isinstance(carried["right_emb"].dropna().iloc[0], np.ndarray)
    ragged = right.copy()
    ragged.at[5, "emb"] = np.zeros(3, dtype=np.float32)
    with pytest.raises(ValueError, match="row 5"):
        left.cosim.join(ragged, "emb", k=2).compute(scheduler="sync")


@pytest.mark.parametrize("option", [{"cosim.eps": 1e-3}, {"cosim.search.tile-bytes.cpu": "1MiB"}])
def test_options_change_the_keys(option: dict[str, Any]) -> None:
    def call() -> Any:
        return _dask(_frame()).cosim.topk(QUERIES, "emb", 3)

    before = _graph_keys(call)
    with dask.config.set(option):
        assert _graph_keys(call) != before


# name -> a lazy search of a dask frame (a tuple: several results of one call)
IN_MEMORY: dict[str, Callable[[dd.DataFrame], Any]] = {
    "dedup": lambda df: df.cosim.dedup("emb", 0.9),
    "dedup return_removed": lambda df: df.cosim.dedup("emb", 0.9, return_removed=True),
    "dedup columns": lambda df: df.cosim.dedup("emb", 0.9, return_removed=True, columns="id"),
    "groups": lambda df: df.cosim.groups("emb", 0.9),
    "neighbors": lambda df: df.cosim.neighbors("emb", threshold=0.9, columns="id"),
    "join": lambda df: df.cosim.join(df, "emb", k=2),
    "dedup of a filtered frame": lambda df: df[df["id"] % 3 > 0].cosim.dedup("emb", 0.9),
}


@pytest.mark.parametrize("name", list(IN_MEMORY))
@pytest.mark.parametrize("max_blocks", [64, 2])
def test_a_frame_in_memory_is_held_once_by_the_graph(name: str, max_blocks: int) -> None:
    """A ``dd.from_pandas`` frame's graph holds its partitions' data: a search's graph
    holds it once, not once for the vectors and again for the whole rows (dedup, groups:
    a projection of such a frame is another copy of the data, not a narrower read)."""
    df = dd.from_pandas(_frame(n=2000, d=64), npartitions=4)
    with dask.config.set({"cosim.search.max-blocks": max_blocks}):
        result = IN_MEMORY[name](df)
    results = result if isinstance(result, tuple) else (result,)
    assert graph_bytes(*results) < 1.2 * graph_bytes(df)


def test_a_parquet_read_still_reads_only_the_vectors_for_the_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dedup and groups of a Parquet read: the search reads the vectors alone, the whole
    rows are read for the result (a wide column the search does not need is read once)."""
    pdf = _frame(n=400)
    pdf["wide"] = vectors_to_arrow(np.zeros((400, 256), dtype=np.float32))
    dask_cosim.to_parquet(dd.from_pandas(pdf, npartitions=2), tmp_path / "d")
    asked = spy_on_reads(monkeypatch)
    for call in (lambda df: df.cosim.dedup("emb", 0.9), lambda df: df.cosim.groups("emb", 0.9)):
        asked.clear()
        call(dask_cosim.read_parquet(tmp_path / "d")).compute(scheduler="sync")
        assert sorted(asked, key=len) == [["emb"], ["emb"], *[["emb", "id", "wide"]] * 2]


def test_steps_between_the_read_and_the_search_run_once_in_their_order(tmp_path: Path) -> None:
    """dedup and groups match the search's row positions to the rows they return.  A step
    between the read and the search that is not row-wise (``map_partitions``, a shuffle)
    ran a second time for a projection of the vectors, and where its rows came in another
    order the second time (dask's disk shuffle gives them so), the positions of one named
    rows of the other: copies kept and their originals dropped, silently."""
    x = np.random.default_rng(0).standard_normal((400, 8)).astype(np.float32)
    x[1::2] = x[0::2]  # row 2i + 1 copies row 2i
    pdf = pd.DataFrame({"emb": vectors_to_arrow(x), "id": np.arange(400), "g": np.arange(400) % 3})
    dask_cosim.to_parquet(dd.from_pandas(pdf, npartitions=4), tmp_path / "d")
    calls = []

    def reorder(part: pd.DataFrame) -> pd.DataFrame:  # another row order at each call
        calls.append(len(part))
        return part.iloc[np.random.default_rng(len(calls)).permutation(len(part))]

    read = dask_cosim.read_parquet(tmp_path / "d")
    for df in (read.map_partitions(reorder, meta=read._meta), read.shuffle("g")):
        calls.clear()
        kept, groups = dask.compute(df.cosim.dedup("emb", 0.99), df.cosim.groups("emb", 0.99))
        assert sorted(kept["id"] // 2) == list(range(200))  # one row of each pair
        by_id = groups.set_index("id")["group"].sort_index().to_numpy()
        assert (by_id[0::2] == by_id[1::2]).all() and len(set(by_id)) == 200
        assert len(calls) in (0, 4)  # once per partition, for both searches (0: the shuffle)


def test_a_step_before_the_search_is_shared_with_what_is_computed_beside_it() -> None:
    """neighbors and join took their sides from a projection of the frame: over a
    ``map_partitions`` (an embedding model) that is a task of its own, which ran the model
    a second time when the frame, or another search, was computed with them.  (topk is
    eager: it computes the frame when called.)"""
    x = np.random.default_rng(1).standard_normal((300, 8)).astype(np.float32)
    base = dd.from_pandas(pd.DataFrame({"id": np.arange(300), "x": x[:, 0]}), npartitions=3)
    calls = []

    def embed(part: pd.DataFrame) -> pd.DataFrame:  # stands for a model
        calls.append(len(part))
        return part.assign(emb=vectors_to_arrow(x[part["id"].to_numpy()]))

    df = base.map_partitions(embed, meta=embed(base._meta))
    for search in (
        lambda: df.cosim.neighbors("emb", threshold=0.5, columns=["id"]),
        lambda: df.cosim.join(df, "emb", k=1),
        lambda: df.cosim.dedup("emb", 0.9),
    ):
        calls.clear()
        got, frame = dask.compute(search(), df, scheduler="threads")
        assert len(calls) == 3 and len(frame) == 300  # once per partition, for both
        pd.testing.assert_frame_equal(got, search().compute(scheduler="threads"))
    calls.clear()
    dask.compute(df.x.mean(), df.cosim.neighbors("emb", k=1), scheduler="threads")
    assert len(calls) == 3


def test_a_step_after_a_parquet_read_is_shared_too(tmp_path: Path) -> None:
    """The same over a Parquet read (embeddings written, or written beside their
    dedup): the search held its frame's graph as dask optimises it alone, the read and
    the model fused into one task, while computed with the frame they are tasks of
    their own, so no key matched and the model ran twice a partition."""
    x = np.random.default_rng(2).standard_normal((300, 8)).astype(np.float32)
    pdf = pd.DataFrame({"id": np.arange(300), "emb": vectors_to_arrow(x)})
    dask_cosim.to_parquet(dd.from_pandas(pdf, npartitions=3), tmp_path / "d")
    calls = []

    def embed(part: pd.DataFrame) -> pd.DataFrame:  # stands for a model
        calls.append(len(part))
        return part.assign(h=1)

    df = dask_cosim.read_parquet(tmp_path / "d").map_partitions(embed)
    for search in (lambda: df.cosim.dedup("emb", 0.9), lambda: df.cosim.neighbors("emb", k=2)):
        calls.clear()
        got, frame = dask.compute(search(), df, scheduler="sync")
        assert len(calls) == 3 and len(frame) == 300
        pd.testing.assert_frame_equal(got, search().compute(scheduler="sync"))
    calls.clear()
    dask.compute(df.to_parquet(tmp_path / "out", compute=False), df.cosim.dedup("emb", 0.9))
    assert len(calls) == 3


def test_which_frames_a_projection_reads_again_alike(tmp_path: Path) -> None:
    """A read under row-wise steps is read again, narrower, for the search's vectors;
    anything else gives them from the rows it computes once."""
    dask_cosim.to_parquet(dd.from_pandas(_frame(), npartitions=2), tmp_path / "d")
    read = dask_cosim.read_parquet(tmp_path / "d")
    alike = [read, read[read["id"] > 3], read.assign(more=read["id"] * 2)[["emb", "more"]]]
    other = [read.map_partitions(lambda p: p), read.shuffle("id"), read.set_index("id"),
             dd.from_pandas(_frame(), npartitions=2), read.merge(read[["id"]], on="id"),
             dd.from_map(_frame, [0, 1]), read.persist()]  # fmt: skip
    assert [search_graph.rereads_alike(df) for df in alike] == [True] * len(alike)
    assert [search_graph.rereads_alike(df) for df in other] == [False] * len(other)


def test_eager_inputs_scattered_again_are_not_lost(client: Any) -> None:
    """Under a client the eager side of a join, and topk's queries, were scattered under
    a key named by their data alone: the next call with the same data scattered it again
    under that key while the release of the previous call's copy was still on its way to
    the scheduler, which then forgot the new copy too ("FutureCancelledError: ... lost
    dependencies"; about 1 join in 20 on two in-process workers, every time when the
    next scatter follows the release at once, as here).  Each scatter now has a key of
    its own."""
    build = Builder(lazy=True)
    for _ in range(10):
        # The previous copy is dropped (its release sent) just before the next scatter.
        np.testing.assert_array_equal(build.value(QUERIES, "cosim-queries").compute(), QUERIES)


def test_a_search_of_partitions_a_closed_client_scattered_says_so() -> None:
    """A frame made by ``from_pandas`` under a client that has closed since holds no data:
    a search of it under another client failed at compute with "FutureCancelledError:
    ... lost dependencies"; it is refused when built, saying why."""
    from distributed import Client, LocalCluster

    pdf = _frame(1, n=20, d=4)
    options = {"n_workers": 1, "processes": False, "dashboard_address": None}
    with LocalCluster(**options) as cluster, Client(cluster) as first:
        df = dask_cosim.from_pandas(pdf, npartitions=2)
    with LocalCluster(**options) as cluster, Client(cluster):
        for search in (lambda: df.cosim.dedup("emb", 0.2), lambda: pdf.cosim.join(df, "emb", k=1)):
            with pytest.raises(RuntimeError, match=rf"scattered to the workers of {first!r}, "
                               r"which has closed: .* build the frame again"):  # fmt: skip
                search()

    # Under another client while its own is open: refused too ("lost dependencies" at
    # compute, naming a task of ours); under its own again, it runs.
    with LocalCluster(**options) as cluster, Client(cluster) as first:
        df = dask_cosim.from_pandas(pdf, npartitions=2)
        with LocalCluster(**options) as other, Client(other) as second:
            with pytest.raises(RuntimeError, match=r"scattered to the workers of .* but "
                               rf"{second!r} computes now, whose workers do not hold them"):  # fmt: skip
                df.cosim.dedup("emb", 0.2)
            with first.as_current():
                assert len(df.cosim.dedup("emb", 0.2).compute()) <= len(pdf)
    # Another client of the same scheduler, reached by another name, computes it.
    local = {"protocol": "tcp://", "host": "127.0.0.1", **options}
    with LocalCluster(**local) as cluster, Client(cluster):
        df = dask_cosim.from_pandas(pdf, npartitions=2)
        port = cluster.scheduler_address.rsplit(":", 1)[1]
        with Client(f"tcp://localhost:{port}"):
            assert len(df.cosim.neighbors("emb", k=2).compute()) == 2 * len(pdf)


def test_a_search_holds_the_partitions_from_pandas_scattered(client: Any) -> None:
    """``dask_cosim.from_pandas`` under a client scatters the partitions, which live as
    long as the frame's futures; a search's graph (made of ``to_delayed``'s partitions)
    did not hold them, so a result that outlived its input frame, as in
    ``pairs = pdf.cosim.join(dask_cosim.from_pandas(pdf), ...)``, failed when computed:
    "FutureCancelledError: ... lost dependencies".  Its graph now holds them."""
    pdf = _frame(1, n=20, d=4)
    searches = {
        "join, eager left": lambda df: pdf.cosim.join(df, "emb", k=1),
        "join": lambda df: df.cosim.join(pdf, "emb", k=1),
        "neighbors": lambda df: df.cosim.neighbors("emb", threshold=0.2),
        "dedup": lambda df: df.cosim.dedup("emb", 0.2),
        "groups": lambda df: df.cosim.groups("emb", 0.2),
    }
    for name, search in searches.items():
        want = search(pdf)  # eager
        result = search(dask_cosim.from_pandas(pdf, npartitions=2))  # the frame is dropped
        gc.collect()
        got = result.compute()
        pd.testing.assert_frame_equal(
            got.reset_index(drop=True), want.reset_index(drop=True), obj=name
        )


def test_a_search_releases_the_partitions_with_the_frame(tmp_path: Path) -> None:
    """Once the frame and its results are dropped, its scattered partitions go: the
    tasks that hold them named the futures themselves, which the messages an in-process
    scheduler logs (distributed.admin.low-level-log-length, 1,000) kept alive, and with
    them the partitions, for about 1,000 more messages."""
    from distributed import Client, LocalCluster

    pdf = _frame(1, n=60, d=4)
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster:
        with Client(cluster) as client:
            for search in (
                lambda df: df.cosim.neighbors("emb", threshold=0.2).compute(),
                lambda df: df.cosim.dedup("emb", 0.2).compute(),
                lambda df: dask_cosim.to_parquet(df, tmp_path / "out", compute=False).compute(),
            ):
                df = dask_cosim.from_pandas(pdf, npartitions=3)
                assert len(client.futures) == 3
                search(df)
                del df
                gc.collect()
                deadline = time.monotonic() + 5
                while client.futures and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert not client.futures, list(client.futures)


def test_topk_under_an_asynchronous_client_says_how_to_await_the_search() -> None:
    """topk computes when called, which an asynchronous Client cannot do: dask's own
    "Attempting to use an asynchronous Client in a synchronous context" is told the
    lazy join of the queries that it can await, which gives topk's answer."""
    import asyncio

    from distributed import Client, LocalCluster

    pdf = _frame(1, n=30, d=4)
    queries = pdf.iloc[:2][["emb"]].reset_index(drop=True)

    async def run() -> pd.DataFrame:
        options = {"n_workers": 1, "processes": False, "dashboard_address": None}
        async with LocalCluster(asynchronous=True, **options) as cluster:
            async with Client(cluster, asynchronous=True) as client:
                df = dask_cosim.from_pandas(pdf, npartitions=2)
                with pytest.raises(RuntimeError, match=r"await client\.compute\(queries\.cosim"
                                   r"\.join\(df, 'emb', k=3\)\)"):  # fmt: skip
                    df.cosim.topk(queries["emb"], "emb", k=3)
                return await client.compute(queries.cosim.join(df, "emb", k=3))

    joined = asyncio.run(run())
    want = pdf.cosim.topk(queries["emb"], "emb", k=3)
    assert joined["right"].tolist() == want["match"].tolist()
    np.testing.assert_array_equal(joined["score"].to_numpy(), want["score"].to_numpy())
