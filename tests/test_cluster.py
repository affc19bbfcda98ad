"""Real distributed clusters with worker processes."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import psutil
import pytest
import torch
from distributed import Client, get_task_stream, wait

import dask_cosim
from tests.helpers import pairs_frame, random_pairs, reference


def test_pairwise_on_worker_processes(client: Client, tmp_path: object) -> None:
    """distributed.utils_test's cluster: a scheduler and two workers, each its own process."""
    workers = client.run(os.getpid)
    assert len(workers) == 2 and os.getpid() not in workers.values()
    a, b = random_pairs(3000, 300)
    pdf = pairs_frame(a, b, "object_torch_300x1")
    ddf = dask_cosim.from_pandas(pdf, npartitions=7)
    ddf["cos"] = ddf.cosim.pairwise("embeds_a", "embeds_b")
    with get_task_stream(client) as stream:
        result = ddf["cos"].compute()
    np.testing.assert_allclose(result.to_numpy(), reference(a, b), atol=1e-6)
    assert result.index.tolist() == list(range(3000))
    # The partition function really ran in the worker processes.
    # Older dask fuses the task into "cosim-assign-getitem-...": our prefix stays.
    ran = [t for t in stream.data if "cosim-" in str(t["key"])]
    assert len(ran) == 7 and {t["worker"] for t in ran} <= set(workers)
    # Parquet in, Parquet out, through the workers.
    ddf[["id", "embeds_a", "embeds_b"]].to_parquet(f"{tmp_path}/in")
    back = dask_cosim.read_parquet(f"{tmp_path}/in")
    back["cos"] = back.cosim.pairwise("embeds_a", "embeds_b")
    back[["id", "cos"]].to_parquet(f"{tmp_path}/out")
    out = pd.read_parquet(f"{tmp_path}/out").sort_values("id")
    np.testing.assert_allclose(out["cos"].to_numpy(), reference(a, b), atol=1e-6)


def test_pairwise_of_a_persisted_frame_adds_one_task_per_partition(client: Client) -> None:
    """distributed runs each expression of a graph as a task of its own (it fuses none):
    the column projection that narrows a Parquet read would, on a frame in worker
    memory, be a second task per partition that narrows nothing.  pairwise then maps the
    frame itself, as a plain map_partitions does."""
    a, b = random_pairs(600, 16)
    ddf = dd.from_pandas(pairs_frame(a, b, "fixed_size_list"), npartitions=3).persist()
    wait(ddf)

    def tasks(series: dd.Series) -> tuple[int, np.ndarray]:
        with get_task_stream(client) as stream:
            values = series.compute().to_numpy()
        return len(stream.data), values

    plain, _ = tasks(ddf.map_partitions(lambda p: p["id"].astype("f4"), meta=("id", "f4")))
    ours, cos = tasks(ddf.cosim.pairwise("embeds_a", "embeds_b"))
    assert ours == plain
    np.testing.assert_allclose(cos, reference(a, b), atol=1e-6)


def test_errors_travel_back_from_workers(client: Client) -> None:
    import pyarrow as pa

    t = pa.list_(pa.float32())
    rows = [[1.0, 2.0]] * 8 + [[1.0]] + [[1.0, 2.0]]
    pdf = pd.DataFrame({"a": pd.array(pa.array(rows, t), dtype=pd.ArrowDtype(t))})
    cos = dask_cosim.from_pandas(pdf, npartitions=3).cosim.pairwise("a", "a")
    with pytest.raises(ValueError, match="column 'a': row 8 has 1 values but row 7 has 2"):
        cos.compute()


def test_shuffles_of_vector_columns_under_a_client_take_the_task_shuffle(client: Client) -> None:
    """docs/troubleshooting.md: dask's p2p shuffle (the default under a client) fails on
    frames with Arrow list columns, whose dtypes it rebuilds from their names, which
    pandas cannot parse (pandas-dev/pandas#57411); the task shuffle carries them whole.
    When the first check fails, pandas parses them: drop that entry of the docs."""
    a, b = random_pairs(200, 8)
    pdf = pairs_frame(a, b, "fixed_size_list").assign(g=np.arange(200) % 3)
    ddf = dask_cosim.from_pandas(pdf, npartitions=2)
    with pytest.raises(RuntimeError, match="P2P"):
        ddf.shuffle("g").compute()
    other = dd.from_pandas(pd.DataFrame({"id": pdf["id"], "x": np.arange(200.0)}), 3)
    with dask.config.set({"dataframe.shuffle.method": "tasks"}):
        for frame in (ddf.shuffle("g"), ddf.merge(other, on="id"), ddf.set_index("id")):
            cos = frame.assign(cos=frame.cosim.pairwise("embeds_a", "embeds_b")).compute()
            by_id = cos.reset_index().set_index("id").sort_index()["cos"].to_numpy()
            np.testing.assert_allclose(by_id, reference(a, b), atol=1e-6)


