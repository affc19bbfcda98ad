"""kernels.pairwise_cosine against the float64 reference and scikit-learn, every kernel:
rows of every dtype (float16 and bfloat16 accumulated in float32, float64, float64
accumulation asked for, integers upcast), zero, non-finite and zero-length vectors,
clamping, float32 overflow recomputed, and properties on generated batches.

The torch kernel (fused=False) is the reference implementation; "numba" is the fused CPU
kernel.  tests/test_kernels_arguments.py covers the options and shapes the kernels take
and which kernel runs, tests/test_kernels_numerics.py magnitudes from 1e-300 to 1e308 and
tests/test_kernels_triton.py the CUDA kernel.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.metrics.pairwise import paired_cosine_distances

from dask_cosim import kernels
from tests.helpers import CHUNK_BYTES, cosine, random_pairs, reference

# Every CPU kernel: the torch kernel and the fused one (numba is a core dependency).
KERNELS = [pytest.param(False, id="torch"), pytest.param("numba", id="numba")]


@pytest.mark.parametrize("fused", KERNELS)
@pytest.mark.parametrize("chunk_rows", [None, 1, 7, 64, 10_000])
def test_matches_reference_and_sklearn(chunk_rows: int | None, fused: bool | str) -> None:
    a, b = random_pairs(513, 300)
    res = cosine(
        torch.from_numpy(a),
        torch.from_numpy(b),
        chunk_rows=chunk_rows,
        fused=fused,
    )
    assert res.dtype == torch.float32 and res.shape == (513,)
    np.testing.assert_allclose(res.numpy(), reference(a, b), atol=1e-6, rtol=0)
    np.testing.assert_allclose(res.numpy(), 1 - paired_cosine_distances(a, b), atol=1e-6, rtol=0)


@pytest.mark.parametrize("fused", KERNELS)
def test_zero_vector_gives_zero_and_nonfinite_gives_nan(fused: bool | str) -> None:
    a = torch.tensor([[0.0, 0.0], [1.0, 0.0], [np.nan, 1.0], [np.inf, 0.0], [1.0, 1.0], [0.0, 0.0]])
    b = torch.tensor([[1.0, 2.0], [0.0, 0.0], [1.0, 1.0], [1.0, 0.0], [-np.inf, 1.0], [0.0, 0.0]])
    for dtype in (torch.float32, torch.float64):
        res = cosine(a.to(dtype), b.to(dtype), fused=fused)
        assert res[:2].tolist() == [0.0, 0.0]
        assert torch.isnan(res[2:5]).all()
        assert res[5].item() == 0.0
        # eps = 0 is the plain formula: a zero vector is 0/0, NaN.
        res = kernels.pairwise_cosine(
            a.to(dtype), b.to(dtype), eps=0.0, fused=fused, chunk_bytes=CHUNK_BYTES
        )
        assert torch.isnan(res[[0, 1, 2, 3, 4, 5]]).all()
        assert (
            kernels.pairwise_cosine(
                a[4:5], a[4:5], eps=0.0, fused=fused, chunk_bytes=CHUNK_BYTES
            ).item()
            == 1.0
        )
    # A zero row beside NaN is NaN: the NaN rule comes first.
    nan_zero = cosine(torch.zeros(1, 3), torch.full((1, 3), np.nan), fused=fused)
    assert torch.isnan(nan_zero).all()


@pytest.mark.parametrize("fused", KERNELS)
def test_parallel_and_antiparallel_clamped(fused: bool | str) -> None:
    a = torch.full((3, 1000), 0.1)
    res = cosine(a, a * 3, fused=fused)
    assert (res <= 1).all() and torch.allclose(res, torch.ones(3))
    assert torch.allclose(
        cosine(a, -a, fused=fused),
        -torch.ones(3),
    )


def test_fp16_accumulates_in_float32_without_overflow() -> None:
    # 60000 is near fp16's maximum: the squared norm over 4096 values is ~1.5e13.
    a = torch.full((4, 4096), 60000.0, dtype=torch.float16)
    b = a.clone()
    b[1] = -b[1]
    b[2, :2048] = 0
    res = cosine(a, b)
    assert res.dtype == torch.float32
    np.testing.assert_allclose(
        res.numpy(), reference(a.float().numpy(), b.float().numpy()), atol=1e-6
    )


@pytest.mark.parametrize("fused", KERNELS)
def test_float64(fused: bool | str) -> None:
    a, b = random_pairs(100, 33, dtype=np.float64)
    res64 = cosine(torch.from_numpy(a), torch.from_numpy(b), fused=fused)
    assert res64.dtype == torch.float64
    np.testing.assert_allclose(res64.numpy(), reference(a, b), atol=1e-12)


def test_bf16_and_float64() -> None:
    a, b = random_pairs(100, 33, dtype=np.float64)
    res64 = cosine(torch.from_numpy(a), torch.from_numpy(b))
    assert res64.dtype == torch.float64
    np.testing.assert_allclose(res64.numpy(), reference(a, b), atol=1e-12)
    abf, bbf = torch.from_numpy(a).bfloat16(), torch.from_numpy(b).bfloat16()
    res = cosine(abf, bbf)
    assert res.dtype == torch.float32
    np.testing.assert_allclose(
        res.numpy(), reference(abf.float().numpy(), bbf.float().numpy()), atol=1e-6
    )


@pytest.mark.parametrize("fused", KERNELS)
def test_requested_float64_accumulation(fused: bool | str) -> None:
    a, b = random_pairs(50, 20)
    res = cosine(
        torch.from_numpy(a),
        torch.from_numpy(b),
        dtype=torch.float64,
        fused=fused,
    )
    assert res.dtype == torch.float64
    np.testing.assert_allclose(res.numpy(), reference(a, b), atol=1e-12)


@pytest.mark.parametrize("fused", KERNELS)
def test_float32_overflow_rows_are_recomputed(fused: bool | str) -> None:
    # |x| = 1e30: x*x overflows float32; the rows are redone in float64.
    a, b = random_pairs(10, 16)
    a[3] *= 1e30
    b[3] *= 1e30
    b[5] *= 1e25
    res = cosine(
        torch.from_numpy(a),
        torch.from_numpy(b),
        chunk_rows=4,
        fused=fused,
    )
    np.testing.assert_allclose(res.numpy(), reference(a, b), atol=1e-6)


def test_integer_inputs_are_upcast() -> None:
    a = torch.tensor([[1, 2, 3], [0, 0, 0]])
    b = torch.tensor([[2, 4, 6], [1, 1, 1]])
    assert cosine(a, b).tolist() == pytest.approx([1.0, 0.0])


FLOAT_DTYPES = st.sampled_from([np.float16, np.float32, np.float64])


@st.composite
def pair_batches(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    n = draw(st.integers(1, 40))
    d = draw(st.integers(1, 1024))
    dtype = draw(FLOAT_DTYPES)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    limit = 4 if dtype == np.float16 else (30 if dtype == np.float32 else 100)
    scale_a = 10.0 ** draw(st.integers(-limit, limit))
    scale_b = 10.0 ** draw(st.integers(-limit, limit))
    a = (rng.standard_normal((n, d)) * scale_a).astype(dtype)
    b = (rng.standard_normal((n, d)) * scale_b).astype(dtype)
    specials = draw(
        st.lists(
            st.tuples(
                st.integers(0, n - 1),
                st.integers(0, d - 1),
                st.sampled_from(["zero_row", "nan", "inf", "-inf"]),
            ),
            max_size=3,
        )
    )
    for row, col, kind in specials:
        target = a if (row + col) % 2 else b
        if kind == "zero_row":
            target[row] = 0
        else:
            target[row, col] = float(kind)
    return a, b


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair_batches(), st.integers(1, 64), st.sampled_from([None, False]))
def test_property_matches_float64_reference(
    pair: tuple[np.ndarray, np.ndarray], chunk_rows: int, fused: bool | None
) -> None:
    a, b = pair
    res = cosine(
        torch.from_numpy(a),
        torch.from_numpy(b),
        chunk_rows=chunk_rows,
        fused=fused,
    ).numpy()
    ref = reference(a, b)
    np.testing.assert_array_equal(np.isnan(res), np.isnan(ref))
    tol = 1e-12 if a.dtype == np.float64 else 1e-6
    np.testing.assert_allclose(res[~np.isnan(ref)], ref[~np.isnan(ref)], atol=tol, rtol=0)
    assert (np.abs(res[~np.isnan(res)]) <= 1).all()


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 300),
    st.integers(0, 2**32 - 1),
    st.floats(-1e3, 1e3).filter(lambda k: abs(k) > 1e-3),
)
def test_property_symmetric_scale_invariant_self_is_one(d: int, seed: int, k: float) -> None:
    a, b = random_pairs(8, d, seed=seed)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    ab = cosine(ta, tb)
    assert torch.equal(ab, cosine(tb, ta))
    scaled = cosine(ta * k, tb)
    torch.testing.assert_close(scaled, ab * np.sign(k), atol=2e-6, rtol=0)
    torch.testing.assert_close(
        cosine(ta, ta),
        torch.ones(8),
        atol=2e-6,
        rtol=0,
    )


@pytest.mark.parametrize("fused", [None, False, "numba"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_zero_length_vectors_give_zero(fused: bool | str | None, dtype: torch.dtype) -> None:
    """D = 0: every vector is the zero vector, so every row is 0.0 (no error)."""
    res = cosine(
        torch.empty(5, 0, dtype=dtype),
        torch.empty(5, 0, dtype=dtype),
    )
    assert res.dtype == dtype and res.tolist() == [0.0] * 5
    empty = torch.empty(5, 0, dtype=dtype)
    assert torch.isnan(cosine(empty, empty, eps=0.0, fused=fused)).all()
    assert cosine(torch.empty(0, 0), torch.empty(0, 0)).shape == (0,)
    assert cosine(torch.empty(0, 3), torch.empty(0, 3), fused=fused).shape == (0,)


@pytest.mark.parametrize("layout", ["fixed_size_list", "list"])
def test_zero_length_vectors_through_a_partition_raise(layout: str) -> None:
    import pandas as pd
    import pyarrow as pa

    from dask_cosim import partition

    value_type = (
        pa.list_(pa.float32(), 0) if layout == "fixed_size_list" else pa.list_(pa.float32())
    )
    # Vectors of no values (an embedding step that failed) have no cosine: they scored
    # 0.0 in every row.  Null rows beside them are still null; no rows, no error.
    column = pd.arrays.ArrowExtensionArray(pa.array([None, [], []], type=value_type))
    df = pd.DataFrame({"a": column, "b": column}, index=["r0", "r1", "r2"])
    with pytest.raises(ValueError, match=r"column 'a': row 'r1' holds an empty vector"):
        partition.pairwise_partition(df, "a", "b")
    assert partition.pairwise_partition(df.iloc[:1], "a", "b").isna().all()
    assert len(partition.pairwise_partition(df.iloc[:0], "a", "b")) == 0
