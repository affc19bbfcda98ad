"""method="clustered" through the accessor, dask_cosim.search and the command line: the
same result as method="exact", and the errors for what does not go together."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dask
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from distributed import Client, LocalCluster

import dask_cosim
from dask_cosim import clustered, search
from dask_cosim._cli import log_steps
from dask_cosim.cli import main
from dask_cosim.datasets import make_embeddings
from tests.helpers import to_dask


@pytest.fixture(scope="module")
def pdf() -> pd.DataFrame:
    frame, _ = make_embeddings(1500, 16, directions=30, duplicates=0.1, seed=4)
    return frame


def test_accessor_clustered_equals_exact(pdf: pd.DataFrame) -> None:
    ddf = to_dask(pdf, 3)
    with dask.config.set(scheduler="sync"):
        for frame in (pdf, ddf):
            want = frame.cosim.neighbors("emb", threshold=0.9)
            got = frame.cosim.neighbors("emb", threshold=0.9, method="clustered", clusters=12)
            if frame is ddf:
                assert got.npartitions == ddf.npartitions
                assert got._meta.dtypes.to_dict() == want._meta.dtypes.to_dict()
                want, got = want.compute(), got.compute()
            assert len(want) > 50
            assert got.dtypes.to_dict() == want.dtypes.to_dict()
            pd.testing.assert_frame_equal(
                got.reset_index(drop=True)[["left", "right"]],
                want.reset_index(drop=True)[["left", "right"]],
            )
            np.testing.assert_allclose(got["score"], want["score"], atol=2e-6)
            kept = frame.cosim.dedup("emb", 0.9, method="clustered", n_probe=3)
            exact = search.dedup(frame, "emb", 0.9)
            if frame is ddf:
                assert kept.divisions == ddf.divisions
                kept, exact = kept.compute(), exact.compute()
            # n_probe may miss pairs (rows kept), never invent them (rows dropped).
            assert set(exact.index) <= set(kept.index)
            assert list(kept.columns) == list(pdf.columns)


def test_clustered_removed_rows_equal_exact(pdf: pd.DataFrame) -> None:
    ddf = to_dask(pdf, 3)
    with dask.config.set(scheduler="sync"):
        for frame in (pdf, ddf):
            want = frame.cosim.dedup("emb", 0.9, return_removed=True)
            got = frame.cosim.dedup("emb", 0.9, return_removed=True, method="clustered",
                                    clusters=12)  # fmt: skip
            if frame is ddf:
                assert got[0].divisions == ddf.divisions
                assert got[1].npartitions == ddf.npartitions
                assert got[1]._meta.dtypes.to_dict() == want[1]._meta.dtypes.to_dict()
                want, got = dask.compute(*want), dask.compute(*got)
            pd.testing.assert_frame_equal(got[0], want[0])
            removed, expected = (r.reset_index(drop=True) for r in (got[1], want[1]))
            assert len(expected) > 50
            assert removed.dtypes.to_dict() == expected.dtypes.to_dict()
            # Which earlier row each removed row names: the same float64 rule, ties alike.
            pd.testing.assert_frame_equal(removed[["left", "right"]], expected[["left", "right"]])
            np.testing.assert_allclose(removed["score"], expected["score"], rtol=1e-12, atol=0)


def test_clustered_errors(pdf: pd.DataFrame) -> None:
    df = pdf.cosim
    with pytest.raises(ValueError, match=r"method='approx'; use 'exact'"):
        df.neighbors("emb", threshold=0.9, method="approx")
    with pytest.raises(ValueError, match=r"n_probe is an option of method='clustered'"):
        df.dedup("emb", 0.9, n_probe=2)
    with pytest.raises(ValueError, match=r"k=5 with method='clustered'.*method='exact'"):
        df.neighbors("emb", k=5, method="clustered")
    with pytest.raises(ValueError, match=r"threshold=-0\.5: method='clustered' needs"):
        df.neighbors("emb", threshold=-0.5, method="clustered")
    with pytest.raises(NotImplementedError, match=r"columns=\['id'\] with method='clustered'"):
        df.neighbors("emb", threshold=0.9, columns=["id"], method="clustered")
    assert dask_cosim.clustered_recall.sample_truth is not None


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster:  # fmt: skip
        yield cluster.scheduler_address


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
                   str(tmp_path / f"r-{method}"), "--scheduler", scheduler, "--quiet"],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        removed[method] = pd.read_parquet(tmp_path / f"r-{method}")
    assert len(removed["exact"]) > 0
    pd.testing.assert_frame_equal(
        removed["clustered"][["left", "right"]], removed["exact"][["left", "right"]]
    )
    # The plan (k-means, the radii) computed on the cluster, not in the CLI's process.
    with Client(scheduler) as client:
        ran = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.task_prefixes))
    assert {"kmeans", "stats_partition"} <= set(ran), sorted(ran)


def test_plan_reports_its_steps(pdf: pd.DataFrame, capsys: pytest.CaptureFixture[str]) -> None:
    with log_steps(False):
        clustered.plan(to_dask(pdf, 2), "emb", 0.9, clusters=10)
    assert capsys.readouterr().err == ""
    with log_steps(True):
        clustered.plan(to_dask(pdf, 2), "emb", 0.9, clusters=10)
    err = capsys.readouterr().err
    assert "clustered: k-means on a sample of about 1500 of 1500 rows, 10 clusters" in err
    assert "copies per row" in err and "the search is lazy from here" in err
