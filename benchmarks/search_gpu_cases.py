"""The cases of ``benchmarks.search_gpu``: data, contenders, timing, decision counts.

Every contender of a case gets the same device tensors; each is timed in rounds (one
run of each per round, after a checked warm-up) with CUDA events, and its answer is
compared with the float64 one: the number of changed decisions (pairs, top-k members,
dropped rows) is counted, never assumed.  On a CPU (the smoke mode) the same code runs
on tiny sizes, our kernel through the torch engine and the clock instead of events.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks import search_reference as ref
from dask_cosim import search_kernels as sk
from dask_cosim import search_precision as sp
from dask_cosim import search_twopass as tp

Log = Callable[[str], None]
TILE_BYTES = 512 * 2**20  # today's GPU tile budget (cosim.search.tile-bytes.cuda)
SCORE_BYTES = 2 * 2**30  # most bytes of one score block of the torch contenders


@dataclasses.dataclass
class Contender:
    """One way to answer a case: ``run()`` returns its decisions (see ``Decisions``).
    ``exact``: it claims the float64 answer.  ``pairs``: pair scores one run computes
    (for the rate; its share of the case when ``subset`` < 1, the time then scaled up).
    """

    name: str
    run: Callable[[], Any]
    exact: bool
    pairs: int
    subset: float = 1.0
    note: str = ""
    # The float64 answer restricted to what this contender answers (its subset).
    restrict: Callable[[Any], Any] | None = None
    times: list[float] = dataclasses.field(default_factory=list)
    changed: int | None = None
    identical: bool | None = None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3, out
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def time_rounds(
    contenders: list[Contender],
    repeat: int,
    judge: Callable[[Contender, Any], None],
    device: torch.device,
    log: Log,
) -> None:
    """A warm-up run of each (its answer judged), then ``repeat`` rounds of one timed
    run of each: drift on the machine hits every contender alike."""
    for c in contenders:
        log(f"  warm-up: {c.name}")
        _, out = _timed(c.run, device)
        judge(c, out)
        del out
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for r in range(repeat):
        for c in contenders:
            seconds, out = _timed(c.run, device)
            c.times.append(seconds)
            del out
        log(f"  round {r + 1}/{repeat}")


def records(contenders: list[Contender], gemm_flops: float | None, dim: int) -> list[dict]:
    """One results record per contender: median seconds (scaled to the whole case for
    a subset), pair-scores/s, fraction of the bfloat16 GEMM rate, decisions changed."""
    out = []
    for c in contenders:
        seconds = statistics.median(c.times) / c.subset
        rate = c.pairs / c.subset / seconds
        out.append(
            {
                "case": c.name,
                "exact": c.exact,
                "seconds": seconds,
                "times": c.times,
                "subset": c.subset,
                "pair_scores_per_s": rate,
                "x_bf16_gemm": rate * 2 * dim / gemm_flops if gemm_flops else None,
                "changed_decisions": c.changed,
                "identical_to_float64": c.identical,
                "note": c.note,
            }
        )
    return out


def bf16_gemm_flops(device: torch.device, n: int = 8192, repeat: int = 10) -> float | None:
    """FLOP/s of one large bfloat16 product on ``device`` (torch, cuBLAS): the rate the
    search rows are measured against."""
    if device.type != "cuda":
        return None
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    torch.mm(a, b)
    times = [_timed(lambda: torch.mm(a, b), device)[0] for _ in range(repeat)]
    return 2 * n**3 / statistics.median(times)


# --------------------------------------------------------------------------- data


def unit_rows(
    n: int, dim: int, device: torch.device, seed: int, dup_share: float = 0.1
) -> torch.Tensor:
    """(n, dim) float16 unit rows: random directions, plus ``dup_share`` of rows that are
    noisy copies of earlier ones at cosines spread over [0.85, 1] (chains included), so
    that thresholds 0.9 and 0.99 find pairs as semantic duplicates do."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(n, dim, device=device, generator=g)
    x /= torch.linalg.vector_norm(x, dim=1, keepdim=True)
    n_dup = int(n * dup_share)
    if n_dup and n > 1:
        rows = torch.randint(1, n, (n_dup,), device=device, generator=g)
        src = (torch.rand(n_dup, device=device, generator=g) * rows).long()
        cos = 0.85 + 0.15 * torch.rand(n_dup, device=device, generator=g) ** 0.5
        delta = torch.sqrt(1 / cos**2 - 1)  # |x + delta z| with z a random unit row
        z = torch.randn(n_dup, dim, device=device, generator=g)
        z /= torch.linalg.vector_norm(z, dim=1, keepdim=True)
        y = x[src] + delta[:, None] * z
        x[rows] = y / torch.linalg.vector_norm(y, dim=1, keepdim=True)
    return x.to(torch.float16)


