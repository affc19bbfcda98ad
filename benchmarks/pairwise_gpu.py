"""``benchmarks.pairwise`` on a machine with CUDA: the same table, plus the GPU rows.

    python -m benchmarks.pairwise_gpu --rows 1000000 --dim 300 --repeat 3 --no-peers

Runs the CPU rows first (they are what the GPU is compared with), closes the CPU cluster,
then, fail-soft (whatever raises is logged with its traceback and left out):

- in this process: the device floors (a streaming read, ``a.sum(); b.sum()``, and a
  device-to-device copy) and our kernel on the run's pairs; the kernel at each (D, dtype)
  of ``GPU_SWEEP`` on pairs of its own, fused and torch, each against floors of its own
  bytes; host data on the GPU (``benchmarks.gpu_host``: host-to-device copies, the
  staged path, pandas partitions under ``device="auto"``, ``"cpu"`` and ``"cuda"``, the
  rates of the placement rule);
- with cudf, on a dask-cuda cluster (one worker per GPU): the pairs persisted as a
  dask_cudf frame, ``cudf.read_parquet`` of both layouts and our end to end from each
  through the GPU reader;
- the copies between host and device in one end-to-end cudf run, under the profiler;
- the GPU read stage by stage (``benchmarks.gpu_read``), in this process.

Same options and results file as ``benchmarks.pairwise`` (named ``gpu<cores>-...``), with
``read_breakdown`` and ``placement_rates`` added.  Without CUDA it says so and exits 0.
``benchmarks.dask_gpu`` measures persisted dask_cudf at 1M-50M rows and two workers on
one GPU.
"""

from __future__ import annotations

import json
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import click
import dask
import dask.dataframe as dd
import torch

import dask_cosim
from benchmarks import gpu_host, gpu_read, harness, pairwise
from benchmarks.harness import A, B, Case, Row
from benchmarks.pairwise import Pairs, sum_cos
from dask_cosim import kernels

# The kernel on device tensors: (D, dtype) pairs, each of about the bytes of the run's pairs.
GPU_SWEEP = [(d, dt) for d in (128, 300, 768, 4096) for dt in ("float16", "float32")]
GPU_COPY = "floor: GPU copy (device to device)"
GPU_READ = "floor: GPU read (sum of both)"


def _sync() -> None:
    """Every GPU case ends here: the harness reads the host clock, so queued work must end."""
    torch.cuda.synchronize()


def _copy_case(name: str, tensors: list[torch.Tensor], rows: int, note: str) -> Case:
    """Clone of device tensors: reads and writes their bytes once."""

    def copy() -> None:
        for t in tensors:
            t.clone()
        _sync()

    return Case(name, copy, rows, note)


def _read_case(name: str, tensors: list[torch.Tensor], rows: int, note: str) -> Case:
    """A sum of each device tensor: reads its bytes once and writes nothing, the floor of a
    kernel that only reads (the copy floor also writes, which flatters such a kernel)."""

    def read() -> None:
        for t in tensors:
            t.sum()
        _sync()

    return Case(name, read, rows, note)


def _kernel_case(name: str, x: torch.Tensor, y: torch.Tensor, fused: bool | None) -> Case:
    def kernel() -> torch.Tensor:
        res = dask_cosim.pairwise_cosine(x, y, fused=fused)
        _sync()
        return res  # checked on the host by the harness, outside the timing

    note = (
        f"fused: {kernels.fused_kernel_for(x, y) or 'none, torch kernel'}"
        if fused is None
        else "fused=False: the chunked torch kernel"
    )
    return Case(name, kernel, len(x), note)


