"""The CPU selection's parts one by one: rows that are copied when they are too far
from norm one to serve as unit rows, the one-pass prepare (numba) against the torch path,
the numba heap of ``scan_rows`` and ``candidates``, the CPU tile sizes read from the cache
share, and the bfloat16 tiles: every score within their bound of the float64 cosine, and
the bfloat16 copy rounded as torch rounds it.  The whole selection on adversarial rows:
tests/test_search_select_near_ties.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dask_cosim import _search_tiles
from dask_cosim import search_kernels as sk
from tests.helpers import brute, hide_numba
from tests.helpers import prepare_rows as prep

numba_kernels = pytest.importorskip("dask_cosim._search_numba")


def test_rows_beyond_the_tolerance_are_copied() -> None:
    x = np.eye(4, dtype=np.float32)
    p = prep(x)
    assert p.unit.data_ptr() == p.raw.data_ptr() and p.err < 1e-14
    x[2] *= np.float32(1 + 2 * sk.RAW_UNIT_TOLERANCE)
    p = prep(x)
    assert p.unit.data_ptr() != p.raw.data_ptr()
    np.testing.assert_allclose(np.linalg.norm(p.unit.numpy(), axis=1), 1, rtol=2**-23)
    assert p.err < 2**-23 and sk.margin(4, p.err, p.err) == sk.margin(4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_prepare_one_pass_matches_the_torch_path(
    dtype: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(12)
    x = rng.standard_normal((40, 9)).astype(dtype)
    x[0] = 0
    x[1, 3] = np.nan
    x[2, 0] = -np.inf
    x[3] *= 1e-30
    if dtype == np.float64:
        x[4] *= 1e300
        x[5] *= 1e-300
        x[6, :] = 5e-324  # subnormal: 1 / its largest value overflows
        x[8, :3] = [5e-324, -1e-320, 0.0]
    null = np.zeros(40, bool)
    null[7] = True
    fast = prep(x, null)
    hide_numba(monkeypatch)
    slow = prep(x, null)
    assert torch.equal(fast.valid, slow.valid)
    v = fast.valid
    torch.testing.assert_close(fast.unit[v], slow.unit[v], rtol=2**-22, atol=0)
    assert (fast.unit[~v] == 0).all() and (fast.scale[~v] == 0).all()
    # inv and scale may split the norm differently; their product may not differ.
    torch.testing.assert_close(fast.inv * fast.scale, slow.inv * slow.scale, rtol=1e-15, atol=0)
    s = brute(x, x)
    for p in (fast, slow):
        i, j = torch.meshgrid(torch.arange(40), torch.arange(40), indexing="ij")
        got = sk.rescore(p, i.reshape(-1), p, j.reshape(-1)).reshape(40, 40).numpy()
        ok = np.isfinite(s) & ~null[:, None] & ~null[None, :]
        np.testing.assert_allclose(got[ok], s[ok], rtol=0, atol=1e-15)


@pytest.mark.parametrize("stream", ["random", "ascending", "descending", "equal", "few"])
@pytest.mark.parametrize("keep", [2, 9, 21, 201])
def test_heap_keeps_the_best_and_the_best_outside(stream: str, keep: int) -> None:
    """scan_rows + candidates on one row: the keep - 1 best scores (a multiset: equal
    scores may be any of them) and the keep-th best as the best dropped."""
    rng = np.random.default_rng(keep)
    n = 3000
    values = {
        "random": rng.standard_normal(n),
        "ascending": np.linspace(-1, 1, n),
        "descending": np.linspace(1, -1, n),
        "equal": np.full(n, 0.5),
        "few": rng.integers(0, 4, n) / 4,
    }[stream].astype(np.float32)
    valid = np.ones(n, bool)
    valid[::7] = False  # never candidates
    hs = np.full((1, keep), -np.inf, np.float32)
    hi = np.full((1, keep), -1, np.int32)
    bar = np.full(1, -np.inf, np.float32)
    for c0 in range(0, n, 500):  # several tiles
        tile = values[None, c0 : c0 + 500].copy()
        numba_kernels.scan_rows(tile, 0, c0, hs, hi, bar, valid, np.ones(1, bool), False)
    index = np.empty((1, keep - 1), np.int64)
    dropped = np.empty(1, np.float32)
    numba_kernels.candidates(hs, hi, index, dropped)
    ranked = np.sort(values[valid])[::-1]
    got = index[0][index[0] >= 0]
    assert len(set(got.tolist())) == len(got) and valid[got].all()
    np.testing.assert_array_equal(np.sort(values[got])[::-1], ranked[: keep - 1])
    assert dropped[0] == ranked[keep - 1]


def test_heap_of_few_entries_drops_nothing() -> None:
    hs = np.full((2, 9), -np.inf, np.float32)
    hi = np.full((2, 9), -1, np.int32)
    bar = np.full(2, -np.inf, np.float32)
    tile = np.array([[0.5, 0.25, 0.75], [0.1, 0.2, 0.3]], np.float32)
    valid = np.array([True, False, True])
    numba_kernels.scan_rows(tile, 0, 0, hs, hi, bar, valid, np.array([True, False]), False)
    index = np.empty((2, 8), np.int64)
    dropped = np.empty(2, np.float32)
    numba_kernels.candidates(hs, hi, index, dropped)
    assert sorted(index[0][index[0] >= 0].tolist()) == [0, 2] and (index[1] == -1).all()
    assert np.isneginf(dropped).all()


def test_cpu_tiles_follow_the_cache_share(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _search_tiles._cache_per_core() >= 1 << 20  # read from sysfs, or the default
    for share, topk, threshold in [(16 << 20, 4 << 20, 2 << 20), (1 << 20, 1 << 20, 512 << 10),
                                   (256 << 20, 8 << 20, 4 << 20)]:  # fmt: skip
        monkeypatch.setattr(_search_tiles, "_cache_per_core", lambda share=share: share)
        assert _search_tiles.cpu_tile_bytes("topk") == topk
        assert _search_tiles.cpu_tile_bytes("threshold") == threshold


def bound_rows(rng: np.random.Generator, d: int) -> np.ndarray:
    """Rows that stress the bfloat16 bound: random, nearly parallel (scores near 1 and
    -1, where rounding the product costs most), values spread over 60 binades, a few
    large values among tiny ones, and rows of one value."""
    base = rng.standard_normal(d)
    return np.concatenate(
        [
            rng.standard_normal((40, d)),
            base + 1e-3 * rng.standard_normal((20, d)),
            -base + 1e-3 * rng.standard_normal((5, d)),
            rng.standard_normal((20, d)) * 2.0 ** rng.integers(-60, 0, (20, d)),
            np.where(rng.random((10, d)) < 0.05, 1.0, 1e-30) * rng.standard_normal((10, d)),
            np.ones((2, d)),
        ]
    ).astype(np.float32)


@pytest.mark.parametrize("d", [1, 3, 128, 384, 1536])
def test_bfloat16_tiles_stay_within_their_bound(d: int) -> None:
    """The scores of torch's bfloat16 product on this CPU, widened as the tiles widen
    them, are within bfloat16_bound of the float64 cosine for every pair."""
    rng = np.random.default_rng(d)
    x = bound_rows(rng, d)
    p = prep(x)
    low, err = sk.bfloat16_rows(p.unit, p.valid)
    err += p.err
    assert low.dtype == torch.bfloat16
    a, b = sk.bfloat16_bound(d, err, err)
    tile = _search_tiles.Tile(len(x), len(x), p.unit.device, low=True)
    s_hat = tile.product(low, low).numpy().astype(np.float64)
    gap = np.abs(s_hat - brute(x, x))
    allowed = a + b * np.abs(s_hat)
    assert (gap <= allowed).all(), float((gap / allowed).max())
    # Not vacuous: some pair comes within a twentieth of the bound.
    assert (gap / allowed).max() > 0.05


def test_bfloat16_copy_rounds_as_torch_and_measures_its_error() -> None:
    """to_bfloat16 writes torch's bfloat16 bits (round to nearest even) and returns the
    largest distance of a valid row from its copy; invalid rows (NaN here) are skipped."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((300, 33)).astype(np.float32)
    x[7] = np.nan
    valid = np.isfinite(x).all(1)
    out = np.empty(x.shape, np.uint16)
    worst = numba_kernels.to_bfloat16(x, valid, out)
    want = torch.from_numpy(x).to(torch.bfloat16)
    bits = want.view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(out[valid], bits[valid])  # NaN: a NaN, of other bits than torch's
    dist = np.linalg.norm(want.double().numpy() - x.astype(np.float64), axis=1)
    np.testing.assert_allclose(worst, dist[valid].max(), rtol=1e-12)
