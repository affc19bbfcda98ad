"""The Triton kernels compile for CUDA GPUs here, without one (benchmarks/kernel_build.py):
the launches dask_cosim makes, specialised as Triton's JIT would, through Triton's own
compiler and ptxas.  The interpreter tests check what the kernels compute; these check
that the GPU compiler takes them, and that the search kernel's product lands on the
tensor cores."""

from __future__ import annotations

import importlib.util

import pytest

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install triton; it ships with CUDA builds of torch)",
)


@needs_triton
@pytest.mark.parametrize(
    ("arch", "kind", "dim", "k", "mode"),
    [
        (90, "float16", 300, 0, "upper"),  # threshold self-join, D not a multiple of 16
        (90, "bfloat16", 768, 10, None),  # top-k
        (80, "tf32", 384, 0, None),  # A100: mma, not wgmma
    ],
)
def test_search_kernel_compiles_for_the_gpu(
    arch: int, kind: str, dim: int, k: int, mode: str | None
) -> None:
    from benchmarks import kernel_build as kb

    launch = kb.search_launch(kind, dim, k, mode)
    kernel = kb.compile_launch(launch, arch)
    res = kb.resources(kernel, arch)
    assert res["registers"] is not None and res["registers"] <= 255
    code = kb.search_structure(kb.sass(kernel))
    assert code["tensor_cores"], "the product does not run on tensor cores"
    assert code["loop"]["mma"] > 0 and code["epilogue"]["instructions"] > 0
    if arch == 90:
        assert any("HGMMA" in op for _, op in kb.sass(kernel))  # Hopper's wgmma


@needs_triton
def test_pairwise_kernel_compiles_for_the_gpu() -> None:
    import torch

    from benchmarks import kernel_build as kb

    kernel = kb.compile_launch(kb.pairwise_launch(torch.bfloat16, 300), 90)
    assert kb.resources(kernel, 90)["registers"] is not None
