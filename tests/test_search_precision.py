"""The low-precision first pass: its bound holds, and the two-pass search gives the float64
answer (same pairs, same top-k sets and order) on adversarial data.

The CPU tests run the torch engine (exact float16 x float16 products summed in float32);
tests/test_search_triton.py runs the same checks on the fused kernel, in Triton's
interpreter and, marked ``gpu``, compiled on a GPU.  The reference is the float64 answer
itself: every pair re-scored by ``search_kernels.rescore``, then thresholded or ranked
with the tie rule (score descending, then position).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dask_cosim import search_kernels as sk
from dask_cosim import search_precision as sp
from dask_cosim import search_twopass as tp
from tests.helpers import fp32_precision, needs_fp32_precision
from tests.search_checks import (
    DTYPES,
    EPS,
    adversarial_rows,
    all_scores,
    check_bound,
    check_limit,
    check_threshold,
    check_topk,
    expected_pair_set,
    expected_topk,
    low_sides,
)


@pytest.mark.parametrize("dim", [1, 7, 300, 768])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_bound_holds_on_adversarial_rows(dim: int, dtype: str) -> None:
    x, null = adversarial_rows(48, dim, dtype, seed=dim)
    for kind in ("float16", "bfloat16", "tf32"):
        check_bound(x, null, kind, engine="torch")


@pytest.mark.parametrize(
    ("dim", "dtype"),
    [(d, t) for d in (1, 7, 300) for t in DTYPES] + [(768, "float16"), (768, "float32")],
)
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
    p, low = low_sides(x, null)
    c = all_scores(p, p)
    t = float(c[0, 12])
    for rows in (1, 7, 64):
        i, j, _ = tp.threshold_pairs(
            p, low, p, low, t, mode="upper", engine="torch", block_rows=rows
        )
        assert set(zip(i.tolist(), j.tolist())) == expected_pair_set(c, t, "upper")
        res = tp.topk(p, low, p, low, 4, exclude_self=True, engine="torch", block_rows=rows)
        want = expected_topk(c, 4, exclude_self=True)
        assert torch.equal(res.index, want.index) and torch.equal(res.score, want.score)


def test_pair_limit_stops_the_first_pass() -> None:
    check_limit("cpu", engine="torch", config=64)


@pytest.mark.parametrize("dim", [300, 304])
def test_fp16_and_bf16_inputs_are_copied_exactly(dim: int) -> None:
    # Their own 16-bit type keeps every value: the copy's error is the weight's rounding.
    for dtype, kind in (("float16", "float16"), ("bfloat16", "bfloat16")):
        x = torch.randn(64, dim).to(DTYPES[dtype])
        x[0] *= 1000.0
        _p, low = low_sides(x, None)
        assert low.kind == kind
        # Rows padded with zeros to a multiple of 16 values, so the kernel's loads are wide.
        assert low.dim == 304 and not low.low[:, dim:].any()
        copy = low.low[:, :dim].float()
        assert torch.equal(copy / copy.abs().amax(1, keepdim=True),
                           x.float() / x.float().abs().amax(1, keepdim=True))  # fmt: skip
        assert float(low.err.max()) <= 2.0**-23
        # float16 is its own copy where no padding is needed: no second N x D tensor.
        assert (low.low.data_ptr() == x.data_ptr()) == (dtype == "float16" and dim == 304)


def test_extreme_magnitudes_neither_overflow_nor_underflow() -> None:
    x = torch.randn(6, 50, dtype=torch.float64)
    x[0] *= 1e300
    x[1] *= 1e-300
    x[2] = 0.0
    x[2, 3] = 1e-305  # a lone tiny value (below 2^-1024 search_kernels.prepare breaks)
    x[3] = torch.full((50,), 1.7e308, dtype=torch.float64)
    x[4] *= 1e-12  # shorter than eps
    _p, low = low_sides(x, None)
    big = low.low.float().abs().amax(1)
    assert ((big >= 2**14) & (big < 2**15))[[0, 1, 3, 4]].all()
    assert torch.isfinite(low.low.float()).all() and torch.isfinite(low.err).all()
    assert float(low.nu[4]) < 1e-3  # its cosines are at most |x| / eps
    check_bound(x, None, "float16", engine="torch")


def test_fast_policy_changes_decisions_that_exact_keeps() -> None:
    # The near-threshold cluster is adversarial: s_hat alone decides some pairs wrongly.
    x, null = adversarial_rows(200, 300, "float32", seed=3)
    p, low = low_sides(x, null)
    c = all_scores(p, p)
    t = float(c[0, 25])
    fast = tp.threshold_pairs(p, low, p, low, t, mode="upper", exact=False, engine="torch")
    exact = tp.threshold_pairs(p, low, p, low, t, mode="upper", engine="torch")
    want = expected_pair_set(c, t, "upper")
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
    _, low = low_sides(x, None)
    want = sp.low_scores(low, low)
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        got = sp.low_scores(low, low)
        kinds = sp.float32_matmul("cpu"), sp.float32_matmul("cuda")
    finally:
        torch.set_float32_matmul_precision(old)
    assert (got - want).abs().max() < 1e-5
    assert kinds == ("bf16", "bf16")


@needs_fp32_precision
@pytest.mark.parametrize(
    ("settings", "cpu", "cuda"),
    [
        ({}, "ieee", "ieee"),
        ({"cuda_matmul": "tf32"}, "ieee", "tf32"),
        ({"mkldnn_matmul": "bf16"}, "bf16", "ieee"),
        ({"generic": "tf32", "cuda_matmul": "ieee"}, "tf32", "ieee"),
    ],
)
def test_torch_per_backend_float32_settings_are_read(
    settings: dict[str, str], cpu: str, cuda: str
) -> None:
    """torch 2.9's fp32_precision settings: torch.get_float32_matmul_precision raises once
    they are used, and what they allow decides how the products are accumulated."""
    x = torch.randn(20, 64)
    _, low = low_sides(x, None)
    want = sp.low_scores(low, low)
    with fp32_precision(**settings):
        got = sp.low_scores(low, low)
        kinds = sp.float32_matmul("cpu"), sp.float32_matmul("cuda")
    assert (got - want).abs().max() < 1e-5
    assert kinds == (cpu, cuda)


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
    p, low = low_sides(x, None)
    c = all_scores(p, p)
    finite = c[torch.isfinite(c)]
    t = float(data.draw(st.sampled_from(finite.tolist()))) if len(finite) else 0.5
    i, j, _ = tp.threshold_pairs(p, low, p, low, t, mode="upper", engine="torch", config=8)
    assert set(zip(i.tolist(), j.tolist())) == expected_pair_set(c, t, "upper")
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
        assert set(zip(i.tolist(), j.tolist())) == expected_pair_set(c, t, mode)
        assert torch.equal(s, c[i, j])


def test_low_precision_scores_reported_are_clamped() -> None:
    """Scores the first pass reports as they are ("fast", and pairs certain to pass with
    exact_scores off) are clamped to [-1, 1] as every score is: those of copies of a row
    came out as s_hat, up to 1.0007 in float16."""
    x = torch.randn(8, 7, generator=torch.Generator().manual_seed(18))
    p, low = low_sides(torch.cat([x, x]), None)
    for run in ({"exact": False}, {"exact_scores": False}):
        _, _, s = tp.threshold_pairs(p, low, p, low, 0.5, mode="upper", engine="torch", **run)
        assert len(s) >= 8 and float(s.max()) == 1.0, run
    res = tp.topk(p, low, p, low, 2, exclude_self=True, exact=False, engine="torch")
    assert float(res.score.max()) == 1.0
