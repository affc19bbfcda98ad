"""Where device="auto" computes: the placement rule (a pure function of sizes, rates and
where the data are), the rates it reads from the config, and what a CPU machine does."""

from __future__ import annotations

import itertools
import warnings

import dask
import numpy as np
import pytest
import torch
from distributed import Client
from hypothesis import given
from hypothesis import strategies as st

import dask_cosim
from dask_cosim import kernels, options, placement, staging
from dask_cosim.partition import pairwise_partition, resolve_device
from tests.helpers import pairs_frame, random_pairs, reference

RATES = options.placement_rates()  # the measured defaults of cosim.yaml
MB = 10**6


def choose(nbytes: int, cpu_kernel: str | None = "numba", **how: object) -> str:
    kwargs: dict[str, object] = {"gpu": True, "cpu_kernel": cpu_kernel, "rates": RATES}
    kwargs.update(how)
    data = str(kwargs.pop("data", "cpu"))
    work = str(kwargs.pop("work", "rows"))
    return placement.choose(data, work, nbytes, **kwargs)  # type: ignore[arg-type]


def test_data_on_a_gpu_stay_there_and_without_a_gpu_everything_is_on_the_host() -> None:
    for work in ("rows", "products"):
        assert choose(10 * MB, data="cuda", work=work) == "cuda"
        assert choose(10 * MB, data="cuda", work=work, gpu=False) == "cuda"
        assert choose(10 * MB, None, work=work, gpu=False) == "cpu"


def test_search_sends_host_data_to_the_gpu() -> None:
    """Matrix products do hundreds of flops per byte: the copy is worth it at any size."""
    assert choose(1, work="products") == "cuda"
    assert choose(10**12, None, work="products") == "cuda"


@given(st.integers(min_value=0, max_value=10**13))
def test_the_fused_host_kernel_keeps_host_rows_on_the_host(nbytes: int) -> None:
    """With the H100 machine's rates the CPU kernel (77.5 GB/s) outruns the bus (51.4 GB/s
    pinned) at every size: pandas partitions of float32 vectors never leave the host."""
    assert choose(nbytes, "numba") == "cpu"


def test_the_torch_fallback_gives_way_to_the_gpu_above_the_break_even_size() -> None:
    """Where only the torch kernel applies on the host (2.1 GB/s), the staged copy wins
    once its fixed cost is paid: bytes > gpu_fixed / (1 / cpu_torch - 1 / host_to_gpu)."""
    even = RATES.gpu_fixed / (1 / RATES.cpu_torch - 1 / RATES.host_to_gpu)
    assert 1 * MB < even < 5 * MB  # about 2.2 MB with the measured rates and 1 ms
    assert choose(int(even * 0.9), None) == "cpu"
    assert choose(int(even * 1.1), None) == "cuda"
    host, gpu = placement.estimate(int(even), None, RATES)
    assert host == pytest.approx(gpu)


