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
from dask_cosim import io, kernels
from dask_cosim.datasets import pair_arrays

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
                lambda: kernels.pairwise_cosine(ta, tb).numpy(),
                n,
                f"fused: {kernels.fused_kernel_for(ta, tb) or 'none, torch kernel'}",
            ),
            "ours",
            floor="floor: torch sum (all cores)",
        ),
        Row(
            Case(
                "ours: kernel, torch fallback",
                lambda: kernels.pairwise_cosine(ta, tb, fused=False).numpy(),
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


def gpu_rows(a: np.ndarray, b: np.ndarray) -> list[Row]:
    """CUDA only: the device-to-device copy floor and our kernel on device tensors."""
    if not torch.cuda.is_available():
        return []
    ga, gb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()

    def copy() -> None:
        ga.clone(), gb.clone()
        torch.cuda.synchronize()

    def kernel() -> np.ndarray:
        res = kernels.pairwise_cosine(ga, gb)
        torch.cuda.synchronize()
        return res.cpu().numpy()

    name = torch.cuda.get_device_name()
    return [
        Row(Case("floor: GPU copy (device to device)", copy, len(a), name), "floor", expect="none"),
        Row(
            Case("ours: kernel on GPU", kernel, len(a), name),
            "ours",
            floor="floor: GPU copy (device to device)",
        ),
    ]


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
    (
        "GPU kernel >= 0.85 x device copy",
        "ours: kernel on GPU",
        "floor: GPU copy (device to device)",
        0.85,
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
@click.option("--peers/--no-peers", default=True, show_default=True)
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
        table_rows = floor_rows(a, b, list_dir, ours_dir) + gpu_rows(a, b)
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
    finally:
        if client is not None:
            client.close()
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
        {"name": name, "params": params, "cases": table, "targets": targets, "memory": memory},
    )
    plot(table, header, out_dir / f"{name}.png")
    log(f"wrote {out_dir / (name + '.json')} and .png")


if __name__ == "__main__":
    main()
