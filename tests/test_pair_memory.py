"""The peak memory a pair of the tasks that hold a threshold search's pairs, measured
in a fresh process (benchmarks.pair_memory), and the in-place compaction they use."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from benchmarks.pair_memory import run_step
from dask_cosim._search_sweep import CHUNK, compact

linux = pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists() or sys.platform != "linux",
    reason="reads the peak resident set from /proc",
)

# 2,500 x 64 rows at 0.05: about a million pairs.  Bytes a pair each step peaked at
# before it stopped copying its pairs (measured at 5,000 rows: 114, 72, 66, 162, 90),
# and now (43, 36, 20, 75, 38): the bounds lie between.
BOUNDS = {
    "pair_threshold": 70,
    "finish_pairs": 55,
    "best_matches": 45,
    "search_blocks": 120,
    "clustered.finish_pairs": 60,
}


@linux
@pytest.mark.parametrize("step", sorted(BOUNDS))
def test_peak_bytes_a_pair(step: str) -> None:
    got = run_step(step, 2500, 64, 0.05)
    assert got["pairs"] > 500_000
    assert got["growth"] / got["pairs"] < BOUNDS[step]


@pytest.mark.parametrize("n", [0, 5, CHUNK + 7, 2 * CHUNK + 3])
def test_compact_is_boolean_indexing(n: int) -> None:
    g = torch.Generator().manual_seed(n)
    keep = torch.rand(n, generator=g) < 0.7
    i = torch.randint(0, 1 << 40, (n,), generator=g)
    s = torch.rand(n, generator=g, dtype=torch.float64)
    want = i[keep], s[keep]
    got = compact(keep, i.clone(), s.clone())
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert compact(torch.ones(n, dtype=torch.bool), i, s)[0] is i  # all kept: as it is
