"""CUDA paths.  Marked gpu: skipped without a GPU, run with `pytest -m gpu` on a GPU box.

The torch/cupy tests need only torch with CUDA (and cupy); the cudf ones also cudf /
dask_cudf / dask_cuda and skip cleanly where those are not installed.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import dask
import numpy as np
import pandas as pd
import pytest
import torch

import dask_cosim
from dask_cosim import kernels, options
from dask_cosim.partition import pairwise_partition, resolve_device
from tests.helpers import pairs_frame, random_pairs, reference

# The kernels take their options as arguments: the configured defaults (cosim.yaml).
EPS, CHUNK_BYTES = options.eps(), options.chunk_bytes()

pytestmark = pytest.mark.gpu


def test_kernel_on_cuda_matches_reference() -> None:
    a, b = random_pairs(5000, 300)
    res = kernels.pairwise_cosine(
        torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda(), eps=EPS, chunk_bytes=CHUNK_BYTES
    )
    assert res.device.type == "cuda" and res.dtype == torch.float32
    np.testing.assert_allclose(res.cpu().numpy(), reference(a, b), atol=1e-6)


def test_kernel_moves_host_chunks_to_the_device() -> None:
    a, b = random_pairs(3000, 64)
    res = kernels.pairwise_cosine(
        torch.from_numpy(a),
        torch.from_numpy(b),
        device="cuda",
        chunk_rows=700,
        eps=EPS,
        chunk_bytes=CHUNK_BYTES,
    )
    assert res.device.type == "cuda"
    np.testing.assert_allclose(res.cpu().numpy(), reference(a, b), atol=1e-6)


def test_fp16_on_cuda_no_overflow() -> None:
    a = torch.full((4, 4096), 60000.0, dtype=torch.float16, device="cuda")
    res = kernels.pairwise_cosine(a, -a, eps=EPS, chunk_bytes=CHUNK_BYTES)
    torch.testing.assert_close(res, -torch.ones(4, device="cuda"), atol=1e-6, rtol=0)


def test_cuda_chunk_budget_bounds_peak_memory() -> None:
    a, b = (torch.from_numpy(x).cuda() for x in random_pairs(200_000, 300))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    kernels.pairwise_cosine(a, b, chunk_bytes="16MiB", eps=EPS)
    peak = torch.cuda.max_memory_allocated() - base
    # Three N-sized float32 outputs plus one chunk of temporaries (and allocator rounding).
    assert peak <= 3 * 200_000 * 4 + 16 * 2**20 + 4 * 2**20


@pytest.mark.parametrize("device", ["auto", "cuda"])
@pytest.mark.parametrize("fmt", ["fixed_size_list", "object_torch_300x1"])
def test_pandas_partition_on_gpu_returns_host_series(fmt: str, device: str) -> None:
    a, b = random_pairs(257, 300)
    res = pairwise_partition(
        pairs_frame(a, b, fmt), "embeds_a", "embeds_b", eps=1e-8, device=device
    )
    assert isinstance(res, pd.Series)
    np.testing.assert_allclose(res.to_numpy(), reference(a, b), atol=1e-6)


def test_auto_places_host_rows_by_the_rule() -> None:
    """With a GPU present, host float32 rows stay on the host (the numba kernel outruns the
    bus) and host float16 rows (the torch kernel on the host) go to the GPU; search sends
    host data to the GPU; device data stay on their device."""
    cpu = torch.device("cpu")
    assert resolve_device("auto", cpu, nbytes=10**9, cpu_kernel="numba") == cpu
    assert resolve_device("auto", cpu, nbytes=10**9, cpu_kernel=None).type == "cuda"
    assert resolve_device("auto", cpu, work="products").type == "cuda"
    assert resolve_device("auto", torch.device("cuda:0")) == torch.device("cuda:0")


def _copies(run: Any) -> dict[str, int]:
    """Bytes copied by kind ("Memcpy HtoD (Pinned -> Device)", ...) while ``run()`` runs, as
    the CUDA profiler sees them."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(trace)
        with open(trace) as f:
            events = json.load(f)["traceEvents"]
    kinds: dict[str, int] = {}
    for e in events:
        if e.get("cat") == "gpu_memcpy":
            kinds[e["name"]] = kinds.get(e["name"], 0) + int(e.get("args", {}).get("bytes", 0))
    return kinds


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_host_rows_reach_the_gpu_through_pinned_staging(dtype: type) -> None:
    """device="cuda" on a pandas partition of several Arrow chunks: the vectors cross the
    bus from pinned buffers, in chunks that span the chunks' boundaries, and the answer
    is the reference's."""
    a, b = random_pairs(20_000, 300)
    a, b = a.astype(dtype), b.astype(dtype)
    pdf = pairs_frame(a, b, "fixed_size_list")
    chunked = pd.concat([pdf.iloc[:7000], pdf.iloc[7000:13001], pdf.iloc[13001:]])

    def run() -> Any:
        with dask.config.set({"cosim.chunk-bytes.cuda": "4MiB"}):  # 0.5 MiB buffers: many chunks
            return pairwise_partition(chunked, "embeds_a", "embeds_b", device="cuda")

    res = run()
    np.testing.assert_allclose(res.to_numpy(), reference(a, b), atol=1e-5)
    copies = _copies(run)
    to_device = {k: v for k, v in copies.items() if "HtoD" in k}
    pinned = sum(v for k, v in to_device.items() if "Pinned" in k)
    assert pinned >= a.nbytes + b.nbytes, copies
    assert sum(to_device.values()) - pinned < 0.01 * (a.nbytes + b.nbytes), copies