def prepared(x: torch.Tensor) -> tuple[sk.Prepared, sp.LowRows]:
    p = sk.prepare(x, eps=1e-8)
    return p, sp.lower(p.raw, p.inv, p.scale, p.valid)


# --------------------------------------------------------------------------- top-k


def mm_topk(q: torch.Tensor, items: torch.Tensor, k: int, dtype: torch.dtype) -> torch.Tensor:
    """crossfit-style: torch ``mm`` of unit rows in ``dtype`` over blocks of items, a
    ``topk`` per block and a running merge.  Indices (Q, k)."""
    qd = q.to(dtype)
    step = max(k, SCORE_BYTES // (len(q) * qd.element_size()))
    best_v = best_i = None
    for c0 in range(0, len(items), step):
        s = torch.mm(qd, items[c0 : c0 + step].to(dtype).T)
        v, i = torch.topk(s, min(k, s.shape[1]), dim=1)
        i += c0
        if best_v is not None:
            v, pick = torch.topk(torch.cat([best_v, v], 1), k, dim=1)
            i = torch.gather(torch.cat([best_i, i], 1), 1, pick)
        best_v, best_i = v, i
    assert best_i is not None
    return best_i


def topk_contenders(
    q: torch.Tensor, items: torch.Tensor, k: int, engine: str, slow_share: float
) -> tuple[list[Contender], Callable[[], tuple[torch.Tensor, int]]]:
    """The top-k contenders on the same device tensors (float16 unit rows), and the run
    that gives the float64 answer by brute force (``benchmarks.search_reference``): the
    positions (Q, k) and how many rows' k-th and next scores lie within float64 rounding
    of each other.  The float32 contenders are slow: they answer the first
    ``slow_share`` of the queries (their time scaled up, their answer compared with those
    queries' float64 answer)."""
    device = items.device
    ip, il = prepared(items)
    pairs = len(q) * len(items)
    n_sub = max(1, int(len(q) * slow_share))
    sub = {
        "pairs": n_sub * len(items),
        "subset": n_sub / len(q),
        "note": f"the first {n_sub:,} queries" if n_sub < len(q) else "",
        "restrict": lambda ref: ref[:n_sub],
    }

    def ours(exact: bool) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            qp, ql = prepared(q)
            return tp.topk(qp, ql, ip, il, k, exact=exact, engine=engine).index

        return run

    def fp32_path() -> torch.Tensor:
        qp = sk.prepare(q[:n_sub], eps=1e-8)
        return sk.topk(qp, ip, k, tile_bytes=TILE_BYTES)[0].index

    def mm(dtype: torch.dtype, rows: int) -> Callable[[], torch.Tensor]:
        return lambda: mm_topk(q[:rows], items, k, dtype)

    cases = [
        Contender("ours: exact (float16 pass + float64)", ours(True), True, pairs),
        Contender("ours: fast (float16 pass alone)", ours(False), False, pairs),
        Contender("ours: fp32 (today's exact path)", fp32_path, True, **sub),  # type: ignore[arg-type]
        Contender("torch float16 mm + topk", mm(torch.float16, len(q)), False, pairs),
        Contender("torch bfloat16 mm + topk", mm(torch.bfloat16, len(q)), False, pairs),
        Contender("torch float32 mm + topk", mm(torch.float32, n_sub), False, **sub),  # type: ignore[arg-type]
    ]
    cuvs = _cuvs_contender(q, items, k, pairs) if device.type == "cuda" else None
    if cuvs is not None:
        cases.append(cuvs)

    def reference() -> tuple[torch.Tensor, int]:
        v, i = ref.topk(sk.prepare(q, eps=1e-8), ip, k + 1)
        near = ref.near_bar(v[:, k], v[:, k - 1], q.shape[1]) if v.shape[1] > k else 0
        return i[:, :k], near

    return cases, reference


def _cuvs_contender(q: torch.Tensor, items: torch.Tensor, k: int, pairs: int) -> Contender | None:
    try:
        from cuvs.neighbors import brute_force
    except ImportError:
        return None
    index = brute_force.build(items, metric="inner_product")

    def run() -> torch.Tensor:
        _, neighbors = brute_force.search(index, q, k)
        return torch.as_tensor(neighbors, device=items.device).long()

    return Contender("cuVS brute_force (float16, inner product)", run, False, pairs)


def topk_changed(got: torch.Tensor, want: torch.Tensor) -> tuple[int, bool]:
    """Members of each row's top-k not in the float64 one (summed), and whether the
    answer is identical (same rows in the same order)."""
    g, w = got.long(), want.long()
    k = w.shape[1]
    missing = (g[:, :, None] != w[:, None, :k]).all(dim=2).sum()
    return int(missing), bool(torch.equal(g, w))


# --------------------------------------------------------------------------- threshold


def _codes(i: torch.Tensor, j: torch.Tensor, n: int) -> torch.Tensor:
    return torch.sort(i.long() * n + j.long()).values


def mm_threshold(x: torch.Tensor, t: float, dtype: torch.dtype, n: int) -> torch.Tensor:
    """torch ``mm`` of unit rows in ``dtype`` over blocks of the upper triangle, then
    a threshold filter; pairs as sorted codes i * n + j."""
    xd = x.to(dtype)
    step = max(1, int((SCORE_BYTES / xd.element_size()) ** 0.5))
    out = []
    for a0 in range(0, len(x), step):
        for b0 in range(a0, len(x), step):
            s = torch.mm(xd[a0 : a0 + step], xd[b0 : b0 + step].T)
            hit = s >= t
            if a0 == b0:
                hit.triu_(1)
            i, j = hit.nonzero(as_tuple=True)
            out.append((i + a0) * n + (j + b0))
    return torch.sort(torch.cat(out)).values


def nemo_max(x: torch.Tensor, batch: int = 8192) -> torch.Tensor:
    """NeMo Curator's pairwise step (float16): for each column batch, ``mm`` of every row
    with the batch, ``triu`` so that only earlier rows count, ``max`` over rows: each
    row's best score with an earlier row.  The whole square is multiplied."""
    xd = x.to(torch.float16)
    best = torch.empty(len(x), dtype=torch.float16, device=x.device)
    for c0 in range(0, len(x), batch):
        s = torch.mm(xd, xd[c0 : c0 + batch].T)
        s = torch.triu(s, diagonal=1 + c0)
        best[c0 : c0 + batch] = s.max(dim=0).values
    return best


def threshold_contenders(
    x: torch.Tensor, t: float, engine: str, slow_share: float
) -> tuple[list[Contender], list[Contender]]:
    """(self-join contenders, dedup contenders): self-join answers are sorted pair codes
    i * n + j, dedup answers a bool mask of the dropped rows.  The float32 contenders
    answer the self-join of the first ``slow_share`` of the rows (time scaled by the
    pairs, answer compared with those rows' float64 pairs).  The float64 pair set they
    are judged by: :func:`threshold_truth`."""
    n = len(x)
    p, low = prepared(x)
    pairs = n * (n - 1) // 2
    n_sub = max(2, int(n * slow_share))
    ps = sk.prepare(x[:n_sub], eps=1e-8)
    sub = {
        "pairs": n_sub * (n_sub - 1) // 2,
        "subset": n_sub * (n_sub - 1) / (n * (n - 1)),
        "note": f"the first {n_sub:,} rows" if n_sub < n else "",
        "restrict": lambda ref: ref[(ref // n < n_sub) & (ref % n < n_sub)],
    }

    def ours_pairs(exact: bool) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            i, j, _ = tp.threshold_pairs(
                p, low, p, low, t, mode="upper", exact=exact, exact_scores=False, engine=engine
            )
            return _codes(i, j, n)

        return run

    def fp32_pairs() -> torch.Tensor:
        i, j, _ = sk.threshold_pairs(ps, ps, t, tile_bytes=TILE_BYTES, mode="upper")
        return _codes(i, j, n)

    def mm(dtype: torch.dtype, rows: int) -> Callable[[], torch.Tensor]:
        return lambda: mm_threshold(x[:rows], t, dtype, n)

    join = [
        Contender("ours: exact (float16 pass + float64)", ours_pairs(True), True, pairs),
        Contender("ours: fast (float16 pass alone)", ours_pairs(False), False, pairs),
        Contender("ours: fp32 (today's exact path)", fp32_pairs, True, **sub),  # type: ignore[arg-type]
        Contender("torch float16 mm + threshold", mm(torch.float16, n), False, pairs),
        Contender("torch bfloat16 mm + threshold", mm(torch.bfloat16, n), False, pairs),
        Contender("torch float32 mm + threshold", mm(torch.float32, n_sub), False, **sub),  # type: ignore[arg-type]
    ]

    def ours_dedup() -> torch.Tensor:
        out = torch.zeros(n, dtype=torch.bool, device=x.device)
        out[tp.matched_columns(p, low, p, low, t, mode="upper", engine=engine)] = True
        return out

    dedup = [
        Contender("ours: dedup, exact", ours_dedup, True, pairs),
        Contender(
            "NeMo-style: float16 mm -> triu -> max",
            lambda: nemo_max(x) >= t,
            False,
            pairs,
            note="multiplies the whole square",
        ),
    ]
    return join, dedup


def threshold_truth(x: torch.Tensor, t: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scores): the float64 pairs of the self-join of ``x`` at ``t``, by brute
    force (``benchmarks.search_reference``); filter the scores for higher thresholds."""
    return ref.self_pairs(sk.prepare(x, eps=1e-8), t)


def dropped_changed(got: torch.Tensor, want_codes: torch.Tensor) -> tuple[int, bool]:
    """Rows dropped by one answer and not the other (``want_codes``: the float64 pairs)."""
    want = torch.zeros_like(got)
    want[want_codes % len(got)] = True
    changed = int((got != want).sum())
    return changed, changed == 0


def pairs_changed(got: torch.Tensor, want: torch.Tensor) -> tuple[int, bool]:
    """Pairs in one set and not the other (both sorted codes)."""
    extra = int((~torch.isin(got, want)).sum())
    missing = int((~torch.isin(want, got)).sum())
    return extra + missing, extra + missing == 0


def run_case(
    contenders: list[Contender],
    reference: Any,
    compare: Callable[[Any, Any], tuple[int, bool]],
    repeat: int,
    device: torch.device,
    log: Log,
) -> None:
    """Time ``contenders`` in rounds; each answer is compared (``compare(answer,
    float64 answer)`` -> changed decisions, identical) with ``reference``, restricted to
    the contender's subset."""

    def judge(c: Contender, out: Any) -> None:
        want = c.restrict(reference) if c.restrict is not None else reference
        c.changed, c.identical = compare(out, want)
        if c.exact and not c.identical:
            log(f"  !! {c.name} claims exactness and changed {c.changed} decisions")

    time_rounds(contenders, repeat, judge, device, log)
    sync(device)
