"""The two-pass search (:mod:`dask_cosim.search_twopass`) against the float64 answer:
adversarial rows, their scores in float64, the pairs and top-k a search must give, and
the checks the CPU, the Triton interpreter and GPUs run alike (``engine``, ``config``
and ``device`` pick the first pass: torch tiles on the CPU, the Triton kernel in the
interpreter or on a GPU).  Every re-scored pair goes through
:func:`dask_cosim.search_kernels.rescore`, then is thresholded or ranked with the tie
rule (score descending, then position)."""

from __future__ import annotations

import math

import numpy as np
import torch

from dask_cosim import search_kernels as sk
from dask_cosim import search_precision as sp
from dask_cosim import search_twopass as tp

EPS = 1e-8
DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}
# Row magnitudes that would overflow or underflow float16 unscaled (fp16 itself: near
# 65504, and subnormal), and the extremes of the wider types.
EXTREMES = {
    "float16": (6.0e4, 2.0**-20),
    "bfloat16": (1e30, 1e-30),
    "float32": (1e30, 1e-30),
    "float64": (1e300, 1e-300),
}


# --------------------------------------------------------------------------- data


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _at_cosine(x: np.ndarray, c: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Rows with cosine ``c`` (float64, before the input's rounding) to ``x``."""
    z = rng.standard_normal((len(c), x.shape[0]))
    z -= (z @ x)[:, None] * x[None, :]
    z = _unit(z)
    return c[:, None] * x[None, :] + np.sqrt(np.clip(1 - c * c, 0, 1))[:, None] * z


def adversarial_rows(
    n: int, dim: int, dtype: str, *, seed: int = 0, target: float = 0.9
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, null mask): random rows, a cluster of rows whose cosines to row 0 lie
    within 1e-7 of ``target`` (around a threshold or a k-th score), exact duplicates
    and power-of-two multiples (exact ties), near-parallel rows, rows at the dtype's
    extreme magnitudes, a zero row, NaN and inf rows, and null rows."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim))
    if dim >= 2:
        m = max(4, n // 4)
        x[0] = _unit(x[0])
        x[1 : 1 + m] = _at_cosine(x[0], target + 2e-9 * (np.arange(m) - m / 2), rng)
        if n > 2 * m + 8:
            x[1 + m : 1 + 2 * m] = x[0] + 1e-4 * rng.standard_normal((m, dim))
    x[-1] = x[2]  # duplicates
    x[-2] = x[3] * 4.0
    big, small = EXTREMES[dtype]
    x[-3] *= big / np.abs(x[-3]).max()
    x[-4] *= small / np.abs(x[-4]).max()
    x[-5] = 0.0
    x[-6, 0] = np.nan
    x[-7, -1] = np.inf
    null = np.zeros(n, bool)
    null[[-8, -9]] = True
    t = torch.from_numpy(x).to(DTYPES[dtype])
    return t, torch.from_numpy(null)


def low_sides(x: torch.Tensor, null: torch.Tensor | None, kind: str | None = None):
    p = sk.prepare(x, null, eps=EPS)
    return p, sp.lower(p.raw, p.inv, p.scale, p.valid, kind)


def all_scores(q: sk.Prepared, r: sk.Prepared) -> torch.Tensor:
    """The float64 answer for every pair (-inf where either row is invalid)."""
    nq, nr = len(q), len(r)
    i = torch.arange(nq).repeat_interleave(nr)
    j = torch.arange(nr).repeat(nq)
    c = sk.rescore(q.to(torch.device("cpu")), i, r.to(torch.device("cpu")), j).view(nq, nr)
    bad = ~(q.valid.cpu()[:, None] & r.valid.cpu()[None, :])
    return c.masked_fill(bad, -math.inf)


def expected_pair_set(c: torch.Tensor, t: float, mode: str | None, diag: int = 0) -> set:
    ok = c >= t
    pos = torch.arange(c.shape[0])[:, None] + diag
    cols = torch.arange(c.shape[1])[None, :]
    if mode == "upper":
        ok &= cols > pos
    elif mode == "exclude_self":
        ok &= cols != pos
    return set(zip(*(v.tolist() for v in ok.nonzero(as_tuple=True))))


def expected_topk(c: torch.Tensor, k: int, exclude_self: bool) -> sk.TopK:
    c = c.clone()
    if exclude_self:
        c.fill_diagonal_(-math.inf)
    pos = np.broadcast_to(np.arange(c.shape[1]), c.shape)
    order = torch.from_numpy(np.lexsort((pos, -c.numpy()), axis=1)[:, :k].copy())
    score = torch.gather(c, 1, order)
    index = torch.where(torch.isfinite(score), order, torch.full_like(order, -1))
    if score.shape[1] < k:  # fewer rows than k
        pad = k - score.shape[1]
        score = torch.cat([score, torch.full((len(c), pad), -math.inf, dtype=c.dtype)], 1)
        index = torch.cat([index, torch.full((len(c), pad), -1, dtype=index.dtype)], 1)
    return sk.TopK(index, score)


# --------------------------------------------------------------------------- checks
# Shared with tests/test_search_triton.py (interpreter and GPU): ``engine``, ``config``
# and ``device`` pick the first pass.


def check_bound(x: torch.Tensor, null: torch.Tensor | None, kind: str | None, **run) -> float:
    """|s_hat - c| <= E for every valid pair; s_hat from the engine (every pair emitted with a
    bar of -inf).  Returns the largest |s_hat - c| / E seen."""
    dev = run.pop("device", "cpu")
    p, low = low_sides(x.to(dev), None if null is None else null.to(dev), kind)
    bar = torch.full((len(p),), -math.inf, device=dev)
    i, j, s, _ = tp._first_pass(low, low, bar, k=0, mode=None, diag=0, **run)
    c = all_scores(p, p)
    valid = p.valid.cpu()
    assert len(i) == int(valid.sum()) ** 2, "every valid pair is emitted"
    i, j, s = i.cpu(), j.cpu(), s.cpu().double()
    err = (s - c[i, j]).abs()
    bound = sp.pair_bound(low, i.to(dev), low, j.to(dev)).cpu()
    worst = float((err / bound).max()) if len(err) else 0.0
    assert worst <= 1.0, f"bound broken: |s_hat - c| / E = {worst}"
    return worst


def check_threshold(
    x: torch.Tensor, null: torch.Tensor | None, t: float | None, kind: str | None, **run
) -> None:
    """The threshold self-join (upper, exclude_self, plain) equals the float64 answer;
    ``t`` None: the float64 score of a pair in the near-``target`` cluster (a pair
    exactly at the threshold)."""
    dev = run.pop("device", "cpu")
    p, low = low_sides(x.to(dev), None if null is None else null.to(dev), kind)
    c = all_scores(p, p)
    if t is None:
        t = float(c[0, 1 + max(4, len(p) // 4) // 2]) if x.shape[1] >= 2 else 1.0
    for mode in ("upper", "exclude_self", None):
        i, j, s = tp.threshold_pairs(p, low, p, low, t, mode=mode, **run)
        got = set(zip(i.tolist(), j.tolist()))
        want = expected_pair_set(c, t, mode)
        assert got == want, (mode, t, len(got ^ want))
        assert torch.equal(s.cpu(), c[i.cpu(), j.cpu()])
    # Scores of certain pairs may stay low-precision: the set does not change.
    i, j, _ = tp.threshold_pairs(p, low, p, low, t, mode="upper", exact_scores=False, **run)
    assert set(zip(i.tolist(), j.tolist())) == expected_pair_set(c, t, "upper")
    # dedup's rows: those with an earlier row at or above the threshold.
    dropped = tp.matched_columns(p, low, p, low, t, mode="upper", **run)
    assert dropped.tolist() == sorted({j for _, j in expected_pair_set(c, t, "upper")})


def check_topk(x: torch.Tensor, null: torch.Tensor | None, ks, kind: str | None, **run) -> None:
    """Top-k of each row among the others, and of a few queries, equal the float64 answer:
    same indices in the same order, same scores."""
    dev = run.pop("device", "cpu")
    p, low = low_sides(x.to(dev), None if null is None else null.to(dev), kind)
    c = all_scores(p, p)
    for k in ks:
        res = tp.topk(p, low, p, low, k, exclude_self=True, **run)
        want = expected_topk(c, k, exclude_self=True)
        assert torch.equal(res.index.cpu(), want.index), k
        assert torch.equal(res.score.cpu(), want.score), k
    qx = x[:5].clone().to(dev)
    qp, ql = low_sides(qx, None, kind)
    res = tp.topk(qp, ql, p, low, ks[0], **run)
    want = expected_topk(all_scores(qp, p), ks[0], exclude_self=False)
    assert torch.equal(res.index.cpu(), want.index)


def check_overflow(device: str, config) -> None:
    """A buffer far too small: the kernel is launched again from where each program
    stopped, and the candidates are exactly those of one launch with room to spare."""
    from dask_cosim import _search_triton as st

    x, null = adversarial_rows(80, 40, "float32", seed=11)
    _, low = low_sides(x.to(device), null.to(device))
    bar = torch.full((len(low),), 0.05, device=device)
    for k, mode in ((0, "upper"), (4, "exclude_self")):
        roomy = st.search_candidates(low, low, bar, k=k, mode=mode, config=config, capacity=10**6)
        tight = st.search_candidates(low, low, bar, k=k, mode=mode, config=config, capacity=7)
        assert roomy.launches == 1 and tight.launches >= 2, (roomy.launches, tight.launches)
        pairs = set(zip(tight.i.tolist(), tight.j.tolist()))
        assert len(pairs) == len(tight.i), "a pair was written twice"
        if k == 0:  # the threshold's candidates do not depend on the order of tiles
            assert pairs == set(zip(roomy.i.tolist(), roomy.j.tolist()))
            want = dict(zip(zip(roomy.i.tolist(), roomy.j.tolist()), roomy.s.tolist()))
            assert all(want[p] == s for p, s in zip(zip(tight.i.tolist(), tight.j.tolist()), tight.s.tolist()))  # fmt: skip


def check_limit(device: str, **run) -> None:
    """A pair limit stops the two-pass threshold search as its first pass finds the
    candidates: 120 copies of one vector (7,140 matching pairs) pass a limit of 300 with
    :class:`TooManyPairs`, having held no more than the limit and one tile's (torch) or
    one launch's (Triton: a buffer cut to the limit's room, at least a tile) candidates
    past it; a limit with room gives the float64 answer."""
    from dask_cosim._search_sweep import PairLimit, TooManyPairs

    gen = torch.Generator().manual_seed(3)
    x = torch.cat(
        [torch.randn(1, 32, generator=gen).expand(120, 32), torch.randn(40, 32, generator=gen)]
    )
    p, low = low_sides(x.to(device), None)
    c = all_scores(p, p)
    want = expected_pair_set(c, 0.9, "upper")
    assert len(want) >= 7140
    limit = PairLimit(300)
    try:
        tp.threshold_pairs(p, low, p, low, 0.9, mode="upper", limit=limit, **run)
    except TooManyPairs as stop:
        assert stop.most == 300 and stop.found > 300, stop.found
        assert limit.found <= 300 + 64 * 64, limit.found  # held: not every pair
    else:
        raise AssertionError("7,140 pairs passed a limit of 300")
    roomy = PairLimit(len(want) + 10_000)
    i, j, s = tp.threshold_pairs(p, low, p, low, 0.9, mode="upper", limit=roomy, **run)
    assert set(zip(i.tolist(), j.tolist())) == want and len(i) == len(want)
    assert torch.equal(s.cpu(), c[i.cpu(), j.cpu()])
    assert len(want) <= roomy.found <= len(want) + 10_000  # the candidates, counted once
