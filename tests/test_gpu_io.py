"""GPU reading and writing (cudf's Parquet reader and writer), two workers sharing one GPU,
and no host round trips on the cudf path.  Marked gpu: skipped without a GPU; the cudf
tests also skip where cudf is not installed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dask_cosim
from tests.helpers import device_to_host_bytes, pairs_frame, random_pairs, reference

pytestmark = pytest.mark.gpu

LAYOUTS = ["binary", "list"]


def _pairs(n: int = 2000, d: int = 48, null_at: tuple[int, ...] = (5, 777)) -> pd.DataFrame:
    a, b = random_pairs(n, d, seed=3)
    null = np.zeros(n, bool)
    null[list(null_at)] = True
    # A sorted, non-range index, so divisions and the index column both travel.
    return pairs_frame(a, b, "fixed_size_list", index=pd.Index(np.arange(n) * 3 + 7), null_a=null)


def _read(path: Path, backend: str, **kwargs: Any) -> Any:
    with dask.config.set({"dataframe.backend": backend}):
        return dask_cosim.read_parquet(str(path), **kwargs)


def _host_vectors(column: Any) -> list[Any]:
    """A pandas or cudf list column as Python lists of floats (None for null rows)."""
    if hasattr(column, "to_arrow"):
        return column.to_arrow().to_pylist()
    return [None if v is None else list(v) for v in column.array.__arrow_array__().to_pylist()]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("per_file", [True, False])
def test_gpu_reader_gives_the_pandas_answer(tmp_path: Path, layout: str, per_file: bool) -> None:
    """Files written through pyarrow, read by cudf's reader on the GPU and by pyarrow: the
    same index, columns, vectors (null rows too) and similarities; with a partition per
    file, or the small files read together (cosim.read.gpu-partition-bytes)."""
    cudf = pytest.importorskip("cudf")
    pdf = _pairs()
    dask_cosim.to_parquet(dask_cosim.from_pandas(pdf, npartitions=3), tmp_path / "d", layout=layout)
    largest = max(f.stat().st_size for f in (tmp_path / "d").glob("*.parquet"))
    on_cpu = _read(tmp_path / "d", "pandas")
    with dask.config.set({"cosim.read.gpu-partition-bytes": largest if per_file else "1GiB"}):
        on_gpu = _read(tmp_path / "d", "cudf")
    assert isinstance(on_gpu._meta, cudf.DataFrame)
    if per_file:
        assert on_gpu.divisions == on_cpu.divisions
    else:
        assert on_gpu.divisions == (on_cpu.divisions[0], on_cpu.divisions[-1])
    got = on_gpu.compute()
    want = on_cpu.compute()
    assert isinstance(got, cudf.DataFrame)
    assert list(got.columns) == list(want.columns)
    np.testing.assert_array_equal(got.index.to_numpy(), want.index.to_numpy())
    np.testing.assert_array_equal(got["id"].to_numpy(), want["id"].to_numpy())
    for column in ("embeds_a", "embeds_b"):
        got_rows, want_rows = _host_vectors(got[column]), _host_vectors(want[column])
        assert [r is None for r in got_rows] == [r is None for r in want_rows]
        np.testing.assert_array_equal(
            np.array([r for r in got_rows if r is not None], dtype=np.float32),
            np.array([r for r in want_rows if r is not None], dtype=np.float32),
        )
    cos_gpu = on_gpu.cosim.pairwise("embeds_a", "embeds_b").compute().to_pandas()
    cos_cpu = on_cpu.cosim.pairwise("embeds_a", "embeds_b").compute()
    pd.testing.assert_series_equal(cos_gpu, cos_cpu, check_exact=False, atol=1e-6, rtol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_reader_projection_row_groups_and_filters(tmp_path: Path, layout: str) -> None:
    pytest.importorskip("cudf")
    pdf = _pairs(3000, 16, null_at=())
    dask_cosim.to_parquet(
        dask_cosim.from_pandas(pdf, npartitions=1), tmp_path / "d", layout=layout,
        row_group_rows=500,
    )  # fmt: skip
    got = _read(tmp_path / "d", "cudf", columns=["embeds_b"]).compute()
    assert list(got.columns) == ["embeds_b"]
    np.testing.assert_array_equal(got.index.to_numpy(), pdf.index.to_numpy())
    filtered = _read(tmp_path / "d", "cudf", filters=[("id", "<", 1000)]).compute()
    want = _read(tmp_path / "d", "pandas", filters=[("id", "<", 1000)]).compute()
    np.testing.assert_array_equal(
        np.sort(filtered["id"].to_numpy()), np.sort(want["id"].to_numpy())
    )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_writer_writes_the_files_pyarrow_writes(tmp_path: Path, layout: str) -> None:
    """cudf partitions written by cudf's GPU writer: the same Arrow schema (vector field
    types and metadata, pandas metadata) as the same frame written through pyarrow, and
    both read back identically by pyarrow and by cudf."""
    cudf = pytest.importorskip("cudf")
    pdf = _pairs()
    cpu_dir, gpu_dir = tmp_path / "cpu", tmp_path / "gpu"
    dask_cosim.to_parquet(dask_cosim.from_pandas(pdf, npartitions=2), cpu_dir, layout=layout)
    largest = max(f.stat().st_size for f in cpu_dir.glob("*.parquet"))
    with dask.config.set({"cosim.read.gpu-partition-bytes": largest}):  # a partition per file
        ddf = _read(cpu_dir, "cudf")
    assert ddf.npartitions == 2
    assert isinstance(ddf._meta, cudf.DataFrame)
    manifest = dask_cosim.to_parquet(ddf, gpu_dir, layout=layout)
    assert manifest["vectors"]["embeds_a"] == {"dim": 48, "dtype": "float32"}
    cpu_manifest = json.loads((cpu_dir / "_dask_cosim.json").read_text())
    assert manifest["divisions"] == cpu_manifest["divisions"]
    assert manifest["rows"] == len(pdf)
    for number in ("00000", "00001"):
        cpu_schema = pq.read_schema(next(cpu_dir.glob(f"part.{number}.*.parquet")))
        gpu_file = next(gpu_dir.glob(f"part.{number}.*.parquet"))
        gpu_schema = pq.read_schema(gpu_file)
        for column in ("embeds_a", "embeds_b"):
            assert gpu_schema.field(column).type == cpu_schema.field(column).type
            assert gpu_schema.field(column).metadata == cpu_schema.field(column).metadata
        assert (
            gpu_schema.pandas_metadata["index_columns"]
            == (cpu_schema.pandas_metadata["index_columns"])
        )
        # Vectors stored uncompressed and plain, as pyarrow's writer stores them.
        column_chunk = pq.ParquetFile(gpu_file).metadata.row_group(0).column(1)
        assert column_chunk.compression == "UNCOMPRESSED"
    back = _read(gpu_dir, "pandas").compute()
    want = _read(cpu_dir, "pandas").compute()
    pd.testing.assert_frame_equal(back, want)
    back_gpu = _read(gpu_dir, "cudf").compute().to_pandas()
    np.testing.assert_array_equal(back_gpu["id"].to_numpy(), want["id"].to_numpy())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cudf_path_makes_no_host_round_trip(tmp_path: Path, layout: str) -> None:
    """Read (GPU decode), pairwise and a sum on the cudf path: what comes back to the host
    is a few scalars, not the vectors (a trip through the host would move >= 80 MB)."""
    pytest.importorskip("cudf")
    a, b = random_pairs(40_000, 256)
    pdf = pairs_frame(a, b, "fixed_size_list")
    dask_cosim.to_parquet(dask_cosim.from_pandas(pdf, npartitions=2), tmp_path / "d", layout=layout)
    df = _read(tmp_path / "d", "cudf")

    def run() -> float:
        return float(df.cosim.pairwise("embeds_a", "embeds_b").sum().compute(scheduler="sync"))

    assert run() == pytest.approx(float(reference(a, b).sum()), rel=1e-5)
    copies, nbytes = device_to_host_bytes(run, tmp_path)
    print(f"{layout}: {copies} device-to-host copies, {nbytes} bytes")
    assert nbytes < 0.01 * (a.nbytes + b.nbytes), (copies, nbytes)


def _device_pairs(a: np.ndarray, b: np.ndarray, npartitions: int) -> Any:
    """A dask_cudf frame whose list columns view (N, D) device arrays."""
    cudf = pytest.importorskip("cudf")
    dask_cudf = pytest.importorskip("dask_cudf")
    import cupy
    import pylibcudf as plc

    gdf = cudf.from_pandas(pd.DataFrame({"id": np.arange(len(a))}))
    gdf["embeds_a"] = cudf.Series.from_pylibcudf(plc.Column.from_array(cupy.asarray(a)))
    gdf["embeds_b"] = cudf.Series.from_pylibcudf(plc.Column.from_array(cupy.asarray(b)))
    return dask_cudf.from_cudf(gdf, npartitions=npartitions)


@pytest.mark.parametrize(("layout", "dim"), [("list", 256), ("binary", 48)])
def test_gpu_writer_moves_each_byte_to_the_host_once(tmp_path: Path, layout: str, dim: int) -> None:
    """Writing device frames with cudf's writer: what leaves the device is the file,
    once (no trip of the vectors through pyarrow on the host first)."""
    a, b = random_pairs(40_000, dim)
    ddf = _device_pairs(a, b, 2)

    def run() -> None:
        with dask.config.set(scheduler="sync"):
            dask_cosim.to_parquet(ddf, tmp_path / "out", layout=layout, overwrite=True)

    run()
    copies, nbytes = device_to_host_bytes(run, tmp_path)
    # The encoded file leaves the device once, on its way to the disk; nothing else does.
    written = sum(f.stat().st_size for f in (tmp_path / "out").glob("*.parquet"))
    print(f"writer: {copies} device-to-host copies, {nbytes} bytes; files {written} bytes")
    assert written > a.nbytes + b.nbytes  # the vectors are in the files, uncompressed
    assert nbytes < 1.02 * written + 2**20, (copies, nbytes, written)
    back = _read(tmp_path / "out", "pandas").compute()
    res = back.cosim.pairwise("embeds_a", "embeds_b").to_numpy()
    np.testing.assert_allclose(res, reference(a, b), atol=1e-6)


def test_wide_binary_vectors_are_written_through_pyarrow(tmp_path: Path) -> None:
    """libcudf keeps a FIXED_LEN_BYTE_ARRAY's width in 8 bits: 300 float32 (1,200 bytes)
    go through pyarrow, and the files read back whole, by pyarrow and by cudf."""
    from dask_cosim.io import cudf_parquet

    a, b = random_pairs(5_000, 300)
    assert 300 * 4 > cudf_parquet.MAX_BINARY_WIDTH
    dask_cosim.to_parquet(_device_pairs(a, b, 2), tmp_path / "out", layout="binary")
    schema = pq.read_schema(next((tmp_path / "out").glob("*.parquet")))
    assert schema.field("embeds_a").type.byte_width == 1200
    for backend in ("pandas", "cudf"):
        res = _read(tmp_path / "out", backend).cosim.pairwise("embeds_a", "embeds_b").compute()
        res = res.to_pandas() if hasattr(res, "to_pandas") else res
        np.testing.assert_allclose(res.sort_index().to_numpy(), reference(a, b), atol=1e-6)


def test_binary_bytes_become_lists_without_a_copy() -> None:
    """The converted list column's values are the very device bytes cudf decoded."""
    cudf = pytest.importorskip("cudf")
    import cupy
    import pylibcudf as plc

    from dask_cosim.io import cudf_parquet

    values = cupy.arange(12, dtype=cupy.float32)
    strings = plc.Column(
        plc.DataType(plc.TypeId.STRING), 3, plc.gpumemoryview(values.view(cupy.uint8)),
        None, 0, 0, [plc.Column.from_array(cupy.arange(4, dtype=cupy.int32) * 16)],
    )  # fmt: skip
    lists = cudf_parquet._bytes_to_lists(strings, "v", 4, "float32")
    series = cudf.Series.from_pylibcudf(lists)
    assert series.to_arrow().to_pylist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert series.list.leaves.values.data.ptr == values.data.ptr


