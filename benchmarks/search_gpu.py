"""Search on a GPU (issue 20): our exact two-pass search against the ways people search.

    python -m benchmarks.search_gpu            # the issue's cases, one H100: ~6 minutes
    python -m benchmarks.search_gpu --quick    # smaller cases, ~2 minutes
    python -m benchmarks.search_gpu --only scale --scale-rows 10000000   # 10M x 768 float16
    python -m benchmarks.search_gpu --smoke    # tiny sizes, on a CPU too (CI)

One process, one GPU.  Every contender of a case gets the same device tensors (float16 unit
rows), is timed with CUDA events after a warm-up (median of ``--repeat`` >= 5 rounds, one
run of each contender per round), and its answer is compared with the float64 one,
computed by brute force (``benchmarks/search_reference.py``: ours is judged by it too):
the decisions it changed are counted (see ``benchmarks/search_gpu_cases.py``).  Rates are
pair-scores per second, and that rate's share of a bfloat16 GEMM's FLOP/s measured in the
same run (2 D flops per pair score).

Cases, most telling first (a run interrupted by its budget writes those it finished): the
threshold self-join and ``dedup`` over 1M x 768 and 300k x 1536 at 0.9 and 0.99; ``topk``
of 10,000 queries over N = 1M and 10M rows, D = 384 and 768, k = 10 and 100; a small sweep
of tile configurations of the fused kernel; and ``scale``: ``dedup`` and
``neighbors(threshold)`` of float16 rows read from Parquet, written back, on the GPU
through the dask graph (sides in blocks, kept on the device), with the peak device memory.
The results file is ``search-gpu-<name of the GPU>.json`` (and ``.png``).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import click
import numpy as np
import torch

from benchmarks import harness as h
from benchmarks import search_gpu_cases as c
from benchmarks import search_reference as ref

# Each plan's cases run in its order, most telling first (the targets: the
# threshold self-join and dedup at D = 768, then top-k at 1M rows), so that a run cut
# short by its budget (SIGINT) still reports and writes the cases it finished.
FULL = {
    "cases": [
        ("threshold", 1_000_000, 768),
        ("topk", 1_000_000, 768, 10),
        ("topk", 1_000_000, 768, 100),
        ("sweep",),
        ("topk", 1_000_000, 384, 10),
        ("topk", 1_000_000, 384, 100),
        ("threshold", 300_000, 1536),
        ("topk", 10_000_000, 768, 10),
        ("topk", 10_000_000, 768, 100),
        ("topk", 10_000_000, 384, 10),
        ("topk", 10_000_000, 384, 100),
        ("scale",),
    ],
    "queries": 10_000,
    "thresholds": (0.9, 0.99),
    "scale_rows": 2_000_000,
}
QUICK = {
    "cases": [
        ("threshold", 300_000, 768),
        ("topk", 1_000_000, 768, 10),
        ("topk", 1_000_000, 768, 100),
        ("sweep",),
        ("topk", 1_000_000, 384, 10),
        ("topk", 1_000_000, 384, 100),
        ("threshold", 100_000, 1536),
        ("scale",),
    ],
    "queries": 10_000,
    "thresholds": (0.9, 0.99),
    "scale_rows": 500_000,
}
SMOKE = {
    "cases": [("threshold", 1200, 16), ("topk", 1500, 16, 5), ("sweep",), ("scale",)],
    "queries": 40,
    "thresholds": (0.9,),
    "scale_rows": 2000,
}
SLOW_SHARE = 0.1  # the float32 contenders answer a tenth of the work (scaled up)

TABLE = [
    h.Column("contender", "case", align="<"),
    h.Column("s", "seconds", ".4f", 8),
    h.Column("Gpairs/s", lambda r: r["pair_scores_per_s"] / 1e9, ".1f", 9),
    h.Column("x bf16 GEMM", "x_bf16_gemm", ".2f", 11),
    h.Column("changed", "changed_decisions", ",", 8),
    h.Column("exact", lambda r: "yes" if r["identical_to_float64"] else "no", "", 5),
    h.Column("note", "note", align="<"),
]


def _tile_sweep(device: torch.device, log: h.Log) -> list[dict[str, Any]]:
    """The threshold kernel alone at a few Hopper-sized tile shapes (200k x 768 self-join
    at 0.9): what the defaults in ``_search_triton.config_for`` should be."""
    from dask_cosim import _search_triton as st
    from dask_cosim import search_twopass as tp

    x = c.unit_rows(200_000, 768, device, seed=5)
    p, low = c.prepared(x)
    out = []
    shapes = [(128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 128, 64, 4, 4), (64, 128, 64, 4, 3)]
    for bm, bn, bk, warps, stages in shapes:
        cfg = st.TileConfig(bm=bm, bn=bn, bk=bk, num_warps=warps, num_stages=stages)
        name = f"BM={bm} BN={bn} BK={bk} warps={warps} stages={stages}"
        try:
            run = c.Contender(
                name,
                lambda cfg=cfg: tp.threshold_pairs(p, low, p, low, 0.9, mode="upper", config=cfg),
                True,
                len(x) * (len(x) - 1) // 2,
            )
            c.time_rounds([run], 3, lambda *_: None, device, log)
            out.extend(c.records([run], None, 768))
        except Exception as err:  # a shape that does not compile: say so, go on
            out.append({"case": name, "error": f"{type(err).__name__}: {err}"[:300]})
            log(f"  {name}: {type(err).__name__}")
    return out


def _scale(rows: int, dim: int, device: torch.device, log: h.Log) -> dict[str, Any]:
    """float16 rows -> Parquet -> dedup and neighbors(threshold) on the GPU -> Parquet."""
    import dask

    import dask_cosim
    from dask_cosim.io import vectors_to_arrow

    x = np.empty((rows, dim), dtype=np.float16)
    step = 1_000_000
    for s in range(0, rows, step):
        n = min(step, rows - s)
        x[s : s + n] = c.unit_rows(n, dim, device, seed=100 + s // step).cpu().numpy()
    # Near-duplicates across the whole frame: copies of earlier rows, slightly moved.
    dup = np.random.default_rng(1).integers(0, rows, rows // 20)
    x[np.sort(dup)[rows // 40 :]] = x[np.sort(dup)[: rows // 20 - rows // 40]] + np.float16(1e-3)
    import pandas as pd

    frame = pd.DataFrame({"emb": vectors_to_arrow(x), "id": np.arange(rows)})
    out: dict[str, Any] = {"rows": rows, "dim": dim, "dtype": "float16"}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in"
        t0 = time.perf_counter()
        dask_cosim.to_parquet(
            dask_cosim.from_pandas(frame, npartitions=max(1, rows // 100_000)), src
        )
        out["write_input_s"] = time.perf_counter() - t0
        del frame
        for name, fn in (
            ("dedup 0.95", lambda df: df.cosim.dedup("emb", 0.95)),
            ("neighbors(threshold=0.95)", lambda df: df.cosim.neighbors("emb", threshold=0.95)),
        ):
            torch.cuda.reset_peak_memory_stats(device) if device.type == "cuda" else None
            dst = Path(tmp) / name.split()[0]
            with dask.config.set({"cosim.device": device.type, "scheduler": "sync"}):
                df = dask_cosim.read_parquet(str(src))
                result = fn(df)
                tasks = len(result.__dask_graph__())
                t0 = time.perf_counter()
                dask_cosim.to_parquet(result, dst)
                seconds = time.perf_counter() - t0
            kept = len(dask_cosim.read_parquet(str(dst)))
            peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
            out[name] = {
                "seconds": seconds,
                "graph_tasks": tasks,
                "result_rows": kept,
                "pair_scores_per_s": rows * (rows - 1) / 2 / seconds,
                "peak_device_bytes": peak,
            }
            log(f"  scale {name}: {seconds:.1f} s, {tasks} tasks, peak {peak}")
    return out


def _topk(
    case: tuple, params: dict, device: torch.device, engine: str, gemm: float | None,
    repeat: int, log: h.Log,
) -> dict[str, Any]:  # fmt: skip
    n, d, k = case
    log(f"topk N={n:,} D={d} k={k}")
    items = c.unit_rows(n, d, device, seed=1)
    q = c.unit_rows(params["queries"], d, device, seed=2)
    contenders, reference = c.topk_contenders(q, items, k, engine, SLOW_SHARE)
    want, near = reference()
    c.run_case(contenders, want, c.topk_changed, repeat, device, log)
    return {
        "case": f"topk N={n:,} D={d} k={k}",
        "float64_near_ties": near,
        "rows": c.records(contenders, gemm, d),
    }


def _threshold(
    case: tuple, params: dict, device: torch.device, engine: str, gemm: float | None,
    repeat: int, log: h.Log, out: list,
) -> None:  # fmt: skip
    """The self-join and dedup of one shape at each threshold, appended to ``out`` as
    each threshold finishes."""
    n, d = case
    x = c.unit_rows(n, d, device, seed=3)
    log(f"threshold N={n:,} D={d}: the float64 pairs, by brute force")
    # A little below the lowest threshold, so that pairs just under a bar count among
    # its near-ties too.
    codes, scores = c.threshold_truth(x, min(params["thresholds"]) - 1e-6)
    for t in params["thresholds"]:
        log(f"threshold N={n:,} D={d} t={t}")
        join, dedup = c.threshold_contenders(x, t, engine, SLOW_SHARE)
        want = codes[scores >= t]
        c.run_case(join, want, c.pairs_changed, repeat, device, log)
        c.run_case(dedup, want, c.dropped_changed, repeat, device, log)
        for name, rows in (("self-join", join), ("dedup", dedup)):
            out.append(
                {
                    "case": f"{name} N={n:,} D={d} threshold={t}",
                    "float64_pairs": len(want),
                    "float64_near_ties": ref.near_bar(scores, t, d),
                    "rows": c.records(rows, gemm, d),
                }
            )


@click.command()
@click.option("--quick", is_flag=True, help="Smaller cases (about 2 minutes on an H100).")
@click.option("--smoke", is_flag=True, help="Tiny cases; runs on a CPU too (the torch engine).")
@click.option("--repeat", default=5, show_default=True, help="Timed rounds (at least 5).")
@click.option("--scale-rows", type=int, default=None, help="Rows of the scale case.")
@click.option(
    "--only",
    type=click.Choice(["sweep", "topk", "threshold", "scale"]),
    multiple=True,
    help="Run only these parts (repeatable); default all.",
)
@h.results_options()
def main(
    quick: bool,
    smoke: bool,
    repeat: int,
    scale_rows: int | None,
    only: tuple[str, ...],
    output: h.Output,
) -> None:
    """The GPU search benchmark (see the module docstring)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not smoke:
        print("no CUDA device: nothing run (use --smoke for the tiny CPU run)")
        return
    params = SMOKE if smoke else QUICK if quick else FULL
    engine = "triton" if device.type == "cuda" else "torch"
    parts = set(only) or {"sweep", "topk", "threshold", "scale"}

    record: h.Record = {}  # filled in case by case: an interrupt keeps what ran

    def run(log: h.Log) -> h.Record:
        gemm = c.bf16_gemm_flops(device)
        record.update(
            params={"quick": quick, "smoke": smoke, "repeat": repeat, **params},
            device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            bf16_gemm_flops=gemm,
        )
        for case in params["cases"]:
            part, shape = case[0], case[1:]
            if part not in parts:
                continue
            if part == "sweep" and device.type == "cuda":
                record["tile_sweep"] = _tile_sweep(device, log)
            elif part == "topk":
                found = _topk(shape, params, device, engine, gemm, repeat, log)
                record.setdefault("topk", []).append(found)
            elif part == "threshold":
                out = record.setdefault("threshold", [])
                _threshold(shape, params, device, engine, gemm, repeat, log, out)
            elif part == "scale":
                rows = scale_rows or params["scale_rows"]
                record["scale"] = _scale(rows, 32 if smoke else 768, device, log)
        return record

    def report(record: h.Record) -> None:
        gemm = record["bf16_gemm_flops"]
        print(
            f"{record['device']}: bfloat16 GEMM {gemm / 1e12:.0f} TFLOP/s"
            if gemm
            else record["device"]
        )
        for part in ("topk", "threshold"):
            for case in record.get(part, []):
                h.print_table(TABLE, case["rows"], case["case"])
        for row in record.get("tile_sweep", []):
            print(
                row["case"],
                f"{row['pair_scores_per_s'] / 1e9:.1f} Gpairs/s"
                if "error" not in row
                else row["error"],
            )
        if "scale" in record:
            print("scale:", record["scale"])

    name = output.name or ("search-gpu-smoke" if smoke else f"search-gpu-{_gpu_name(device)}")
    h.execute_benchmark(h.Config(output, name, run, report, chart=_chart, partial=record))


def _gpu_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device).split()[1].lower() if device.type == "cuda" else "cpu"


def _chart(record: h.Record, path: Path) -> None:
    """One panel per case: pair-scores/s of each contender (exact ones dark)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = record.get("topk", []) + record.get("threshold", [])
    if not cases:
        return
    cols = 2
    rows_n = (len(cases) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(13, 2.6 * rows_n), squeeze=False)
    for ax, case in zip(axes.flat, cases):
        rows = case["rows"][::-1]
        ax.barh(
            [r["case"] for r in rows],
            [r["pair_scores_per_s"] / 1e9 for r in rows],
            color=["#1f77b4" if r["identical_to_float64"] else "#ff7f0e" for r in rows],
        )
        ax.set_title(case["case"], fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("G pair-scores/s (blue: the float64 answer)", fontsize=7)
    for ax in list(axes.flat)[len(cases) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
