"""Host data on a GPU machine: the rows of ``benchmarks.pairwise_gpu`` that measure where
``device="auto"`` should compute pandas partitions, and the rates its rule reads.

- floors: host-to-device copies of the run's pairs, from pinned and from pageable memory;
- the staged path (``dask_cosim.staging``): our kernel on host tensors with
  ``device="cuda"``, at three staging buffer sizes;
- a pandas partition (Arrow fixed-size lists) with ``device="auto"``, ``"cpu"`` and
  ``"cuda"``, in float32 (the rule keeps it on the host) and float16 (only the torch
  kernel applies on the host: the rule sends it to the GPU);
- the fixed cost of a GPU call on host data (one row);
- a search side (``prepare_side``) of host data moved to the GPU, staged, against the
  pageable ``.to()`` it replaced.

:func:`placement_rates` reads the measured rates off the table, as the lines of
``cosim.yaml``'s ``placement`` section.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

import dask_cosim
from benchmarks import harness
from benchmarks.harness import A, B, Case, Row
from dask_cosim import io
from dask_cosim.partition import pairwise_partition

PINNED = "floor: host to device copy (pinned)"
STAGED = "ours: kernel, host tensors -> GPU, staged"
FIXED = "placement: GPU call on 1 host row"
# Staging buffers of chunk-bytes.cuda / 8 (the default, 256 MiB, gives 32 MiB buffers).
BUFFERS = {"4 MiB": "32MiB", "32 MiB": "256MiB", "128 MiB": "1GiB"}


def _sync() -> None:
    torch.cuda.synchronize()


def _frame(a: np.ndarray, b: np.ndarray) -> pd.DataFrame:
    """A pandas partition: two Arrow fixed-size-list columns over ``a`` and ``b``."""
    return pd.DataFrame({A: io.vectors_to_arrow(a), B: io.vectors_to_arrow(b)})


def _partition_rows(pdf: pd.DataFrame, label: str, n: int, **own: Any) -> list[Row]:
    """pairwise_partition of one pandas partition with each device choice."""
    rows = []
    for device in ("auto", "cpu", "cuda"):

        def run(device: str = device) -> np.ndarray:
            res = pairwise_partition(pdf, A, B, device=device)
            _sync()
            return res.to_numpy()

        name = f"ours: pandas partition{label}, device={device}"
        note = "the placement rule" if device == "auto" else "forced"
        rows.append(Row(Case(name, run, n, note), "ours", **own))
    return rows


def host_rows(a: np.ndarray, b: np.ndarray) -> list[Row]:
    """The host-data rows on the run's pairs (float32) and on their float16 copies."""
    n = len(a)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    pinned = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t) for t in (ta, tb)]
    on_device = [torch.empty(t.shape, dtype=t.dtype, device="cuda") for t in (ta, tb)]

    def copy_pinned() -> None:
        for dst, src in zip(on_device, pinned):
            dst.copy_(src, non_blocking=True)
        _sync()

    def copy_pageable() -> None:
        for dst, src in zip(on_device, (ta, tb)):
            dst.copy_(src)
        _sync()

    rows = [
        Row(Case(PINNED, copy_pinned, n, "pin_memory, non_blocking"), "floor", expect="none"),
        Row(Case("floor: host to device copy (pageable)", copy_pageable, n, "what .to() does"),
            "floor", expect="none"),
    ]  # fmt: skip
    for size, budget in BUFFERS.items():

        def staged(budget: str = budget) -> torch.Tensor:
            res = dask_cosim.pairwise_cosine(ta, tb, device="cuda", chunk_bytes={"cuda": budget})
            _sync()
            return res

        name = f"{STAGED}, {size} buffers"
        rows.append(Row(Case(name, staged, n, 'device="cuda"'), "ours", floor=PINNED))
    rows += _partition_rows(_frame(a, b), "", n)

    half_a, half_b = a.astype(np.float16), b.astype(np.float16)
    own = {"ref": harness.reference(half_a, half_b), "nbytes": half_a.nbytes + half_b.nbytes}
    rows += _partition_rows(_frame(half_a, half_b), " float16", n, **own)

    one_a, one_b = ta[:1].clone(), tb[:1].clone()

    def one_row() -> torch.Tensor:
        res = dask_cosim.pairwise_cosine(one_a, one_b, device="cuda")
        _sync()
        return res

    fixed = Case(FIXED, one_row, 1, "what a GPU call costs whatever its size")
    ref_one, bytes_one = harness.reference(a[:1], b[:1]), one_a.nbytes + one_b.nbytes
    rows.append(Row(fixed, "ours", ref=ref_one, nbytes=bytes_one))
    return rows + search_side_rows(a)


def search_side_rows(a: np.ndarray) -> list[Row]:
    """A search side of host rows moved to the GPU: staged (what ``prepare_side`` does) and
    through a pageable ``.to()`` (what it did)."""
    from dask_cosim import search_kernels as sk
    from dask_cosim import search_partition as sp

    pdf = pd.DataFrame({A: io.vectors_to_arrow(a)})
    ta = torch.from_numpy(a)

    def staged() -> None:
        sp.prepare_side(pdf, A, 0, eps=1e-8, device="cuda")
        _sync()

    def pageable() -> None:
        sk.prepare(ta, eps=1e-8, device="cuda")
        _sync()

    floor = "floor: search side -> GPU, pageable .to()"
    return [
        Row(Case(floor, pageable, len(a), "prepare(x.to(cuda))"), "floor", expect="none"),
        Row(Case("ours: search side -> GPU, staged", staged, len(a), "prepare_side"), "ours",
            floor=floor, expect="none"),
    ]  # fmt: skip


TARGETS = [
    (f"{dtype}: device=auto within 10% of the {path} path",
     f"ours: pandas partition{label}, device=auto",
     f"ours: pandas partition{label}, device={device}", 0.9)
    for dtype, label in (("float32", ""), ("float16", " float16"))
    for path, device in (("CPU", "cpu"), ("GPU", "cuda"))
]  # fmt: skip


def placement_rates(table: list[harness.Record]) -> dict[str, str]:
    """The rates of the placement rule as this run measured them: config
    ``cosim.placement`` values (bytes of both inputs per second; seconds)."""
    by = {r["case"]: r for r in table}
    out: dict[str, str] = {}
    if "ours: kernel" in by:
        out["cpu-fused"] = f"{by['ours: kernel']['gb_per_s']:.1f}GB"
    if "ours: kernel, torch fallback" in by:
        out["cpu-torch"] = f"{by['ours: kernel, torch fallback']['gb_per_s']:.1f}GB"
    staged = [r["gb_per_s"] for name, r in by.items() if name.startswith(STAGED)]
    if staged:
        out["host-to-gpu"] = f"{max(staged):.1f}GB"
    if FIXED in by:
        out["gpu-fixed"] = f"{by[FIXED]['seconds'] * 1e3:.2f}ms"
    return out


def report_rates(rates: dict[str, str]) -> None:
    if rates:
        print("\nplacement rates measured here (cosim.yaml, cosim.placement):")
        for key, value in rates.items():
            print(f"    {key}: {value}")
