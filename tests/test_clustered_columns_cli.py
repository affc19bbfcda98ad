"""method="clustered" carrying columns (columns=) as method="exact" does: of a frame in
memory and of a dask frame, persisted, lazily and on a distributed cluster; and on that
cluster and from the command line: k-means in a shard per worker thread, --method
clustered against exact, and the plan's steps reported.
tests/test_clustered_accessor.py has the accessor's answers against the exact method."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dask
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from click.testing import CliRunner
from dask.utils import key_split
from distributed import Client, LocalCluster, get_task_stream

import dask_cosim
from dask_cosim import clustered
from dask_cosim._cli import log_steps
from dask_cosim.cli import main
from dask_cosim.datasets import embedding_arrays
from tests.clustered_data import generated
from tests.helpers import as_column, counting_computes, to_dask


@pytest.fixture(scope="module")
def pdf() -> pd.DataFrame:
    return generated()


COLUMNS = ["id", "name", "weight", "tags"]


@pytest.fixture(scope="module")
def carrying() -> pd.DataFrame:
    """Rows to carry columns from: null rows, repeated string labels, and columns of
    several dtypes (int, string with nulls, float, an Arrow list)."""
    x, _ = embedding_arrays(900, 16, directions=20, duplicates=0.15, seed=7)
    n = len(x)
    null = np.zeros(n, dtype=bool)
    null[::37] = True
    tags = [[i % 5, i] if i % 11 else None for i in range(n)]
    names = [None if i % 13 == 0 else f"row{i}" for i in range(n)]
    return pd.DataFrame(
        {
            "emb": as_column(x.numpy(), "fixed_size_list", null),
            "id": np.arange(n, dtype=np.int64),
            "name": pd.array(names, dtype="string"),
            "weight": np.linspace(-1.0, 1.0, n),
            "tags": pd.array(tags, dtype=pd.ArrowDtype(pa.list_(pa.int64()))),
        },
        index=pd.Index([f"k{i % 97}" for i in range(n)]),
    )


def _by_ids(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(["left_id", "right_id"]).reset_index(drop=True)


def _assert_same_pairs(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """The same rows with the same columns and dtypes, the scores to float32 rounding."""
    assert list(got.columns) == ["left", "right", "score"] + [
        f"{side}_{c}" for side in ("left", "right") for c in COLUMNS
    ]
    assert got.dtypes.to_dict() == want.dtypes.to_dict()
    got, want = _by_ids(got), _by_ids(want)
    pd.testing.assert_frame_equal(got.drop(columns="score"), want.drop(columns="score"))
    np.testing.assert_allclose(got["score"], want["score"], atol=2e-6)


def test_clustered_carries_columns_as_exact(carrying: pd.DataFrame) -> None:
    ddf = to_dask(carrying, 3)
    opts = {"method": "clustered", "clusters": 10}
    with dask.config.set(scheduler="sync"):
        for frame in (carrying, ddf):
            want = frame.cosim.neighbors("emb", threshold=0.9, columns=COLUMNS)
            got = frame.cosim.neighbors("emb", threshold=0.9, columns=COLUMNS, **opts)
            kept_want, removed_want = frame.cosim.dedup("emb", 0.9, return_removed=True,
                                                        columns=COLUMNS)  # fmt: skip
            kept, removed = frame.cosim.dedup("emb", 0.9, return_removed=True,
                                              columns=COLUMNS, **opts)  # fmt: skip
            if frame is ddf:
                assert got.npartitions == removed.npartitions == ddf.npartitions
                assert got._meta.dtypes.to_dict() == want._meta.dtypes.to_dict()
                assert removed._meta.dtypes.to_dict() == removed_want._meta.dtypes.to_dict()
                want, got = want.compute(), got.compute()
                kept_want, removed_want, kept, removed = dask.compute(
                    kept_want, removed_want, kept, removed
                )
            assert len(want) > 100 and len(removed_want) > 50
            _assert_same_pairs(got, want)
            pd.testing.assert_frame_equal(kept, kept_want)
            # In frame order, as the exact method gives them.
            assert list(removed["right_id"]) == list(removed_want["right_id"])
            _assert_same_pairs(removed, removed_want)
            # n_probe may miss pairs, never invent them: each pair found is the exact one.
            some = frame.cosim.neighbors("emb", threshold=0.9, columns=COLUMNS, n_probe=2,
                                         **opts)  # fmt: skip
            some = some.compute() if frame is ddf else some
            found = set(zip(some["left_id"], some["right_id"], strict=True))
            among = [p in found for p in zip(want["left_id"], want["right_id"], strict=True)]
            assert 0 < len(some) == sum(among)
            _assert_same_pairs(some, want[among])


def test_clustered_columns_persist(carrying: pd.DataFrame) -> None:
    """persist() of a result carrying columns, of a frame held in memory: it failed with
    "Missing dependency" (persist optimizes twice; see clustered._carry)."""
    ddf = to_dask(carrying, 3)
    opts = {"method": "clustered", "clusters": 10, "columns": COLUMNS}
    with dask.config.set(scheduler="sync"):
        for result in (
            ddf.cosim.neighbors("emb", threshold=0.9, **opts),
            ddf.cosim.dedup("emb", 0.9, return_removed=True, **opts)[1],
        ):
            _assert_same_pairs(result.persist().compute(), result.compute())


@pytest.mark.filterwarnings("ignore::dask_cosim.errors.RepeatedLabelsWarning")
def test_clustered_columns_stay_lazy(carrying: pd.DataFrame) -> None:
    """Carrying columns adds no computation to the call: only the plan's."""
    ddf = to_dask(carrying, 3)
    counts = []
    for columns in (None, COLUMNS):
        with counting_computes() as calls:
            dask_cosim.search.neighbors(ddf, "emb", threshold=0.9, columns=columns,
                                        method="clustered", clusters=10)  # fmt: skip
            dask_cosim.search.dedup(ddf, "emb", 0.9, return_removed=True, columns=columns,
                                    method="clustered", clusters=10)  # fmt: skip
        counts.append(len(calls))
    assert counts[0] == counts[1] > 0


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster:  # fmt: skip
        yield cluster.scheduler_address


