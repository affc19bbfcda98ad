"""The low-precision first pass: its bound holds, and the two-pass search gives the float64
answer (same pairs, same top-k sets and order) on adversarial data.

The CPU tests run the torch engine (exact float16 x float16 products summed in float32);
tests/test_search_triton.py runs the same checks on the fused kernel, in Triton's
interpreter and, marked ``gpu``, compiled on a GPU.  The reference is the float64 answer
itself: every pair re-scored by ``search_kernels.rescore``, then thresholded or ranked
with the tie rule (score descending, then position).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

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


def sides(x: torch.Tensor, null: torch.Tensor | None, kind: str | None = None):
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


def expected_pairs(c: torch.Tensor, t: float, mode: str | None, diag: int = 0) -> set:
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
    p, low = sides(x.to(dev), None if null is None else null.to(dev), kind)
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
    p, low = sides(x.to(dev), None if null is None else null.to(dev), kind)
    c = all_scores(p, p)
    if t is None:
        t = float(c[0, 1 + max(4, len(p) // 4) // 2]) if x.shape[1] >= 2 else 1.0
    for mode in ("upper", "exclude_self", None):
        i, j, s = tp.threshold_pairs(p, low, p, low, t, mode=mode, **run)
        got = set(zip(i.tolist(), j.tolist()))
        want = expected_pairs(c, t, mode)
        assert got == want, (mode, t, len(got ^ want))
        assert torch.equal(s.cpu(), c[i.cpu(), j.cpu()])
    # Scores of certain pairs may stay low-precision: the set does not change.
    i, j, _ = tp.threshold_pairs(p, low, p, low, t, mode="upper", exact_scores=False, **run)
    assert set(zip(i.tolist(), j.tolist())) == expected_pairs(c, t, "upper")
    # dedup's rows: those with an earlier row at or above the threshold.
    dropped = tp.matched_columns(p, low, p, low, t, mode="upper", **run)
    assert dropped.tolist() == sorted({j for _, j in expected_pairs(c, t, "upper")})


def check_topk(x: torch.Tensor, null: torch.Tensor | None, ks, kind: str | None, **run) -> None:
    """Top-k of each row among the others, and of a few queries, equal the float64 answer:
    same indices in the same order, same scores."""
    dev = run.pop("device", "cpu")
    p, low = sides(x.to(dev), None if null is None else null.to(dev), kind)
    c = all_scores(p, p)
    for k in ks:
        res = tp.topk(p, low, p, low, k, exclude_self=True, **run)
        want = expected_topk(c, k, exclude_self=True)
        assert torch.equal(res.index.cpu(), want.index), k
        assert torch.equal(res.score.cpu(), want.score), k
    qx = x[:5].clone().to(dev)
    qp, ql = sides(qx, None, kind)
    res = tp.topk(qp, ql, p, low, ks[0], **run)
    want = expected_topk(all_scores(qp, p), ks[0], exclude_self=False)
    assert torch.equal(res.index.cpu(), want.index)


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("dim", [1, 7, 300, 768])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_bound_holds_on_adversarial_rows(dim: int, dtype: str) -> None:
    x, null = adversarial_rows(48, dim, dtype, seed=dim)
    for kind in ("float16", "bfloat16", "tf32"):
        check_bound(x, null, kind, engine="torch")


@pytest.mark.parametrize("dim", [1, 7, 300, 768])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_threshold_equals_float64(dim: int, dtype: str) -> None:
    x, null = adversarial_rows(96 if dim < 768 else 64, dim, dtype, seed=dim + 1)
    check_threshold(x, null, None, None, engine="torch", config=40)


@pytest.mark.parametrize("dim", [1, 7, 300])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_topk_equals_float64(dim: int, dtype: str) -> None:
    x, null = adversarial_rows(96, dim, dtype, seed=dim + 2, target=0.6)
    check_topk(x, null, [1, 10, 30], None, engine="torch", config=32)


def test_d4096_and_every_kind() -> None:
    x, null = adversarial_rows(32, 4096, "float32", seed=4)
    for kind in ("bfloat16", "tf32"):  # float16: the default, tested everywhere else
        check_threshold(x, null, None, kind, engine="torch", config=64)
        check_topk(x, null, [3], kind, engine="torch", config=64)


def test_row_blocks_give_the_same_answer() -> None:
    # What an out-of-memory halving does: the rows of q in blocks, each with its own
    # offset on the diagonal.
    x, null = adversarial_rows(90, 24, "float32", seed=8, target=0.7)
    p, low = sides(x, null)
    c = all_scores(p, p)
    t = float(c[0, 12])
    for rows in (1, 7, 64):
        i, j, _ = tp.threshold_pairs(
            p, low, p, low, t, mode="upper", engine="torch", block_rows=rows
        )
        assert set(zip(i.tolist(), j.tolist())) == expected_pairs(c, t, "upper")
        res = tp.topk(p, low, p, low, 4, exclude_self=True, engine="torch", block_rows=rows)
        want = expected_topk(c, 4, exclude_self=True)
        assert torch.equal(res.index, want.index) and torch.equal(res.score, want.score)


def test_fp16_and_bf16_inputs_are_copied_exactly() -> None:
    # Their own 16-bit type keeps every value: the copy's error is the weight's rounding.
    for dtype, kind in (("float16", "float16"), ("bfloat16", "bfloat16")):
        x = torch.randn(64, 300).to(DTYPES[dtype])
        x[0] *= 1000.0
        _p, low = sides(x, None)
        assert low.kind == kind
        assert torch.equal(low.low.float() / low.low.float().abs().amax(1, keepdim=True),
                           x.float() / x.float().abs().amax(1, keepdim=True))  # fmt: skip
        assert float(low.err.max()) <= 2.0**-23
        # float16 is its own copy: no second N x D tensor.
        assert (low.low.data_ptr() == x.data_ptr()) == (dtype == "float16")


def test_extreme_magnitudes_neither_overflow_nor_underflow() -> None:
    x = torch.randn(6, 50, dtype=torch.float64)
    x[0] *= 1e300
    x[1] *= 1e-300
    x[2] = 0.0
    x[2, 3] = 1e-305  # a lone tiny value (below 2^-1024 search_kernels.prepare breaks)
    x[3] = torch.full((50,), 1.7e308, dtype=torch.float64)
    x[4] *= 1e-12  # shorter than eps
    _p, low = sides(x, None)
    big = low.low.float().abs().amax(1)
    assert ((big >= 2**14) & (big < 2**15))[[0, 1, 3, 4]].all()
    assert torch.isfinite(low.low.float()).all() and torch.isfinite(low.err).all()
    assert float(low.nu[4]) < 1e-3  # its cosines are at most |x| / eps
    check_bound(x, None, "float16", engine="torch")


def test_fast_policy_changes_decisions_that_exact_keeps() -> None:
    # The near-threshold cluster is adversarial: s_hat alone decides some pairs wrongly.
    x, null = adversarial_rows(200, 300, "float32", seed=3)
    p, low = sides(x, null)
    c = all_scores(p, p)
    t = float(c[0, 25])
    fast = tp.threshold_pairs(p, low, p, low, t, mode="upper", exact=False, engine="torch")
    exact = tp.threshold_pairs(p, low, p, low, t, mode="upper", engine="torch")
    want = expected_pairs(c, t, "upper")
    assert set(zip(exact[0].tolist(), exact[1].tolist())) == want
    changed = set(zip(fast[0].tolist(), fast[1].tolist())) ^ want
    assert changed
    # ... and every pair it decides differently is within its bound of the threshold.
    s_hat = sp.low_scores(low, low).double()
    bound = sp.bound_matrix(low, low).double()
    assert all(abs(s_hat[a, b] - t) <= bound[a, b] for a, b in changed)
    res = tp.topk(p, low, p, low, 5, exclude_self=True, exact=False, engine="torch")
    assert (res.index >= 0).sum() == 5 * int(p.valid.sum())


def test_worst_case_bounds_for_unit_rows_at_1536() -> None:
    # The figures quoted in docs/search-precision.md.
    assert sp.worst_case(1536, "float16") == pytest.approx(1.2e-3, rel=0.03)
    assert sp.worst_case(1536, "bfloat16") == pytest.approx(8.0e-3, rel=0.03)
    assert sp.worst_case(1536, "tf32") == pytest.approx(1.2e-3, rel=0.03)
    assert sp.worst_case(1536, "tf32", truncating_copy=True) == pytest.approx(2.2e-3, rel=0.03)


def test_reduced_precision_float32_products_fall_back_to_float64() -> None:
    x = torch.randn(20, 64)
    _, low = sides(x, None)
    want = sp.low_scores(low, low)
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        got = sp.low_scores(low, low)
    finally:
        torch.set_float32_matmul_precision(old)
    assert (got - want).abs().max() < 1e-5


rows_strategy = hnp.arrays(
    np.float32,
    hnp.array_shapes(min_dims=2, max_dims=2, min_side=2, max_side=24),
    elements=st.one_of(
        st.floats(-1e4, 1e4, width=32),
        st.sampled_from([0.0, 1e-30, -1e-30, 6e4, -6e4, 1e30, 3e-8]),
    ),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=rows_strategy, kind=st.sampled_from(["float16", "bfloat16", "tf32"]))
def test_bound_holds_on_any_rows(rows: np.ndarray, kind: str) -> None:
    x = torch.from_numpy(np.concatenate([rows, rows[:1] * 2.0, -rows[:1]]))
    check_bound(x, None, kind, engine="torch")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=rows_strategy, k=st.integers(1, 5), data=st.data())
def test_two_pass_equals_float64_on_any_rows(rows: np.ndarray, k: int, data) -> None:
    x = torch.from_numpy(np.concatenate([rows, rows[:2]]))  # duplicates: exact ties
    p, low = sides(x, None)
    c = all_scores(p, p)
    finite = c[torch.isfinite(c)]
    t = float(data.draw(st.sampled_from(finite.tolist()))) if len(finite) else 0.5
    i, j, _ = tp.threshold_pairs(p, low, p, low, t, mode="upper", engine="torch", config=8)
    assert set(zip(i.tolist(), j.tolist())) == expected_pairs(c, t, "upper")
    res = tp.topk(p, low, p, low, k, exclude_self=True, engine="torch", config=8)
    want = expected_topk(c, k, exclude_self=True)
    assert torch.equal(res.index, want.index) and torch.equal(res.score, want.score)


def test_handover_entry_points_on_lean_sides() -> None:
    # What search_kernels hands over to on CUDA, here on the CPU (torch engine): sides
    # prepared without unit rows, in chunks, give the float32 path's answers.
    x, null = adversarial_rows(80, 20, "float32", seed=12, target=0.7)
    y, _ = adversarial_rows(50, 20, "float16", seed=13, target=0.7)
    full = sk.prepare(x, null, eps=EPS)
    lean = tp.prepare_lean(x, null, eps=EPS, chunk_rows=7)
    assert lean.unit.shape == full.unit.shape and lean.unit.stride() == (0, 0)
    for name in ("inv", "scale", "valid"):
        assert torch.equal(getattr(lean, name), getattr(full, name)), name
    other, other_lean = sk.prepare(y, eps=EPS), tp.prepare_lean(y, eps=EPS)
    for same, both, r, r_lean in ((True, False, full, lean), (False, True, other, other_lean)):
        want = sk.topk(full, r, 6, tile_bytes=4096, same=same, both=both)
        got = tp.topk_prepared(lean, r_lean, 6, same=same, both=both, exact=True)
        for g, w in zip(got, want):
            if w is None:
                assert g is None
                continue
            assert g is not None
            assert torch.equal(g.index, w.index) and torch.equal(g.score, w.score)
    assert tp.lowered(lean) is tp.lowered(lean)  # made once per side
    c = all_scores(full, full)
    t = float(c[0, 9])
    for mode in ("upper", None):
        i, j, s = tp.threshold_prepared(lean, lean, t, mode=mode, exact_scores=True, exact=True)
        assert set(zip(i.tolist(), j.tolist())) == expected_pairs(c, t, mode)
        assert torch.equal(s, c[i, j])
