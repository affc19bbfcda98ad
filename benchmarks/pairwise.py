"""One run, one table: our pipeline against this machine's floor and the tools people use.

    python -m benchmarks.pairwise --rows 1000000 --dim 300        # make bench

Generates N pairs of D-vectors once, writes them as list<float> Parquet (what pandas,
dask and Spark write) and in ``dask_cosim.to_parquet``'s layout, starts a LocalCluster
(worker processes, one per core), then times every case on the same data: a warm-up run,
then --repeat rounds in which each case runs once (so drift in the machine hits every
case alike), and reports the median.  Each result is checked against a float64 reference.

Ratios: "x floor" is floor time / case time (1.00 = as fast as merely reading the input;
in-memory cases against the streaming floor, Parquet cases against pyarrow reading the
same files); "ours is x faster" is case time / our comparable time (in-memory peers
against our kernel, file-based peers against our end-to-end run from our layout).

Writes ``benchmarks/results/<name>.json`` (with the machine and its load average) and
``<name>.png`` (bar chart); timing, checks, table, JSON and chart are ``benchmarks.harness``'s.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import click
import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

import dask_cosim
from benchmarks.harness import RESULTS, Row, plot, print_table, summarize, time_rows, write_results
from benchmarks.peers import Case, file_peers, in_memory_peers
from dask_cosim import io, kernels, options
from dask_cosim.datasets import pair_arrays

# The kernels take their options as arguments: the configured ones, as the accessor.
EPS, CHUNK_BYTES = options.eps(), options.chunk_bytes()

A, B = "embeds_a", "embeds_b"


def make_pairs(rows: int, dim: int, dtype: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The demo's pairs (similarities spread over [-1, 1]) in ``dtype``."""
    a, b = pair_arrays(rows, dim, seed)
    return a.astype(dtype, copy=False), b.astype(dtype, copy=False)


def reference(a: np.ndarray, b: np.ndarray, block: int = 1 << 16) -> np.ndarray:
    """float64 cos per row, in blocks so the float64 copies stay small."""
    out = np.empty(len(a))
    for s in range(0, len(a), block):
        x = a[s : s + block].astype(np.float64)
        y = b[s : s + block].astype(np.float64)
        nx = np.maximum(np.sqrt(np.einsum("ij,ij->i", x, x)), 1e-8)
        ny = np.maximum(np.sqrt(np.einsum("ij,ij->i", y, y)), 1e-8)
        out[s : s + block] = np.einsum("ij,ij->i", x, y) / (nx * ny)
    return np.clip(out, -1, 1)


def write_list_layout(a: np.ndarray, b: np.ndarray, folder: Path, files: int) -> None:
    """list<float>, snappy, one file per partition: what pandas/dask/Spark users hold."""
    folder.mkdir()
    per_file = math.ceil(len(a) / files)
    for i, start in enumerate(range(0, len(a), per_file)):
        stop = min(len(a), start + per_file)
        columns = {"id": pa.array(np.arange(start, stop))}
        for name, x in ((A, a), (B, b)):
            fixed = io.encode_vectors(x[start:stop], layout="list")
            columns[name] = fixed.cast(pa.list_(fixed.type.value_type))
        pq.write_table(pa.table(columns), folder / f"part.{i:05d}.parquet")


def write_our_layout(a: np.ndarray, b: np.ndarray, folder: Path, files: int) -> None:
    pdf = pd.DataFrame(
        {"id": np.arange(len(a)), A: io.vectors_to_arrow(a), B: io.vectors_to_arrow(b)}
    )
    with dask.config.set(scheduler="threads"):  # in-process: the data is already here
        dask_cosim.to_parquet(dd.from_pandas(pdf, npartitions=files), folder)


def _sum_cos(df: dd.DataFrame) -> float:
    return float(df.cosim.pairwise(A, B).sum().compute())