def _sweep_rows(dim: int, dtype: str, target_bytes: int, gen: torch.Generator) -> list[Row]:
    """The kernel at one sweep point, on pairs of its own of about ``target_bytes`` per
    input, fused and torch, against a copy of its own bytes (its device memory is held
    by the rows' cases)."""
    label = f"D={dim} {dtype}"
    tdtype = getattr(torch, dtype)
    count = max(1, target_bytes // (dim * tdtype.itemsize))
    # Half of each pair is the other half plus noise: cos spread over (-1, 1), not all
    # near 0 as for two independent draws.
    x = torch.randn((count, dim), generator=gen, device="cuda", dtype=tdtype)
    y = torch.randn((count, dim), generator=gen, device="cuda", dtype=tdtype)
    y[: count // 2] += x[: count // 2]
    ref, nbytes, floor = harness.reference(x, y), 2 * x.nbytes, f"floor: GPU read {label}"
    rows = [
        Row(_read_case(floor, [x, y], count, f"{count:,} rows"), "floor", expect="none",
            nbytes=nbytes),
        Row(_copy_case(f"floor: GPU copy {label}", [x, y], count, "reads and writes"), "floor",
            expect="none", nbytes=nbytes),
    ]  # fmt: skip
    for suffix, fused in (("", None), (", torch fallback", False)):
        case = _kernel_case(f"ours: GPU kernel {label}{suffix}", x, y, fused)
        rows.append(Row(case, "ours", floor=floor, ref=ref, nbytes=nbytes))
    return rows


def gpu_tensor_rows(pairs: Pairs, log: harness.Log) -> list[Row]:
    """CUDA, in this process: the device floors and our kernel on the run's pairs, the
    kernel at each point of GPU_SWEEP, then host data on the GPU.  Device memory is held
    by the rows' cases until they are dropped.  A sweep point that cannot be set up is
    logged and left out."""
    n = len(pairs.a)
    ga, gb = torch.from_numpy(pairs.a).cuda(), torch.from_numpy(pairs.b).cuda()
    device = torch.cuda.get_device_name()
    rows = [
        Row(_read_case(GPU_READ, [ga, gb], n, device), "floor", expect="none"),
        Row(_copy_case(GPU_COPY, [ga, gb], n, "reads and writes"), "floor", expect="none"),
        Row(_kernel_case("ours: kernel on GPU", ga, gb, None), "ours", floor=GPU_READ),
        Row(_kernel_case("ours: kernel on GPU, torch fallback", ga, gb, False), "ours",
            floor=GPU_READ),
    ]  # fmt: skip
    gen = torch.Generator(device="cuda").manual_seed(0)
    for dim, dtype in GPU_SWEEP:
        try:
            rows += _sweep_rows(dim, dtype, pairs.a.nbytes, gen)
        except Exception:
            log(f"GPU kernel at D={dim} {dtype}: set-up failed, left out")
            traceback.print_exc(file=sys.stderr)
    return rows + gpu_host.host_rows(pairs.a, pairs.b)


def cudf_rows(pairs: Pairs, persisted: dd.DataFrame | None) -> list[Row]:
    """CUDA with cudf, on a dask-cuda cluster (the default client; dataframe.backend must be
    "cudf" while these run): floors that read the files with ``cudf.read_parquet`` in this
    process, our pairs persisted as a dask_cudf frame, and end to end from both layouts
    through the GPU reader.  ``persisted`` None: that row is left out (its set-up failed)."""
    import cudf

    from dask_cosim.io.files import parquet_files

    n = len(pairs.a)
    rows = []
    if persisted is not None:
        rows.append(
            Row(Case("ours: dask_cudf, persisted", lambda: sum_cos(persisted), n,
                     "partitions in GPU worker memory"), "ours", floor=GPU_COPY, expect="sum")
        )  # fmt: skip
    rows.append(
        Row(Case("floor: dask round trip (no work)", lambda: dask.delayed(int)(0).compute(), n,
                 "one task on the cluster: what any persisted compute costs at least"),
            "floor", expect="none")
    )  # fmt: skip
    for layout, folder in (("list", pairs.list_dir), ("our", pairs.ours_dir)):
        found = parquet_files(folder)
        assert found is not None
        files = found[1]  # the files our reader reads, in its order

        def read(files: list[str] = files) -> None:
            cudf.read_parquet(files, columns=[A, B])
            _sync()  # cudf's work runs on its own stream; synchronize waits on the device

        def end_to_end(folder: Path = folder) -> float:
            return sum_cos(dask_cosim.read_parquet(folder))

        floor = f"floor: cudf read, {layout} files"
        rows += [
            Row(Case(floor, read, n, "cudf.read_parquet, this process"), "floor", expect="none"),
            Row(Case(f"ours: {layout} Parquet -> sum (cudf)", end_to_end, n,
                     'dataframe.backend="cudf", one dask-cuda worker'), "ours", floor=floor,
                expect="sum"),
        ]  # fmt: skip
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
    pairs: Pairs, repeat: int, log: harness.Log
) -> tuple[list[Row], list[dict[str, str]], dict[str, Any]]:
    """The GPU rows, fail-soft: (timed rows, failures {"case", "error"}, more entries of
    the results record: "host_round_trips", "read_breakdown").

    First this process's tensor and host-data cases (their device memory freed after),
    then the cudf cases on a dask-cuda cluster of one worker per GPU
    (``dask_cosim.local_cluster()``, closed after), then in this process the host round
    trips and the read breakdown.  Whatever raises is logged with its traceback and left
    out.  An interrupt (SIGINT: ``.ci/gpu-check``'s budget) ends it early: the rows of
    the sections that finished stay, and "interrupted" is set in the record.
    """
    failed: list[dict[str, str]] = []
    extras: dict[str, Any] = {"host_round_trips": None, "read_breakdown": None}

    rows: list[Row] = []
    try:
        _gpu_sections(pairs, repeat, log, rows, failed, extras)
    except KeyboardInterrupt:
        # .ci/gpu-check's budget: the rows of the sections that finished are kept.
        log("GPU: interrupted; the rows timed so far are kept")
        failed.append({"case": "interrupted", "error": "KeyboardInterrupt (the budget)"})
        extras["interrupted"] = True
    return rows, failed, extras


def _gpu_sections(
    pairs: Pairs,
    repeat: int,
    log: harness.Log,
    rows: list[Row],
    failed: list[dict[str, str]],
    extras: dict[str, Any],
) -> None:
    """:func:`run_gpu`'s sections in order, each adding to ``rows`` only once timed; what
    raises is logged with its traceback and added to ``failed``."""

    def fail(what: str) -> None:
        exc = sys.exc_info()[1]
        log(f"GPU: {what} failed, left out: {exc!r}")
        traceback.print_exc(file=sys.stderr)
        failed.append({"case": what, "error": repr(exc)})

    try:
        log("GPU: device floors and kernels, kernel sweep, host data on the GPU")
        tensor_rows = gpu_tensor_rows(pairs, log)
        failed.extend(harness.time_rows(tensor_rows, repeat, pairs.ref, log, drop_failed=True))
        rows += tensor_rows
    except Exception:
        fail("device tensor cases")
    for row in rows:  # the timings stay; the device memory their cases hold goes
        row.case.run, row.ref = _spent, None
    torch.cuda.empty_cache()  # for the dask-cuda worker's RMM pool

    client = None
    with dask.config.set({"dataframe.backend": "cudf"}):
        try:
            log("GPU: starting a dask-cuda cluster (one worker per GPU)")
            client = dask_cosim.local_cluster(gpus=True, dashboard_address=None)
            persisted = None
            try:
                persisted = dask_cosim.read_parquet(pairs.ours_dir).persist()
                from distributed import wait

                wait(persisted)
            except Exception:
                fail("ours: dask_cudf, persisted (set-up)")
                persisted = None
            cudf_cases = cudf_rows(pairs, persisted)
            failed.extend(harness.time_rows(cudf_cases, repeat, pairs.ref, log, drop_failed=True))
            rows += cudf_cases
            del persisted
        except Exception:
            fail("cudf cases")
        finally:
            if client is not None:
                client.close()
        log("GPU: host round trips of one end-to-end cudf run, under the profiler")
        try:
            trips = host_round_trips(pairs.ours_dir)
            summary = ", ".join(
                f"{k}: {v['count']}" + (f" ({v['bytes'] / 1e6:.1f} MB)" if v["bytes"] else "")
                for k, v in trips["kinds"].items()
            )
            print(f"host round trips (cudf path, one run): {summary or 'no memcpy events'}")
            extras["host_round_trips"] = trips
        except Exception:
            fail("host round trips (profiler)")
        try:
            folders = {"our": pairs.ours_dir, "list": pairs.list_dir}
            extras["read_breakdown"] = gpu_read.read_breakdown(folders, repeat, log)
        except Exception:
            fail("GPU read breakdown")


def _spent() -> None:
    raise RuntimeError("timed already; its device memory is freed")


TARGETS = [
    ("GPU kernel >= 0.85 x device read", "ours: kernel on GPU", GPU_READ, 0.85),
    *(
        (
            f"GPU kernel D={d} {dt} >= 0.85 x device read",
            f"ours: GPU kernel D={d} {dt}",
            f"floor: GPU read D={d} {dt}",
            0.85,
        )
        for d, dt in GPU_SWEEP
    ),
    *gpu_host.TARGETS,
    (
        "our layout end to end (cudf) >= 0.8 x cudf read",
        "ours: our Parquet -> sum (cudf)",
        "floor: cudf read, our files",
        0.8,
    ),
    (
        "list files end to end (cudf) >= 0.8 x cudf read",
        "ours: list Parquet -> sum (cudf)",
        "floor: cudf read, list files",
        0.8,
    ),
    (
        "our layout end to end: GPU faster than CPU",
        "ours: our Parquet -> sum (cudf)",
        "ours: our Parquet -> sum",
        1.0,
    ),
]


def report(record: harness.Record) -> None:
    """What the GPU phase adds after the table: the read breakdown, the placement rates."""
    if record.get("read_breakdown"):
        gpu_read.report(record["read_breakdown"])
    gpu_host.report_rates(record.get("placement_rates") or {})


def from_table(table: list[harness.Record]) -> dict[str, Any]:
    return {"placement_rates": gpu_host.placement_rates(table)}


@click.command()
@pairwise.options
def main(**given: Any) -> None:
    """benchmarks.pairwise plus the GPU rows; without CUDA it says so and exits 0."""
    if not torch.cuda.is_available():
        print("no CUDA device: nothing run (the CPU rows alone: python -m benchmarks.pairwise)")
        return
    record = pairwise.execute(given, "gpu", pairwise.Phase(run_gpu, TARGETS, report, from_table))
    if record.get("interrupted"):
        raise SystemExit(130)  # written, but cut short: the step did not finish


if __name__ == "__main__":
    main()
