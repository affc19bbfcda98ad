"""Similarity search: ours against faiss, scikit-learn and sentence-transformers.

One run, same process, same threads, cases timed in rounds (one run of each per round,
after a checked first run; medians of 5; a case whose first run took over 5 s keeps
that run's time):

- ``topk`` at every shape (N = 200k and 1M, D = 128 and 384, Q = 1, 100 and 1,000,
  k = 10 and 100): ``df.cosim.topk`` on a pandas frame (Arrow fixed_size_list column,
  normalised per call) and on the same frame prepared once (``df.cosim.prepare``),
  against faiss ``IndexFlatIP.search`` (index built once, from L2-normalised rows),
  scikit-learn ``NearestNeighbors(metric="cosine", algorithm="brute").kneighbors``
  (fitted once) and sentence-transformers ``util.semantic_search``; every result set
  compared with faiss's (differences allowed only at float64 near-ties);
- ``neighbors(threshold)`` against faiss ``range_search`` on the same rows, same pair set;
- ``join(k=10)`` (2 x 2 partitions) against one bare ``torch.mm`` of the same shapes, and
  against a large product's rate;
- ``dedup``: rows/s on data with planted near-duplicates, checked against float64;
- scaling of ``topk`` with N, and ``neighbors(k)`` on a 2-worker LocalCluster giving the
  same result as the eager frame;
- peak RSS growth of one pair task (a subprocess, every allocation above 1 MiB mapped on
  its own, so RSS follows the live tensors).

Prints a table per case and writes ``benchmarks/results/<name>.json`` (default
``search-cpu<cores>``; with the machine and its load average, and each case's load
before and after it), one key per case.  Usage::

    python -m benchmarks.search              # the full run: ~15 minutes on 2 quiet cores
    python -m benchmarks.search --quick      # seconds, for the smoke test

A new case is a ``bench_`` function in ``benchmarks/search_cases.py`` that measures,
checks and returns its record, a ``report_`` function here that prints it, and a line
in ``CASES`` with its sizes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

import click
import torch

from benchmarks import harness
from benchmarks.search_cases import (
    FAISS,
    OURS,
    PREPARED,
    RANGE_FAISS,
    SKLEARN,
    ST,
    bench_cluster,
    bench_dedup,
    bench_join,
    bench_range,
    bench_scaling,
    bench_topk,
    peak_memory,
)

SECONDS = harness.Column("s", "seconds", ".3f")


def _case_table(seconds: dict[str, float], *more: harness.Column) -> None:
    """One line per case: its seconds and ``more`` (keyed by the case's name)."""
    harness.print_table(
        [harness.Column("case", "case", align="<"), SECONDS, *more],
        [{"case": name, "seconds": s} for name, s in seconds.items()],
    )


def report_topk(t: dict[str, Any]) -> None:
    names = [OURS, PREPARED, FAISS, SKLEARN, ST]
    short = {OURS: "ours", PREPARED: "prepared", FAISS: "faiss", SKLEARN: "sklearn", ST: "s-t"}

    def secs(name: str) -> Callable[[dict[str, Any]], str]:
        def cell(r: dict[str, Any]) -> str:
            mark = "*" if r["rounds"][name] < max(r["rounds"].values()) else ""
            return f"{r['seconds'][name]:.4f}{mark}"

        return cell

    def sets(r: dict[str, Any]) -> str:
        v = r["sets_vs_faiss"]
        bad = [short[c] for c, s in v.items() if s["differ"] != s["differ_only_at_near_ties"]]
        return "same" if not bad else "DIFFER: " + ",".join(bad)

    columns = [
        harness.Column("N", "rows", ","),
        harness.Column("D", "dim"),
        harness.Column("Q", "queries", ","),
        harness.Column("k", "k"),
        *[harness.Column(f"{short[n]} s", secs(n)) for n in names],
        harness.Column("ours x faiss", lambda r: r["x_faiss"][OURS], ".2f"),
        harness.Column("prepared x faiss", lambda r: r["x_faiss"][PREPARED], ".2f"),
        harness.Column("sets vs faiss", sets, align="<"),
        harness.Column("load", "load_before", align="<"),
    ]
    tiles = "bfloat16" if t.get("cpu_bfloat16") else "float32"
    print(f"topk: seconds (median; * fewer rounds), ours on {tiles} tiles, peers {t['peers']}")
    harness.print_table(columns, t["shapes"])


def report_range(rows: list[dict[str, Any]]) -> None:
    columns = [
        harness.Column("range N", "rows", ","),
        harness.Column("D", "dim"),
        harness.Column("thr", "threshold"),
        harness.Column("pairs", "pairs", ","),
        harness.Column(
            "ours s", lambda r: r["seconds"]["ours: df.cosim.neighbors(threshold)"], ".3f"
        ),
        harness.Column("faiss s", lambda r: r["seconds"][RANGE_FAISS], ".3f"),
        harness.Column("ours x faiss", "throughput_vs_faiss", ".2f"),
        harness.Column("differ beyond near-ties", "pair_sets_differ_beyond_near_ties"),
        harness.Column("load", "load_before", align="<"),
    ]
    harness.print_table(columns, rows)


def report_join(rows: list[dict[str, Any]]) -> None:
    columns = [
        harness.Column("join k", "k"),
        harness.Column("left", "left_rows", ","),
        harness.Column("right", "right_rows", ","),
        harness.Column("D", "dim"),
        harness.Column("join s", lambda r: r["seconds"]["join"], ".3f"),
        harness.Column("bare mm s", lambda r: r["seconds"]["bare"], ".3f"),
        harness.Column("x bare mm", "x_bare_mm", ".2f"),
        harness.Column("of large mm rate", "fraction_of_large_mm", ".2f"),
        harness.Column("load", "load_before", align="<"),
    ]
    harness.print_table(columns, rows)


def report_dedup(d: dict[str, Any]) -> None:
    print(
        f"dedup {d['rows']:,} rows D={d['dim']} thr={d['threshold']}: kept {d['kept']:,}, "
        f"{d['rows_per_s']:,.0f} rows/s, mismatches vs float64 {d['mismatches_vs_float64']}"
        f"  load {d['load']}"
    )


def report_scaling(rows: list[dict[str, Any]]) -> None:
    columns = [
        harness.Column("scaling topk N", "rows", ",", align="<"),
        SECONDS,
        harness.Column("rows x queries/s", "rows_per_s", ",.0f"),
        harness.Column("load", "load", align="<"),
    ]
    harness.print_table(columns, rows)


def report_cluster(c: dict[str, Any]) -> None:
    print(
        f"cluster {c['workers']} workers neighbors k={c['k']} N={c['rows']:,}: "
        f"{c['seconds']:.2f} s, same as eager: {c['same_result_as_eager']}"
    )


def report_peak_memory(m: dict[str, Any]) -> None:
    print(
        f"peak RSS growth over the inputs of one pair task {m['queries']} x {m['rows']:,}: "
        f"{m['peak_rss_growth_bytes'] / 2**20:.0f} MiB "
        f"(sampled every ms; inputs "
        f"{m['inputs_bytes'] / 2**20:.0f} MiB, score matrix "
        f"{m['score_matrix_bytes'] / 2**20:.0f} MiB, tile budget 32 MiB)"
    )


class SearchCase(NamedTuple):
    """One case of the run: ``run(*full)`` (``run(*quick)`` with --quick) measures and
    checks, and returns its record in the results file; ``report(record)`` prints it."""

    run: Callable[..., Any]
    report: Callable[[Any], None]
    full: tuple[Any, ...]
    quick: tuple[Any, ...]


# The results file's keys, in the order the cases run, with each case's arguments.
CASES = {
    "topk": SearchCase(
        bench_topk,
        report_topk,
        ([200_000, 1_000_000], [128, 384], [1, 100, 1000], [10, 100], 5),
        ([2000], [64], [1, 50], [10], 1),
    ),
    "range": SearchCase(
        bench_range, report_range, ([10_000, 40_000], 128, 0.9, 5), ([1000], 64, 0.9, 1)
    ),
    "join": SearchCase(
        bench_join,
        report_join,
        ([(5000, 50_000, 128), (5000, 50_000, 384)], 10, 5),
        ([(500, 2000, 64)], 10, 1),
    ),
    "dedup": SearchCase(
        bench_dedup, report_dedup, (20_000, 128, 0.95, 6000), (2000, 64, 0.95, 1000)
    ),
    "scaling": SearchCase(
        bench_scaling,
        report_scaling,
        ([25_000, 50_000, 100_000], 500, 128, 10),
        ([1000, 2000], 50, 64, 10),
    ),
    "cluster": SearchCase(bench_cluster, report_cluster, (10_000, 128, 5), (600, 64, 5)),
    "peak_memory": SearchCase(
        peak_memory, report_peak_memory, (1000, 200_000, 128), (200, 5000, 64)
    ),
}


@click.command()
@click.option("--quick", is_flag=True, help="Tiny sizes, seconds: the smoke test.")
@harness.results_options()
def main(quick: bool, output: harness.Output) -> None:
    """Similarity search: ours against faiss, scikit-learn and sentence-transformers."""
    torch.set_num_threads(os.cpu_count() or 1)

    def run(log: harness.Log) -> harness.Record:
        record = {}
        for key, case in CASES.items():
            log(f"{key}{' (quick)' if quick else ''}")
            record[key] = case.run(*(case.quick if quick else case.full))
        return record

    def report(record: harness.Record) -> None:
        for key, case in CASES.items():
            case.report(record[key])

    # A quick run names its own file: it must not replace the full run's, which the docs quote.
    name = output.name or f"search-cpu{os.cpu_count()}{'-quick' if quick else ''}"
    harness.execute_benchmark(harness.Config(output, name, run, report))


if __name__ == "__main__":
    main()