def our_rows(
    ta: torch.Tensor,
    tb: torch.Tensor,
    persisted: dd.DataFrame,
    list_dir: Path,
    ours_dir: Path,
    out_dir: Path,
) -> list[Row]:
    n = len(ta)

    def end_to_end_write() -> np.ndarray:
        df = dask_cosim.read_parquet(ours_dir)
        df["cos"] = df.cosim.pairwise(A, B)
        dask_cosim.to_parquet(df[["id", "cos"]], out_dir, overwrite=True)
        return pq.read_table(out_dir, columns=["cos"])["cos"].to_numpy()

    return [
        Row(
            Case(
                "ours: kernel",
                lambda: kernels.pairwise_cosine(ta, tb, eps=EPS, chunk_bytes=CHUNK_BYTES).numpy(),
                n,
                f"fused: {kernels.fused_kernel_for(ta, tb) or 'none, torch kernel'}",
            ),
            "ours",
            floor="floor: torch sum (all cores)",
        ),
        Row(
            Case(
                "ours: kernel, torch fallback",
                lambda: kernels.pairwise_cosine(
                    ta, tb, fused=False, eps=EPS, chunk_bytes=CHUNK_BYTES
                ).numpy(),
                n,
                "fused=False: the chunked torch kernel",
            ),
            "ours",
            floor="floor: torch sum (all cores)",
        ),
        Row(
            Case(
                "ours: dask, persisted",
                lambda: _sum_cos(persisted),
                n,
                "partitions in worker memory",
            ),
            "ours",
            floor="floor: torch sum (all cores)",
            expect="sum",
        ),
        Row(
            Case(
                "ours: list Parquet -> sum", lambda: _sum_cos(dask_cosim.read_parquet(list_dir)), n
            ),
            "ours",
            floor="floor: pyarrow read, list files",
            expect="sum",
        ),
        Row(
            Case(
                "ours: our Parquet -> sum", lambda: _sum_cos(dask_cosim.read_parquet(ours_dir)), n
            ),
            "ours",
            floor="floor: pyarrow read, our files",
            expect="sum",
        ),
        Row(
            Case("ours: our Parquet -> Parquet", end_to_end_write, n, "writes id, cos"),
            "ours",
            floor="floor: pyarrow read, our files",
        ),
    ]


def floor_rows(a: np.ndarray, b: np.ndarray, list_dir: Path, ours_dir: Path) -> list[Row]:
    n = len(a)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    return [
        Row(
            Case(
                "floor: numpy sum (1 core)",
                lambda: (a.sum(), b.sum()),
                n,
                "streams both arrays once",
            ),
            "floor",
            expect="none",
        ),
        Row(
            Case(
                "floor: torch sum (all cores)",
                lambda: (ta.sum(), tb.sum()),
                n,
                f"{torch.get_num_threads()} threads",
            ),
            "floor",
            expect="none",
        ),
        Row(
            Case(
                "floor: pyarrow read, list files",
                lambda: pq.read_table(list_dir, columns=[A, B], memory_map=True),
                n,
                "read_table, memory-mapped, all cores",
            ),
            "floor",
            expect="none",
        ),
        Row(
            Case(
                "floor: pyarrow read, our files",
                lambda: pq.read_table(ours_dir, columns=[A, B], memory_map=True),
                n,
                "read_table, memory-mapped, all cores",
            ),
            "floor",
            expect="none",
        ),
    ]


# The kernel on device tensors: (D, dtype) pairs, each of about the bytes of the run's pairs.
GPU_SWEEP = [(d, dt) for d in (128, 300, 768, 4096) for dt in ("float16", "float32")]
GPU_COPY = "floor: GPU copy (device to device)"


def _sync() -> None:
    """Every GPU case ends here: the harness reads the host clock, so queued work must end."""
    torch.cuda.synchronize()


def _gpu_reference(x: torch.Tensor, y: torch.Tensor, block: int = 1 << 18) -> np.ndarray:
    """float64 cos per row of device tensors, on the device, in blocks (float64 copies of a
    whole input would be 4x its float16 bytes); fine as a reference for random data."""
    out = torch.empty(len(x), dtype=torch.float64, device=x.device)
    for s in range(0, len(x), block):
        out[s : s + block] = torch.nn.functional.cosine_similarity(
            x[s : s + block].double(), y[s : s + block].double(), dim=1, eps=1e-8
        ).clamp_(-1, 1)
    return out.cpu().numpy()


def _copy_case(name: str, tensors: list[torch.Tensor], rows: int, note: str) -> Case:
    """Clone of device tensors: reads and writes their bytes once, the device's floor."""

    def copy() -> None:
        for t in tensors:
            t.clone()
        _sync()

    return Case(name, copy, rows, note)


