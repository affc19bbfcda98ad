"""Where the search runs and what it takes: on worker processes (the module's tests
share one cluster) with queries and eager frames scattered to the workers outside the
graph, the peak memory of one pair task bounded by its tiles, and on a GPU (the CUDA
kernels give the CPU's answer, cudf frames the pandas one)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import warnings

import dask
import numpy as np
import pandas as pd
import pytest
import torch
from distributed import Client

import dask_cosim
from tests.helpers import assert_pairs_equal, brute, expected_pairs, reference_dedup
from tests.helpers import search_frame as frame
from tests.helpers import search_vectors as vectors

# --------------------------------------------------------------------------- clusters, memory


@pytest.mark.slow
def test_search_on_worker_processes(shared_client: Client) -> None:
    assert len(set(shared_client.run(os.getpid).values())) == 2
    x = vectors(300, seed=7)
    pdf = frame(x)
    ddf = dask_cosim.from_pandas(pdf, npartitions=6)
    s = brute(x, x)
    np.fill_diagonal(s, -np.inf)
    got = ddf.cosim.neighbors("emb", k=4).compute().reset_index(drop=True)
    assert_pairs_equal(got, expected_pairs(s, 4, None, pdf.index, pdf.index))
    got = ddf.cosim.topk(x[:3], "emb", k=2, columns=["id"])
    assert got["id"].tolist()[::2] == [0, 1, 2]
    whole = ddf.compute()
    pd.testing.assert_frame_equal(
        ddf.cosim.dedup("emb", 0.9).compute(), whole[reference_dedup(x, 0.9)]
    )
    single = dask_cosim.from_pandas(pdf, npartitions=1)  # a one-partition right: broadcast
    got = ddf.cosim.join(single, "emb", threshold=0.5).compute().reset_index(drop=True)
    assert_pairs_equal(got, expected_pairs(brute(x, x), None, 0.5, pdf.index, pdf.index))


def test_queries_and_eager_frames_go_to_the_workers_outside_the_graph(
    shared_client: Client,
) -> None:
    """topk's queries and an eager right frame of join are scattered to the workers (to
    every one: each pair task needs them), not sent inside the graph ("Sending large
    graph"), and give the same results."""
    x = vectors(2000, 64, seed=3)
    pdf = frame(x)
    ddf = dask_cosim.from_pandas(pdf, npartitions=3)
    with dask.config.set({"distributed.admin.large-graph-warning-threshold": "100kB"}):
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="Sending large graph")
            got = ddf.cosim.topk(x, "emb", k=1)
            pairs = ddf.cosim.join(pdf, "emb", k=1).compute()
    pd.testing.assert_frame_equal(got, pdf.cosim.topk(x, "emb", k=1))
    want = pdf.cosim.join(pdf, "emb", k=1)
    pd.testing.assert_frame_equal(pairs.reset_index(drop=True), want.reset_index(drop=True))


def test_a_stale_prepared_column_is_told_to_the_client(shared_client: Client) -> None:
    """A search of a prepared frame whose column was assigned again warns in the client
    (StalePreparedWarning) when a worker process finds it: the warning had stayed in the
    worker's log, and the notebook's user never saw why the search normalised again."""
    x = vectors(400, 16, seed=5)
    prepared = dask_cosim.from_pandas(frame(x), npartitions=2).cosim.prepare("emb")
    swapped = prepared.assign(emb=dask_cosim.from_pandas(frame(x[::-1].copy()), 2)["emb"])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = swapped.cosim.neighbors("emb", k=1).compute()
        # The worker's event reaches the client beside the result, not before it.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
            issubclass(w.category, dask_cosim.errors.StalePreparedWarning) for w in seen
        ):
            time.sleep(0.05)
    stale = [w for w in seen if issubclass(w.category, dask_cosim.errors.StalePreparedWarning)]
    assert stale and "'emb' changed after prepare" in str(stale[0].message)
    assert len(got) == len(x)


def test_peak_memory_of_a_pair_task_is_bounded_by_the_tile() -> None:
    """1,000 x 100,000 scores would take 400 MB; the task stays within inputs + tiles."""
    code = textwrap.dedent(
        """
        import resource, torch, pandas as pd
        from dask_cosim import search_partition as search
        torch.manual_seed(0)
        def side(n):
            prep = search.sk.prepare(torch.randn(n, 16), eps=1e-8)
            return search.Side(prep, pd.RangeIndex(n), 0, "v", None)
        q, r = side(1000), side(100000)
        tiles = {"cpu": 8 << 20, "cuda": 8 << 20}
        search.join_pair_topk(q, r, 10, None, tiles)  # warm up the allocator and BLAS
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = search.join_pair_topk(q, r, 10, None, tiles)
        search.pair_threshold(q, r, 0.8, tiles)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert len(out) == 10000
        print(before, after, (after - before) * 1024)
        """
    )
    # Every allocation above 1 MiB gets its own mapping, returned when freed, so the peak
    # RSS follows the live tensors rather than what glibc's per-thread arenas keep cached.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    growth = int(out.stdout.split()[-1])
    assert growth < 100e6, out.stdout


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_kernels_on_cuda_give_the_cpu_answer() -> None:
    from dask_cosim import search_kernels as sk

    x = torch.from_numpy(vectors(500, seed=11))
    results = []
    for device in ("cpu", "cuda"):
        p = sk.prepare(x, eps=1e-8, device=device)
        res, _ = sk.topk(p, p, 5, tile_bytes=1 << 16, same=True)
        i, j, _ = sk.threshold_pairs(p, p, 0.5, tile_bytes=1 << 16, mode="upper")
        results.append((res.index.cpu(), res.score.cpu(), set(zip(i.tolist(), j.tolist()))))
    (ia, sa, pa_), (ib, sb, pb) = results
    assert torch.equal(ia, ib) and pa_ == pb
    torch.testing.assert_close(sa, sb, atol=1e-12, rtol=0)


@pytest.mark.gpu
def test_cudf_frames_give_the_pandas_answer() -> None:
    cudf = pytest.importorskip("cudf")
    dask_cudf = pytest.importorskip("dask_cudf")
    x = vectors(200, seed=12)
    pdf = frame(x, "list")[["emb", "id"]]
    gdf = cudf.from_pandas(pdf)
    ddf = dask_cudf.from_cudf(gdf, npartitions=3)
    want = pdf.cosim.neighbors("emb", k=3)
    got = ddf.cosim.neighbors("emb", k=3).compute()
    assert isinstance(got, cudf.DataFrame)  # cudf in, cudf out
    pd.testing.assert_frame_equal(got.to_pandas().reset_index(drop=True), want)
    kept = ddf.cosim.dedup("emb", 0.6).compute()
    assert kept["id"].to_pandas().tolist() == pdf.cosim.dedup("emb", 0.6)["id"].tolist()
    hits = gdf.cosim.topk(x[:2], "emb", k=2, columns=["id"])
    assert isinstance(hits, cudf.DataFrame) and hits["id"].to_pandas().tolist()[::2] == [0, 1]
