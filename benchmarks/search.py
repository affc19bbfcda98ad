"""Similarity search: ours against faiss, scikit-learn and sentence-transformers.

One run, same process, same threads, ratios measured side by side:

- ``topk``: ``df.cosim.topk`` (pandas frame, Arrow fixed_size_list column, normalised
  inside) vs faiss ``IndexFlatIP`` (add + search on L2-normalised arrays), scikit-learn
  ``NearestNeighbors(metric="cosine", algorithm="brute")`` and sentence-transformers
  ``util.semantic_search``; result sets compared with faiss's;
- ``neighbors(threshold)`` vs faiss ``range_search`` on the same rows, same pair set;
- ``join(k)`` against the machine's matrix-multiply rate (a large ``torch.mm``);
- ``dedup``: rows/s on data with planted near-duplicates, checked against float64;
- scaling of ``topk`` with N, and ``neighbors(k)`` on a 2-worker LocalCluster giving the
  same result as the eager frame;
- peak RSS growth of one pair task (a subprocess, every allocation above 1 MiB mapped on
  its own, so RSS follows the live tensors).

Prints a table per case and writes ``benchmarks/results/<name>.json`` (default
``search-cpu<cores>``; with the machine and its load average), one key per case.  Usage::

    python -m benchmarks.search              # the default run, ~2 minutes on 2 cores
    python -m benchmarks.search --quick      # seconds, for the smoke test

A new case is a ``bench_`` function that measures, checks and returns its record, a
``report_`` function that prints it, and a line in ``CASES`` with its sizes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import click
import numpy as np
import pandas as pd
import torch

import dask_cosim
from benchmarks import harness
from benchmarks.harness import embeddings, load_text, median_seconds, vector_frame


def same_sets(ours: np.ndarray, theirs: np.ndarray, exact: np.ndarray, k: int) -> dict[str, Any]:
    """Per query, do the two index sets agree (up to near-ties |d| < 1e-6 at the k-th)?"""
    differ = 0
    near_tie_only = 0
    for row in range(len(ours)):
        a, b = set(ours[row].tolist()), set(theirs[row].tolist())
        if a == b:
            continue
        differ += 1
        kth = np.sort(exact[row])[::-1][k - 1]
        swapped = [j for j in a ^ b if j >= 0]
        if all(abs(exact[row, j] - kth) < 1e-6 for j in swapped):
            near_tie_only += 1
    return {"queries": len(ours), "differ": differ, "differ_only_at_near_ties": near_tie_only}


def bench_topk(n: int, q: int, d: int, k: int, repeat: int) -> dict[str, Any]:
    import faiss
    from sentence_transformers import util
    from sklearn.neighbors import NearestNeighbors

    x = embeddings(n, d, seed=0, clusters=max(1, n // 100))
    queries = embeddings(q, d, seed=1, clusters=0)
    df = vector_frame(x)
    out: dict[str, Any] = {"rows": n, "queries": q, "dim": d, "k": k, "load_before": load_text()}

    def ours() -> pd.DataFrame:
        return df.cosim.topk(queries, "emb", k=k)

    def faiss_flat() -> tuple[np.ndarray, np.ndarray]:
        index = faiss.IndexFlatIP(d)
        index.add(x)
        return index.search(queries, k)

    xt, qt = torch.from_numpy(x), torch.from_numpy(queries)

    def st_search() -> Any:
        return util.semantic_search(qt, xt, top_k=k)

    nn = NearestNeighbors(n_neighbors=k, metric="cosine", algorithm="brute")

    def sklearn_nn() -> Any:
        return nn.fit(x).kneighbors(queries, k)

    cases = {
        "ours: df.cosim.topk": ours,
        "faiss IndexFlatIP": faiss_flat,
        "sentence-transformers semantic_search": st_search,
        "scikit-learn NearestNeighbors brute": sklearn_nn,
    }
    seconds = {name: median_seconds(fn, repeat) for name, fn in cases.items()}
    out["seconds"] = seconds
    out["load_after"] = load_text()
    base = seconds["faiss IndexFlatIP"]
    out["throughput_vs_faiss"] = {name: base / s for name, s in seconds.items()}
    got = ours()
    mine = got["match"].to_numpy().reshape(q, k)
    _, theirs = faiss_flat()
    exact = queries.astype(np.float64) @ x.astype(np.float64).T
    out["result_sets_vs_faiss"] = same_sets(mine, theirs, exact, k)
    st = np.array([[h["corpus_id"] for h in hits] for hits in st_search()])
    out["result_sets_vs_sentence_transformers"] = same_sets(mine, st, exact, k)
    out["queries_per_s"] = {name: q / s for name, s in seconds.items()}
    return out


def bench_range(n: int, d: int, threshold: float, repeat: int) -> dict[str, Any]:
    import faiss

    x = embeddings(n, d, seed=2, clusters=max(1, n // 50), noise=0.25)
    df = vector_frame(x)

    def ours() -> pd.DataFrame:
        return df.cosim.neighbors("emb", threshold=threshold)

    def faiss_range() -> Any:
        index = faiss.IndexFlatIP(d)
        index.add(x)
        return index.range_search(x, threshold)

    seconds = {
        "ours: df.cosim.neighbors(threshold)": median_seconds(ours, repeat),
        "faiss IndexFlatIP.range_search": median_seconds(faiss_range, repeat),
    }
    got = ours()
    mine = set(zip(got["left"].tolist(), got["right"].tolist()))
    lims, _, labels = faiss_range()
    rows = np.repeat(np.arange(n), np.diff(lims.astype(np.int64)))
    theirs = {(int(i), int(j)) for i, j in zip(rows, labels) if i < j}
    exact = {}
    for i, j in mine ^ theirs:
        exact[(i, j)] = float(x[i].astype(np.float64) @ x[j].astype(np.float64))
    unexplained = [p for p, s in exact.items() if abs(s - threshold) >= 1e-6]
    return {
        "rows": n,
        "dim": d,
        "threshold": threshold,
        "pairs": len(mine),
        "seconds": seconds,
        "throughput_vs_faiss": seconds["faiss IndexFlatIP.range_search"]
        / seconds["ours: df.cosim.neighbors(threshold)"],
        "pair_sets_differ_beyond_near_ties": len(unexplained),
        "pair_sets_differ_at_near_ties": len(exact) - len(unexplained),
        "load": load_text(),
    }


def bench_join(nl: int, nr: int, d: int, k: int, repeat: int) -> dict[str, Any]:
    import dask

    left = vector_frame(embeddings(nl, d, seed=3, clusters=nl // 100))
    right = vector_frame(embeddings(nr, d, seed=4, clusters=nr // 100))
    a, b = torch.randn(4096, d), torch.randn(d, 32768)

    def mm() -> torch.Tensor:
        return torch.mm(a, b)

    lazy = dask_cosim.from_pandas(left, npartitions=2).cosim.join(
        dask_cosim.from_pandas(right, npartitions=2), "emb", k=k
    )

    def ours() -> pd.DataFrame:
        with dask.config.set(scheduler="sync"):  # torch uses every core inside a task
            return lazy.compute()

    t_mm = median_seconds(mm, repeat)
    t_join = median_seconds(ours, repeat)
    mm_rate = 2 * 4096 * d * 32768 / t_mm
    join_rate = 2 * nl * nr * d / t_join
    return {
        "left_rows": nl,
        "right_rows": nr,
        "dim": d,
        "k": k,
        "seconds": t_join,
        "join_gflops": join_rate / 1e9,
        "torch_mm_gflops": mm_rate / 1e9,
        "fraction_of_mm": join_rate / mm_rate,
        "load": load_text(),
    }


def bench_dedup(n: int, d: int, threshold: float, check_rows: int) -> dict[str, Any]:
    rng = np.random.default_rng(5)
    base = embeddings(n // 2, d, seed=6, clusters=0)
    copies = base[rng.integers(0, len(base), n - len(base))]
    copies = copies + 0.02 * rng.standard_normal(copies.shape).astype(np.float32)
    x = np.concatenate([base, copies])[rng.permutation(n)].astype(np.float32)
    df = vector_frame(x)
    t0 = time.perf_counter()
    kept = df.cosim.dedup("emb", threshold)
    seconds = time.perf_counter() - t0
    # float64 reference on the first check_rows rows.
    sub = x[:check_rows].astype(np.float64)
    sub /= np.linalg.norm(sub, axis=1, keepdims=True)
    s = sub @ sub.T
    want = ~np.tril(s >= threshold, -1).any(axis=1)
    got = vector_frame(x[:check_rows]).cosim.dedup("emb", threshold)
    near = np.tril(np.abs(s - threshold) < 1e-6, -1).any(axis=1)
    mismatch = (np.isin(np.arange(check_rows), got.index.to_numpy()) != want) & ~near
    return {
        "rows": n,
        "dim": d,
        "threshold": threshold,
        "kept": len(kept),
        "seconds": seconds,
        "rows_per_s": n / seconds,
        "pair_scores_per_s": n * (n - 1) / 2 / seconds,
        "checked_rows": check_rows,
        "mismatches_vs_float64": int(mismatch.sum()),
        "load": load_text(),
    }


def bench_scaling(sizes: list[int], q: int, d: int, k: int) -> list[dict[str, Any]]:
    queries = embeddings(q, d, seed=1)
    rows = []
    for n in sizes:
        df = vector_frame(embeddings(n, d, seed=0, clusters=n // 100))

        def topk(df: pd.DataFrame = df) -> pd.DataFrame:
            return df.cosim.topk(queries, "emb", k=k)

        s = median_seconds(topk, 1)
        rows.append({"rows": n, "seconds": s, "rows_per_s": n * q / s, "load": load_text()})
    return rows


def bench_cluster(n: int, d: int, k: int) -> dict[str, Any]:
    from distributed import Client, LocalCluster

    x = embeddings(n, d, seed=7, clusters=n // 100)
    df = vector_frame(x)
    eager = df.cosim.neighbors("emb", k=k)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True) as cluster:
        with Client(cluster):
            ddf = dask_cosim.from_pandas(df, npartitions=4)
            t0 = time.perf_counter()
            got = ddf.cosim.neighbors("emb", k=k).compute().reset_index(drop=True)
            seconds = time.perf_counter() - t0
    return {
        "rows": n,
        "dim": d,
        "k": k,
        "workers": 2,
        "partitions": 4,
        "seconds": seconds,
        "same_result_as_eager": bool(got.equals(eager)),
        "load": load_text(),
    }


def peak_memory(nq: int, nr: int, d: int) -> dict[str, Any]:
    code = textwrap.dedent(
        f"""
        import threading, time, torch, pandas as pd
        from dask_cosim import search_partition as search
        def rss():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * 4096
        def side(n):
            return search.Side(search.sk.prepare(torch.randn(n, {d}), eps=1e-8),
                               pd.RangeIndex(n), 0, "v", None)
        q, r = side({nq}), side({nr})
        tiles = {{"cpu": 32 << 20, "cuda": 32 << 20}}
        search.join_pair_topk(q, r, 10, None, tiles)  # first call: BLAS and thread pools
        peak, done = [0], [False]
        def sample():
            while not done[0]:
                peak[0] = max(peak[0], rss())
                time.sleep(0.001)
        base = rss()
        t = threading.Thread(target=sample)
        t.start()
        search.join_pair_topk(q, r, 10, None, tiles)
        search.pair_threshold(q, r, 0.5, tiles)
        done[0] = True
        t.join()
        print(base, peak[0] - base)
        """
    )
    # Every allocation above 1 MiB gets its own mapping, returned when freed: the sampled
    # RSS follows the live tensors, not what malloc keeps cached.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if proc.returncode:
        raise RuntimeError(proc.stderr)
    base, growth = (int(v) for v in proc.stdout.split()[-2:])
    return {
        "queries": nq,
        "rows": nr,
        "dim": d,
        "tile_bytes": 32 << 20,
        "inputs_bytes": (nq + nr) * d * 4 * 2,  # raw and unit vectors
        "peak_rss_growth_bytes": growth,
        "rss_before_bytes": base,
        "score_matrix_bytes": nq * nr * 4,
    }


SECONDS = harness.Column("s", "seconds", ".3f")


def _case_table(seconds: dict[str, float], *more: harness.Column) -> None:
    """One line per case: its seconds and ``more`` (keyed by the case's name)."""
    harness.print_table(
        [harness.Column("case", "case", align="<"), SECONDS, *more],
        [{"case": name, "seconds": s} for name, s in seconds.items()],
    )


def report_topk(t: dict[str, Any]) -> None:
    print(
        f"topk  N={t['rows']:,} Q={t['queries']} D={t['dim']} k={t['k']}  load {t['load_before']}"
    )
    _case_table(
        t["seconds"],
        harness.Column("x faiss", lambda r: t["throughput_vs_faiss"][r["case"]], ".2f"),
        harness.Column("queries/s", lambda r: t["queries_per_s"][r["case"]], ",.0f"),
    )
    print(f"  result sets vs faiss: {t['result_sets_vs_faiss']}")
    print(f"  result sets vs sentence-transformers: {t['result_sets_vs_sentence_transformers']}")


def report_range(g: dict[str, Any]) -> None:
    print(
        f"range N={g['rows']:,} D={g['dim']} thr={g['threshold']}  pairs {g['pairs']:,}  "
        f"load {g['load']}"
    )
    _case_table(g["seconds"])
    print(
        f"  ours vs faiss range_search: {g['throughput_vs_faiss']:.2f}x; pair sets differ "
        f"beyond near-ties: {g['pair_sets_differ_beyond_near_ties']}"
    )


def report_join(j: dict[str, Any]) -> None:
    print(
        f"join  {j['left_rows']:,} x {j['right_rows']:,} D={j['dim']} k={j['k']}: "
        f"{j['seconds']:.2f} s, "
        f"{j['join_gflops']:.1f} GFLOP/s = {j['fraction_of_mm']:.2f} of torch.mm "
        f"({j['torch_mm_gflops']:.1f})  load {j['load']}"
    )


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
    "topk": SearchCase(bench_topk, report_topk, (100_000, 1000, 128, 10, 2), (2000, 50, 64, 10, 1)),
    "range": SearchCase(bench_range, report_range, (10_000, 128, 0.9, 2), (1000, 64, 0.9, 1)),
    "join": SearchCase(bench_join, report_join, (5000, 50_000, 128, 10, 1), (500, 2000, 64, 10, 1)),
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

    name = output.name or f"search-cpu{os.cpu_count()}"
    harness.execute_benchmark(harness.Config(output, name, run, report))


if __name__ == "__main__":
    main()
