"""Dask on one GPU, where its overhead matters: persisted dask_cudf ``pairwise`` at 1M-50M
rows against the device floors at the same size, and two dask-cuda workers sharing the GPU.

    python -m benchmarks.dask_gpu --sizes 1000000,10000000,50000000 --dim 300 --repeat 3

``persisted``: one dask-cuda worker (``dask_cosim.local_cluster``), partitions of about
``cosim.read.gpu-partition-bytes`` (1 GiB) generated on the device (no host copy); at each
size, first the floors (a device-to-device copy and a streaming read of that many rows, in
the worker, timed with CUDA events), then the pairs persisted and
``df.cosim.pairwise(A, B).sum().compute()`` timed.  A size whose pairs do not fit in
``--fit`` of the device's memory (50M x 300 float32 is 120 GB) persists what fits and
reads the rest from our Parquet layout (a 1M-row folder, read as many times as needed,
from the page cache); its floors are those of the largest size measured, scaled to its
bytes.  Each sum is checked against a float64 sum computed on the device.

``workers``: one, then two ``dask cuda worker`` processes on the same GPU (dask-cuda takes
no repeated device in one process), each computing persisted pairs (``--workers-rows``)
and our Parquet layout read ``--workers-reads`` times end to end: the scaling from 1 to 2.

Expected on one H100: about 1.5 minutes for ``persisted`` (mostly the 50M row's reads and
the workers' start), 1 minute for ``workers``.  Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import dask
import dask.dataframe as dd
import torch

import dask_cosim
from benchmarks import harness
from benchmarks.harness import A, B

ROW_BYTES_PER_DIM = 2 * 4  # a pair of float32 values


def _device_pairs(seed: int, rows: int, dim: int) -> Any:
    """One partition generated on the device: ``rows`` pairs of float32 vectors, half of
    them correlated (cosines spread over (-1, 1)), as cudf list columns over cupy arrays."""
    import cudf
    import cupy
    import pylibcudf as plc

    rng = cupy.random.default_rng(seed)
    x = rng.standard_normal((rows, dim), dtype=cupy.float32)
    y = rng.standard_normal((rows, dim), dtype=cupy.float32)
    y[: rows // 2] += x[: rows // 2]
    df = cudf.DataFrame({"id": cupy.arange(rows, dtype=cupy.int64)})
    df[A] = cudf.Series.from_pylibcudf(plc.Column.from_array(x))
    df[B] = cudf.Series.from_pylibcudf(plc.Column.from_array(y))
    return df


def _reference_sum(seed: int, rows: int, dim: int) -> float:
    """The float64 sum of cos over one generated partition, on the device."""
    df = _device_pairs(seed, rows, dim)
    from dask_cosim import backends

    x = backends.to_vectors(df[A], A).blocks[0].double()
    y = backends.to_vectors(df[B], B).blocks[0].double()
    return float(harness.reference(x, y).sum())


def _floors(rows: int, dim: int, repeat: int) -> dict[str, float]:
    """Seconds of a device-to-device copy (clone) and of a streaming read (sum) of two
    (rows, dim) float32 tensors, median of ``repeat`` after a warm-up, CUDA events; run in
    the worker so that its allocator (the RMM pool) serves them."""
    x = torch.randn(rows, dim, device="cuda")
    y = torch.randn(rows, dim, device="cuda")

    def timed(fn: Callable[[], Any]) -> float:
        fn()
        times = []
        for _ in range(repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)

    copy = timed(lambda: (x.clone(), y.clone()))
    read = timed(lambda: (x.sum(), y.sum()))
    return {"rows": rows, "copy_s": copy, "read_s": read}


def _device_memory() -> int:
    return int(torch.cuda.mem_get_info()[1])


def _persisted(client: Any, rows: int, dim: int, part_rows: int, first_seed: int) -> Any:
    """``rows`` generated pairs in partitions of ``part_rows``, persisted on the workers;
    returns (frame, float64 reference sum)."""
    specs = [
        (first_seed + i, min(part_rows, rows - s)) for i, s in enumerate(range(0, rows, part_rows))
    ]
    meta = _device_pairs(0, 1, dim).iloc[:0]  # a list column of no rows, from a real one
    df = dd.from_map(lambda spec: _device_pairs(spec[0], spec[1], dim), specs, meta=meta,
                     enforce_metadata=False, label="generated-pairs")  # fmt: skip
    df = df.persist()
    from distributed import wait

    wait(df)
    ref = sum(client.gather(client.map(_reference_sum, *zip(*specs), dim=dim, pure=False)))
    return df, ref


def _timed_sum(df: Any, repeat: int) -> tuple[float, float]:
    """(median seconds, the last sum) of ``df.cosim.pairwise(A, B).sum().compute()``."""
    total = float(df.cosim.pairwise(A, B).sum().compute())
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        total = float(df.cosim.pairwise(A, B).sum().compute())
        times.append(time.perf_counter() - t0)
    return statistics.median(times), total


def _parquet_folder(dim: int, tmp: Path, log: harness.Log) -> tuple[Path, float]:
    """Our layout of 1M generated pairs (host) in 8 files, and their float64 sum of cos;
    written once per run."""
    folder = tmp / "ours"
    total = tmp / "ours-sum.txt"
    if not total.exists():
        a, b = harness.generate_pairs(1_000_000, dim, "float32")
        log(f"writing 1,000,000 pairs in our layout to {folder.name}/")
        harness.write_our_layout(a, b, folder, 8)
        total.write_text(repr(float(harness.reference(a, b).sum())))
    return folder, float(total.read_text())


def persisted_records(
    sizes: list[int], dim: int, repeat: int, fit: float, tmp: Path, log: harness.Log
) -> list[harness.Record]:
    """The ``persisted`` part: a record per size."""
    from dask_cosim import options

    part_rows = max(1, options.gpu_partition_bytes() // (ROW_BYTES_PER_DIM * dim))
    records: list[harness.Record] = []
    with dask.config.set({"dataframe.backend": "cudf"}):
        client = dask_cosim.local_cluster(gpus=True, n_workers=1, dashboard_address=None)
        try:
            memory = client.submit(_device_memory, pure=False).result()
            fits = int(fit * memory // (ROW_BYTES_PER_DIM * dim)) // part_rows * part_rows
            fits = max(fits, part_rows)
            round_trip = statistics.median(
                _seconds(lambda: client.submit(int, 0, pure=False).result()) for _ in range(5)
            )
            floors: dict[str, float] | None = None
            folder: tuple[Path, float] | None = None
            for n in sizes:
                on_device = min(n, fits)
                log(f"persisted: {n:,} rows ({on_device:,} on the device); floors first")
                # The copy floor holds its inputs and their copies: half of what fits.
                if n <= fits // 2 or floors is None:
                    floor_rows = min(n, fits // 2)
                    floors = client.submit(
                        _floors, floor_rows, dim, max(repeat, 5), pure=False
                    ).result()
                df, ref = _persisted(client, on_device, dim, part_rows, first_seed=n)
                from_files = n - on_device
                if from_files:
                    folder = folder or _parquet_folder(dim, tmp, log)
                    copies = -(-from_files // 1_000_000)
                    files = sorted(str(p) for p in folder[0].glob("*.parquet")) * copies
                    df = dd.concat([df, dask_cosim.read_parquet(files)[df.columns.tolist()]])
                    ref += copies * folder[1]
                    from_files = copies * 1_000_000
                seconds, total = _timed_sum(df, repeat)
                rows = on_device + from_files
                scale = rows / floors["rows"]
                records.append({
                    "part": "persisted", "rows": rows, "persisted_rows": on_device,
                    "parquet_rows": from_files, "partitions": df.npartitions,
                    "seconds": seconds, "pairs_per_s": rows / seconds,
                    "floor_rows": floors["rows"], "floor_copy_s": floors["copy_s"] * scale,
                    "floor_read_s": floors["read_s"] * scale, "round_trip_s": round_trip,
                    "x_copy": floors["copy_s"] * scale / seconds,
                    "x_read": floors["read_s"] * scale / seconds,
                    "error": abs(total - ref) / max(1.0, abs(ref)),
                })  # fmt: skip
                del df
                client.run(torch.cuda.empty_cache)
        finally:
            client.close()
    return records


def _seconds(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@contextlib.contextmanager
def _shared_gpu(workers: int, tmp: Path, pool: str) -> Iterator[Any]:
    """A scheduler and ``workers`` ``dask cuda worker`` processes on the first visible
    GPU, each with an RMM pool of ``pool``; yields a client."""
    from distributed import Client, LocalCluster

    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    with LocalCluster(n_workers=0, dashboard_address=None) as cluster, Client(cluster) as client:
        command = [sys.executable, "-m", "dask", "cuda", "worker", cluster.scheduler_address,
                   "--rmm-pool-size", pool, "--nthreads", "1", "--no-dashboard"]  # fmt: skip
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": first}
        procs = [
            subprocess.Popen([*command, "--local-directory", str(tmp / f"w{i}")], env=env)
            for i in range(workers)
        ]
        try:
            client.wait_for_workers(workers, timeout=180)
            yield client
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(60)


def worker_records(
    rows: int, reads: int, dim: int, repeat: int, tmp: Path, log: harness.Log
) -> list[harness.Record]:
    """The ``workers`` part: persisted pairs and our Parquet layout read ``reads`` times,
    on one and on two workers sharing the GPU."""
    from dask_cosim import options

    folder, folder_ref = _parquet_folder(dim, tmp, log)
    files = sorted(str(p) for p in folder.glob("*.parquet")) * reads
    part_rows = max(1, options.gpu_partition_bytes() // (ROW_BYTES_PER_DIM * dim))
    records: list[harness.Record] = []
    with dask.config.set({"dataframe.backend": "cudf"}):
        for workers in (1, 2):
            log(f"workers: {workers} dask cuda worker process(es) on one GPU")
            with _shared_gpu(workers, tmp, "30GiB") as client:
                df, ref = _persisted(client, rows, dim, part_rows, first_seed=7)
                seconds, total = _timed_sum(df, repeat)
                records.append({"part": "workers", "workers": workers, "case": "persisted",
                                "rows": rows, "seconds": seconds, "pairs_per_s": rows / seconds,
                                "error": abs(total - ref) / max(1.0, abs(ref))})  # fmt: skip
                del df
                read = dask_cosim.read_parquet(files)
                seconds, total = _timed_sum(read, repeat)
                ref = reads * folder_ref
                records.append({"part": "workers", "workers": workers, "case": "our Parquet -> sum",
                                "rows": reads * 1_000_000, "seconds": seconds,
                                "pairs_per_s": reads * 1_000_000 / seconds,
                                "error": abs(total - ref) / max(1.0, abs(ref))})  # fmt: skip
    for r in records:
        one = next(o for o in records if o["case"] == r["case"] and o["workers"] == 1)
        r["speedup"] = one["seconds"] / r["seconds"]
    return records


PERSISTED_TABLE = [
    harness.Column("rows", "rows", ",", 11),
    harness.Column("persisted", "persisted_rows", ","),
    harness.Column("from Parquet", "parquet_rows", ","),
    harness.Column("parts", "partitions", ","),
    harness.Column("s", "seconds", ".4f", 8),
    harness.Column("Mpairs/s", lambda r: r["pairs_per_s"] / 1e6, ".1f", 9),
    harness.Column("copy floor s", "floor_copy_s", ".4f"),
    harness.Column("x copy", "x_copy", ".2f", 7),
    harness.Column("x read", "x_read", ".2f", 7),
    harness.Column("round trip s", "round_trip_s", ".4f"),
    harness.Column("err", "error", ".0e", 6),
]
WORKERS_TABLE = [
    harness.Column("workers", "workers", "", 7),
    harness.Column("case", "case", align="<"),
    harness.Column("rows", "rows", ","),
    harness.Column("s", "seconds", ".4f", 8),
    harness.Column("Mpairs/s", lambda r: r["pairs_per_s"] / 1e6, ".1f", 9),
    harness.Column("x 1 worker", "speedup", ".2f"),
    harness.Column("err", "error", ".0e", 6),
]


def report(record: harness.Record) -> None:
    persisted = [r for r in record["records"] if r["part"] == "persisted"]
    workers = [r for r in record["records"] if r["part"] == "workers"]
    if persisted:
        title = "persisted dask_cudf pairwise + sum, one dask-cuda worker (x = floor / ours)"
        harness.print_table(PERSISTED_TABLE, persisted, title)
        ten = [r for r in persisted if r["rows"] == 10_000_000]
        if ten:
            met = "met" if ten[0]["x_copy"] >= 0.5 else "NOT met"
            print(f"target: 10M rows >= 0.5 x device copy floor: {ten[0]['x_copy']:.2f}, {met}")
    if workers:
        harness.print_table(WORKERS_TABLE, workers, "\none GPU shared by dask cuda workers")
    for f in record["failed"]:
        print(f"left out: {f['case']}: {f['error']}")


@click.command()
@click.option(
    "--sizes",
    default="1000000,10000000,50000000",
    show_default=True,
    help="Rows of the persisted part, comma-separated.",
)
@click.option("--dim", default=300, show_default=True, help="Vector length D.")
@click.option("--repeat", default=3, show_default=True, help="Timed computes per case.")
@click.option(
    "--fit",
    default=0.6,
    show_default=True,
    help="Share of the device's memory the persisted pairs may take.",
)
@click.option(
    "--parts",
    default="persisted,workers",
    show_default=True,
    help="Which parts to run, comma-separated.",
)
@click.option(
    "--workers-rows",
    default=10_000_000,
    show_default=True,
    help="Persisted rows of the workers part.",
)
@click.option(
    "--workers-reads",
    default=8,
    show_default=True,
    help="Times the 1M-row folder is read in the workers part.",
)
@harness.results_options()
def main(sizes: str, dim: int, repeat: int, fit: float, parts: str, workers_rows: int,
         workers_reads: int, output: harness.Output) -> None:  # fmt: skip
    """Persisted dask_cudf pairwise at several sizes, and 1 -> 2 workers on one GPU."""
    if not torch.cuda.is_available():
        print("no CUDA device: nothing run")
        return
    wanted = {p.strip() for p in parts.split(",") if p.strip()}
    unknown = wanted - {"persisted", "workers"}
    if unknown:
        raise click.BadParameter(f"unknown parts {sorted(unknown)}; use persisted, workers")
    rows = [int(s) for s in sizes.split(",") if s.strip()]

    def run(log: harness.Log) -> harness.Record:
        tmp = Path(tempfile.mkdtemp(prefix="cosim-dask-gpu-"))
        records: list[harness.Record] = []
        failed: list[dict[str, str]] = []
        try:
            for part, fn in (
                ("persisted", lambda: persisted_records(rows, dim, repeat, fit, tmp, log)),
                ("workers", lambda: worker_records(workers_rows, workers_reads, dim, repeat,
                                                   tmp, log)),
            ):  # fmt: skip
                if part not in wanted:
                    continue
                try:
                    records += fn()
                except Exception as exc:  # the other part still runs
                    log(f"{part} failed: {exc!r}")
                    import traceback

                    traceback.print_exc(file=sys.stderr)
                    failed.append({"case": part, "error": repr(exc)})
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        params = {"sizes": rows, "dim": dim, "repeat": repeat, "fit": fit, "parts": sorted(wanted),
                  "workers_rows": workers_rows, "workers_reads": workers_reads}  # fmt: skip
        return {"params": params, "records": records, "failed": failed}

    name = output.name or f"dask-gpu{os.cpu_count()}-{dim}"
    harness.execute_benchmark(harness.Config(output, name, run, report))


if __name__ == "__main__":
    main()
