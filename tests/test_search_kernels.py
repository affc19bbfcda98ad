"""search_kernels against a float64 brute force: any tile size, ties, invalid rows, extremes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import dask_cosim  # noqa: F401  (the .cosim accessor)
from dask_cosim import search_kernels as sk
from tests.helpers import brute


def expected_topk(s: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    pos = np.broadcast_to(np.arange(s.shape[1]), s.shape)
    order = np.lexsort((pos, -s), axis=1)[:, :k]
    score = np.take_along_axis(s, order, 1)
    return np.where(np.isfinite(score), order, -1), score


def check_topk(res: sk.TopK, s: np.ndarray, k: int) -> None:
    want_i, want_s = expected_topk(s, k)
    got_i, got_s = res.index.numpy(), res.score.numpy()
    kk = min(k, s.shape[1])
    np.testing.assert_allclose(got_s[:, :kk], want_s[:, :kk], atol=1e-9)
    assert (got_i[:, kk:] == -1).all()
    differ = got_i[:, :kk] != want_i[:, :kk]
    # Different rows only where their exact scores are a near-tie.
    rows, cols = np.nonzero(differ)
    for r, c in zip(rows, cols):
        assert abs(s[r, got_i[r, c]] - s[r, want_i[r, c]]) < 1e-6


def prep(x: np.ndarray) -> sk.Prepared:
    return sk.prepare(torch.from_numpy(x), eps=1e-8)


@pytest.mark.parametrize("tile_bytes", [4, 256, 4096, 1 << 24])
@pytest.mark.parametrize("k", [1, 5, 40])
def test_topk_equals_brute_force_for_any_tile(tile_bytes: int, k: int) -> None:
    rng = np.random.default_rng(k)
    q = rng.standard_normal((37, 16)).astype(np.float32)
    r = rng.standard_normal((91, 16)).astype(np.float32)
    res, _ = sk.topk(prep(q), prep(r), k, tile_bytes=tile_bytes)
    check_topk(res, brute(q, r), k)


def test_k_beyond_the_rows_allocates_for_the_rows() -> None:
    """A row has no more matches than the other side has rows: k=10**6 against 91 rows
    keeps (n, 91) state, not (n, 10**6) (15 GiB for 2,000 queries), on every path."""
    from dask_cosim import search_twopass

    rng = np.random.default_rng(3)
    q = rng.standard_normal((37, 16)).astype(np.float32)
    r = rng.standard_normal((91, 16)).astype(np.float32)
    for both in (False, True):
        res, res_r = sk.topk(prep(q), prep(r), 10**6, tile_bytes=4096, both=both)
        assert res.index.shape[1] <= len(r)
        check_topk(res, brute(q, r), len(r))
        if both:
            assert res_r is not None and res_r.index.shape[1] <= len(q)
        two, two_r = search_twopass.topk_prepared(
            prep(q), prep(r), 10**6, same=False, both=both, exact=True
        )
        assert two.index.shape[1] <= len(r)
        check_topk(two, brute(q, r), len(r))
        if both:
            assert two_r is not None and two_r.index.shape[1] <= len(q)


def test_duplicates_ranked_by_position_whatever_the_tiles() -> None:
    rng = np.random.default_rng(1)
    r = rng.standard_normal((120, 8)).astype(np.float32)
    r[[7, 30, 64, 65, 90, 119]] = r[50]  # seven identical rows
    q = r[[50]] * 3
    for tile_bytes in (4, 64, 1 << 20):
        res, _ = sk.topk(prep(q), prep(r), 4, tile_bytes=tile_bytes)
        assert res.index[0].tolist() == [7, 30, 50, 64]
        scores = res.score[0].tolist()
        assert len(set(scores)) == 1 and abs(scores[0] - 1.0) < 1e-12


def test_invalid_rows_never_match_and_zero_rows_score_zero() -> None:
    rng = np.random.default_rng(2)
    r = rng.standard_normal((10, 4)).astype(np.float32)
    r[1] = np.nan
    r[2, 3] = np.inf
    r[3] = 0
    null = torch.zeros(10, dtype=torch.bool)
    null[4] = True
    q = np.concatenate([-r[:1], np.full((1, 4), np.nan, np.float32)])
    rp = sk.prepare(torch.from_numpy(r), null, eps=1e-8)
    res, _ = sk.topk(prep(q), rp, 10, tile_bytes=64)
    hits = res.index[0][res.index[0] >= 0].tolist()
    assert sorted(hits) == [0, 3, 5, 6, 7, 8, 9]
    assert res.score[0, hits.index(3)] == 0.0
    assert (res.index[1] == -1).all()  # a NaN query gets nothing
    i, j, _ = sk.threshold_pairs(prep(q), rp, -1.0, tile_bytes=64)
    assert sorted(j.tolist()) == [0, 3, 5, 6, 7, 8, 9] and set(i.tolist()) == {0}


def test_extreme_magnitudes() -> None:
    """float64 up to 1e308 and subnormal-sized rows keep the exact cosine."""
    x = np.array([[1e308, 1e308], [1e-300, -1e-300], [3e-5, 4e-5], [1.0, 0.0]])
    s = brute(x, x)
    np.testing.assert_allclose(s[0, 3], np.sqrt(0.5), rtol=1e-12)
    res, _ = sk.topk(prep(x), prep(x), 4, tile_bytes=64)
    check_topk(res, s, 4)


def test_same_excludes_the_row_itself_and_both_reduces_columns() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((150, 12)).astype(np.float32)
    x[100:110] = x[20]
    s = brute(x, x)
    np.fill_diagonal(s, -np.inf)
    p = prep(x)
    res, _ = sk.topk(p, p, 6, tile_bytes=300, same=True)
    check_topk(res, s, 6)
    assert res.index[20].tolist()[:6] == [100, 101, 102, 103, 104, 105]
    a, b = sk.topk(
        p.take(torch.arange(60)), p.take(torch.arange(60, 150)), 5, tile_bytes=200, both=True
    )
    assert b is not None
    check_topk(a, s[:60, 60:], 5)
    check_topk(b, s[60:, :60], 5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rescore_is_symmetric_to_the_last_bit(dtype: type) -> None:
    """cos(a, b) and cos(b, a) are the same float64 number: float32 rows scored 35% of
    their pairs one bit apart (the scaling was reassociated), so a self-join at a
    threshold equal to such a score kept (a, b) and dropped (b, a)."""
    x = np.random.default_rng(0).standard_normal((300, 17)).astype(dtype)
    p = prep(x)
    i, j = (torch.from_numpy(t) for t in np.triu_indices(len(x), 1))
    assert torch.equal(sk.rescore(p, i, p, j), sk.rescore(p, j, p, i))

    pdf = pd.DataFrame({"emb": list(np.array([[0, 0, 7], [1, 1, 1]], dtype=dtype))})
    scores = pdf.cosim.join(pdf, "emb", threshold=-1.0).set_index(["left", "right"])["score"]
    pairs = pdf.cosim.join(pdf, "emb", threshold=float(scores[(0, 1)]))
    assert sorted(zip(pairs["left"], pairs["right"])) == [(0, 0), (0, 1), (1, 0), (1, 1)]


@pytest.mark.parametrize("tile_bytes", [4, 512, 1 << 20])
def test_threshold_pairs_equal_brute_force(tile_bytes: int) -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((80, 6)).astype(np.float32)
    s = brute(x, x)
    p = prep(x)
    i, j, score = sk.threshold_pairs(p, p, 0.4, tile_bytes=tile_bytes, mode="upper")
    got = set(zip(i.tolist(), j.tolist()))
    want = {(a, b) for a, b in zip(*np.nonzero(s >= 0.4)) if b > a}
    assert got == want
    np.testing.assert_allclose(score.numpy(), s[i.numpy(), j.numpy()], atol=1e-12)


def test_empty_sides() -> None:
    empty = prep(np.zeros((0, 5), np.float32))
    some = prep(np.ones((3, 5), np.float32))
    res, _ = sk.topk(empty, some, 2, tile_bytes=64)
    assert res.index.shape == (0, 2)
    res, _ = sk.topk(some, empty, 2, tile_bytes=64)
    assert (res.index == -1).all()
    i, _, _ = sk.threshold_pairs(some, empty, 0.0, tile_bytes=64)
    assert len(i) == 0


@st.composite
def small_sets(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    d = draw(st.integers(1, 6))
    # Small integers: many exact ties, zero rows, duplicate rows.
    elements = st.integers(-3, 3).map(float)
    q = draw(hnp.arrays(np.float32, (draw(st.integers(0, 12)), d), elements=elements))
    r = draw(hnp.arrays(np.float32, (draw(st.integers(0, 30)), d), elements=elements))
    return q, r


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_sets(), st.integers(1, 8), st.sampled_from([4, 40, 1 << 16]), st.floats(-1, 1))
def test_hypothesis_topk_and_threshold(
    sets: tuple[np.ndarray, np.ndarray], k: int, tile_bytes: int, thr: float
) -> None:
    q, r = sets
    s = brute(q, r)
    res, _ = sk.topk(prep(q), prep(r), k, tile_bytes=tile_bytes)
    check_topk(res, s, k)
    i, j, _ = sk.threshold_pairs(prep(q), prep(r), thr, tile_bytes=tile_bytes)
    got = set(zip(i.tolist(), j.tolist()))
    near = np.abs(s - thr) < 1e-6
    want = set(zip(*np.nonzero(s >= thr)))
    assert {p for p in got ^ want if not near[p]} == set()
