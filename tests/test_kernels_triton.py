"""The Triton (CUDA) kernel: in Triton's interpreter on CPU tensors, and on real GPUs.

Without a GPU the kernel runs in the interpreter (``TRITON_INTERPRET=1``, which must be
set before triton compiles anything, hence a fresh process): the same kernel source,
the same masks and dtype conversions, executed with numpy.  The ``gpu`` tests run the
compiled kernel.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from dask_cosim import kernels, options
from tests.helpers import exact_reference, random_pairs, reference, run_in_triton_interpreter

# The kernels take their options as arguments: the configured defaults (cosim.yaml).
EPS, CHUNK_BYTES = options.eps(), options.chunk_bytes()

ROOT = Path(__file__).resolve().parent.parent
needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install triton; it ships with CUDA builds of torch)",
)

# D values: shorter than a block, one block, several blocks with a ragged tail.
DIMS = [1, 7, 128, 300, 1000]
TOLERANCE = {torch.float32: 1e-6, torch.float64: 1e-12, torch.float16: 1e-6, torch.bfloat16: 1e-6}


def check_against_reference(device: str) -> None:
    """Every input dtype and several D on ``device``: the fused kernel against float64."""
    for dim in DIMS:
        a, b = random_pairs(37, dim, seed=dim, dtype=np.float64)
        a[5] = 0.0  # a zero row
        b[6, 0] = np.nan
        a[7] *= 1e200  # sums past float64's range: the careful rule
        for dtype in TOLERANCE:
            ta = torch.from_numpy(a).to(device=device, dtype=dtype)
            tb = torch.from_numpy(b).to(device=device, dtype=dtype)
            if dtype != torch.float64:
                ta[7], tb[7] = 1.0, 2.0  # 1e200 is inf in the smaller types
            res = kernels.pairwise_cosine(ta, tb, fused="triton", eps=EPS, chunk_bytes=CHUNK_BYTES)
            want = exact_reference(ta.double().cpu().numpy(), tb.double().cpu().numpy())
            assert res.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
            got = res.cpu().numpy()
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            ok = ~np.isnan(want)
            np.testing.assert_allclose(got[ok], want[ok], atol=TOLERANCE[dtype], rtol=0)
            assert got[5] == 0.0
    big = torch.tensor([[1e308] * 3, [3e200, 4e200, 0.0]], dtype=torch.float64, device=device)
    flip = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 0.0, 0.0]], dtype=torch.float64, device=device)
    res = kernels.pairwise_cosine(
        big,
        flip * big.abs().amax(1, keepdim=True),
        fused="triton",
        eps=EPS,
        chunk_bytes=CHUNK_BYTES,
    )
    np.testing.assert_allclose(res.cpu().numpy(), [-1.0, 0.6], atol=1e-15)


@needs_triton
def test_triton_kernel_in_the_interpreter() -> None:
    code = "from tests.test_kernels_triton import check_against_reference as c; c('cpu')"
    run_in_triton_interpreter(code, timeout=240)


@pytest.mark.gpu
def test_triton_kernel_on_gpu() -> None:
    ones = torch.ones(4, 3, device="cuda")
    assert kernels.fused_kernel_for(ones, ones) == "triton"
    assert kernels.fused_kernel_for(ones, ones, device="cuda") == "triton"  # "cuda" = cuda:0
    # Host tensors computed on the GPU arrive as staged, contiguous chunks: Triton too.
    assert kernels.fused_kernel_for(ones.cpu(), ones.cpu(), device="cuda") == "triton"
    assert kernels.fused_kernel_for(ones.cpu().long(), ones.cpu().long(), device="cuda") is None
    check_against_reference("cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dim", [128, 300, 768, 4096])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_triton_matches_torch_kernel_on_gpu(dim: int, dtype: torch.dtype) -> None:
    a, b = random_pairs(10_000, dim)
    ta = torch.from_numpy(a).to("cuda", dtype)
    tb = torch.from_numpy(b).to("cuda", dtype)
    fused = kernels.pairwise_cosine(ta, tb, eps=EPS, chunk_bytes=CHUNK_BYTES)
    plain = kernels.pairwise_cosine(ta, tb, fused=False, eps=EPS, chunk_bytes=CHUNK_BYTES)
    torch.testing.assert_close(fused, plain, atol=1e-6, rtol=0)
    want = reference(ta.double().cpu().numpy(), tb.double().cpu().numpy())
    np.testing.assert_allclose(fused.cpu().numpy(), want, atol=1e-6)