def _listening(pids: list[int]) -> set[tuple[str, int]]:
    """(ip, port) of every TCP socket the processes listen on."""
    found = set()
    for pid in pids:
        for conn in psutil.Process(pid).net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN:
                found.add((conn.laddr.ip, conn.laddr.port))
    return found


# The local_cluster tests run on distributed's test loop (the `loop` fixture): no IO-loop
# thread of their own, which distributed gives 10 s to start and a busy 2-core CI machine
# once did not; and the fixture's teardown fails a test that leaks threads.
def test_local_cluster_cpu_listens_on_localhost_only(loop: object) -> None:
    before = _listening([os.getpid()])
    with dask_cosim.local_cluster(2, gpus=False, dashboard_address=":0", loop=loop) as c:
        info = c.scheduler_info()
        assert len(info["workers"]) == 2
        assert all(v["nthreads"] == 1 for v in info["workers"].values())
        assert c.dashboard_link.startswith("http://127.0.0.1:")
        # Scheduler, nannies and dashboard live in this process; workers in children.
        pids = [os.getpid(), *c.run(os.getpid).values()]
        sockets = _listening(pids) - before
        ports = {int(a.rsplit(":", 1)[1]) for a in [info["address"], *info["workers"]]}
        assert ports <= {port for _, port in sockets}
        assert {ip for ip, _ in sockets} == {"127.0.0.1"}, sockets
        # 2 workers x 1 thread on 2 cores: torch gets 1 thread per task.
        assert set(c.run(torch.get_num_threads).values()) == {1}
        a, b = random_pairs(500, 300)
        pdf = pairs_frame(a, b, "fixed_size_list")
        cos = dask_cosim.from_pandas(pdf, npartitions=4).cosim.pairwise("embeds_a", "embeds_b")
        np.testing.assert_allclose(cos.compute().to_numpy(), reference(a, b), atol=1e-6)
        # The scheduler's log is this process's: a p2p shuffle (the clustered search
        # does two) logged two WARNING lines as it started and ended as it should.
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append  # type: ignore[method-assign]
        plugin_log = logging.getLogger("distributed.shuffle._scheduler_plugin")
        plugin_log.addHandler(handler)
        try:
            frame = dd.from_pandas(pd.DataFrame({"x": range(100)}), npartitions=4)
            assert len(frame.shuffle("x", shuffle_method="p2p").compute()) == 100
        finally:
            plugin_log.removeHandler(handler)
        assert [r.getMessage() for r in records if r.levelno >= logging.WARNING] == []
        cluster = c.cluster
    # Leaving the client's block closed the cluster it started.
    assert cluster.status.name == "closed"


def test_torch_threads_fill_the_cores_dask_leaves_idle(loop: object) -> None:
    assert dask_cosim.cluster.torch_threads(2, 1, cores=2) == 1
    assert dask_cosim.cluster.torch_threads(1, 1, cores=8) == 8
    assert dask_cosim.cluster.torch_threads(2, 2, cores=8) == 2
    assert dask_cosim.cluster.torch_threads(4, 4, cores=8) == 1  # never 0
    with dask_cosim.local_cluster(1, gpus=False, dashboard_address=None, loop=loop) as c:
        expected = dask_cosim.cluster.torch_threads(1, 1)
        # In the task threads, not only the worker's main thread.
        threads = c.gather(c.map(lambda _: torch.get_num_threads(), range(3)))
        assert threads == [expected] * 3


