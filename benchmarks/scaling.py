"""Does the time per pair stay flat as N grows, and grow linearly with D?

    python -m benchmarks.scaling                      # rows 1e5..1e7 and D 64..1024

For each size: our kernel in-process, and ``df.cosim.pairwise(...).sum()`` on a LocalCluster
over partitions persisted in worker memory and from our Parquet files.  Prints nanoseconds
per pair (flat = constant time per pair) and, for the D sweep, per pair per 100 dimensions
(flat = linear in D), each also relative to the largest size.  Sizes whose pairs would not
fit in this machine's memory are skipped and reported as such.  Writes
``benchmarks/results/scaling-<name>.json`` (``benchmarks.harness.write_results``: with the
machine and its load average).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
import torch
from distributed import wait

import dask_cosim
from benchmarks.harness import RESULTS, median_seconds, write_results
from benchmarks.pairwise import make_pairs, write_our_layout
from dask_cosim import kernels, options

# The kernels take their options as arguments: the configured ones, as the accessor.
EPS, CHUNK_BYTES = options.eps(), options.chunk_bytes()


def measure(rows: int, dim: int, repeat: int, tmp: Path) -> dict[str, float]:
    """ns per pair: kernel in-process; dask over persisted partitions; dask from Parquet."""
    a, b = make_pairs(rows, dim, "float32")
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    kernel = median_seconds(
        lambda: kernels.pairwise_cosine(ta, tb, eps=EPS, chunk_bytes=CHUNK_BYTES), repeat
    )
    folder = tmp / f"{rows}x{dim}"
    write_our_layout(a, b, folder, max(4, round(a.nbytes * 2 / 2**27)))

    def cos(df: Any) -> float:
        return float(df.cosim.pairwise("embeds_a", "embeds_b").sum().compute())

    persisted_df = dask_cosim.read_parquet(folder).persist()
    wait(persisted_df)
    persisted = median_seconds(lambda: cos(persisted_df), repeat)
    from_files = median_seconds(lambda: cos(dask_cosim.read_parquet(folder)), repeat)
    shutil.rmtree(folder)
    return {
        "rows": rows,
        "dim": dim,
        "kernel_ns": kernel / rows * 1e9,
        "persisted_ns": persisted / rows * 1e9,
        "parquet_ns": from_files / rows * 1e9,
    }


def _per(run: dict[str, float], column: str, sweep: str) -> float:
    """ns per pair (N sweep) or per pair per 100 dims (D sweep)."""
    return run[column] * (100 / run["dim"] if sweep == "dims" else 1.0)


@click.command()
@click.option(
    "--rows",
    "row_sizes",
    default="100000,300000,1000000,3000000,10000000",
    show_default=True,
    help="Row counts for the N sweep.",
)
@click.option("--dim", default=64, show_default=True, help="D for the N sweep.")
@click.option(
    "--dims", default="32,64,128,300,768,1024", show_default=True, help="D values for the D sweep."
)
@click.option("--dim-rows", default=500_000, show_default=True, help="N for the D sweep.")
@click.option("--repeat", default=3, show_default=True)
@click.option("--name", default=None, help="Results file: scaling-<name>.json.")
@click.option(
    "--out", "out_dir", type=click.Path(path_type=Path), default=RESULTS, show_default=True
)
def main(
    row_sizes: str, dim: int, dims: str, dim_rows: int, repeat: int, name: str | None, out_dir: Path
) -> None:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    results: dict[str, list[dict[str, float]]] = {"rows": [], "dims": []}
    sweeps = [("rows", int(float(r)), dim) for r in row_sizes.split(",")]
    sweeps += [("dims", dim_rows, int(d)) for d in dims.split(",")]
    client = dask_cosim.local_cluster(gpus=False, dashboard_address=None)
    tmp = Path(tempfile.mkdtemp(prefix="cosim-scaling-"))
    try:
        for sweep, rows, d in sweeps:
            # The arrays here plus a persisted copy in the workers, with room to spare.
            if 2.5 * 2 * rows * d * 4 > 0.6 * memory:
                print(f"skip N={rows:,} D={d}: {8 * rows * d / 1e9:.1f} GB of pairs won't fit")
                continue
            print(f"{sweep} sweep: N={rows:,} D={d}", file=sys.stderr, flush=True)
            results[sweep].append(measure(rows, d, repeat, tmp))
    finally:
        client.close()
        client.cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)

    cols = ("kernel_ns", "persisted_ns", "parquet_ns")
    for sweep in ("rows", "dims"):
        runs = results[sweep]
        if not runs:
            continue
        label = "ns per pair" if sweep == "rows" else "ns per pair per 100 dims"
        print(f"\n{label} (and relative to the largest {'N' if sweep == 'rows' else 'D'})")
        print(f"{'N':>11} {'D':>5} {'kernel':>14} {'dask persisted':>16} {'dask Parquet':>16}")

        for r in runs:
            cells = [
                f"{_per(r, c, sweep):8.2f} ({_per(r, c, sweep) / _per(runs[-1], c, sweep):4.2f})"
                for c in cols
            ]
            print(f"{r['rows']:>11,} {r['dim']:>5} {cells[0]:>14} {cells[1]:>16} {cells[2]:>16}")
    name = name or f"cpu{os.cpu_count()}"
    write_results(out_dir / f"scaling-{name}.json", results)


if __name__ == "__main__":
    main()