@pytest.mark.parametrize("fused", [None, False])
def test_the_staged_loop_never_waits_for_the_device(fused: bool | None) -> None:
    """Host copies overlap transfers and kernels only if nothing in the loop waits for the
    device: torch's sync debug mode raises on every implicit synchronisation (a copy from
    pageable memory, a read of a device value) while the chunks are queued."""
    a, b = random_pairs(10_000, 300)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    target = torch.device("cuda", torch.cuda.current_device())
    kernels.pairwise_cosine(ta[:10], tb[:10], device=target, eps=EPS, chunk_bytes=CHUNK_BYTES)
    torch.cuda.set_sync_debug_mode("error")
    try:
        res, redo = kernels._staged([(ta, tb)], EPS, target, torch.float32, fused, 700, CHUNK_BYTES)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert not bool(redo.any())
    np.testing.assert_allclose(res.cpu().numpy(), reference(a, b), atol=1e-6)


def test_staged_chunks_are_the_host_rows() -> None:
    """The staging pipeline alone: landing buffers reused two chunks later (each chunk's
    work queued before the next but one is asked for), and rows copied into place; a block
    already on the device is sliced."""
    from dask_cosim import staging

    x = torch.randn(10_007, 33)
    y = torch.arange(10_007, dtype=torch.float64)
    blocks = [(x[:4000], y[:4000]), (x[4000:4001], y[4000:4001]), (x[4001:], y[4001:])]
    sums = torch.empty(len(x), dtype=torch.float64, device="cuda")
    ids = torch.empty(len(x), dtype=torch.float64, device="cuda")
    for start, (cx, cy) in staging.device_chunks(blocks, "cuda", 999):
        assert cx.device.type == "cuda" and len(cx) <= 999
        sums[start : start + len(cx)] = cx.double().sum(1)  # queued on the current stream
        ids[start : start + len(cx)] = cy
    torch.testing.assert_close(sums.cpu(), x.double().sum(1))
    torch.testing.assert_close(ids.cpu(), y)
    whole = staging.to_device([x[:5000], x[5000:]], "cuda", rows=777)
    assert torch.equal(whole.cpu(), x)
    on_device = [(x[:10].cuda(), y[:10])]
    [(start, (cx, cy))] = list(staging.device_chunks(on_device, "cuda", 100))
    assert cx.data_ptr() == on_device[0][0].data_ptr() and torch.equal(cy.cpu(), y[:10])


def test_search_sides_reach_the_gpu_through_pinned_staging() -> None:
    """A pandas partition prepared for search on a GPU worker: its vectors cross the bus
    from pinned buffers, and the side answers as on the CPU."""
    from dask_cosim import search_partition as sp

    a, _ = random_pairs(30_000, 128)
    pdf = pairs_frame(a, a, "fixed_size_list")
    side = sp.prepare_side(pdf, "embeds_a", 0, eps=1e-8, device="auto")
    assert side.prep.unit.device.type == "cuda"
    copies = _copies(lambda: sp.prepare_side(pdf, "embeds_a", 0, eps=1e-8, device="auto"))
    pinned = sum(v for k, v in copies.items() if "HtoD" in k and "Pinned" in k)
    assert pinned >= a.nbytes, copies
    on_cpu = sp.prepare_side(pdf, "embeds_a", 0, eps=1e-8, device="cpu")
    torch.testing.assert_close(side.prep.unit.cpu(), on_cpu.prep.unit)
    queries = on_cpu.prep.to(torch.device("cuda", torch.cuda.current_device()))
    assert torch.equal(queries.raw.cpu(), on_cpu.prep.raw)


