"""kernels.pairwise_cosine's arguments: the shapes it takes, its options (eps, the chunk
budget) given as arguments and read from no configuration (the top-level pairwise_cosine
fills them from the config), the chunk budget and the memory it bounds (no whole-partition
temporaries, the chunk halved on out-of-memory), and ``fused``: which kernel runs, its
errors, the numba kernel's threads and a machine without numba.

tests/test_kernels_reference.py checks the kernels' answers against the float64 reference.
"""

from __future__ import annotations

import dask
import numpy as np
import pytest
import torch

from dask_cosim import kernels
from tests.helpers import CHUNK_BYTES, EPS, cosine, random_pairs, reference


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
