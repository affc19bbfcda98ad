"""The fused search kernel against the float64 answer: in Triton's interpreter on the CPU
(small blocks, small inputs: CI has 2 cores) and, marked ``gpu``, compiled on a GPU with
the Hopper-sized blocks at larger sizes.

The interpreter needs ``TRITON_INTERPRET=1`` before triton compiles anything, hence a
fresh process (as in tests/test_kernels_triton.py).
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from tests.helpers import run_in_triton_interpreter
from tests.search_checks import (
    adversarial_rows,
    check_bound,
    check_limit,
    check_overflow,
    check_threshold,
    check_topk,
    low_sides,
)

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install triton; it ships with CUDA builds of torch)",
)


def interpreter_checks() -> None:
    """Every check of tests/test_search_precision.py on the kernel, in the interpreter."""
    from dask_cosim import _search_triton as st

    small = st.TileConfig(
        bm=32, bn=32, bk=32, num_warps=4, num_stages=1, splits=2, group_m=2, raise_every=2
    )
    run = {"engine": "triton", "config": small}
    for dim, dtype in ((1, "float32"), (7, "float16"), (300, "bfloat16"), (33, "float64")):
        x, null = adversarial_rows(72, dim, dtype, seed=dim)
        check_bound(x, null, None, **run)
        check_threshold(x, null, None, None, **run)
    x, null = adversarial_rows(64, 24, "float32", seed=5, target=0.6)
    check_topk(x, null, [1, 10, 32, 40], None, **run)  # 40: more than a tile's buckets
    for kind in ("bfloat16", "tf32"):
        check_bound(x, null, kind, **run)
        check_topk(x, null, [3], kind, **run)
    check_overflow("cpu", small)
    # One tile's buffer (32 x 32) at first: the limit is checked launch by launch.
    check_limit("cpu", engine="triton", config=small)


@needs_triton
def test_search_kernel_in_the_interpreter() -> None:
    run_in_triton_interpreter(
        "from tests.test_search_triton import interpreter_checks; interpreter_checks()"
    )


# --------------------------------------------------------------------------- GPU

GPU = {"engine": "triton", "device": "cuda"}


@pytest.mark.gpu
@pytest.mark.parametrize("dim", [1, 7, 300, 768, 1536, 4096])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_bound_holds_on_tensor_cores(dim: int, dtype: str) -> None:
    # Every pair of 600 rows (360k low-precision scores from the compiled kernel):
    # the accumulation term of the bound is the tensor cores' own behaviour.
    x, null = adversarial_rows(600, dim, dtype, seed=dim)
    worst = max(check_bound(x, null, kind, **GPU) for kind in ("float16", "bfloat16", "tf32"))
    print(f"D={dim} {dtype}: largest |s_hat - c| / E = {worst:.3f}")


@pytest.mark.gpu
@pytest.mark.parametrize("dim", [1, 7, 300, 768, 4096])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_threshold_equals_float64_on_gpu(dim: int, dtype: str) -> None:
    x, null = adversarial_rows(1500 if dim < 4096 else 400, dim, dtype, seed=dim + 1)
    check_threshold(x, null, None, None, **GPU)


@pytest.mark.gpu
@pytest.mark.parametrize("dim", [7, 384, 768])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_topk_equals_float64_on_gpu(dim: int, dtype: str) -> None:
    x, null = adversarial_rows(1500, dim, dtype, seed=dim + 2, target=0.6)
    check_topk(x, null, [1, 10, 100], None, **GPU)


@pytest.mark.gpu
def test_overflow_relaunch_on_gpu() -> None:
    from dask_cosim import _search_triton as st

    check_overflow("cuda", st.config_for("float16", 0, torch.device("cuda")))
    check_overflow("cuda", st.config_for("float16", 4, torch.device("cuda")))
    check_limit("cuda", engine="triton")


@pytest.mark.gpu
def test_search_halves_row_blocks_on_a_full_gpu() -> None:
    """A real out-of-memory: the GPU is filled until 256 MiB are left; a top-k of 100
    over 20,000 rows (millions of candidates before the floors rise, their buffer and
    sorts: far more than 256 MiB at once) halves its row blocks until each fits, and the
    answer stays the float64 one."""
    from dask_cosim import search_kernels as sk
    from dask_cosim import search_twopass as tp

    x = torch.randn(20_000, 64, device="cuda").to(torch.float16)
    p, low = low_sides(x, None)
    want, _ = sk.topk(p, p, 100, tile_bytes=2**28, same=True)
    free, _ = torch.cuda.mem_get_info()
    filler = torch.empty(max(0, free - 256 * 2**20), dtype=torch.uint8, device="cuda")
    try:
        got = tp.topk(p, low, p, low, 100, exclude_self=True)
    finally:
        del filler
        torch.cuda.empty_cache()
    assert torch.equal(got.index, want.index) and torch.equal(got.score, want.score)


@pytest.mark.gpu
def test_torch_reduced_precision_settings_change_nothing() -> None:
    from dask_cosim import _search_triton as st

    x, null = adversarial_rows(2000, 768, "float16", seed=9)
    _, low = low_sides(x.to("cuda"), null.to("cuda"))
    bar = torch.full((len(low),), -math.inf, device="cuda")
    flags = torch.backends.cuda.matmul
    saved = (flags.allow_fp16_reduced_precision_reduction, flags.allow_bf16_reduced_precision_reduction, flags.allow_tf32)  # fmt: skip
    got = []
    try:
        for on in (False, True):
            flags.allow_fp16_reduced_precision_reduction = on
            flags.allow_bf16_reduced_precision_reduction = on
            flags.allow_tf32 = on
            found = st.search_candidates(low, low, bar, mode="upper")
            order = torch.argsort(found.i * len(low) + found.j)
            got.append(found.s[order])
    finally:
        (flags.allow_fp16_reduced_precision_reduction, flags.allow_bf16_reduced_precision_reduction, flags.allow_tf32) = saved  # fmt: skip
    assert torch.equal(got[0], got[1])