def test_two_workers_share_one_gpu(tmp_path: Path) -> None:
    """Two dask-cuda workers on the one GPU, each computing its own partitions, every row
    exactly once.  One `dask cuda worker` process per slot: dask-cuda takes no repeated
    device (LocalCUDACluster refuses CUDA_VISIBLE_DEVICES=0,0, and under `dask cuda
    worker` CUDA rejects the repeated ordinal: "invalid device ordinal")."""
    pytest.importorskip("dask_cuda")
    dask_cudf = pytest.importorskip("dask_cudf")
    import subprocess
    import sys

    from distributed import Client, LocalCluster, get_task_stream

    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    a, b = random_pairs(30_000, 64)
    with (
        LocalCluster(n_workers=0, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        command = [sys.executable, "-m", "dask", "cuda", "worker", cluster.scheduler_address,
                   "--rmm-pool-size", "1GiB", "--nthreads", "1", "--no-dashboard"]  # fmt: skip
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": first}
        workers = [
            subprocess.Popen([*command, "--local-directory", str(tmp_path / f"w{i}")], env=env)
            for i in range(2)
        ]
        try:
            client.wait_for_workers(2, timeout=120)
            devices = client.run(lambda: os.environ["CUDA_VISIBLE_DEVICES"])
            assert list(devices.values()) == [first, first]
            pdf = pairs_frame(a, b, "fixed_size_list")
            ddf = dask_cudf.from_cudf(_cudf_frame_of(pdf), npartitions=12).persist()
            with get_task_stream(client) as ts:
                res = ddf.cosim.pairwise("embeds_a", "embeds_b").compute().to_pandas()
            assert len(res) == len(a) and res.index.is_unique
            np.testing.assert_allclose(res.sort_index().to_numpy(), reference(a, b), atol=1e-6)
            ran_on = {t["worker"] for t in ts.data}
            print(f"{len(ts.data)} tasks on {len(ran_on)} workers")
            assert len(ran_on) == 2
        finally:
            for worker in workers:
                worker.terminate()
            for worker in workers:
                worker.wait(60)


def _cudf_frame_of(pdf: pd.DataFrame) -> Any:
    from dask_cosim.backends import frame_from_arrow

    return frame_from_arrow(pa.Table.from_pandas(pdf, preserve_index=False), "cudf")


# Paths changed since the last GPU run (docs/gpu.md), each against the pandas backend's.


def _plain(values: Any) -> list[Any]:
    """A pandas or cudf column or index as Python values, None for nulls."""
    host = values.to_pandas() if hasattr(values, "to_pandas") else values
    return [None if pd.isna(v) else v for v in host.tolist()]


def _same_meta_as_data(df: Any) -> Any:
    """``df`` computed, once its meta is seen to name the data's columns, their dtypes and
    the index dtype (cudf partitions the meta does not describe fail here)."""
    got = df.compute()
    assert list(df._meta.columns) == list(got.columns)
    assert [str(t) for t in df._meta.dtypes] == [str(t) for t in got.dtypes]
    assert str(df._meta.index.dtype) == str(got.index.dtype)
    return got


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cudf_projections_and_filters_on_columns_not_read(tmp_path: Path, layout: str) -> None:
    """An empty projection (``df[[]]``: the index alone) gives partitions of no column, as
    the meta says; a filter may compare a column ``columns=`` or dask's projection leaves
    out; both as the pandas backend gives them."""
    pytest.importorskip("cudf")
    path = tmp_path / "d"
    dask_cosim.to_parquet(dask_cosim.from_pandas(_pairs(), npartitions=3), path, layout=layout)
    for kwargs in ({}, {"filters": [("id", "<", 1000)]}, {"columns": ["embeds_b", "id"]}):
        on_gpu, on_cpu = _read(path, "cudf", **kwargs), _read(path, "pandas", **kwargs)
        for project in (lambda df: df[[]], lambda df: df[[df.columns[0]]]):
            got, want = _same_meta_as_data(project(on_gpu)), project(on_cpu).compute()
            assert list(got.columns) == list(want.columns), kwargs
            np.testing.assert_array_equal(got.index.to_numpy(), want.index.to_numpy())
            assert all(_host_vectors(got[c]) == _host_vectors(want[c]) for c in want.columns)
        assert on_gpu[[]].map_partitions(len).compute().sum() == len(on_cpu), kwargs
    kwargs = {"columns": ["embeds_a"], "filters": [("id", ">=", 1500)]}
    got, want = _same_meta_as_data(_read(path, "cudf", **kwargs)), _read(path, "pandas", **kwargs)
    assert list(got.columns) == ["embeds_a"]
    np.testing.assert_array_equal(got.index.to_numpy(), want.compute().index.to_numpy())


def test_cudf_reads_a_hive_folder_through_dasks_reader(tmp_path: Path) -> None:
    """With the cudf backend a hive folder goes to dask's reader: the rows, vectors and key
    (a categorical) of the pandas backend's read, a filter on the key too.  Labels are not
    compared: dask's reader numbers each file from 0, ours number rows across the folder."""
    pytest.importorskip("cudf")
    pdf = _pairs(300, 8, null_at=()).reset_index(drop=True)
    pdf["lang"] = np.array(["fr", "en", "de"])[np.arange(300) % 3]
    table = pa.Table.from_pandas(pdf, preserve_index=False).replace_schema_metadata(None)
    pq.write_to_dataset(table, tmp_path / "hive", partition_cols=["lang"])
    for filters, rows in ((None, 300), ([("lang", "==", "en")], 100)):
        on_gpu = _read(tmp_path / "hive", "cudf", filters=filters)
        got = on_gpu.compute().to_pandas().sort_values("id")
        want = _read(tmp_path / "hive", "pandas", filters=filters).compute().sort_values("id")
        assert list(got.columns) == list(want.columns) and len(want) == rows
        assert got["id"].tolist() == want["id"].tolist()
        assert str(on_gpu._meta["lang"].dtype) == str(got["lang"].dtype) == "category"
        assert got["lang"].astype(str).tolist() == want["lang"].astype(str).tolist()
        assert _host_vectors(got["embeds_a"]) == _host_vectors(want["embeds_a"])


@pytest.mark.parametrize("kind", ["datetime", "timedelta", "date"])
def test_cudf_time_indexes_keep_their_divisions(tmp_path: Path, kind: str) -> None:
    """A timestamp or duration index written from cudf partitions (cudf's writer) is in the
    manifest as the pandas write puts it, and each folder reads back with the cudf backend
    with the pandas read's divisions and labels, the meta's index dtype the data's.  A date
    index (cudf has no date type: written from pandas) read with the cudf backend: the
    meta's index dtype is the data's, the labels the dates'."""
    cudf = pytest.importorskip("cudf")
    dask_cudf = pytest.importorskip("dask_cudf")
    pdf = _pairs(400, 8, null_at=())
    steps = pd.to_timedelta(np.arange(400) * 90, "s")
    days = (pd.Timestamp("2026-01-01") + steps * 960).date
    pdf.index = {
        "datetime": pd.DatetimeIndex(pd.Timestamp("2026-01-01") + steps, name="t"),
        "timedelta": pd.TimedeltaIndex(steps, name="t"),
        "date": pd.Index(pd.array(days, dtype="date32[pyarrow]"), name="t"),
    }[kind]
    folders = [tmp_path / "cpu"]
    dask_cosim.to_parquet(dask_cosim.from_pandas(pdf, npartitions=2), folders[0])
    assert (want := _read(folders[0], "pandas")).known_divisions
    if kind != "date":
        gdf = _cudf_frame_of(pdf)
        gdf.index = cudf.from_pandas(pdf.index)
        folders.append(tmp_path / "gpu")
        written = dask_cosim.to_parquet(dask_cudf.from_cudf(gdf, npartitions=2), folders[1])
        cpu_manifest = json.loads((folders[0] / "_dask_cosim.json").read_text())
        for key in ("divisions", "index_type", "encoded_divisions"):
            assert written.get(key) == cpu_manifest.get(key), key
        assert _read(folders[1], "pandas").divisions == want.divisions
    for folder in folders:
        df = _read(folder, "cudf")
        got = _same_meta_as_data(df).index.to_pandas()
        if kind == "date":
            assert pd.to_datetime(got).tolist() == [pd.Timestamp(d) for d in days]
        else:
            assert df.divisions == want.divisions and got.tolist() == pdf.index.tolist()


def test_cudf_reads_categoricals_as_its_meta_says(tmp_path: Path) -> None:
    """Categoricals of numbers are restored for pandas frames only (io.categories); the
    cudf backend gives them as cudf reads them (printed): the meta's dtypes are the data's,
    the values the pandas backend's."""
    pytest.importorskip("cudf")
    pdf = pd.DataFrame(
        {
            "x": np.arange(6.0),
            "c": pd.Categorical([10, 20, None, 30, 10, 20], categories=[40, 30, 20, 10]),
            "s": pd.Categorical(list("abcabc"), categories=list("zcba"), ordered=True),
        },
        index=pd.Index([3, 1, 2, 3, 1, 2], name="k"),
    )
    dask_cosim.to_parquet(dask_cosim.from_pandas(pdf, npartitions=2), tmp_path / "ours")
    pdf.to_parquet(tmp_path / "pandas.parquet")
    for path in (tmp_path / "ours", tmp_path / "pandas.parquet"):
        got, want = _same_meta_as_data(_read(path, "cudf")), _read(path, "pandas").compute()
        print(path.name, dict(got.dtypes.astype(str)))
        for column in ("x", "c", "s"):
            assert _plain(got[column]) == _plain(want[column]), (path.name, column)
        assert _plain(got.index) == _plain(want.index)


@pytest.mark.parametrize("stored", ["named", "unnamed", "none"])
def test_describe_parquet_gives_the_index_a_cudf_read_gives(tmp_path: Path, stored: str) -> None:
    """describe_parquet's ``index`` (one {"name", "dtype"} per level; None where the files
    store none and the read numbers the rows) is what a read with the cudf backend gives."""
    pytest.importorskip("cudf")
    from dask_cosim.io import describe_parquet

    pdf = _pairs(200, 8, null_at=())
    path = tmp_path / ("plain.parquet" if stored == "none" else "d")
    if stored == "none":
        pdf.to_parquet(path, index=False)
    else:
        pdf.index = pdf.index.rename("key" if stored == "named" else None)
        dask_cosim.to_parquet(dask_cosim.from_pandas(pdf, npartitions=2), path)
    described = describe_parquet(path)["index"]
    got = _same_meta_as_data(_read(path, "cudf")).index
    if stored == "none":
        assert described is None and got.to_pandas().tolist() == list(range(200))
    else:
        assert described == [{"name": got.name, "dtype": str(got.dtype)}]
        assert got.name == ("key" if stored == "named" else None)


def test_cudf_frames_written_together(tmp_path: Path) -> None:
    """to_parquet_together of cudf frames (cudf's writer), two folders in one computation:
    the manifests and the data of the same frames written from the pandas backend."""
    cudf = pytest.importorskip("cudf")
    from dask_cosim.io import to_parquet_together

    dask_cosim.to_parquet(dask_cosim.from_pandas(_pairs(), npartitions=2), tmp_path / "src")
    largest = max(f.stat().st_size for f in (tmp_path / "src").glob("*.parquet"))
    manifests = {}
    for backend in ("cudf", "pandas"):
        with dask.config.set({"cosim.read.gpu-partition-bytes": largest}):  # a file each
            df = _read(tmp_path / "src", backend)
        assert df.npartitions == 2 and isinstance(df._meta, cudf.DataFrame) == (backend == "cudf")
        out = tmp_path / backend
        manifests[backend] = to_parquet_together(
            [(df, out / "all", {"layout": "list"}), (df[["embeds_a", "id"]], out / "a", {})]
        )
    for gpu_manifest, cpu_manifest in zip(*manifests.values(), strict=True):
        for key in ("rows", "divisions", "vectors", "layout"):
            assert gpu_manifest[key] == cpu_manifest[key], key
    for folder in ("all", "a"):
        back = _read(tmp_path / "cudf" / folder, "pandas").compute()
        pd.testing.assert_frame_equal(back, _read(tmp_path / "pandas" / folder, "pandas").compute())
