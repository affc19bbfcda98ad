"""Faults with real worker processes: a killed worker loses no row; a partition that
always kills its worker ends in KilledWorker, not a hang."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from distributed import Client, KilledWorker, LocalCluster, get_task_stream

import dask_cosim
from dask_cosim._cli import failure_message as _failure_message
from dask_cosim.io import vectors_to_arrow
from tests.helpers import pairs_frame, random_pairs, reference


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


def _cluster(loop: object) -> LocalCluster:
    """Two worker processes on distributed's test loop (see tests/test_cluster.py)."""
    return LocalCluster(n_workers=2, threads_per_worker=1, processes=True, loop=loop,
                        host="127.0.0.1", dashboard_address=None)  # fmt: skip


def test_killed_worker_loses_and_duplicates_no_row(
    pairs: tuple[Path, np.ndarray], loop: object
) -> None:
    folder, expected = pairs
    with _cluster(loop) as cluster, Client(cluster) as client:
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


def test_partition_that_always_kills_its_worker(
    pairs: tuple[Path, np.ndarray], loop: object
) -> None:
    folder, _ = pairs
    # worker-saturation 1.0: one task per thread at a time.  With dask's default (1.1) a
    # worker also holds the next root task, and that innocent neighbour is counted as a
    # suspect each time the worker dies, so KilledWorker may name it instead.
    config = {
        "distributed.scheduler.allowed-failures": 1,
        "distributed.scheduler.worker-saturation": 1.0,
    }
    with dask.config.set(config):
        with _cluster(loop) as cluster, Client(cluster) as client:
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


# ~5 GB of Parquet: 2,080,000 pairs x 300 float32 in 40 files, of which 4 hold distinct
# rows and the others are hard links to them (file i holds file i % 4's rows): writing the
# list layout took 41 s of the test's 53 (the read is the subject; each file is read as a
# file of its own, whatever inode it shares).
_ROWS, _DIM, _FILES, _DISTINCT = 2_080_000, 300, 40, 4


def _generated(i: int) -> pd.DataFrame:
    n = _ROWS // _FILES
    rng = np.random.default_rng(i)
    a, b = (rng.random((n, _DIM), dtype=np.float32) - 0.5 for _ in range(2))
    index = pd.RangeIndex(i * n, (i + 1) * n)
    return pd.DataFrame(
        {"embeds_a": vectors_to_arrow(a), "embeds_b": vectors_to_arrow(b), "id": index},
        index=index,
    )


def _linked_folder(tmp_path: Path, layout: str) -> Path:
    """The 40 files in ``layout``, without the index (rows numbered across the folder)
    and without our manifest (which would list 4), as the folder ``pairs``."""
    distinct = tmp_path / "distinct"
    meta = _generated(0).iloc[:0]
    with dask.config.set(scheduler="threads"):
        frame = dd.from_map(_generated, range(_DISTINCT), meta=meta)
        dask_cosim.to_parquet(frame, distinct, layout=layout, write_index=False)
    files = sorted(distinct.glob("*.parquet"))
    assert len(files) == _DISTINCT
    folder = tmp_path / "pairs"
    folder.mkdir()
    for i in range(_FILES):
        os.link(files[i % _DISTINCT], folder / f"part.{i:02d}.parquet")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["list", "binary"])
