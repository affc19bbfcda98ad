"""The fused search kernel (Triton): a low-precision matrix product whose epilogue selects.

One program multiplies a block of ``BM`` rows of side a with the column tiles of side b
(``tl.dot`` on float16 / bfloat16 / TF32 tiles, float32 accumulators) and, for each
``BM x BN`` tile still in registers, keeps the pairs that can pass:
``s_hat + E >= bar[i]`` (:mod:`dask_cosim.search_precision`: s_hat the low-precision score, E
its bound).  A tile first tests its pairs against each row's bound over the whole tile
(the tile's largest rho and err, :class:`_ColumnTiles`); only a tile where some pair
passes that test takes each pair's own E, counts and writes.  The score matrix never
goes to device memory; only the candidates (i, j, s_hat) do, into a bounded buffer
through an atomic counter.

- Threshold: ``bar`` is the threshold.
- Top-k (``K`` > 0): ``bar`` is each row's running floor, a lower bound of its k-th
  best float64 score.  It starts from a seed, and rises as the program goes: each
  column of a tile falls into one of ``MB`` buckets (column position mod ``MB``), a
  bucket keeps the best s_hat - E it has seen, and since buckets hold distinct columns,
  any value at or below ``K`` of the bucket maxima is a valid floor (found by bisection,
  with comparisons and counts only).  The programs that share a row block (one per
  split of the columns) share its floors through an atomic max.
- Self-joins: row i of a is column i + ``diag`` of b.  "upper" keeps j > i + diag and
  skips the column tiles wholly below the diagonal; "exclude_self" drops j == i + diag.

No candidate is ever lost: a tile whose candidates do not fit in the buffer writes none
of them; its program records the first such tile and stops, and
:func:`search_candidates` launches those programs again from there into a new, larger
buffer until every program has finished.  (Filling is prefix-shaped: once one
reservation fails, every later one does, so the candidates written are exactly the
buffer's first ``first_fail`` entries.)

Imported on the first CUDA call only; with ``TRITON_INTERPRET=1`` set before import the
same kernel runs on CPU tensors in Triton's interpreter, which is how CI tests it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from dask_cosim._search_sweep import PairLimit
from dask_cosim.search_precision import TAU, LowRows

__all__ = ["Candidates", "TileConfig", "config_for", "search_candidates"]

MODES = {None: 0, "upper": 1, "exclude_self": 2}
# Bisection steps of a floor raise: the floor lands within 2^-16 of the range searched.
_ITERS = 16
_INT32_MAX = 2**31 - 1
# A row's bound over a tile is widened by this factor (see the kernel): more than the
# (1 + 2^-24)^7 that the roundings of the two bounds can take between them.
SLACK = tl.constexpr(1.0 + 2.0**-20)
# Contracted multiply-adds, said so rather than left to a default that Triton 3.10 turns
# off (3.9 warns about it): each one rounds once where two operations would round twice,
# so the bound holds either way (docs/search-precision.md).
FP_FUSION = True


@triton.jit
def _raise_floor(M, L, K: tl.constexpr, ITERS: tl.constexpr):
    # The largest value v (to 2^-ITERS of the range) with at least K bucket maxima >= v.
    # Valid entries of M are above -4 (a score minus its bound); masked ones are -inf.
    lo = tl.maximum(L, -4.0)
    ok = tl.sum((M >= lo[:, None]).to(tl.int32), axis=1) >= K
    hi = tl.maximum(tl.max(M, axis=1), lo)
    for _ in tl.static_range(ITERS):
        mid = (lo + hi) * 0.5
        enough = tl.sum((M >= mid[:, None]).to(tl.int32), axis=1) >= K
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid)
    return tl.where(ok, tl.maximum(L, lo), L)


@triton.jit
def _search_tiles(
    a_ptr, b_ptr, stride_a, stride_b,
    a_w, a_coef, a_nu, a_ok,
    b_w, b_rho, b_err, b_ok, b_rmax, b_emax,
    bar_ptr, resume_ptr,
    out_i, out_j, out_s, count_ptr, fail_ptr, capacity,
    n_a, n_b, d, n_m, n_splits, tiles_per_split, diag, tau,
    K: tl.constexpr, MB: tl.constexpr, RAISE_EVERY: tl.constexpr, ITERS: tl.constexpr,
    MODE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr, TF32: tl.constexpr,
):  # fmt: skip
    # Programs run roughly in id order: a wave of them takes GROUP_M row blocks times
    # every split, so it reads GROUP_M blocks of a and one column tile per split, both
    # small enough to stay in L2 while the whole wave uses them.
    prog = tl.program_id(0)
    per_group = GROUP_M * n_splits
    first_m = (prog // per_group) * GROUP_M
    group_m = tl.minimum(n_m - first_m, GROUP_M)
    pid_m = first_m + (prog % per_group) % group_m
    split = (prog % per_group) // group_m
    rows = pid_m * BM + tl.arange(0, BM)
    row_in = rows < n_a
    rows64 = rows.to(tl.int64)
    wa = tl.load(a_w + rows, mask=row_in, other=0.0)
    ca = tl.load(a_coef + rows, mask=row_in, other=0.0)
    na = tl.load(a_nu + rows, mask=row_in, other=0.0)
    oka = row_in & (tl.load(a_ok + rows, mask=row_in, other=0) != 0)
    # Threshold: the bar per row.  Top-k: the floor per row, shared by every program of
    # the row block (each one's floor is valid for all: atomic max).
    bar = tl.load(bar_ptr + rows, mask=row_in, other=float("inf"))

    n_tiles = tl.cdiv(n_b, BN)
    first = split * tiles_per_split
    end = tl.minimum(first + tiles_per_split, n_tiles)
    if MODE == 1:  # nothing left of the diagonal block: its first useful column
        first = tl.maximum(first, (pid_m * BM + diag + 1) // BN)
    resume = tl.load(resume_ptr + prog)
    tile = tl.where(resume >= 0, tl.maximum(first, resume), end)
    stop = -1
    done = 0
    M = tl.full([BM, MB], float("-inf"), tl.float32)
    while tile < end:
        cols = tile * BN + tl.arange(0, BN)
        col_in = cols < n_b
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for k0 in range(0, d, BK):
            ks = k0 + tl.arange(0, BK)
            if EVEN_K:
                ma = row_in[:, None]
                mb = col_in[:, None]
            else:
                ma = row_in[:, None] & (ks[None, :] < d)
                mb = col_in[:, None] & (ks[None, :] < d)
            x = tl.load(a_ptr + rows64[:, None] * stride_a + ks[None, :], mask=ma, other=0.0)
            y = tl.load(
                b_ptr + cols.to(tl.int64)[:, None] * stride_b + ks[None, :], mask=mb, other=0.0
            )
            if UPCAST:  # the interpreter multiplies bfloat16 as integers: exact in float32
                x = x.to(tl.float32)
                y = y.to(tl.float32)
            if TF32:
                acc = tl.dot(x, tl.trans(y), acc, input_precision="tf32", out_dtype=tl.float32)
            else:
                acc = tl.dot(x, tl.trans(y), acc, out_dtype=tl.float32)
        # The column arrays are padded to whole tiles (padding: invalid), so no mask.
        wb = tl.load(b_w + cols)
        okb = tl.load(b_ok + cols) != 0
        s = acc * wa[:, None] * wb[None, :]
        # Every tile, a bound per row for all its columns: from the tile's largest rho
        # and err, widened by SLACK so that it is at least each pair's own bound however
        # the compiler orders and fuses either (both are sums of products of terms >= 0,
        # and float rounding is monotone).  Each pair's own bound is taken only where
        # this one lets a pair through.
        loose = (ca * tl.load(b_rmax + tile) + na * tl.load(b_emax + tile) + tau) * SLACK
        ok = oka[:, None] & okb[None, :]
        if MODE == 1:
            ok = ok & (cols[None, :] > rows[:, None] + diag)
        if MODE == 2:
            ok = ok & (cols[None, :] != rows[:, None] + diag)
        if K > 0:
            lb = tl.where(ok, s - loose[:, None], float("-inf"))
            if MB == BN:
                M = tl.maximum(M, lb)
            else:
                M = tl.maximum(M, tl.max(tl.reshape(lb, [BM, BN // MB, MB]), axis=1))
            done += 1
            if (done <= RAISE_EVERY) | (done % RAISE_EVERY == 0):
                shared = tl.load(bar_ptr + rows, mask=row_in, other=float("inf"))
                bar = _raise_floor(M, tl.maximum(bar, shared), K, ITERS)
                tl.atomic_max(bar_ptr + rows, bar, mask=row_in)
        maybe = ok & (s + loose[:, None] >= bar[:, None])
        # Every tile: only whether any pair may pass, reduced where the accumulators lie.
        # Which pairs pass, and where they go, is worked out for the rare tile that has
        # some, from values of its own: shared with the test, they would move the whole
        # tile to another layout every time.
        if tl.max(tl.where(maybe, 1.0, 0.0)) > 0:
            rb = tl.load(b_rho + cols)
            eb = tl.load(b_err + cols)
            bound = ca[:, None] * rb[None, :] + na[:, None] * eb[None, :] + tau
            hit = maybe & (s + bound >= bar[:, None])
            n_hit = tl.sum(tl.sum(hit.to(tl.int32), axis=1), axis=0)
            if n_hit > 0:
                base = tl.atomic_add(count_ptr, n_hit.to(tl.int64))
                if base + n_hit <= capacity:
                    upto = tl.cumsum(hit.to(tl.int32), axis=1)  # a row's hits so far
                    per_row = tl.max(upto, axis=1)
                    at = (tl.cumsum(per_row, axis=0) - per_row)[:, None] + upto - 1
                    i = rows[:, None] + tl.zeros([BM, BN], tl.int32)
                    j = cols[None, :] + tl.zeros([BM, BN], tl.int32)
                    tl.store(out_i + base + at, i, mask=hit)
                    tl.store(out_j + base + at, j, mask=hit)
                    tl.store(out_s + base + at, s, mask=hit)
                else:
                    # Keep the buffer a prefix: the lowest failed reservation is where
                    # the written candidates end.
                    tl.atomic_min(fail_ptr, base)
                    stop = tile
                    tile = end
        tile += 1
    tl.store(resume_ptr + prog, stop)
    if K > 0:
        tl.atomic_max(bar_ptr + rows, bar, mask=row_in)


@dataclass(frozen=True)
class TileConfig:
    """Block shape and launch settings.  ``splits``: programs per row block, each
    taking a contiguous share of the column tiles (None: ``group_m``, or more to fill
    the device twice); ``group_m``: row blocks per group of programs (see the kernel);
    ``raise_every``: tiles between two raises of a top-k floor."""

    bm: int = 128
    bn: int = 128
    bk: int = 64
    num_warps: int = 8
    num_stages: int = 3
    splits: int | None = None
    group_m: int = 16
    raise_every: int = 8


def config_for(kind: str, k: int = 0, device: torch.device | None = None) -> TileConfig:
    """Hopper-sized blocks: 128 x 128 float32 accumulators over 8 warps (two warpgroups
    of wgmma), K steps of 64 16-bit values (128 bytes a row) three stages deep; TF32
    takes K steps of 32 (the same bytes).  Top-k keeps a second array, the bucket
    maxima, in registers beside the accumulators: 128 x 64 tiles for k <= 64 (at most 64
    buckets), 64 x 128 beyond (128 buckets), so that the two stay within the register
    file.  Until a GPU run's sweep (``benchmarks/search_gpu.py``) confirms them these are
    educated guesses.  On a CPU (the interpreter) small blocks keep the numpy work per
    program low."""
    if device is not None and device.type != "cuda":
        return TileConfig(bm=32, bn=32, bk=32, num_warps=4, num_stages=1, splits=2, group_m=2)
    bk = 32 if kind == "tf32" else 64
    if k > 64:
        return TileConfig(bm=64, bn=128, bk=bk)
    if k > 0:
        return TileConfig(bm=128, bn=64, bk=bk)
    return TileConfig(bk=bk)


@dataclass
class Candidates:
    """Pairs that may pass: ``i``, ``j`` (int64 positions in a and b), ``s`` (float32
    low-precision score); ``floor`` (n_a,) float32, for top-k: each row's final floor
    (a lower bound of its k-th float64 score), else None; ``launches``: kernel launches
    taken (more than one when the buffer overflowed)."""

    i: torch.Tensor
    j: torch.Tensor
    s: torch.Tensor
    floor: torch.Tensor | None
    launches: int


@dataclass
class _ColumnTiles:
    """Side b's per-row numbers padded to whole column tiles (padding: weight 0, not
    valid), and each tile's largest rho and err."""

    weight: torch.Tensor
    rho: torch.Tensor
    err: torch.Tensor
    ok: torch.Tensor
    rho_max: torch.Tensor
    err_max: torch.Tensor

    @classmethod
    def of(cls, b: LowRows, n_tiles: int, bn: int) -> _ColumnTiles:
        def pad(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
            out = torch.zeros(n_tiles * bn, dtype=dtype, device=t.device)
            out[: len(t)] = t
            return out

        rho, err = pad(b.rho, torch.float32), pad(b.err, torch.float32)
        return cls(
            pad(b.weight, torch.float32), rho, err, pad(b.valid, torch.int8),
            rho.view(n_tiles, bn).amax(1), err.view(n_tiles, bn).amax(1),
        )  # fmt: skip


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _buckets(k: int, bn: int) -> int:
    """Buckets of a top-k floor: twice k (rounded to a power of two), so the k best
    columns seldom share one, and at most the tile's width."""
    return min(bn, max(16, triton.next_power_of_2(2 * k)))


def search_candidates(
    a: LowRows,
    b: LowRows,
    bar: torch.Tensor,
    *,
    k: int = 0,
    mode: str | None = None,
    diag: int = 0,
    config: TileConfig | None = None,
    capacity: int | None = None,
    limit: PairLimit | None = None,
) -> Candidates:
    """Every pair (i, j) of valid rows with s_hat + E >= bar (see the module docstring).

    ``bar`` (n_a,) float32: the threshold per row (rounded down), or for top-k (``k`` >
    0, at most the tile width) the seed floor per row (-inf: none).  ``mode`` None,
    "upper" or "exclude_self" with ``diag``.  ``capacity``: first buffer's size in
    candidates (default: a few per row).  ``limit`` counts the candidates each launch
    writes and raises :class:`~dask_cosim._search_sweep.TooManyPairs` once they and
    those still to write pass its most, before a larger buffer is allocated (and no
    buffer is made larger than the limit leaves room for).  Inputs on one device (CUDA,
    or the CPU under the interpreter).
    """
    dev = a.low.device
    config = config or config_for(a.kind, k, dev)
    if k > config.bn:
        raise ValueError(f"k={k!r} is more than the tile width {config.bn}")
    n_a, n_b, d = len(a), len(b), a.dim
    n_m = triton.cdiv(max(n_a, 1), config.bm)
    n_tiles = triton.cdiv(max(n_b, 1), config.bn)
    splits = config.splits
    if splits is None:
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        splits = max(config.group_m, triton.cdiv(2 * sms, n_m))
    tiles_per_split = triton.cdiv(n_tiles, max(1, min(splits, n_tiles)))
    splits = triton.cdiv(n_tiles, tiles_per_split)
    state = bar.to(torch.float32).clone()  # the kernel raises top-k floors in place
    resume = torch.zeros(splits * n_m, dtype=torch.int32, device=dev)
    capacity = capacity or max(config.bm * config.bn, 8 * n_a * max(1, k))
    capacity = _room(capacity, limit, config)
    ok_a = a.valid.to(torch.int8)
    cols = _ColumnTiles.of(b, n_tiles, config.bn)
    bf16 = a.low.dtype == torch.bfloat16
    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    launches = 0
    while True:
        out_i = torch.empty(capacity, dtype=torch.int32, device=dev)
        out_j = torch.empty(capacity, dtype=torch.int32, device=dev)
        out_s = torch.empty(capacity, dtype=torch.float32, device=dev)
        count = torch.zeros(1, dtype=torch.int64, device=dev)
        fail = torch.full((1,), 2**62, dtype=torch.int64, device=dev)
        _search_tiles[(n_m * splits,)](
            a.low, b.low, a.low.stride(0), b.low.stride(0),
            a.weight, a.coef, a.nu, ok_a, cols.weight, cols.rho, cols.err, cols.ok,
            cols.rho_max, cols.err_max,
            state, resume, out_i, out_j, out_s, count, fail, capacity,
            n_a, n_b, d, n_m, splits, tiles_per_split, diag, TAU,
            K=k, MB=_buckets(k, config.bn) if k else 16,
            RAISE_EVERY=config.raise_every, ITERS=_ITERS, MODE=MODES[mode],
            BM=config.bm, BN=config.bn, BK=config.bk, GROUP_M=config.group_m,
            EVEN_K=d % config.bk == 0,
            UPCAST=bf16 and _interpreting(), TF32=a.kind == "tf32",
            num_warps=config.num_warps, num_stages=config.num_stages,
            enable_fp_fusion=FP_FUSION,
        )  # fmt: skip
        launches += 1
        total, first_fail = int(count.item()), int(fail.item())
        kept = min(total, first_fail)
        if limit is not None:
            # The failed programs' reservations are candidates still to write.
            limit.add(kept, pending=total - kept)
        if first_fail > total:  # no reservation failed: every program finished
            parts.append((out_i[:kept], out_j[:kept], out_s[:kept]))
            break
        # Copies, so that this buffer can go before the next, larger one is allocated.
        parts.append((out_i[:kept].clone(), out_j[:kept].clone(), out_s[:kept].clone()))
        del out_i, out_j, out_s
        # The failed programs go on from their first unwritten tile, into a buffer at
        # least twice as large (and never smaller than one tile: progress each launch).
        capacity = max(2 * capacity, 2 * (total - kept), config.bm * config.bn)
        capacity = _room(capacity, limit, config)
    i = torch.cat([p[0] for p in parts]).to(torch.int64)
    j = torch.cat([p[1] for p in parts]).to(torch.int64)
    s = torch.cat([p[2] for p in parts])
    floor = state if k > 0 else None
    return Candidates(i, j, s, floor, launches)


def _room(capacity: int, limit: PairLimit | None, config: TileConfig) -> int:
    """``capacity`` cut to what ``limit`` leaves room for (one more than it, so that
    passing it is seen), never below one tile: progress each launch."""
    if limit is None:
        return capacity
    return max(config.bm * config.bn, min(capacity, limit.left() + 1))


def with_splits(config: TileConfig, splits: int) -> TileConfig:
    """``config`` with ``splits`` programs per row block."""
    return replace(config, splits=splits)
