"""Clustered neighbours and dedup (issue 24) against exact all-pairs, with measured recall.

Rows with the structure of real embeddings (``dask_cosim.datasets.embedding_arrays``: a
few thousand directions with spread, planted near-duplicates), one dask partition per
``--partition-rows`` rows, generated partition by partition on ``--device``:

- exact all-pairs ``neighbors(threshold=...)`` at a few smaller sizes (``--exact-rows``),
  fitted by a quadratic and extrapolated to ``--rows`` (all-pairs grows as rows^2);
- ``method="clustered"`` ``neighbors`` and ``dedup`` at each threshold, for each
  ``--n-probe`` mode: ``exact`` (the provable skip rule, recall 1), an integer (at most
  that many clusters probed per row) and 0 (each row against its own cluster only: NeMo
  Curator's semantic dedup, on the same clusters), into each of ``--clusters`` cluster
  counts (default: the library's, about sqrt(rows));
- beside every clustered figure its speed-up against the extrapolated exact time, the
  speed-up its plan expected (``Plan.cost_vs_exact``: the clustered method runs here even
  where the plan would run exact all-pairs instead), and its recall against exact
  all-pairs on ``--recall-rows`` sampled rows (``dask_cosim.clustered_recall``; the
  truth is computed once, at the lowest threshold).

Usage::

    python -m benchmarks.clustered                         # CPU: 1M x 384 (long)
    python -m benchmarks.clustered --rows 200000 --exact-rows 25000,50000,100000
    python -m benchmarks.clustered --quick                 # seconds, for the smoke test
    python -m benchmarks.clustered --rows 200000 --exact-rows '' --clusters 224,447,894
    python -m benchmarks.clustered --device cuda --rows 10000000 --dim 768
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import click
import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import torch

from benchmarks import harness as h
from dask_cosim import clustered
from dask_cosim import clustered_recall as cr
from dask_cosim.clustered_plan import default_clusters
from dask_cosim.datasets import embedding_arrays
from dask_cosim.io import vectors_to_arrow


def _piece(
    part: int, start: int, stop: int, dim: int, directions: int, device: str, dtype: str
) -> Any:
    x, _ = embedding_arrays(stop - start, dim, directions=directions, seed=0, part=part,
                            device=device)  # fmt: skip
    x = x.to(getattr(torch, dtype)).cpu().numpy()
    return pd.DataFrame({"emb": vectors_to_arrow(x)}, index=pd.RangeIndex(start, stop))


def frame(
    rows: int, dim: int, directions: int, device: str, part_rows: int, dtype: str = "float32"
) -> dd.DataFrame:
    """``rows`` generated rows of ``dtype`` in partitions of ``part_rows`` (unique labels
    0..rows-1)."""
    bounds = [*range(0, rows, part_rows), rows]
    parts = [
        dask.delayed(_piece)(i, a, b, dim, directions, device, dtype)
        for i, (a, b) in enumerate(itertools.pairwise(bounds))
    ]
    meta = _piece(0, 0, 1, dim, 1, "cpu", dtype).iloc[:0]
    df = dd.from_delayed(parts, meta=meta, divisions=(*bounds[:-1], rows - 1), verify_meta=False)
    # Held in memory when it fits easily (every run reads it several times), else made again.
    size = rows * dim * getattr(torch, dtype).itemsize
    return df.persist() if size < 40 * 2**30 else df


def timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def quadratic(points: list[tuple[int, float]], rows: int) -> float:
    """Seconds at ``rows`` from ``a n^2 + b n + c`` fitted to ``points`` by least squares
    with a, b, c >= 0 (three noisy points fitted freely can bend the curve downwards)."""
    from scipy.optimize import nnls

    n = np.array([p[0] for p in points], dtype=np.float64) / rows
    s = np.array([p[1] for p in points])
    coeffs, _ = nnls(np.stack([n * n, n, np.ones_like(n)], axis=1), s)
    return float(coeffs.sum())


TABLE = [
    h.Column("op", "op", align="<"),
    h.Column("threshold", "threshold", ".2f"),
    h.Column("n_probe", "n_probe", align="<"),
    h.Column("clusters", "clusters", "d"),
    h.Column("s", "seconds", ".1f", 7),
    h.Column("x exact", "x_exact", ".1f"),
    h.Column("recall", "recall", ".5f"),
    h.Column("expected", "expected", "d"),
    h.Column("extra", "extra", "d"),
    h.Column("result rows", "result_rows", ",d"),
    h.Column("copies/row", "copies_per_row", ".1f"),
    h.Column(
        "plan: x exact", lambda r: 1 / r["cost_vs_exact"] if r.get("cost_vs_exact") else None, ".1f"
    ),
    h.Column("note", lambda r: r.get("skipped"), align="<"),
]


def _case(
    df: dd.DataFrame, op: str, t: float, mode: int | None, k: int, truth: Any, est: Any
) -> h.Record:
    """One clustered run into ``k`` clusters, timed, with its recall on the truth's
    sampled rows."""
    opts = {"method": "clustered", "n_probe": mode, "clusters": k}
    if op == "neighbors":
        secs, got = timed(lambda: df.cosim.neighbors("emb", threshold=t, **opts).compute())
        rec = cr.neighbors_recall(truth, got, t)
    else:
        # The kept rows' labels only: the whole frame need not come back.
        secs, got = timed(lambda: df.cosim.dedup("emb", t, **opts)[[]].compute())
        rec = cr.dedup_recall(truth, got, t)
    return {
        "op": op, "threshold": t, "n_probe": "exact" if mode is None else str(mode),
        "clusters": k, "seconds": secs, "x_exact": est / secs if est else None,
        "recall": rec.recall, "expected": rec.expected, "found": rec.found, "extra": rec.extra,
        "result_rows": len(got),
    }  # fmt: skip


def _skipped(op: str, t: float, k: int, copies: float, cost: float) -> h.Record:
    return {
        "op": op, "threshold": t, "n_probe": "exact", "clusters": k, "copies_per_row": copies,
        "cost_vs_exact": cost,
        "skipped": f"{copies:.0f} copies per row > --max-copies",
        **dict.fromkeys(("seconds", "x_exact", "recall", "expected", "extra", "result_rows")),
    }  # fmt: skip


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


@click.command()
@click.option("--rows", default=1_000_000, show_default=True, help="Rows N.")
@click.option("--dim", default=384, show_default=True, help="Vector length D.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "float16"]),
    default="float32",
    show_default=True,
    help="The vectors' dtype (the routing shuffle carries it as it is).",
)
@click.option("--directions", default=2000, show_default=True, help="Directions of the data.")
@click.option("--thresholds", default="0.9,0.95", show_default=True)
@click.option(
    "--n-probe",
    "modes",
    default="exact,2,0",
    show_default=True,
    help="Clustered modes: 'exact' (provable) or integers (0: own cluster only).",
)
@click.option(
    "--exact-rows",
    default="100000,200000,300000",
    show_default=True,
    help="Sizes of the exact all-pairs runs ('' for none).",
)
@click.option(
    "--clusters",
    default="",
    show_default=True,
    help="Cluster counts to try, e.g. 200,450,900 ('': the default, about sqrt(rows)).",
)
@click.option("--recall-rows", default=10_000, show_default=True)
@click.option("--partition-rows", default=100_000, show_default=True)
@click.option(
    "--max-copies",
    default=8.0,
    show_default=True,
    help="Skip the provable mode where its plan copies each row to more blocks.",
)
@click.option("--quick", is_flag=True, help="Tiny sizes, for the smoke test.")
@h.results_options()
def main(
    rows: int, dim: int, device: str, dtype: str, directions: int, thresholds: str, modes: str,
    exact_rows: str, clusters: str, recall_rows: int, partition_rows: int, max_copies: float,
    quick: bool, output: h.Output,
) -> None:  # fmt: skip
    """Clustered neighbours and dedup against exact all-pairs (extrapolated), with recall."""
    if quick:
        rows, dim, directions, exact_rows = 6000, 32, 40, "1000,2000,3000"
        recall_rows, partition_rows = 500, 2000
    ts = sorted(float(t) for t in thresholds.split(","))
    probes = [None if m == "exact" else int(m) for m in modes.split(",")]
    counts = _ints(clusters) or [default_clusters(rows)]

    record: h.Record = {}  # filled in step by step: an interrupt keeps what ran

    def run(log: h.Log) -> h.Record:
        record.update({
            "params": {"rows": rows, "dim": dim, "device": device, "dtype": dtype,
                       "directions": directions,
                       "partition_rows": partition_rows, "recall_rows": recall_rows},
            "load_before": h.load_text(),
            "exact": [],
            "cases": [],
        })  # fmt: skip
        # The clustered method itself, also where its plan would run exact all-pairs
        # instead: the table sets the plan's estimate beside the time measured.
        measured = {"cosim.device": device, "cosim.search.clustered.exact-when-cheaper": False}
        with dask.config.set(measured):
            # Untimed: the kernels' first calls compile them.
            warm = frame(2 * min(partition_rows, 1000), dim, directions, device, 1000, dtype)
            warm.cosim.neighbors("emb", threshold=ts[0]).compute()
            warm.cosim.neighbors("emb", threshold=ts[0], method="clustered").compute()
            exact = []
            for n in _ints(exact_rows):
                small = frame(n, dim, directions, device, partition_rows, dtype)
                secs, pairs = timed(
                    lambda small=small: small.cosim.neighbors("emb", threshold=ts[0]).compute()
                )
                log(f"exact all-pairs {n:,} rows: {secs:.1f} s, {len(pairs):,} pairs")
                exact.append((n, secs))
                record["exact"].append({"rows": n, "seconds": secs})
            est = quadratic(exact, rows) if exact else None
            record["exact_extrapolated_seconds"] = est
            # For comparison: all-pairs as pure n^2 from the largest run (the fit is lower).
            record["exact_n2_from_largest_seconds"] = (
                exact[-1][1] * (rows / exact[-1][0]) ** 2 if exact else None
            )
            df = frame(rows, dim, directions, device, partition_rows, dtype)
            secs, truth = timed(lambda: cr.sample_truth(df, "emb", ts[0], sample_rows=recall_rows))
            record["truth_seconds"] = secs
            log(f"truth of {recall_rows:,} sampled rows: {secs:.1f} s")
            cases = record["cases"]
            for t, k, mode in itertools.product(ts, counts, probes):
                # The plan alone (k-means, the clusters' radii): how many blocks each
                # row is copied to, and its cost against all pairs.  A provable mode
                # past --max-copies would hold that many copies of the rows in the
                # shuffle: skipped, and said so.
                p = clustered.plan(df, "emb", t, n_probe=mode, clusters=k)
                copies = p.copies / max(p.stats.rows, 1)
                log(f"t={t} n_probe={mode}: {k} clusters, {copies:.1f} copies/row, "
                    f"{p.cost_vs_exact:.2f} of the all-pairs cost expected")  # fmt: skip
                for op in ("neighbors", "dedup"):
                    if mode is None and copies > max_copies:
                        cases.append(_skipped(op, t, k, copies, p.cost_vs_exact))
                        continue
                    case = _case(df, op, t, mode, k, truth, est)
                    case["copies_per_row"] = copies
                    case["cost_vs_exact"] = p.cost_vs_exact
                    log(f"{op} t={t} n_probe={case['n_probe']} clusters={k}: "
                        f"{case['seconds']:.1f} s, recall {case['recall']:.5f}")  # fmt: skip
                    cases.append(case)
        record["load_after"] = h.load_text()
        return record

    def report(record: h.Record) -> None:
        for e in record.get("exact", []):
            print(f"exact all-pairs  {e['rows']:>11,} rows  {e['seconds']:8.1f} s")
        est = record.get("exact_extrapolated_seconds")
        if est is not None:
            print(
                f"exact all-pairs  {rows:>11,} rows  {est:8.1f} s  (quadratic fit, a, b, c >= 0; "
                f"n^2 from the largest run: {record['exact_n2_from_largest_seconds']:.1f} s)"
            )
        if "truth_seconds" in record:
            print(f"recall truth: {recall_rows:,} sampled rows in {record['truth_seconds']:.1f} s")
        h.print_table(TABLE, record.get("cases", []), f"clustered, N={rows:,} D={dim} on {device}")

    name = output.name or f"clustered-{device}-{rows}x{dim}" + (
        "" if dtype == "float32" else f"-{dtype}"
    )
    h.execute_benchmark(h.Config(output, name, run, report, partial=record))


if __name__ == "__main__":
    main()