def _cudf_frame(a: np.ndarray, b: np.ndarray, null_a: list[int] = ()) -> object:  # type: ignore[assignment]
    """float32 list columns, as embeddings come (Python floats would make float64 lists)."""
    cudf = pytest.importorskip("cudf")
    import pyarrow as pa

    rows_a = [None if i in null_a else r for i, r in enumerate(a)]
    lists = pa.list_(pa.float32())
    return cudf.DataFrame.from_arrow(
        pa.table({"embeds_a": pa.array(rows_a, lists), "embeds_b": pa.array(list(b), lists)})
    )


def test_cudf_partition_zero_copy_and_nulls() -> None:
    cudf = pytest.importorskip("cudf")
    a, b = random_pairs(100, 16)
    gdf = _cudf_frame(a, b, null_a=[3])
    res = pairwise_partition(gdf, "embeds_a", "embeds_b", eps=1e-8, device="auto")
    assert isinstance(res, cudf.Series)
    host = res.to_pandas()
    assert host.isna().tolist() == [i == 3 for i in range(100)]
    ref = reference(a, b)
    np.testing.assert_allclose(host.drop(3).to_numpy(), np.delete(ref, 3), atol=1e-6)
    # The eager accessor is registered on cudf frames too.
    assert isinstance(gdf.cosim.pairwise("embeds_a", "embeds_b"), cudf.Series)
    # A sliced partition (child values beyond the slice) gives the same rows.
    sliced = pairwise_partition(gdf.iloc[10:40], "embeds_a", "embeds_b", eps=1e-8)
    np.testing.assert_allclose(sliced.to_pandas().to_numpy(), ref[10:40], atol=1e-6)


def test_cudf_ragged_row_named() -> None:
    cudf = pytest.importorskip("cudf")
    gdf = cudf.DataFrame({"a": [[1.0, 2.0], [1.0], [3.0, 4.0]]}, index=[5, 6, 7])
    with pytest.raises(ValueError, match="column 'a': row 6 has 1 values but row 5 has 2"):
        pairwise_partition(gdf, "a", "a", eps=1e-8)


def test_dask_cudf_accessor_and_read_parquet(tmp_path: object) -> None:
    dask_cudf = pytest.importorskip("dask_cudf")
    import dask

    a, b = random_pairs(1000, 32)
    gdf = _cudf_frame(a, b)
    ddf = dask_cudf.from_cudf(gdf, npartitions=4)
    cos = ddf.cosim.pairwise("embeds_a", "embeds_b")
    assert type(cos._meta).__module__.startswith("cudf")
    np.testing.assert_allclose(cos.compute().to_pandas().to_numpy(), reference(a, b), atol=1e-6)
    ddf.to_parquet(str(tmp_path))
    with dask.config.set({"dataframe.backend": "cudf"}):
        back = dask_cosim.read_parquet(str(tmp_path))
    assert type(back._meta).__module__.startswith("cudf")
    res = back.cosim.pairwise("embeds_a", "embeds_b").compute().to_pandas().sort_index()
    np.testing.assert_allclose(res.to_numpy(), reference(a, b), atol=1e-6)


@pytest.mark.parametrize("layout", ["binary", "list"])
def test_dask_cudf_to_parquet_round_trip(tmp_path: object, layout: str) -> None:
    """cudf partitions written in each layout (via dask.dataframe.dispatch.to_pyarrow_table_dispatch), read back as cudf."""
    dask_cudf = pytest.importorskip("dask_cudf")
    import dask

    a, b = random_pairs(1000, 32)
    ddf = dask_cudf.from_cudf(_cudf_frame(a, b), npartitions=3)
    out = os.path.join(str(tmp_path), "pairs")
    manifest = dask_cosim.to_parquet(ddf, out, layout=layout)
    assert manifest["vectors"]["embeds_a"] == {"dim": 32, "dtype": "float32"}
    with dask.config.set({"dataframe.backend": "cudf"}):
        back = dask_cosim.read_parquet(out)
    assert type(back._meta).__module__.startswith("cudf")
    res = back.cosim.pairwise("embeds_a", "embeds_b").compute().to_pandas().sort_index()
    np.testing.assert_allclose(res.to_numpy(), reference(a, b), atol=1e-6)


