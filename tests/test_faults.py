"""Faults with real worker processes: a killed worker loses no row; a partition that
always kills its worker ends in KilledWorker, not a hang."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import dask
import numpy as np
import pandas as pd
import pytest
from distributed import Client, KilledWorker, LocalCluster

import dask_cosim
from dask_cosim.cli import _failure_message
from tests.conftest import pairs_frame, random_pairs, reference


def _slowly(s: pd.Series) -> pd.Series:
    time.sleep(0.2)  # so that a worker is killed while partitions remain
    return s


def _die_on(s: pd.Series, label: int) -> pd.Series:
    if label in s.index:
        os._exit(1)  # as a segfault or the OOM killer would end the process
    return s


@pytest.fixture
def pairs(tmp_path: Path) -> tuple[Path, np.ndarray]:
    a, b = random_pairs(8000, 32)
    folder = tmp_path / "pairs"
    dask_cosim.to_parquet(dask_cosim.from_pandas(pairs_frame(a, b, "fixed_size_list"),
                                                 npartitions=40), folder)  # fmt: skip
    return folder, reference(a, b)


def _cluster() -> LocalCluster:
    return LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                        host="127.0.0.1", dashboard_address=None)  # fmt: skip


def test_killed_worker_loses_and_duplicates_no_row(pairs: tuple[Path, np.ndarray]) -> None:
    folder, expected = pairs
    with _cluster() as cluster, Client(cluster) as client:
        cos = dask_cosim.read_parquet(folder).cosim.pairwise("embeds_a", "embeds_b")
        future = client.compute(cos.map_partitions(_slowly, meta=cos._meta))
        deadline = time.monotonic() + 60
        while not client.processing() or not any(client.processing().values()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1.0)  # some partitions done, most still to do
        victim = next(iter(client.run(os.getpid).values()))
        os.kill(victim, signal.SIGKILL)
        result = future.result(timeout=120)
        assert victim not in client.run(os.getpid).values()  # the nanny started a new one
    assert result.index.is_unique and len(result) == 8000
    np.testing.assert_allclose(result.sort_index().to_numpy(), expected, atol=1e-6)


def test_partition_that_always_kills_its_worker(pairs: tuple[Path, np.ndarray]) -> None:
    folder, _ = pairs
    # worker-saturation 1.0: one task per thread at a time.  With dask's default (1.1) a
    # worker also holds the next root task, and that innocent neighbour is counted as a
    # suspect each time the worker dies, so KilledWorker may name it instead.
    config = {
        "distributed.scheduler.allowed-failures": 1,
        "distributed.scheduler.worker-saturation": 1.0,
    }
    with dask.config.set(config):
        with _cluster() as cluster, Client(cluster) as client:
            cos = dask_cosim.read_parquet(folder).cosim.pairwise("embeds_a", "embeds_b")
            doomed = cos.map_partitions(_die_on, 4321, meta=cos._meta)
            with pytest.raises(KilledWorker) as info:
                client.compute(doomed).result(timeout=120)
    # 8000 rows in 40 partitions of 200: row 4321 is in partition 21.
    assert info.value.task[1] == 21
    # What the command line prints for it (exit 1, one line, the partition named).
    message = _failure_message(info.value)
    assert message.startswith(
        "the computation failed: partition 21 killed the worker process running it more "
        "than 1 time(s)"
    )
