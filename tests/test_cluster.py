"""Real distributed clusters with worker processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from distributed import Client, get_task_stream
from distributed.utils_test import cleanup, client, cluster_fixture, loop, loop_in_thread  # noqa: F401

import dask_cosim
from tests.conftest import pairs_frame, random_pairs, reference


def test_pairwise_on_worker_processes(client: Client, tmp_path: object) -> None:  # noqa: F811
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
    ran = [t for t in stream.data if "cosim-pairwise" in str(t["key"])]
    assert len(ran) == 7 and {t["worker"] for t in ran} <= set(workers)
    # Parquet in, Parquet out, through the workers.
    ddf[["id", "embeds_a", "embeds_b"]].to_parquet(f"{tmp_path}/in")
    back = dask_cosim.read_parquet(f"{tmp_path}/in")
    back["cos"] = back.cosim.pairwise("embeds_a", "embeds_b")
    back[["id", "cos"]].to_parquet(f"{tmp_path}/out")
    out = pd.read_parquet(f"{tmp_path}/out").sort_values("id")
    np.testing.assert_allclose(out["cos"].to_numpy(), reference(a, b), atol=1e-6)


def test_errors_travel_back_from_workers(client: Client) -> None:  # noqa: F811
    import pyarrow as pa

    t = pa.list_(pa.float32())
    rows = [[1.0, 2.0]] * 8 + [[1.0]] + [[1.0, 2.0]]
    pdf = pd.DataFrame({"a": pd.array(pa.array(rows, t), dtype=pd.ArrowDtype(t))})
    cos = dask_cosim.from_pandas(pdf, npartitions=3).cosim.pairwise("a", "a")
    with pytest.raises(ValueError, match="column 'a': row 8 has 1 values but row 7 has 2"):
        cos.compute()


def test_local_cluster_cpu_binds_localhost() -> None:
    with dask_cosim.local_cluster(2, gpus=False, dashboard_address="127.0.0.1:0") as c:
        info = c.scheduler_info()
        assert len(info["workers"]) == 2
        assert info["address"].startswith("tcp://127.0.0.1:")
        assert all(w.startswith("tcp://127.0.0.1:") for w in info["workers"])
        assert all(v["nthreads"] == 1 for v in info["workers"].values())
        a, b = random_pairs(500, 300)
        pdf = pairs_frame(a, b, "fixed_size_list")
        cos = dask_cosim.from_pandas(pdf, npartitions=4).cosim.pairwise("embeds_a", "embeds_b")
        np.testing.assert_allclose(cos.compute().to_numpy(), reference(a, b), atol=1e-6)


def test_local_cluster_argument_errors() -> None:
    with pytest.raises(ValueError, match="n_workers=0 must be a positive integer"):
        dask_cosim.local_cluster(0)
    with pytest.raises(ValueError, match="gpus='yes'; use 'auto', True or False"):
        dask_cosim.local_cluster(gpus="yes")
    if dask_cosim.cluster.gpu_count() == 0:
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