def test_kernel_halves_chunks_on_a_full_gpu() -> None:
    """A real out-of-memory: the GPU is filled until 64 MiB are left, then a chunk budget
    of 8 GiB is asked for; the torch kernel halves its chunk until it fits (the fused
    kernel allocates only its outputs, so it is not the one tested)."""
    a, b = random_pairs(200_000, 300)
    ga, gb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    free, _ = torch.cuda.mem_get_info()
    filler = torch.empty(max(0, free - 64 * 2**20), dtype=torch.uint8, device="cuda")
    try:
        res = kernels.pairwise_cosine(ga, gb, chunk_bytes="8GiB", eps=EPS, fused=False)
    finally:
        del filler
        torch.cuda.empty_cache()
    np.testing.assert_allclose(res.cpu().numpy(), reference(a, b), atol=1e-6)


def test_local_cuda_cluster_one_worker_per_gpu() -> None:
    pytest.importorskip("dask_cuda")
    n = torch.cuda.device_count()
    with dask_cosim.local_cluster(dashboard_address="127.0.0.1:0") as client:
        assert len(client.scheduler_info()["workers"]) == n
        # Each worker sees its own GPU as cuda:0 (CUDA_VISIBLE_DEVICES rotated).
        visible = client.run(lambda: os.environ["CUDA_VISIBLE_DEVICES"].split(",")[0])
        assert len(set(visible.values())) == n
        # Host partitions kept on a GPU worker's CPU get the cores the workers share.
        from dask.system import CPU_COUNT

        threads = client.run(torch.get_num_threads)
        assert set(threads.values()) == {max(1, CPU_COUNT // n)}
        a, b = random_pairs(4000, 300)
        ddf = dask_cosim.from_pandas(pairs_frame(a, b, "fixed_size_list"), npartitions=2 * n)
        res = ddf.cosim.pairwise("embeds_a", "embeds_b").compute()
        np.testing.assert_allclose(res.to_numpy(), reference(a, b), atol=1e-6)


_CLIENT_PROCESS = """
import os, sys, torch
import dask_cosim
if __name__ == "__main__":
    with dask_cosim.local_cluster(dashboard_address=None) as client:
        workers = client.scheduler_info()["workers"]
        devices = client.run(lambda: os.environ["CUDA_VISIBLE_DEVICES"])
        pool = client.run(lambda: type(__import__("rmm").mr.get_current_device_resource()).__name__
                          if __import__("importlib").util.find_spec("rmm") else "no rmm")
        # The client process must not hold a CUDA context: workers come first.
        print(len(workers), sorted(devices.values()), set(pool.values()),
              torch.cuda.is_initialized())
"""


def _client_process(env: dict[str, str]) -> list[str]:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _CLIENT_PROCESS], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **env})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1].split(" ", 1)


def test_local_cluster_respects_cuda_visible_devices_and_leaves_the_client_without_context() -> (
    None
):
    pytest.importorskip("dask_cuda")
    n, rest = _client_process({})
    assert int(n) == torch.cuda.device_count() and rest.endswith("False")
    n, rest = _client_process({"CUDA_VISIBLE_DEVICES": "0"})
    assert n == "1" and rest.startswith("['0']") and rest.endswith("False")
    if "no rmm" not in rest:
        assert "PoolMemoryResource" in rest  # one pool, shared with torch