def test_the_rule_follows_the_rates() -> None:
    """A machine whose bus outruns its host kernel (a slow CPU beside a fast link) sends
    even fused-kernel rows to the GPU; the rates are measured per machine (config)."""
    slow_host = placement.Rates(cpu_fused=5e9, cpu_torch=1e9, host_to_gpu=25e9, gpu_fixed=0.0)
    assert choose(100 * MB, "numba", rates=slow_host) == "cuda"
    assert choose(100 * MB, "numba", gpu=False, rates=slow_host) == "cpu"
    with pytest.raises(ValueError, match=r"work='sort'; use one of \('rows', 'products'\)"):
        choose(1, work="sort")


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without CUDA does")
def test_auto_without_a_gpu_is_the_cpu_and_says_nothing() -> None:
    cpu = torch.device("cpu")
    for work in ("rows", "products"):
        assert resolve_device("auto", cpu, work=work, nbytes=10**9, cpu_kernel=None) == cpu
    a, b = random_pairs(300, 16)
    for fmt in ("fixed_size_list", "object_numpy"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            res = pairwise_partition(pairs_frame(a, b, fmt), "embeds_a", "embeds_b", device="auto")
        np.testing.assert_allclose(res.to_numpy(), reference(a, b), atol=1e-6)


def test_which_host_kernel_the_rule_is_told_about() -> None:
    """The rule weighs the kernel the host would run: numba for float32/float64 pairs of
    one dtype, the torch kernel for float16 (pandas partitions of half-precision vectors)."""
    a, b = random_pairs(10, 8)
    f32 = torch.from_numpy(a), torch.from_numpy(b)
    assert kernels.fused_kernel_for(*f32, device="cpu") == "numba"
    assert kernels.fused_kernel_for(f32[0].half(), f32[1].half(), device="cpu") is None


def test_blocks_give_the_answer_of_their_concatenation() -> None:
    """pairwise_cosine_blocks: a partition's Arrow chunks, computed without concatenating
    them (on a GPU, staged together), give what the whole rows give."""
    a, b = random_pairs(1000, 24)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    cuts = [0, 1, 300, 300, 999, 1000]
    pairs = [(ta[s:e], tb[s:e]) for s, e in itertools.pairwise(cuts)]
    res = kernels.pairwise_cosine_blocks(pairs, eps=1e-8, chunk_bytes=options.chunk_bytes())
    np.testing.assert_allclose(res.numpy(), reference(a, b), atol=1e-6)
    none = kernels.pairwise_cosine_blocks([], eps=1e-8, chunk_bytes=options.chunk_bytes())
    assert none.shape == (0,) and none.dtype == torch.float32


def test_staged_chunks_span_blocks() -> None:
    """How rows of several blocks are cut into staging chunks of ``rows`` each: pieces
    (block, offset, rows) in order, every row once, empty blocks skipped."""
    blocks = [(torch.zeros(n, 2),) for n in (5, 0, 3, 7)]
    chunks = list(staging._chunks(blocks, 4))
    assert [(start, count) for start, count, _ in chunks] == [(0, 4), (4, 4), (8, 4), (12, 3)]
    assert chunks[1][2] == [(0, 4, 1), (2, 0, 3)]
    assert chunks[2][2] == [(3, 0, 4)] and chunks[3][2] == [(3, 4, 3)]
    assert staging.buffer_rows(1200) == staging.BUFFER_BYTES // 1200
    with pytest.raises(ValueError, match="stages host rows onto a GPU, not onto cpu"):
        next(staging.device_chunks(blocks, "cpu", 4))


def _pretend_a_gpu() -> None:
    """In a worker: torch reports a GPU, and the rule records the rates it is given (then
    answers "cpu", the only device there is)."""
    seen: list[placement.Rates] = []

    def record(*args: object, rates: placement.Rates, **kwargs: object) -> str:
        seen.append(rates)
        return "cpu"

    torch.cuda.is_available = lambda: True
    placement.choose = record  # type: ignore[assignment]
    placement.seen = seen  # type: ignore[attr-defined]


def _rates_seen() -> list[placement.Rates]:
    return list(placement.seen)  # type: ignore[attr-defined]


def test_the_rates_set_in_the_client_reach_the_workers(client: Client) -> None:
    """cosim.placement set around the call decides where remote workers compute: the
    rates are read when the graph is built (a worker's own config has only the defaults)."""
    client.run(_pretend_a_gpu)
    a, b = random_pairs(400, 16)
    ddf = dask_cosim.from_pandas(pairs_frame(a, b, "fixed_size_list"), npartitions=2)
    with dask.config.set({"cosim.placement.gpu-fixed": "2s", "cosim.placement.cpu-fused": "1GB"}):
        cos = ddf.cosim.pairwise("embeds_a", "embeds_b")
    np.testing.assert_allclose(cos.compute().to_numpy(), reference(a, b), atol=1e-6)
    seen = [r for rates in client.run(_rates_seen).values() for r in rates]
    assert len(seen) == 2
    assert {(r.gpu_fixed, r.cpu_fused) for r in seen} == {(2.0, 1e9)}