def test_clustered_columns_on_a_cluster(carrying: pd.DataFrame, scheduler: str) -> None:
    """On a distributed cluster, whose default shuffle (p2p) cannot carry an Arrow list."""
    ddf = to_dask(carrying, 3)
    with Client(scheduler):
        want = ddf.cosim.neighbors("emb", threshold=0.9, columns=COLUMNS).compute()
        got = ddf.cosim.neighbors("emb", threshold=0.9, columns=COLUMNS, method="clustered",
                                  clusters=10).compute()  # fmt: skip
        removed = ddf.cosim.dedup("emb", 0.9, return_removed=True, columns=COLUMNS,
                                  method="clustered", clusters=10)[1].compute()  # fmt: skip
    _assert_same_pairs(got, want)
    assert len(removed) > 50
    assert removed["left_tags"].dtype == carrying["tags"].dtype


def test_kmeans_runs_in_a_shard_per_thread(pdf: pd.DataFrame, scheduler: str) -> None:
    """On a distributed cluster each Lloyd iteration's product runs once per worker
    thread (the cluster has two), to the centroids of the sample in one shard."""
    ddf = to_dask(pdf, 4)
    with Client(scheduler) as client, get_task_stream(client) as stream:
        got = clustered.plan(ddf, "emb", 0.9, clusters=10, iters=3)
    ran = [key_split(t["key"]) for t in stream.data]
    assert ran.count("lloyd_sums") == 2 * 3, sorted(set(ran))
    want = clustered.plan(ddf, "emb", 0.9, clusters=10, iters=3)  # threads: one shard
    torch.testing.assert_close(got.layout.centroids, want.layout.centroids)


def test_cli_method_clustered(pdf: pd.DataFrame, tmp_path: Path, scheduler: str) -> None:
    data = tmp_path / "in"
    dask_cosim.to_parquet(to_dask(pdf, 2), data)
    runner = CliRunner()
    outs = {}
    for method in ("exact", "clustered"):
        for command in ("neighbors", "dedup"):
            out = tmp_path / f"{command}-{method}"
            args = [command, str(data), "--on", "emb", "--threshold", "0.9", "-o", str(out)]
            args += ["--method", method, "--scheduler", scheduler, "--quiet"]
            if method == "clustered":
                args += ["--clusters", "10"]
            result = runner.invoke(main, args)
            assert result.exit_code == 0, result.output
            outs[command, method] = pd.read_parquet(out)
    for command in ("neighbors", "dedup"):
        want, got = outs[command, "exact"], outs[command, "clustered"]
        assert len(want) == len(got) > 0
        assert list(want.columns) == list(got.columns)
    removed = {}
    for method in ("exact", "clustered"):
        result = runner.invoke(
            main, ["dedup", str(data), "--on", "emb", "--threshold", "0.9", "-o",
                   str(tmp_path / f"x-{method}"), "--method", method, "--removed",
                   str(tmp_path / f"r-{method}"), "--columns", "id", "--scheduler", scheduler,
                   "--quiet"],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        removed[method] = pd.read_parquet(tmp_path / f"r-{method}")
    assert len(removed["exact"]) > 0
    rows = ["left", "right", "left_id", "right_id"]
    pd.testing.assert_frame_equal(removed["clustered"][rows], removed["exact"][rows])
    # The plan's steps are printed unless --quiet, also when stderr is not a terminal
    # (as here): a log file says how far a long run got.
    for quiet in (False, True):
        args = ["neighbors", str(data), "--on", "emb", "--threshold", "0.9", "--method",
                "clustered", "--n-probe", "2", "-o", str(tmp_path / f"q-{quiet}"),
                "--scheduler", scheduler] + ["--quiet"] * quiet  # fmt: skip
        result = runner.invoke(main, args)
        assert result.exit_code == 0, result.output
        assert ("clustered: k-means done in" in result.stderr) != quiet, result.stderr
    # The plan (k-means, the radii) computed on the cluster, not in the CLI's process.
    with Client(scheduler) as client:
        ran = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.task_prefixes))
    assert {"lloyd_sums", "stats_partition"} <= set(ran), sorted(ran)


def test_plan_reports_its_steps(pdf: pd.DataFrame, capsys: pytest.CaptureFixture[str]) -> None:
    with log_steps(False):
        clustered.plan(to_dask(pdf, 2), "emb", 0.9, clusters=10)
    assert capsys.readouterr().err == ""
    with log_steps(True):
        found = clustered.plan(to_dask(pdf, 2), "emb", 0.9, clusters=10)
    err = capsys.readouterr().err
    assert "clustered: k-means on a sample of about 1500 of 1500 rows, 10 clusters" in err
    assert "copies per row" in err and "the search is lazy from here" in err
    # The routing shuffle's partitions, named so (the result's partitions are others).
    assert f"copies per row, {found.partitions} shuffle partitions;" in err


def test_plan_reports_one_shuffle_partition_in_the_singular(
    pdf: pd.DataFrame, capsys: pytest.CaptureFixture[str]
) -> None:
    with log_steps(True):
        found = clustered.plan(to_dask(pdf, 1), "emb", 0.9, clusters=10)
    assert found.partitions == 1
    assert "copies per row, 1 shuffle partition;" in capsys.readouterr().err