def test_clustered_on_cuda_equals_exact() -> None:
    """The clustered search on the GPU (k-means, the radii, the routing in torch on CUDA,
    the blocks by the GPU search): the provable mode finds exactly the pairs of the exact
    method, and n_probe=2 never reports a pair the exact method lacks."""
    from dask_cosim.datasets import make_embeddings
    from tests.helpers import to_dask

    pdf, _ = make_embeddings(3000, 64, directions=40, duplicates=0.1, seed=4)
    ddf = to_dask(pdf, 3)
    cols = ["left", "right"]
    with dask.config.set({"cosim.device": "cuda", "scheduler": "sync"}):
        want = ddf.cosim.neighbors("emb", threshold=0.9).compute()
        got = ddf.cosim.neighbors("emb", threshold=0.9, method="clustered", clusters=20)
        near = ddf.cosim.neighbors("emb", threshold=0.9, method="clustered", n_probe=2)
        got, near = got.compute(), near.compute()
    assert len(want) > 50
    pd.testing.assert_frame_equal(
        got.reset_index(drop=True)[cols], want.reset_index(drop=True)[cols]
    )
    np.testing.assert_allclose(got["score"], want["score"], atol=2e-6)
    assert set(zip(near["left"], near["right"], strict=True)) <= set(
        zip(want["left"], want["right"], strict=True)
    )


@pytest.mark.parametrize("make", ["from_cudf", "to_backend"])
def test_cudf_frames_in_memory_are_held_once_by_dedup_and_groups(make: str) -> None:
    """A dask_cudf frame whose graph holds its data (dask_cudf.from_cudf, or a pandas
    frame's to_backend("cudf")): dedup's and groups' graphs hold it once, and give the
    pandas frame's rows and groups; a clustered neighbors carrying a column too, persisted."""
    cudf = pytest.importorskip("cudf")
    dask_cudf = pytest.importorskip("dask_cudf")
    from dask_cosim.search_graph import holds_data
    from tests.helpers import graph_bytes, search_frame, search_vectors, to_dask

    pdf = search_frame(search_vectors(2000, 64, seed=5), "list")[["emb", "id"]]
    ddf = to_dask(pdf, 4)
    gdf = (
        dask_cudf.from_cudf(cudf.from_pandas(pdf), 4)
        if make == "from_cudf"
        else ddf.to_backend("cudf")
    )
    assert holds_data(gdf)
    searches = {
        "dedup": lambda df: df.cosim.dedup("emb", 0.9),
        "groups": lambda df: df.cosim.groups("emb", 0.9),
        "clustered": lambda df: df.cosim.neighbors(
            "emb", threshold=0.9, method="clustered", clusters=8, columns="id"
        ).persist(),
    }
    for name, search in searches.items():
        got = search(gdf)
        if name != "clustered":
            assert graph_bytes(got) < 1.2 * graph_bytes(gdf), name
        got = got.compute()
        assert isinstance(got, cudf.DataFrame), name
        got, want = got.to_pandas().drop(columns="emb"), search(ddf).compute().drop(columns="emb")
        if name == "clustered":  # the same pairs (the provable mode's), in either order
            got, want = (
                p.sort_values(["left", "right"]).reset_index(drop=True) for p in (got, want)
            )
        pd.testing.assert_frame_equal(got, want, obj=name)


def test_cudf_queries_and_right_frames_are_scattered(client: Any) -> None:
    """Under a distributed client topk's queries and join's eager right frame are scattered
    to the workers, a cudf right frame too: no large graph, the pandas frames' answers."""
    cudf = pytest.importorskip("cudf")
    dask_cudf = pytest.importorskip("dask_cudf")
    import warnings

    from tests.helpers import search_frame, search_vectors, to_dask

    x = search_vectors(2000, 64, seed=6)
    pdf = search_frame(x, "list")[["emb", "id"]]
    gdf = cudf.from_pandas(pdf)
    on_workers = dask_cudf.from_cudf(gdf, 3).persist()  # (its own graph holds the frame)
    with dask.config.set({"distributed.admin.large-graph-warning-threshold": "100kB"}):
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="Sending large graph")
            hits = on_workers.cosim.topk(x, "emb", k=2, columns=["id"])
            pairs = on_workers.cosim.join(gdf, "emb", k=2).compute()
    assert isinstance(pairs, cudf.DataFrame)
    ddf = to_dask(pdf, 3)
    want_hits = ddf.cosim.topk(x, "emb", k=2, columns=["id"])
    hits = hits.to_pandas() if hasattr(hits, "to_pandas") else hits
    pd.testing.assert_frame_equal(hits, want_hits)
    want = ddf.cosim.join(pdf, "emb", k=2).compute()
    pd.testing.assert_frame_equal(
        pairs.to_pandas().reset_index(drop=True), want.reset_index(drop=True)
    )