def test_local_cluster_tls(loop: object) -> None:
    from distributed.security import Security

    with dask_cosim.local_cluster(
        1, gpus=False, dashboard_address=None, security=True, loop=loop
    ) as c:
        info = c.scheduler_info()
        assert info["address"].startswith("tls://127.0.0.1:")
        assert all(w.startswith("tls://127.0.0.1:") for w in info["workers"])
        a, b = random_pairs(200, 16)
        cos = dask_cosim.from_pandas(pairs_frame(a, b, "fixed_size_list"), npartitions=2)
        np.testing.assert_allclose(
            cos.cosim.pairwise("embeds_a", "embeds_b").compute().to_numpy(),
            reference(a, b),
            atol=1e-6,
        )
        # A client without the cluster's certificates is turned away.
        with pytest.raises((OSError, TimeoutError)):
            Client(info["address"], security=Security.temporary(), timeout="3s", loop=loop)
        with pytest.raises((OSError, TimeoutError, TypeError)):
            Client(info["address"].replace("tls://", "tcp://"), timeout="3s", loop=loop)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"n_workers": 0}, ValueError, "n_workers=0 must be a positive integer, e.g. n_workers=2"),
        ({"n_workers": 1.5}, ValueError, "n_workers=1.5 must be a positive integer"),
        ({"gpus": "yes"}, ValueError, "gpus='yes'; use 'auto', True or False, e.g. gpus=False"),
        ({"threads_per_worker": 0}, ValueError, "threads_per_worker=0 must be a positive integer"),
        (
            {"memory_limit": "lots"},
            ValueError,
            "memory_limit='lots' is not a size: give bytes, a string like \"4GiB\"",
        ),
        ({"memory_limit": -1}, ValueError, "memory_limit=-1 is not a size"),
        ({"memory_limit": 1.5}, ValueError, "memory_limit=1.5 is not a size"),  # 1 byte each
        (
            {"rmm_pool_size": "1GB", "gpus": False},
            ValueError,
            "rmm_pool_size='1GB' applies to GPU workers only",
        ),
        ({"rmm_pool_size": "big"}, ValueError, "rmm_pool_size='big' is not a size"),
        (
            {"dashboard_address": "0.0.0.0:8787"},
            ValueError,
            "dashboard_address='0.0.0.0:8787': use a port on 127.0.0.1",
        ),
        (
            {"host": "0.0.0.0"},
            ValueError,
            "host='0.0.0.0': local_cluster listens on 127.0.0.1 only.  To serve other machines, start `dask scheduler`",
        ),
        ({"security": "yes"}, TypeError, "security='yes'; use True for TLS"),
        (
            {"n_worker": 2},
            TypeError,
            "unexpected keyword argument 'n_worker'; did you mean 'n_workers'?",
        ),
        # Keywords local_cluster sets: nthreads was overridden, processes collided.
        (
            {"nthreads": 2},
            TypeError,
            "takes no 'nthreads': each worker's threads are threads_per_worker",
        ),
        ({"processes": False}, TypeError, "takes no 'processes': it starts worker processes;"),
        ({"threads": 2}, TypeError, "argument 'threads'; did you mean 'threads_per_worker'?"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_local_cluster_argument_errors(kwargs: dict, error: type, message: str) -> None:
    if "rmm_pool_size" in kwargs and "gpus" not in kwargs:
        kwargs = {**kwargs, "gpus": "auto"}
    before = len(psutil.Process().children(recursive=True))
    with pytest.raises(error, match=re.escape(message)):
        dask_cosim.local_cluster(**kwargs)
    # Checked before anything started.
    assert len(psutil.Process().children(recursive=True)) == before


def test_a_memory_limit_too_small_for_a_worker_is_named() -> None:
    """Below 1.5 GiB a worker is paused and restarted until the task fails (KilledWorker):
    a warning says so before the cluster starts (here an argument error then stops it)."""
    for limit in ("400MB", 300_000_000, "1GiB"):
        with pytest.warns(UserWarning, match=r"gives each worker \d+\.\d+ [MG]iB: a worker holds"):
            with pytest.raises(ValueError, match="host="):
                dask_cosim.local_cluster(memory_limit=limit, host="0.0.0.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="host="):
            dask_cosim.local_cluster(memory_limit="2GiB", host="0.0.0.0")
        with pytest.raises(ValueError, match="host="):
            dask_cosim.local_cluster(memory_limit="1.5GiB", host="0.0.0.0")


def test_gpus_true_without_a_gpu() -> None:
    if dask_cosim.cluster.gpu_count():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="gpus=True but no GPU is usable here"):
        dask_cosim.local_cluster(gpus=True)


def test_demo_command_runs_end_to_end(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dask_cosim", "demo", "--rows", "3000", "--dim", "16",
         "--workers", "2", "--output", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "rows        3,000" in proc.stdout and "histogram" in proc.stdout
    mean = float(proc.stdout.split("mean")[1].split()[0])
    assert -0.1 < mean < 0.1  # similarities are spread symmetrically over [-1, 1]
    # The generated pairs are gone; the result and the histogram stay.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["histogram.png", "result"]
    result = dask_cosim.read_parquet(tmp_path / "result").compute()
    assert list(result.columns) == ["id", "cos"] and len(result) == 3000
    assert (tmp_path / "histogram.png").stat().st_size > 0


_UNGUARDED = """\
import dask_cosim

client = dask_cosim.local_cluster(1, gpus=False, dashboard_address=None)
print("started")
"""
_UNGUARDED_MAIN = """\
import dask_cosim


def main():
    with dask_cosim.local_cluster(1, gpus=False, dashboard_address=None) as client:
        print("workers", len(client.scheduler_info()["workers"]))


main()
"""
_GUARDED = """\
import dask_cosim


def main():
    with dask_cosim.local_cluster(1, gpus=False, dashboard_address=None) as client:
        print("workers", len(client.scheduler_info()["workers"]))


if "__main__" == __name__:
    main()
"""


_UNCLOSED = """\
import atexit

import numpy as np
import pandas as pd
from distributed import Client

import dask_cosim

if __name__ == "__main__":
    pdf = pd.DataFrame({"a": [np.ones(3)] * 4, "b": [np.ones(3)] * 4})
    # The user's own client (in-process workers), left open, and an exit hook of the
    # user's that it serves, registered before dask_cosim's (so it runs after it).
    own = Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None)
    atexit.register(lambda: print("at exit", own.status))
    mine = dask_cosim.from_pandas(pdf)  # scattered to own's worker, held to the end
    print(mine.cosim.pairwise("a", "b").sum().compute())
    client = dask_cosim.local_cluster(1, gpus=False, dashboard_address=None)
    df = dask_cosim.from_pandas(pdf)  # scattered to the worker
    print(df.cosim.pairwise("a", "b").sum().compute())
"""


def _run_script(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(source)
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(dask_cosim.__file__).parents[1])},
    )