def _kernel_case(name: str, x: torch.Tensor, y: torch.Tensor, fused: bool | None) -> Case:
    def kernel() -> torch.Tensor:
        res = kernels.pairwise_cosine(x, y, fused=fused, eps=EPS, chunk_bytes=CHUNK_BYTES)
        _sync()
        return res  # checked on the host by the harness, outside the timing

    note = (
        f"fused: {kernels.fused_kernel_for(x, y) or 'none, torch kernel'}"
        if fused is None
        else "fused=False: the chunked torch kernel"
    )
    return Case(name, kernel, len(x), note)


def gpu_tensor_rows(a: np.ndarray, b: np.ndarray, log: Any, keep: list[torch.Tensor]) -> list[Row]:
    """CUDA, in this process: the device copy floor and our kernel on the run's pairs; the
    kernel at each (D, dtype) of GPU_SWEEP on pairs of its own (generated on the device,
    about the run's bytes), fused and torch, each against a copy of its own bytes; host to
    device copies (pinned, pageable) and our kernel fed from host tensors (what pandas
    partitions on a GPU worker do, ``cosim.device: cuda``).  Device memory is held by
    ``keep`` until the caller clears it.  A sweep point that cannot be set up is logged
    and left out."""
    n = len(a)
    name = torch.cuda.get_device_name()
    ga, gb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    keep += [ga, gb]
    rows = [
        Row(_copy_case(GPU_COPY, [ga, gb], n, name), "floor", expect="none"),
        Row(_kernel_case("ours: kernel on GPU", ga, gb, None), "ours", floor=GPU_COPY),
        Row(
            _kernel_case("ours: kernel on GPU, torch fallback", ga, gb, False),
            "ours",
            floor=GPU_COPY,
        ),
    ]
    target_bytes = a.nbytes  # per input, as the run's pairs
    gen = torch.Generator(device="cuda").manual_seed(0)
    for dim, dtype in GPU_SWEEP:
        label = f"D={dim} {dtype}"
        try:
            tdtype = getattr(torch, dtype)
            count = max(1, target_bytes // (dim * tdtype.itemsize))
            # Half of each pair is the other half plus noise: cos spread over (-1, 1),
            # not all near 0 as for two independent draws.
            x = torch.randn((count, dim), generator=gen, device="cuda", dtype=tdtype)
            y = torch.randn((count, dim), generator=gen, device="cuda", dtype=tdtype)
            y[: count // 2] += x[: count // 2]
            keep += [x, y]
            ref_xy = _gpu_reference(x, y)
            nbytes_xy = 2 * x.nbytes
            floor = f"floor: GPU copy {label}"
            rows.append(
                Row(
                    _copy_case(floor, [x, y], count, f"{count:,} rows"),
                    "floor",
                    expect="none",
                    nbytes=nbytes_xy,
                )
            )
            for suffix, fused in (("", None), (", torch fallback", False)):
                rows.append(
                    Row(
                        _kernel_case(f"ours: GPU kernel {label}{suffix}", x, y, fused),
                        "ours",
                        floor=floor,
                        ref=ref_xy,
                        nbytes=nbytes_xy,
                    )
                )
        except Exception:
            log(f"GPU kernel at {label}: set-up failed, left out")
            traceback.print_exc(file=sys.stderr)
    rows += host_to_device_rows(a, b, keep)
    return rows


def host_to_device_rows(a: np.ndarray, b: np.ndarray, keep: list[torch.Tensor]) -> list[Row]:
    """Host to device copies of the run's pairs and our kernel on host tensors with
    device="cuda" (chunks move to the GPU one at a time, as for pandas partitions on a GPU
    worker); its floor is the pinned copy, the fastest the bus allows."""
    n = len(a)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    pinned = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t) for t in (ta, tb)]
    on_device = [torch.empty(t.shape, dtype=t.dtype, device="cuda") for t in (ta, tb)]
    keep += [*pinned, *on_device]

    def copy_pinned() -> None:
        for dst, src in zip(on_device, pinned):
            dst.copy_(src, non_blocking=True)
        _sync()

    def copy_pageable() -> None:
        for dst, src in zip(on_device, (ta, tb)):
            dst.copy_(src)
        _sync()

    def kernel_from_host() -> torch.Tensor:
        res = kernels.pairwise_cosine(ta, tb, device="cuda", eps=EPS, chunk_bytes=CHUNK_BYTES)
        _sync()
        return res

    pinned_floor = "floor: host to device copy (pinned)"
    return [
        Row(Case(pinned_floor, copy_pinned, n, "pin_memory, non_blocking"), "floor", expect="none"),
        Row(
            Case("floor: host to device copy (pageable)", copy_pageable, n, "for information"),
            "floor",
            expect="none",
        ),
        Row(
            Case(
                "ours: kernel, host tensors -> GPU",
                kernel_from_host,
                n,
                'device="cuda": chunks moved one at a time',
            ),
            "ours",
            floor=pinned_floor,
        ),
    ]