def test_capped_workers_stream_5gb_without_pausing(tmp_path: Path, layout: str) -> None:
    """Two workers limited to 1.5 GiB each (dask pauses at 80 %) read ~5 GB of Parquet
    (list: what other tools write, read buffered; binary: ours, memory-mapped):
    partitions stream through, no worker pauses, none is restarted.

    An idle worker holds ~600 MiB before any data (torch, pyarrow, distributed and the
    numba runtime of the CPU kernel, ~170 MiB of it): 1.25 GiB, enough before the fused
    kernel, left too little room for a list-layout partition being decoded."""
    folder = _linked_folder(tmp_path, layout)
    size = sum(f.stat().st_size for f in folder.glob("*.parquet"))
    assert size > 4.5e9
    # The first call of the CPU kernel for a type of input (here read-only Arrow buffers)
    # compiles it, which takes a few hundred MiB for a moment; the result is cached on
    # disk.  Compiled here first, as one small job does on a new machine, so that the
    # workers load it instead of each compiling under the cap.
    with dask.config.set(scheduler="sync"):
        dask_cosim.read_parquet(sorted(folder.glob("*.parquet"))[0]).head(10).cosim.pairwise(
            "embeds_a", "embeds_b"
        )
    limit = 1.5 * 2**30
    with dask_cosim.local_cluster(2, gpus=False, memory_limit=limit, dashboard_address=None,
                                  silence_logs=logging.WARNING) as client:  # fmt: skip
        pids = client.run(os.getpid)
        cos = dask_cosim.read_parquet(folder).cosim.pairwise("embeds_a", "embeds_b")
        future = client.compute(cos)
        peak: dict[str, float] = {}
        states = set()
        paused_since = None
        while not future.done():
            # A paused worker with nothing to spill never resumes: stop waiting.
            if "paused" in states:
                paused_since = paused_since or time.monotonic()
                if time.monotonic() - paused_since > 20:
                    break
            seen = client.run(lambda dask_worker: (dask_worker.status.name,
                                                   dask_worker.monitor.get_process_memory()))  # fmt: skip
            for worker, (state, rss) in seen.items():
                states.add(state)
                peak[worker] = max(peak.get(worker, 0), rss)
            time.sleep(0.1)
        logs = [line for w in client.get_worker_logs().values() for _, line in w]
        assert states == {"running"}, (states, {w: f"{m / 2**20:.0f} MiB" for w, m in peak.items()})
        result = future.result()
        assert client.run(os.getpid) == pids  # no worker died or was restarted
    assert not [line for line in logs if "Pausing worker" in line or "Restarting" in line]
    assert max(peak.values()) < 0.8 * limit, {w: f"{m / 2**20:.0f} MiB" for w, m in peak.items()}
    # Nothing lost, values right (first and last file checked against the reference).
    assert len(result) == _ROWS and (result.index == pd.RangeIndex(_ROWS)).all()
    for i in (0, _FILES - 1):
        part = _generated(i % _DISTINCT)
        a = np.stack(part["embeds_a"].to_numpy())
        b = np.stack(part["embeds_b"].to_numpy())
        rows = pd.RangeIndex(i * len(part), (i + 1) * len(part))
        np.testing.assert_allclose(result.loc[rows].to_numpy(), reference(a, b), atol=1e-6)


def _flaky(s: pd.Series, flag: str) -> pd.Series:
    """Fails the first time any partition runs, as a storage hiccup would."""
    try:
        os.close(os.open(flag, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return s
    raise OSError("storage hiccup (transient)")


def test_transient_errors_honour_retries_and_bad_data_fails_once(
    pairs: tuple[Path, np.ndarray], tmp_path: Path, loop: object
) -> None:
    folder, expected = pairs
    with _cluster(loop) as cluster, Client(cluster) as client:
        cos = dask_cosim.read_parquet(folder).cosim.pairwise("embeds_a", "embeds_b")
        # Without retries the hiccup fails the job; with retries=1 the task runs again.
        flaky = cos.map_partitions(_flaky, str(tmp_path / "one"), meta=cos._meta)
        with pytest.raises(OSError, match="storage hiccup"):
            client.compute(flaky).result(timeout=60)
        # (Another flag file, so other keys: the scheduler remembers the erred ones.)
        flaky = cos.map_partitions(_flaky, str(tmp_path / "two"), meta=cos._meta)
        result = client.compute(flaky, retries=1).result(timeout=60)
        np.testing.assert_allclose(result.sort_index().to_numpy(), expected, atol=1e-6)
        # Bad data (a ragged row) fails at once: dask retries only when asked to, and
        # the kernel does not retry anything itself.
        t = pa.list_(pa.float32())
        rows = [[1.0, 2.0]] * 30 + [[1.0]] + [[1.0, 2.0]] * 9
        bad = pd.DataFrame({"a": pd.array(pa.array(rows, t), dtype=pd.ArrowDtype(t))})
        ragged = dask_cosim.from_pandas(bad, npartitions=4).cosim.pairwise("a", "a")
        with get_task_stream(client) as stream:
            # (Its partition, rows 30-39, starts at the odd row: named against the others.)
            with pytest.raises(
                ValueError, match="column 'a': row 30 has 1 values but row 31 has 2"
            ):
                client.compute(ragged).result(timeout=60)
    runs = [t for t in stream.data if "cosim-pairwise" in str(t["key"])]
    erred = [t for t in runs if t.get("status") == "error"]
    assert len(erred) == 1 and len(runs) <= 4
