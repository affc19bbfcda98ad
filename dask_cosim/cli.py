"""The ``dask-cosim`` command line (also ``python -m dask_cosim``).

For now: ``demo``, which generates pairs, runs the main job on an embedded local cluster
and prints a summary.
"""

from __future__ import annotations

import shutil
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

import dask_cosim  # also registers the .cosim accessor
from dask_cosim.io import vectors_to_arrow

__all__ = ["main", "make_pairs", "summarize"]


def make_pairs(rows: int, dim: int, seed: int, first_id: int = 0) -> pd.DataFrame:
    """``rows`` pairs with similarities spread over [-1, 1]: b = t*a + (1-|t|)*noise."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((rows, dim), dtype=np.float32)
    t = rng.uniform(-1, 1, size=(rows, 1)).astype(np.float32)
    b = t * a + (1 - np.abs(t)) * rng.standard_normal((rows, dim), dtype=np.float32)
    return pd.DataFrame(
        {
            "id": np.arange(first_id, first_id + rows, dtype=np.int64),
            "embeds_a": vectors_to_arrow(a),
            "embeds_b": vectors_to_arrow(b),
        }
    )


def summarize(cos: dd.Series, show_progress: bool = False) -> dict[str, Any]:
    """Rows, nulls, mean, min, max and a 10-bin histogram over [-1, 1], in one pass.

    ``show_progress`` draws distributed's progress bar (needs a distributed Client).
    """
    edges = np.linspace(-1, 1, 11)
    # A module-level function, not a lambda: a lambda makes distributed fall back to
    # cloudpickling the whole expression, which fails on pyarrow's dataset objects.
    hist = cos.dropna().map_partitions(_histogram, edges, meta=(None, object))
    wanted = [cos.size, cos.isna().sum(), cos.mean(), cos.min(), cos.max(), hist]
    if show_progress:
        from distributed import default_client, progress

        client = default_client()
        futures = client.compute(wanted)
        progress(futures)
        values = client.gather(futures)
    else:
        values = dask.compute(*wanted)
    rows, nulls, mean, lo, hi, parts = values
    counts = np.sum(list(parts), axis=0) if len(parts) else np.zeros(10, int)
    return dict(
        rows=int(rows),
        nulls=int(nulls),
        mean=float(mean),
        min=float(lo),
        max=float(hi),
        edges=edges,
        counts=counts,
    )


def _histogram(s: pd.Series, edges: np.ndarray) -> pd.Series:
    return pd.Series([np.histogram(s.to_numpy(), bins=edges)[0]])


def format_summary(summary: dict[str, Any], seconds: float, embedding_bytes: int) -> str:
    lines = [
        f"rows        {summary['rows']:,}",
        f"nulls       {summary['nulls']:,}",
        f"mean        {summary['mean']:+.6f}",
        f"min / max   {summary['min']:+.6f} / {summary['max']:+.6f}",
        f"time        {seconds:.2f} s  ({summary['rows'] / seconds:,.0f} pairs/s, "
        f"{embedding_bytes / seconds / 1e9:.2f} GB/s of embeddings)",
        "histogram",
    ]
    counts, edges = summary["counts"], summary["edges"]
    top = max(1, int(np.max(counts)))
    for lo, hi, c in zip(edges[:-1], edges[1:], counts):
        lines.append(f"  [{lo:+.1f}, {hi:+.1f})  {'#' * int(40 * c / top):<40} {int(c):,}")
    return "\n".join(lines)


def _write_pairs(path: Path, rows: int, dim: int, first_id: int) -> None:
    table = pa.Table.from_pandas(
        make_pairs(rows, dim, seed=first_id, first_id=first_id), preserve_index=False
    )
    pq.write_table(table.replace_schema_metadata(None), path)


@click.group()
def main() -> None:
    """Row-wise cosine similarity of embedding columns, on dask clusters of CPUs or GPUs."""


@main.command()
@click.option("--rows", default=1_000_000, show_default=True, type=click.IntRange(1))
@click.option("--dim", default=300, show_default=True, type=click.IntRange(1))
@click.option(
    "--partitions",
    default=None,
    type=click.IntRange(1),
    help="Parquet files to generate (default: about 64 MiB each).",
)
@click.option(
    "--workers",
    default=None,
    type=click.IntRange(1),
    help="Local workers (default: one per GPU, else one per core).",
)
def demo(rows: int, dim: int, partitions: int | None, workers: int | None) -> None:
    """Generate pairs into a temporary folder and score them on a local cluster."""
    if partitions is None:
        partitions = max(1, min(rows, (rows * dim * 8) // (64 * 2**20)))
    bounds = np.linspace(0, rows, partitions + 1).astype(int)
    folder = Path(tempfile.mkdtemp(prefix="dask-cosim-demo-"))
    try:
        with dask_cosim.local_cluster(workers) as client:
            click.echo(
                f"cluster     {len(client.scheduler_info()['workers'])} workers, "
                f"dashboard {client.dashboard_link}"
            )
            t0 = time.perf_counter()
            (folder / "pairs").mkdir()
            writes = [
                dask.delayed(_write_pairs)(
                    folder / "pairs" / f"part.{i:05d}.parquet", int(hi - lo), dim, int(lo)
                )
                for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:]))
            ]
            dask.compute(*writes)
            click.echo(
                f"generated   {rows:,} pairs of {dim} float32 in {partitions} files "
                f"({time.perf_counter() - t0:.1f} s) under {folder}"
            )

            t0 = time.perf_counter()
            df = dask_cosim.read_parquet(folder / "pairs")
            df["cos"] = df.cosim.pairwise("embeds_a", "embeds_b")
            summary = summarize(df["cos"], show_progress=sys.stdout.isatty())
            seconds = time.perf_counter() - t0
            click.echo("from Parquet to summary:")
            click.echo(format_summary(summary, seconds, rows * dim * 4 * 2))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
