"""Every finite input gives the right cosine: magnitudes from 1e-300 to 1e308, both dtypes.

The reference is exact (``tests.helpers.exact_reference``): sums of products of the inputs
as fractions (no rounding, no overflow), rounded to float once at the end.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dask_cosim import kernels, options
from tests.helpers import exact_reference, reference

# The kernels take their options as arguments: the configured defaults (cosim.yaml).
EPS, CHUNK_BYTES = options.eps(), options.chunk_bytes()

KERNELS = [pytest.param(False, id="torch"), pytest.param("numba", id="numba")]


@pytest.mark.parametrize("fused", KERNELS)
def test_the_extremes_of_float64(fused: bool | str) -> None:
    big = 1e308
    a = torch.tensor(
        [[big] * 3, [3e200, 4e200, 0.0], [1e200, 0.0, 0.0], [big, big, 0.0], [5e-324, 0, 0]],
        dtype=torch.float64,
    )
    b = torch.tensor(
        [[-big] * 3, [3e200, 4e200, 0.0], [1.0, 0.0, 0.0], [big, 0.0, 0.0], [5e-324, 0, 0]],
        dtype=torch.float64,
    )
    res = kernels.pairwise_cosine(a, b, fused=fused, eps=EPS, chunk_bytes=CHUNK_BYTES)
    assert res.tolist()[:4] == pytest.approx([-1.0, 1.0, 1.0, 2**-0.5], abs=1e-15)
    # The smallest subnormal is far below eps: (a / eps) . (b / eps) = 2.5e-631, i.e. 0.
    assert res[4].item() == 0.0
    zero_eps = kernels.pairwise_cosine(a, b, eps=0.0, fused=fused, chunk_bytes=CHUNK_BYTES)
    assert zero_eps.tolist() == pytest.approx([-1.0, 1.0, 1.0, 2**-0.5, 1.0], abs=1e-15)


@pytest.mark.parametrize("fused", KERNELS)
def test_the_extremes_of_float32(fused: bool | str) -> None:
    big = 3e38
    a = torch.tensor([[big] * 3, [3e30, 4e30, 0.0], [1e30, 0.0, 0.0], [1e-40, 1e-40, 0]])
    b = torch.tensor([[-big] * 3, [3e30, 4e30, 0.0], [1.0, 0.0, 0.0], [1e-40, 0.0, 0]])
    res = kernels.pairwise_cosine(a, b, eps=0.0, fused=fused, chunk_bytes=CHUNK_BYTES)
    assert res.dtype == torch.float32
    assert res.tolist() == pytest.approx([-1.0, 1.0, 1.0, 2**-0.5], abs=1e-7)


@st.composite
def extreme_pairs(draw: st.DrawFn, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """Rows of any finite magnitude: each vector its own power of ten, some rows with one
    entry far larger than the rest, zero entries and zero rows."""
    top = 300 if dtype == np.float64 else 37
    n = draw(st.integers(1, 12))
    d = draw(st.integers(1, 48))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    out = []
    for _ in range(2):
        exps = draw(st.lists(st.integers(-top, top), min_size=n, max_size=n))
        x = rng.standard_normal((n, d)) * (10.0 ** np.array(exps, dtype=np.float64))[:, None]
        for row in draw(st.lists(st.integers(0, n - 1), max_size=3)):
            with np.errstate(over="ignore"):  # clipped to a finite value below
                x[row, rng.integers(d)] *= 10.0 ** draw(st.integers(0, top // 2))
        for row in draw(st.lists(st.integers(0, n - 1), max_size=2)):
            x[row] = 0.0
        x[rng.random((n, d)) < 0.1] = 0.0
        top_value = np.finfo(dtype).max / 4
        out.append(np.clip(x, -top_value, top_value).astype(dtype))
    return out[0], out[1]


def _check(a: np.ndarray, b: np.ndarray, eps: float, fused: bool | None, atol: float) -> None:
    res = kernels.pairwise_cosine(
        torch.from_numpy(a), torch.from_numpy(b), eps=eps, fused=fused, chunk_bytes=CHUNK_BYTES
    ).numpy()
    ref = exact_reference(a, b, eps)
    np.testing.assert_array_equal(np.isnan(res), np.isnan(ref))  # zero rows when eps = 0
    assert not np.isnan(ref).any() or eps == 0
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(res[ok], ref[ok], atol=atol, rtol=0)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    extreme_pairs(np.float64), st.sampled_from([1e-8, 0.0, 1e-200]), st.sampled_from([None, False])
)
def test_property_float64_any_magnitude(
    pair: tuple[np.ndarray, np.ndarray], eps: float, fused: bool | None
) -> None:
    _check(*pair, eps, fused, atol=1e-13)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(extreme_pairs(np.float32), st.sampled_from([1e-8, 0.0]), st.sampled_from([None, False]))
def test_property_float32_any_magnitude(
    pair: tuple[np.ndarray, np.ndarray], eps: float, fused: bool | None
) -> None:
    _check(*pair, eps, fused, atol=1e-6)


def test_exact_reference_agrees_with_float64_where_float64_suffices() -> None:
    """The exact reference against the float64 one on ordinary rows: one policy, twice."""
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 20, 30))
    a[3] *= 1e-9  # |a| < eps: the eps factor
    np.testing.assert_allclose(exact_reference(a, b), reference(a, b), atol=1e-14, rtol=0)