def cudf_rows(n: int, persisted: dd.DataFrame | None, list_dir: Path, ours_dir: Path) -> list[Row]:
    """CUDA with cudf, on a dask-cuda cluster (the default client; dataframe.backend must be
    "cudf" while these run): floors that read the files with ``cudf.read_parquet`` in this
    process, our pairs persisted as a dask_cudf frame, and end to end from both layouts
    through the GPU reader.  ``persisted`` None: that row is left out (its set-up failed)."""
    import cudf

    from dask_cosim.io.files import parquet_files

    rows = []
    for layout, folder in (("list", list_dir), ("our", ours_dir)):
        found = parquet_files(folder)
        assert found is not None
        files = found[1]  # the files our reader reads, in its order

        def read(files: list[str] = files) -> None:
            cudf.read_parquet(files, columns=[A, B])
            _sync()  # cudf's work runs on its own stream; synchronize waits on the device

        floor = f"floor: cudf read, {layout} files"
        rows.append(
            Row(Case(floor, read, n, "cudf.read_parquet, this process"), "floor", expect="none")
        )

        def end_to_end(folder: Path = folder) -> float:
            return _sum_cos(dask_cosim.read_parquet(folder))

        rows.append(
            Row(
                Case(
                    f"ours: {layout} Parquet -> sum (cudf)",
                    end_to_end,
                    n,
                    'dataframe.backend="cudf", one dask-cuda worker',
                ),
                "ours",
                floor=floor,
                expect="sum",
            )
        )
    rows.insert(
        0,
        Row(
            Case(
                "floor: dask round trip (no work)",
                lambda: dask.delayed(int)(0).compute(),
                n,
                "one task on the cluster: what any persisted compute costs at least",
            ),
            "floor",
            expect="none",
        ),
    )
    if persisted is not None:
        rows.insert(
            0,
            Row(
                Case(
                    "ours: dask_cudf, persisted",
                    lambda: _sum_cos(persisted),
                    n,
                    "partitions in GPU worker memory",
                ),
                "ours",
                floor=GPU_COPY,
                expect="sum",
            ),
        )
    return rows