@pytest.mark.parametrize(("source", "line"), [(_UNGUARDED, 3), (_UNGUARDED_MAIN, 9)])
def test_script_without_main_guard_gets_one_sentence(
    tmp_path: Path, source: str, line: int
) -> None:
    """Without the guard, spawned workers re-run the script: say so before any starts."""
    proc = _run_script(tmp_path, source)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        f"RuntimeError: local_cluster() called at '{tmp_path / 'script.py'}', line {line}, "
        'outside `if __name__ == "__main__":`: every worker process starts by importing the '
        "script and would start a cluster of its own; move the code from this call on (or a "
        'call to a main() that holds it) under `if __name__ == "__main__":`'
    )
    assert "Nanny failed to start" not in proc.stderr and "started" not in proc.stdout
    assert len(proc.stderr.splitlines()) < 15  # our frames only: no worker ever started


def test_script_with_main_guard_starts_its_cluster(tmp_path: Path) -> None:
    proc = _run_script(tmp_path, _GUARDED)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "workers 1"


def test_script_that_never_closes_its_client_exits_quietly(tmp_path: Path) -> None:
    """docs/first-hour.md's script ends without client.close(): at exit the client goes
    before its cluster, so the scheduler does not log an ERROR about scattered data lost.
    So does a client of the user's own that holds what from_pandas scattered (it logged
    that ERROR; dd.from_pandas scatters nothing): that data is released, the client left
    open for the user's exit hooks."""
    proc = _run_script(tmp_path, _UNCLOSED)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["4.0", "4.0", "at", "exit", "running"]
    assert "ERROR" not in proc.stderr and "lose scattered data" not in proc.stderr, proc.stderr


def test_worker_process_rerunning_a_script_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback when the script's source cannot be read: a process that multiprocessing
    is still bootstrapping refuses to start a cluster of its own."""
    import multiprocessing

    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    before = len(psutil.Process().children(recursive=True))
    with pytest.raises(RuntimeError, match="ran while a worker process was starting"):
        dask_cosim.local_cluster(1, gpus=False)
    assert len(psutil.Process().children(recursive=True)) == before
