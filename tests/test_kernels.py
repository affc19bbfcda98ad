"""kernels.pairwise_cosine against the float64 reference and scikit-learn, every kernel.

The torch kernel (fused=False) is the reference implementation; "numba" is the fused CPU
kernel.  tests/test_kernels_numerics.py covers magnitudes from 1e-300 to 1e308 and
tests/test_kernels_triton.py the CUDA kernel.
"""

from __future__ import annotations

import functools

import dask
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.metrics.pairwise import paired_cosine_distances

from dask_cosim import kernels, options
from tests.helpers import random_pairs, reference

# The kernels take their options as arguments: the configured defaults (cosim.yaml).
EPS, CHUNK_BYTES = options.eps(), options.chunk_bytes()
# The kernel with the configured eps and chunk budget (both are required arguments).
cosine = functools.partial(kernels.pairwise_cosine, eps=EPS, chunk_bytes=CHUNK_BYTES)

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


def test_shape_errors() -> None:
    with pytest.raises(ValueError, match=r"a \(3, 2\) and b \(3, 4\)"):
        cosine(torch.ones(3, 2), torch.ones(3, 4))
    with pytest.raises(ValueError, match="two \\(N, D\\) tensors"):
        cosine(torch.ones(3), torch.ones(3))


def test_chunk_budget() -> None:
    # float32, D=300: 1 MiB of temporaries is 873 rows, a third of that when converting.
    assert kernels.chunk_rows_for(300, torch.float32, "cpu", chunk_bytes="1MiB") == 873
    assert (
        kernels.chunk_rows_for(300, torch.float32, "cpu", converts=True, chunk_bytes=2**20) == 291
    )
    assert (
        kernels.chunk_rows_for(300, torch.float32, "cuda", chunk_bytes={"cpu": 1, "cuda": "12KB"})
        == 10
    )
    assert kernels.chunk_rows_for(10**9, torch.float64, "cpu", chunk_bytes=CHUNK_BYTES) == 1
    # The budget is the argument, not the configuration's.
    with dask.config.set({"cosim.chunk-bytes.cpu": "2400B"}):
        assert kernels.chunk_rows_for(300, torch.float32, chunk_bytes="512KiB") == 2**19 // 1200


def test_kernels_read_no_configuration() -> None:
    """Options arrive as arguments, with no defaults of the kernels' own (the defaults
    are cosim.yaml's, which the layers above pass down)."""
    a = torch.tensor([[1e-9, 0.0], [1.0, 1.0]])
    b = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    with pytest.raises(TypeError, match="eps"):
        kernels.pairwise_cosine(a, b, chunk_bytes=CHUNK_BYTES)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="chunk_bytes"):
        kernels.pairwise_cosine(a, b, eps=EPS)  # type: ignore[call-arg]
    before = kernels.pairwise_cosine(a, b, eps=1e-8, chunk_bytes=CHUNK_BYTES)
    before_torch = kernels.pairwise_cosine(a, b, fused=False, eps=1e-8, chunk_bytes=CHUNK_BYTES)
    with dask.config.set({"cosim.eps": 1.0, "cosim.chunk-bytes.cpu": "1B"}):
        after = kernels.pairwise_cosine(a, b, eps=1e-8, chunk_bytes=CHUNK_BYTES)
        after_torch = kernels.pairwise_cosine(a, b, fused=False, eps=1e-8, chunk_bytes=CHUNK_BYTES)
    assert torch.equal(after, before) and torch.equal(after_torch, before_torch)
    # |a| = 1e-9 < eps: 1e-9 / (1e-8 * 1) = 0.1; with eps = 1, 1e-9.
    assert before.tolist() == pytest.approx([0.1, 2**-0.5])
    with_eps_1 = kernels.pairwise_cosine(a, b, eps=1.0, chunk_bytes=CHUNK_BYTES)
    assert with_eps_1[0].item() == pytest.approx(1e-9)