def host_round_trips(ours_dir: Path) -> dict[str, Any]:
    """Copies between host and device in one end-to-end run from our layout through the
    GPU reader (read, pairwise, sum), counted by the CUDA profiler (CUPTI sees the copies
    of every library in the process, cudf's included).

    Runs in this process with dask's synchronous scheduler, so that the profiler sees the
    tasks (on a worker it would not); dataframe.backend must be "cudf".  Returns
    {"kind": {"count", "bytes"}} per memcpy kind ("Memcpy HtoD (Pageable -> Device)", ...;
    bytes from the trace's event arguments, None where the profiler gives none), the sum
    and where it ran.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        total = float(
            dask_cosim.read_parquet(ours_dir).cosim.pairwise(A, B).sum().compute(scheduler="sync")
        )
        _sync()
    kinds: dict[str, dict[str, Any]] = {}
    for event in prof.key_averages():
        # The copies themselves ("Memcpy HtoD (Pinned -> Device)", ...), not the kernels
        # or API calls whose names hold "memcpy".
        if event.key.startswith("Memcpy"):
            kinds[event.key] = {"count": int(event.count), "bytes": None}
    # Bytes are only in the trace's event arguments ("args": {"bytes": ...}).
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    for event in events:
        name = str(event.get("name", ""))
        if not name.startswith("Memcpy") or event.get("ph") != "X":
            continue
        size = (event.get("args") or {}).get("bytes")
        if size is None or event.get("cat") not in ("gpu_memcpy", "Memcpy"):
            continue
        entry = kinds.setdefault(name, {"count": 0, "bytes": None})
        entry["bytes"] = (entry["bytes"] or 0) + int(size)
    return {"where": "client process, scheduler='sync'", "sum": total, "kinds": kinds}


def run_gpu(
    a: np.ndarray,
    b: np.ndarray,
    list_dir: Path,
    ours_dir: Path,
    repeat: int,
    ref: np.ndarray,
    log: Any,
) -> tuple[list[Row], list[dict[str, str]], dict[str, Any] | None]:
    """The GPU rows, fail-soft: (timed rows, failures {"case", "error"}, host round trips).

    First this process's tensor cases (its device memory freed after), then the cudf cases
    on a dask-cuda cluster of one worker per GPU (``dask_cosim.local_cluster()``, closed
    after).  Whatever raises is logged with its traceback and left out of the table.
    """
    failed: list[dict[str, str]] = []

    def fail(what: str) -> None:
        exc = sys.exc_info()[1]
        log(f"GPU: {what} failed, left out: {exc!r}")
        traceback.print_exc(file=sys.stderr)
        failed.append({"case": what, "error": repr(exc)})

    rows: list[Row] = []
    keep: list[torch.Tensor] = []
    try:
        log("GPU: device tensors, kernel sweep, host to device copies")
        tensor_rows = gpu_tensor_rows(a, b, log, keep)
        failed += time_rows(tensor_rows, repeat, ref, log, drop_failed=True)
        rows += tensor_rows
    except Exception:
        fail("device tensor cases")
    keep.clear()
    torch.cuda.empty_cache()  # for the dask-cuda worker's RMM pool

    trips = None
    client = None
    try:
        with dask.config.set({"dataframe.backend": "cudf"}):
            log("GPU: starting a dask-cuda cluster (one worker per GPU)")
            client = dask_cosim.local_cluster(gpus=True, dashboard_address=None)
            persisted = None
            try:
                persisted = dask_cosim.read_parquet(ours_dir).persist()
                from distributed import wait

                wait(persisted)
            except Exception:
                fail("ours: dask_cudf, persisted (set-up)")
                persisted = None
            cudf_cases = cudf_rows(len(a), persisted, list_dir, ours_dir)
            failed += time_rows(cudf_cases, repeat, ref, log, drop_failed=True)
            rows += cudf_cases
            del persisted
            client.close()
            client = None
            log("GPU: host round trips of one end-to-end cudf run, under the profiler")
            try:
                trips = host_round_trips(ours_dir)
                summary = ", ".join(
                    f"{k}: {v['count']}" + (f" ({v['bytes'] / 1e6:.1f} MB)" if v["bytes"] else "")
                    for k, v in trips["kinds"].items()
                )
                print(f"host round trips (cudf path, one run): {summary or 'no memcpy events'}")
            except Exception:
                fail("host round trips (profiler)")
    except Exception:
        fail("cudf cases")
    finally:
        if client is not None:
            client.close()
    return rows, failed, trips


TARGETS = [
    # (what, row, compared with, bar): the targets, as ratios of this run's times.
    ("kernel >= 0.9 x all-core floor", "ours: kernel", "floor: torch sum (all cores)", 0.9),
    (
        "dask persisted >= 0.8 x all-core floor",
        "ours: dask, persisted",
        "floor: torch sum (all cores)",
        0.8,
    ),
    (
        "list Parquet end to end >= 0.9 x pyarrow read",
        "ours: list Parquet -> sum",
        "floor: pyarrow read, list files",
        0.9,
    ),
    (
        "our layout end to end >= 5 x plain dask",
        "ours: our Parquet -> sum",
        "peer: dask read_parquet + F.cosine_similarity",
        5.0,
    ),
    ("GPU kernel >= 0.85 x device copy", "ours: kernel on GPU", GPU_COPY, 0.85),
    *(
        (
            f"GPU kernel D={d} {dt} >= 0.85 x device copy",
            f"ours: GPU kernel D={d} {dt}",
            f"floor: GPU copy D={d} {dt}",
            0.85,
        )
        for d, dt in GPU_SWEEP
    ),
    ("dask_cudf persisted >= 0.7 x device copy", "ours: dask_cudf, persisted", GPU_COPY, 0.7),
    (
        "our layout end to end (cudf) >= 0.8 x cudf read",
        "ours: our Parquet -> sum (cudf)",
        "floor: cudf read, our files",
        0.8,
    ),
    (
        "our layout end to end: GPU faster than CPU",
        "ours: our Parquet -> sum (cudf)",
        "ours: our Parquet -> sum",
        1.0,
    ),
]


def target_lines(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seconds = {r["case"]: r["seconds"] for r in table}
    lines = []
    for what, ours, base, bar in TARGETS:
        if ours in seconds and base in seconds:
            ratio = seconds[base] / seconds[ours]
            lines.append({"target": what, "ratio": ratio, "bar": bar, "met": ratio >= bar})
    return lines


def fresh_process_memory(folder: Path) -> dict[str, Any] | None:
    """Peak RSS a fresh worker-like process gains while ``pairwise`` runs on one partition.

    A fresh process, so freed memory left over from earlier work cannot hide allocations;
    with dask's worker environment (MALLOC_TRIM_THRESHOLD_, one OpenMP thread).  Linux
    only (None elsewhere): /proc/self/clear_refs resets the peak, VmHWM reads it.  RSS
    counts torch's allocations, which tracemalloc would not see.
    """
    if not Path("/proc/self/clear_refs").exists():
        return None
    env = dict(os.environ, MALLOC_TRIM_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    # From the repository root, where ``-c`` finds the benchmarks package.
    code = "import sys; from benchmarks.pairwise import memory_probe; memory_probe(sys.argv[1])"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(folder)],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    measured: dict[str, Any] = json.loads(proc.stdout)
    return memory_budget(measured)


def memory_budget(measured: dict[str, Any]) -> dict[str, Any]:
    """The documented budget for ``pairwise`` on one partition, beyond its input: the
    chunk temporaries, 16 bytes per row (dot, two norms, overflow masks; the dot becomes
    the result) and 256 KiB for the interpreter and allocator."""
    chunk = dask.config.get("cosim.chunk-bytes")["cpu"]
    budget = dask.utils.parse_bytes(chunk) + 16 * measured["rows"] + 256 * 2**10
    return dict(
        measured,
        budget_bytes=budget,
        budget=f"cosim.chunk-bytes.cpu ({chunk}) + 16 bytes per row + 256 KiB",
    )


def memory_probe(folder: str) -> None:
    """In the fresh process: one partition of ``folder``, ``pairwise`` twice, peak RSS."""
    import gc

    def status_kib(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise KeyError(field)

    partition = dask_cosim.read_parquet(folder).partitions[0].compute(scheduler="sync")
    extra = []
    for _ in range(2):  # the first call allocates; the second shows the steady state
        gc.collect()
        Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
        before = status_kib("VmRSS")
        result = partition.cosim.pairwise(A, B)  # the eager accessor: what dask maps
        extra.append((status_kib("VmHWM") - before) * 1024)
        del result
    vectors = sum(partition[c].array.nbytes for c in (A, B))
    # The first call also faults in torch's code and thread pools (once per process); the
    # second is what every later partition costs.
    measured = {
        "rows": len(partition),
        "input_bytes": int(vectors),
        "first_call_extra_bytes": extra[0],
        "extra_bytes": extra[1],
    }
    print(json.dumps(measured))


@click.command()
@click.option("--rows", default=1_000_000, show_default=True, help="Pairs N.")
@click.option("--dim", default=300, show_default=True, help="Vector length D.")
@click.option(
    "--dtype",
    type=click.Choice(["float32", "float16", "float64"]),
    default="float32",
    show_default=True,
)
@click.option(
    "--partitions",
    type=int,
    default=None,
    help="Files/partitions; default about 128 MiB of vectors each, at least 2 per worker.",
)
@click.option("--workers", type=int, default=None, help="Dask workers; default one per core.")
@click.option("--repeat", default=5, show_default=True, help="Timed rounds after the warm-up.")
@click.option(
    "--peers/--no-peers",
    default=True,
    show_default=True,
    help="The CPU peers (in memory and from files); the spawn peer's set-up takes minutes.",
)
@click.option(
    "--gpu/--no-gpu",
    default=True,
    show_default=True,
    help="The GPU rows, when CUDA is available (cudf rows also need cudf and dask-cuda).",
)
@click.option("--name", default=None, help="Results file name; default from the machine and size.")
@click.option(
    "--out", "out_dir", type=click.Path(path_type=Path), default=RESULTS, show_default=True
)
@click.option("--quiet", is_flag=True, help="No progress lines.")
def main(
    rows: int,
    dim: int,
    dtype: str,
    partitions: int | None,
    workers: int | None,
    repeat: int,
    peers: bool,
    gpu: bool,
    name: str | None,
    out_dir: Path,
    quiet: bool,
) -> None:
    def log(msg: str) -> None:
        if not quiet:
            print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    workers = workers or os.cpu_count() or 1
    itemsize = np.dtype(dtype).itemsize
    nbytes = 2 * rows * dim * itemsize
    partitions = partitions or max(2 * workers, math.ceil(nbytes / (128 * 2**20)))
    partitions = min(partitions, rows)
    name = (
        name
        or f"{'gpu' if torch.cuda.is_available() else 'cpu'}{os.cpu_count()}-{rows}x{dim}-{dtype}"
    )

    log(f"generating {rows:,} pairs x {dim} {dtype} ({nbytes / 1e9:.2f} GB)")
    a, b = make_pairs(rows, dim, dtype)
    ref = reference(a, b)
    tmp = Path(tempfile.mkdtemp(prefix="cosim-bench-"))
    client = None
    failed: list[dict[str, str]] = []
    trips = None
    try:
        list_dir, ours_dir = tmp / "list", tmp / "ours"
        log(f"writing {partitions} list<float> files and our layout")
        write_list_layout(a, b, list_dir, partitions)
        write_our_layout(a, b, ours_dir, partitions)

        log(f"starting a LocalCluster: {workers} worker processes x 1 thread")
        client = dask_cosim.local_cluster(n_workers=workers, gpus=False, dashboard_address=None)
        persisted = dask_cosim.read_parquet(ours_dir).persist()
        from distributed import wait

        wait(persisted)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        table_rows = floor_rows(a, b, list_dir, ours_dir)
        table_rows += our_rows(ta, tb, persisted, list_dir, ours_dir, tmp / "result")
        if peers:
            log("building peer cases")
            for case in in_memory_peers(a, b):
                table_rows.append(
                    Row(case, "peer", floor="floor: numpy sum (1 core)", versus="ours: kernel")
                )
            for case in file_peers(list_dir, a, b, tmp / "peers", processes=workers):
                table_rows.append(Row(case, "peer", versus="ours: our Parquet -> sum"))
        time_rows(table_rows, repeat, ref, log)
        log("measuring the peak memory of pairwise on one partition, in a fresh process")
        memory = fresh_process_memory(ours_dir)
        for row in table_rows:
            if row.case.cleanup is not None:
                row.case.cleanup()
        if gpu and torch.cuda.is_available():
            # One cluster at a time: the CPU workers would compete with the GPU worker's
            # host side (Parquet decoding, the copies to the device).
            del persisted
            client.close()
            client = None
            gpu_table, failed, trips = run_gpu(a, b, list_dir, ours_dir, repeat, ref, log)
            table_rows += gpu_table
    finally:
        if client is not None:
            client.close()
            if client.cluster is not None:
                client.cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)

    table = summarize(table_rows, rows, nbytes)
    targets = target_lines(table)
    header = (
        f"N={rows:,} D={dim} {dtype}, {partitions} partitions, {workers} workers, "
        f"{os.cpu_count()} cores, median of {repeat} (row by row: a sample, scaled to N)"
    )
    print_table(table, header)
    print("\ntargets (ratios from this run):")
    for t in targets:
        where = "at or above" if t["met"] else "below"
        print(f"  {t['target']:50} {t['ratio']:.2f}, {where} the bar ({t['bar']})")

    if failed:
        print("\nleft out (raised; tracebacks above):")
        for f in failed:
            print(f"  {f['case']}: {f['error']}")
    if memory is not None:
        print(
            f"\nmemory: peak RSS of pairwise beyond its input partition ({memory['rows']:,} rows,"
            f" {memory['input_bytes'] / 2**20:.0f} MiB of vectors): "
            f"{memory['extra_bytes'] / 2**20:.2f} MiB (first call in the process "
            f"{memory['first_call_extra_bytes'] / 2**20:.2f} MiB); budget "
            f"{memory['budget_bytes'] / 2**20:.2f} MiB = {memory['budget']}"
        )
    params = {
        "rows": rows,
        "dim": dim,
        "dtype": dtype,
        "partitions": partitions,
        "workers": workers,
        "repeat": repeat,
    }
    write_results(
        out_dir / f"{name}.json",
        {
            "name": name,
            "params": params,
            "cases": table,
            "targets": targets,
            "memory": memory,
            "failed": failed,
            "host_round_trips": trips,
        },
    )
    plot(table, header, out_dir / f"{name}.png")
    log(f"wrote {out_dir / (name + '.json')} and .png")


if __name__ == "__main__":
    main()
