"""Where the time of a GPU read from Parquet goes: the breakdown ``benchmarks.pairwise_gpu``
prints after its table, for our layout and for list files.

End to end on a dask-cuda worker (read, pairwise, sum) took 0.232 s on the H100 against
0.136 s for ``cudf.read_parquet`` of the same files in one call (``docs/gpu.md``).  Each
stage below runs alone, in this process, on the run's files (median of ``repeat`` after a
warm-up, the device synchronised after each):

- ``cudf.read_parquet`` of every file in one call (the floor), under this process's
  allocator and under an RMM pool (the dask-cuda worker's);
- ``cudf.read_parquet`` once per file (the fixed work per file);
- the footers read again for the files' RangeIndexes (what a piece of several files cost
  before the manifest gave them);
- our reader (``cudf_parquet.read_files``) on all files in one call, the ranges from the
  footers and from the manifest;
- the binary-to-list view of both vector columns (our layout);
- pairwise and a sum on the frame in memory;
- the dask graph built and not run, and run on the synchronous scheduler (no cluster).

Against the end-to-end row on the worker and the dask round trip of the table, the
differences are the dask and distributed overheads.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch

import dask_cosim
from benchmarks import harness
from benchmarks.harness import A, B
from dask_cosim.partition import pairwise_partition

COLUMNS = [A, B]


def _synced(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        out = fn()
        torch.cuda.synchronize()  # cudf queues on its own stream: wait for the device
        return out

    return run


def _pool() -> Callable[[], None]:
    """An RMM pool as this process's device memory resource (as on a dask-cuda worker);
    returns the function that puts the previous resource back."""
    import rmm

    before = rmm.mr.get_current_device_resource()
    free, _ = torch.cuda.mem_get_info()
    size = (free // 2) // 256 * 256
    rmm.mr.set_current_device_resource(
        rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=size)
    )
    return lambda: rmm.mr.set_current_device_resource(before)


def stages(folder: Path) -> list[tuple[str, Callable[[], Any]]]:
    """(stage, function) for one folder of the run, in the order they are timed."""
    import cudf

    from dask_cosim.io import cudf_parquet
    from dask_cosim.io.files import parquet_files
    from dask_cosim.io.layouts import binary_vectors

    found = parquet_files(folder)
    assert found is not None
    files, manifest = found.files, found.manifest
    schema = pq.read_schema(files[0])
    vectors = binary_vectors(schema)
    ranges = cudf_parquet.manifest_ranges(schema, manifest)

    def ours(given: Any) -> Any:
        return cudf_parquet.read_files(
            files, row_groups=None, columns=COLUMNS, filters=None, vectors=vectors, ranges=given
        )

    def cudf_read(paths: Any) -> Any:
        return cudf.read_parquet(paths, columns=COLUMNS)

    read_once = cudf_read(files)  # the binary view's input
    in_memory = ours(ranges)

    def view() -> list[Any]:
        table, _ = read_once.to_pylibcudf()
        columns = list(table.columns())
        return [
            cudf_parquet._bytes_to_lists(columns[i], str(name), *vectors[name])
            for i, name in enumerate(read_once.columns)
            if name in vectors
        ]

    def graph() -> Any:
        return dask_cosim.read_parquet(folder).cosim.pairwise(A, B).sum()

    out = [
        ("floor: cudf.read_parquet, all files in one call", lambda: cudf_read(files)),
        ("cudf.read_parquet, one call per file", lambda: [cudf_read(f) for f in files]),
        ("footers read again (footer_ranges)", lambda: cudf_parquet.footer_ranges(files)),
        ("our reader, one call, ranges from the footers", lambda: ours(None)),
    ]
    if ranges is not None:
        out.append(("our reader, one call, ranges from the manifest", lambda: ours(ranges)))
    if vectors:
        out.append(("binary bytes -> list columns (both)", view))
    out += [
        (
            "pairwise + sum of the frame in memory",
            lambda: pairwise_partition(in_memory, A, B).sum(),
        ),
        ("dask graph built (read, pairwise, sum), not run", graph),
        ("end to end, dask synchronous scheduler", lambda: graph().compute(scheduler="sync")),
    ]
    return out


def read_breakdown(folders: dict[str, Path], repeat: int, log: harness.Log) -> list[harness.Record]:
    """Each stage of :func:`stages` timed per folder ({layout: folder}), then the floor and
    our one-call reader again under an RMM pool; dataframe.backend must be "cudf"."""
    records: list[harness.Record] = []
    for layout, folder in folders.items():
        log(f"GPU read breakdown: {layout} files")
        timed = stages(folder)
        for stage, fn in timed:
            seconds = harness.median_seconds(_synced(fn), repeat)
            records.append({"layout": layout, "stage": stage, "seconds": seconds, "rmm": "plain"})
        restore = _pool()
        try:
            for stage, fn in [t for t in timed if t[0].startswith(("floor", "our reader"))]:
                seconds = harness.median_seconds(_synced(fn), repeat)
                records.append(
                    {"layout": layout, "stage": stage, "seconds": seconds, "rmm": "pool"}
                )
        finally:
            restore()
    return records


BREAKDOWN_TABLE = [
    harness.Column("layout", "layout", align="<"),
    harness.Column("allocator", "rmm", align="<"),
    harness.Column("stage", "stage", align="<"),
    harness.Column("s", "seconds", ".4f", 8),
    harness.Column("s / floor", "of_floor", ".2f", 9),
]


def report(records: list[harness.Record]) -> None:
    """The breakdown, each stage's time over the floor's (cudf.read_parquet, one call)."""
    floors = {
        (r["layout"], r["rmm"]): r["seconds"] for r in records if r["stage"].startswith("floor")
    }
    rows = [{**r, "of_floor": r["seconds"] / floors[(r["layout"], r["rmm"])]} for r in records]
    harness.print_table(BREAKDOWN_TABLE, rows, "\nGPU read, stage by stage (this process):")