def test_top_level_pairwise_cosine_takes_the_configured_options() -> None:
    """``dask_cosim.pairwise_cosine`` is the kernel with eps and chunk_bytes from the
    config when not given (the kernel itself has no defaults)."""
    import dask_cosim

    a = torch.tensor([[1e-9, 0.0], [1.0, 1.0]])
    b = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    assert dask_cosim.pairwise_cosine(a, b).tolist() == pytest.approx([0.1, 2**-0.5])
    with dask.config.set({"cosim.eps": 1.0}):
        assert dask_cosim.pairwise_cosine(a, b)[0].item() == pytest.approx(1e-9)
    assert dask_cosim.pairwise_cosine(a, b, eps=1.0)[0].item() == pytest.approx(1e-9)
    with pytest.raises(ValueError, match="eps"):
        dask_cosim.pairwise_cosine(a, b, eps=-1.0)


def test_does_not_materialise_whole_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel never calls F.cosine_similarity (N x D temporaries): every product it
    forms is at most one chunk, written into one buffer allocated once."""
    sizes: list[int] = []
    buffers: set[int] = set()
    real_mul = torch.mul

    def spy(x: torch.Tensor, y: torch.Tensor, **kw: torch.Tensor) -> torch.Tensor:
        sizes.append(x.shape[0])
        buffers.add(kw["out"].untyped_storage().data_ptr())
        return real_mul(x, y, **kw)

    def forbidden(*args: object, **kw: object) -> None:
        raise AssertionError("F.cosine_similarity called")

    monkeypatch.setattr(torch, "mul", spy)
    monkeypatch.setattr(torch.nn.functional, "cosine_similarity", forbidden)
    a, b = random_pairs(10_000, 300)
    res = kernels.pairwise_cosine(
        torch.from_numpy(a), torch.from_numpy(b), chunk_bytes="1MiB", fused=False, eps=EPS
    )
    assert max(sizes) == 873 and sum(sizes) == 3 * 10_000  # a.b, a.a, b.b
    assert len(buffers) == 1
    np.testing.assert_allclose(res.numpy(), reference(a, b), atol=1e-6)


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


@pytest.mark.parametrize("error", [torch.cuda.OutOfMemoryError, MemoryError])
def test_out_of_memory_halves_the_chunk(monkeypatch: pytest.MonkeyPatch, error: type) -> None:
    """A device that cannot hold more than 100 rows of temporaries (simulated here: no GPU
    on this machine; tests/test_gpu.py runs the real thing): the chunk halves until it
    fits, and every row is still computed once."""
    real_empty = torch.empty
    sizes: list[int] = []

    def small_device(*shape: object, **kw: object) -> torch.Tensor:
        dims = shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        if len(dims) == 2 and dims[1] == 300:
            sizes.append(int(dims[0]))  # type: ignore[call-overload]
            if dims[0] > 100:  # type: ignore[operator]
                raise error("out of memory (simulated)")
        return real_empty(*shape, **kw)  # type: ignore[call-overload]

    monkeypatch.setattr(torch, "empty", small_device)
    a, b = random_pairs(1000, 300)
    res = cosine(
        torch.from_numpy(a),
        torch.from_numpy(b),
        chunk_rows=800,
        fused=False,
    )
    np.testing.assert_allclose(res.numpy(), reference(a, b), atol=1e-6)
    assert sizes == [800, 400, 200, 100]

    def no_memory(*shape: object, **kw: object) -> torch.Tensor:
        dims = shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        if len(dims) == 2 and dims[1] == 300:  # even one row fails: nothing left to halve
            sizes.append(int(dims[0]))  # type: ignore[call-overload]
            raise error("out of memory (simulated)")
        return real_empty(*shape, **kw)  # type: ignore[call-overload]

    monkeypatch.setattr(torch, "empty", no_memory)
    sizes.clear()
    with pytest.raises(error, match="simulated"):
        cosine(
            torch.from_numpy(a),
            torch.from_numpy(b),
            chunk_rows=8,
            fused=False,
        )
    assert sizes == [8, 4, 2, 1]


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


def test_which_kernel_runs() -> None:
    f32 = torch.ones(4, 3)
    assert kernels.fused_kernel_for(f32, f32) == "numba"
    assert kernels.fused_kernel_for(f32.double(), f32.double()) == "numba"
    # Mixed dtypes, integers, half precision and strided views take the torch kernel.
    assert kernels.fused_kernel_for(f32, f32.double()) is None
    assert kernels.fused_kernel_for(f32.long(), f32.long()) is None
    assert kernels.fused_kernel_for(f32.half(), f32.half()) is None
    strided = torch.ones(4, 6)[:, ::2]
    assert kernels.fused_kernel_for(strided, strided) is None
    a, b = random_pairs(20, 6)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    np.testing.assert_allclose(
        cosine(ta.T.contiguous().T, tb).numpy(),
        reference(a, b),
        atol=1e-6,
    )


def test_fused_argument_errors() -> None:
    f32 = torch.ones(4, 3)
    with pytest.raises(RuntimeError, match=r"fused=True but no fused kernel applies: numba "
                       r"takes float32 or float64 pairs, got torch.int64"):  # fmt: skip
        cosine(f32.long(), f32.long(), fused=True)
    with pytest.raises(ValueError, match=r"fused='cuda'; use None, True, False, 'numba'"):
        cosine(f32, f32, fused="cuda")
    assert cosine(f32, f32, fused=True).tolist() == pytest.approx([1.0] * 4)


def test_fused_kernel_releases_grad_and_follows_torch_threads() -> None:
    """Tensors that require grad are read without a copy; numba takes torch's thread
    count (what TorchThreads sets in dask workers), and small inputs one thread."""
    import numba

    from dask_cosim import _kernels_numba

    a, b = random_pairs(64, 10)
    ta = torch.from_numpy(a).requires_grad_()
    res = cosine(ta, torch.from_numpy(b), fused="numba")
    np.testing.assert_allclose(res.numpy(), reference(a, b), atol=1e-6)

    big = torch.ones(_kernels_numba.PARALLEL_MIN_VALUES // 64, 64)
    before = torch.get_num_threads()
    most = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]
    try:
        for threads in (1, 2):
            numba.set_num_threads(1)
            torch.set_num_threads(threads)
            assert cosine(big, big, fused="numba").min().item() == 1.0
            assert numba.get_num_threads() == min(threads, most)
    finally:
        torch.set_num_threads(before)


def test_without_numba_the_torch_kernel_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a machine without numba (or with a broken install) gets: the same numbers."""
    monkeypatch.setitem(kernels._loaded, "numba", "numba is not installed (pip install numba)")
    a, b = random_pairs(50, 12)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    assert kernels.fused_kernel_for(ta, tb) is None
    np.testing.assert_allclose(
        cosine(ta, tb).numpy(),
        reference(a, b),
        atol=1e-6,
    )
    with pytest.raises(RuntimeError, match=r"fused=True but no fused kernel applies: numba is "
                       r"not installed \(pip install numba\); use fused=None"):  # fmt: skip
        cosine(ta, tb, fused=True)


@pytest.mark.parametrize("layout", ["fixed_size_list", "list"])
def test_zero_length_vectors_through_a_partition(layout: str) -> None:
    import pandas as pd
    import pyarrow as pa

    from dask_cosim import partition

    value_type = (
        pa.list_(pa.float32(), 0) if layout == "fixed_size_list" else pa.list_(pa.float32())
    )
    column = pd.arrays.ArrowExtensionArray(pa.array([[], [], []], type=value_type))
    df = pd.DataFrame({"a": column, "b": column})
    assert partition.pairwise_partition(df, "a", "b").tolist() == [0.0] * 3
