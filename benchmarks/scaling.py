"""Does the time per pair stay flat as N grows, and grow linearly with D?

    python -m benchmarks.scaling                      # rows 1e5..1e7 and D 64..1024

For each size: our kernel in-process, and ``df.cosim.pairwise(...).sum()`` on a LocalCluster
over partitions persisted in worker memory and from our Parquet files.  Prints nanoseconds
per pair (flat = constant time per pair) and, for the D sweep, per pair per 100 dimensions
(flat = linear in D), each also relative to the largest size.  Sizes whose pairs would not
fit in this machine's memory are skipped and reported as such.  Writes
``benchmarks/results/scaling-<name>.json`` (with the machine and its load average).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import torch
from distributed import wait

import dask_cosim
from benchmarks import harness
from benchmarks.harness import generate_pairs, median_seconds, write_our_layout


def measure(rows: int, dim: int, repeat: int, tmp: Path) -> dict[str, float]:
    """ns per pair: kernel in-process; dask over persisted partitions; dask from Parquet."""
    a, b = generate_pairs(rows, dim)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    kernel = median_seconds(lambda: dask_cosim.pairwise_cosine(ta, tb), repeat)
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


def _per(run: Mapping[str, Any], column: str, sweep: str) -> float:
    """ns per pair (N sweep) or per pair per 100 dims (D sweep)."""
    return run[column] * (100 / run["dim"] if sweep == "dims" else 1.0)


def _cell(column: str, sweep: str, last: dict[str, float]) -> harness.Column:
    """A column of a sweep's table: its value per pair, and relative to the largest size."""

    def text(run: Mapping[str, Any]) -> str:
        per = _per(run, column, sweep)
        return f"{per:8.2f} ({per / _per(last, column, sweep):4.2f})"

    title = {"kernel_ns": "kernel", "persisted_ns": "dask persisted", "parquet_ns": "dask Parquet"}
    return harness.Column(title[column], text)


def report(results: harness.Record) -> None:
    for sweep in ("rows", "dims"):
        runs = results[sweep]
        if not runs:
            continue
        label = "ns per pair" if sweep == "rows" else "ns per pair per 100 dims"
        columns = [
            harness.Column("N", "rows", ","),
            harness.Column("D", "dim"),
            *(_cell(c, sweep, runs[-1]) for c in ("kernel_ns", "persisted_ns", "parquet_ns")),
        ]
        title = f"\n{label} (and relative to the largest {'N' if sweep == 'rows' else 'D'})"
        harness.print_table(columns, runs, title)


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
@harness.results_options()
def main(
    row_sizes: str, dim: int, dims: str, dim_rows: int, repeat: int, output: harness.Output
) -> None:
    """Time per pair against N and against D."""

    sweeps = [("rows", int(float(r)), dim) for r in row_sizes.split(",")]
    sweeps += [("dims", dim_rows, int(d)) for d in dims.split(",")]

    def run(log: harness.Log) -> harness.Record:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        results: dict[str, list[dict[str, float]]] = {"rows": [], "dims": []}
        client = dask_cosim.local_cluster(gpus=False, dashboard_address=None)
        tmp = Path(tempfile.mkdtemp(prefix="cosim-scaling-"))
        try:
            for sweep, rows, d in sweeps:
                # The arrays here plus a persisted copy in the workers, with room to spare.
                if 2.5 * 2 * rows * d * 4 > 0.6 * memory:
                    print(f"skip N={rows:,} D={d}: {8 * rows * d / 1e9:.1f} GB of pairs won't fit")
                    continue
                log(f"{sweep} sweep: N={rows:,} D={d}")
                results[sweep].append(measure(rows, d, repeat, tmp))
        finally:
            client.close()
            client.cluster.close()
            shutil.rmtree(tmp, ignore_errors=True)
        return dict(results)

    # Other sizes than the defaults name their own file: they must not replace the default
    # run's, which the docs quote.
    defaults = {p.name: p.default for p in click.get_current_context().command.params}
    given = {"row_sizes": row_sizes, "dim": dim, "dims": dims, "dim_rows": dim_rows}
    custom = any(value != defaults[key] for key, value in given.items())
    name = f"scaling-{output.name or f'cpu{os.cpu_count()}' + '-custom' * custom}"
    harness.execute_benchmark(harness.Config(output, name, run, report))


if __name__ == "__main__":
    main()
