"""dedup and groups of a frame where many rows are one vector (boilerplate in a scraped
corpus): every pair of the copies matches, more pairs than a task may hold, so the pair
tasks search their rows again by blocks (``dask_cosim.search_reduced``; the clustered
method's blocks: ``clustered_blocks.kept_pairs``).

    python -m benchmarks.duplicates        # 40,000 x 64 rows, 20,000 of them one vector

The rows: a mixture of 200 directions with spread (so that the clustered method has
clusters to use), then the first ``--copies`` rows made one vector (scaled copies).  At
``--threshold`` 0.95 no two other rows match, so each answer is known: the copies
collapse to their first.  Prints, per search (one process, dask's threads scheduler, the
default config but ``--max-result-bytes``), its seconds (median of ``--repeat``), what
it kept, and whether that is the known answer.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import click
import dask
import numpy as np
import pandas as pd

import dask_cosim


def frame(rows: int, copies: int, dim: int, partitions: int) -> Any:
    """The dask frame of the module docstring, with an "id" column (its positions)."""
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((200, dim))
    x = centres[rng.integers(0, 200, rows)] + 0.6 * rng.standard_normal((rows, dim))
    x[:copies] = x[0] * rng.uniform(0.5, 2.0, size=(copies, 1))
    pdf = pd.DataFrame({"id": np.arange(rows), "emb": list(x.astype(np.float32))})
    return dask_cosim.from_pandas(pdf, npartitions=partitions)


def searches(df: Any, threshold: float) -> dict[str, Callable[[], int]]:
    """Each search, run and counted: the rows it keeps (groups: its groups; the removed
    rows: their number)."""

    def dedup(**how: Any) -> int:
        return len(df.cosim.dedup("emb", threshold, **how).compute())

    def removed() -> int:
        kept, gone = df.cosim.dedup("emb", threshold, return_removed=True, columns=["id"])
        return len(dask.compute(kept, gone)[1])

    def groups() -> int:
        return int(df.cosim.groups("emb", threshold).compute()["group"].nunique())

    def clustered() -> int:
        # The clustered blocks themselves, where the plan would run exact all-pairs.
        with dask.config.set({"cosim.search.clustered.exact-when-cheaper": False}):
            return dedup(method="clustered")

    return {
        "dedup": dedup,
        "dedup, removed rows": removed,
        "groups": groups,
        "dedup, clustered": clustered,
    }


@click.command()
@click.option("--rows", default=40_000, show_default=True)
@click.option("--copies", default=20_000, show_default=True, help="Rows that are one vector.")
@click.option("--dim", default=64, show_default=True)
@click.option("--threshold", default=0.95, show_default=True)
@click.option("--partitions", default=2, show_default=True)
@click.option("--repeat", default=1, show_default=True)
@click.option(
    "--max-result-bytes",
    default="auto",
    show_default=True,
    help="cosim.search.max-result-bytes (a small one forces the search by blocks).",
)
def main(
    rows: int,
    copies: int,
    dim: int,
    threshold: float,
    partitions: int,
    repeat: int,
    max_result_bytes: str,
) -> None:
    df = frame(rows, copies, dim, partitions)
    want = {"dedup": rows - copies + 1, "dedup, removed rows": copies - 1}
    want |= {"groups": rows - copies + 1, "dedup, clustered": rows - copies + 1}
    budget = int(max_result_bytes) if max_result_bytes.isdigit() else max_result_bytes
    settings = {"scheduler": "threads", "cosim.search.max-result-bytes": budget}
    click.echo(
        f"{rows:,} x {dim} rows, {copies:,} of them one vector ({copies * (copies - 1) // 2:,} "
        f"pairs), {partitions} partitions, threshold {threshold}, "
        f"max-result-bytes {max_result_bytes}"
    )
    click.echo(f"{'search':24} {'median s':>9} {'runs':>5} {'found':>8} {'known':>8}")
    with dask.config.set(settings):
        for name, run in searches(df, threshold).items():
            times, found = [], 0
            for _ in range(repeat):
                start = time.perf_counter()
                found = run()
                times.append(time.perf_counter() - start)
            verdict = "yes" if found == want[name] else f"NO ({want[name]:,})"
            click.echo(
                f"{name:24} {statistics.median(times):9.2f} {repeat:5d} {found:8,} {verdict:>8}"
            )


if __name__ == "__main__":
    main()
