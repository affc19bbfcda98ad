"""The CPU selection (numba heaps, one-pass normalisation, raw unit rows) against a
float64 brute force on adversarial inputs (a cluster of near-ties, exact duplicates,
zero, NaN, inf and null rows), on the numba kernels, the torch path and bfloat16 tiles
alike: top-k by tiles or by direct dots, self-joins and both sides at once, any split
among threads, threshold pairs with bars inside the near-ties in every mode, k beyond
the valid rows, raw unit rows off norm one and beside NaN/inf rows, and the numba and
torch paths agreeing.  The selection's parts one by one:
tests/test_search_select_parts.py."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from dask_cosim import _search_sweep
from dask_cosim import search_kernels as sk
from tests.helpers import brute, hide_numba
from tests.helpers import prepare_rows as prep

# The path fixture runs the numba kernels: without numba the module is skipped.
pytest.importorskip("dask_cosim._search_numba")

# float64 rounding of a cosine of D <= 384 values: scores this close are one score.
SAME = 1e-13


@pytest.fixture(params=["numba", "torch", "bfloat16"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run a test on the numba kernels, again with numba hidden (the torch path that GPUs
    and installs without numba take), and again with every search "exact" from bfloat16
    tiles (what CPUs with bfloat16 units run; any CPU computes it, if slowly)."""
    if request.param == "torch":
        hide_numba(monkeypatch)
    if request.param == "bfloat16":
        for name in ("topk", "threshold_pairs"):
            low = functools.partial(getattr(sk, name), precision="exact", bfloat16=True)
            monkeypatch.setattr(sk, name, low)
    yield request.param


def expected_topk(s: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row the k best positions (score descending, then position; -1 past the
    finite scores) and their scores."""
    pos = np.broadcast_to(np.arange(s.shape[1]), s.shape)
    order = np.lexsort((pos, -s), axis=1)[:, :k]
    score = np.take_along_axis(s, order, 1)
    return np.where(np.isfinite(score), order, -1), score


def check_strict(res: sk.TopK, s: np.ndarray, k: int) -> None:
    """Same rows in the same order as the float64 brute force; rows may trade places only
    where their exact scores are equal (up to float64 rounding)."""
    want_i, want_s = expected_topk(s, k)
    kk = min(k, s.shape[1])
    got_i, got_s = res.index.numpy(), res.score.numpy()
    # k wide, or narrower where the other side has fewer rows (never narrower than kk).
    assert got_i.shape[0] == s.shape[0] and kk <= got_i.shape[1] <= k
    assert (got_i[:, kk:] == -1).all() and np.isneginf(got_s[:, kk:]).all()
    found = want_i[:, :kk] >= 0
    assert ((got_i[:, :kk] >= 0) == found).all()
    np.testing.assert_allclose(got_s[:, :kk][found], want_s[:, :kk][found], rtol=0, atol=SAME)
    rows, cols = np.nonzero(got_i[:, :kk] != want_i[:, :kk])
    for r, c in zip(rows, cols):
        assert abs(s[r, got_i[r, c]] - s[r, want_i[r, c]]) < SAME, (r, c)


def near_tie_rows(rng: np.random.Generator, base: np.ndarray, n: int) -> np.ndarray:
    """n copies of ``base``, each with a few values moved by one float32 ulp: their
    cosines with a row at an angle to ``base`` differ by ~1e-10..1e-8, far below a
    float32 score's rounding and far above a float64 one's."""
    out = np.repeat(base[None, :], n, axis=0)
    for row in out:
        cols = rng.choice(len(base), size=min(3, len(base)), replace=False)
        direction = np.where(rng.random(len(cols)) < 0.5, -np.inf, np.inf).astype(np.float32)
        row[cols] = np.nextafter(row[cols], direction)
    return out


def adversarial(d: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Right rows: random, a cluster of near-ties around one row, exact duplicates, zero,
    NaN, inf and null rows, in shuffled order; queries hitting the cluster."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(d).astype(np.float32)
    r = np.concatenate(
        [
            rng.standard_normal((150, d)).astype(np.float32),
            near_tie_rows(rng, base, 40),
            np.repeat(base[None, :] * 2, 12, axis=0),  # exact duplicates (of one another)
            np.zeros((3, d), np.float32),
            np.full((2, d), np.nan, np.float32),
            np.where(np.arange(d) == 0, np.inf, 1).astype(np.float32)[None, :],
        ]
    )
    order = rng.permutation(len(r))
    r = r[order]
    null = np.zeros(len(r), bool)
    null[rng.choice(len(r), 4, replace=False)] = True
    # Queries at an angle to the cluster (their cosines with it move with each ulp to
    # first order; from ``base`` itself they would move to second order, below float64
    # rounding), one on the cluster, and the rest.
    at_angle = base + rng.uniform(0.2, 0.8, (4, 1)) * rng.standard_normal((4, d))
    q = np.concatenate(
        [
            at_angle.astype(np.float32),
            base[None, :],
            -base[None, :],
            rng.standard_normal((2, d)).astype(np.float32),
            np.zeros((1, d), np.float32),
            np.full((1, d), np.nan, np.float32),
        ]
    )
    return q, r, null


def reference(q: np.ndarray, r: np.ndarray, null: np.ndarray) -> np.ndarray:
    s = brute(q, r)
    s[:, null] = -np.inf
    return s


@pytest.mark.parametrize("route", ["tiles", "direct"])
@pytest.mark.parametrize("d", [1, 7, 128, 384])
@pytest.mark.parametrize("k", [1, 10, 100])
def test_topk_near_ties_duplicates_and_invalid_rows(
    path: str, route: str, d: int, k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tile products (torch.mm + scan) or, for a few queries, dots one by one (numba)."""
    monkeypatch.setattr(sk, "DIRECT_MAX_QUERIES", 100 if route == "direct" else 0)
    q, r, null = adversarial(d, seed=d * 1000 + k)
    s = reference(q, r, null)
    pq, pr = prep(q), prep(r, null)
    for tile_bytes in (256, 1 << 12, 32 << 20):
        res, _ = sk.topk(pq, pr, k, tile_bytes=tile_bytes)
        check_strict(res, s, k)


@pytest.mark.parametrize("d", [1, 7, 128])
@pytest.mark.parametrize("k", [1, 10, 100])
def test_same_and_both_with_near_ties(path: str, d: int, k: int) -> None:
    q, r, null = adversarial(d, seed=d + k)
    x = np.concatenate([q, r])
    nulls = np.concatenate([np.zeros(len(q), bool), null])
    s = reference(x, x, nulls)
    s[nulls, :] = -np.inf
    np.fill_diagonal(s, -np.inf)
    p = prep(x, nulls)
    for tile_bytes in (256, 32 << 20):
        res, _ = sk.topk(p, p, k, tile_bytes=tile_bytes, same=True)
        check_strict(res, s, k)
        a, b = 70, len(x)
        left, right = p.take(torch.arange(a)), p.take(torch.arange(a, b))
        res_a, res_b = sk.topk(left, right, k, tile_bytes=tile_bytes, both=True)
        assert res_b is not None
        check_strict(res_a, s[:a, a:], k)
        check_strict(res_b, s[a:, :a], k)


@pytest.mark.parametrize("bfloat16", [False, True])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_rows_or_columns_split_among_threads_give_the_same_answer(
    threads: int, bfloat16: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The main thread splits big searches among torch's threads, each with its own
    heaps, merged after (the query rows of a top-k, the columns of a self-join pair or
    of a few queries; and the bfloat16 copies and float64 re-scores by rows): any split
    gives the brute force's answer, rows and columns."""
    monkeypatch.setattr(_search_sweep, "PARALLEL_MIN_WORK", 1)
    monkeypatch.setattr(_search_sweep, "MIN_ROWS", 1)
    if bfloat16:
        monkeypatch.setattr(
            sk, "topk", functools.partial(sk.topk, precision="exact", bfloat16=True)
        )
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        q, r, null = adversarial(16, seed=21)
        s = reference(q, r, null)
        for k in (1, 10):
            for direct in (0, 100):
                monkeypatch.setattr(sk, "DIRECT_MAX_QUERIES", direct)
                monkeypatch.setattr(sk, "DIRECT_BLOCK_ROWS", 50)
                res, _ = sk.topk(prep(q), prep(r, null), k, tile_bytes=256)
                check_strict(res, s, k)
        x = np.concatenate([q, r])
        nulls = np.concatenate([np.zeros(len(q), bool), null])
        s = reference(x, x, nulls)
        s[nulls, :] = -np.inf
        p = prep(x, nulls)
        res_a, res_b = sk.topk(
            p.take(torch.arange(60)), p.take(torch.arange(60, len(x))), 5, tile_bytes=256, both=True
        )
        assert res_b is not None
        check_strict(res_a, s[:60, 60:], 5)
        check_strict(res_b, s[60:, :60], 5)
        assert torch.get_num_threads() == threads  # restored
    finally:
        torch.set_num_threads(previous)


def brute_pairs(
    s: np.ndarray, thr: np.ndarray, pos: np.ndarray | None, mode: str | None
) -> set[tuple[int, int]]:
    keep = s >= thr[:, None]
    cols = np.arange(s.shape[1])[None, :]
    if mode == "upper":
        keep &= cols > pos[:, None]
    elif mode == "exclude_self":
        keep &= cols != pos[:, None]
    return set(zip(*(a.tolist() for a in np.nonzero(keep))))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("d", [1, 7, 128])
def test_threshold_pairs_near_ties_every_mode(
    path: str, threads: int, d: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bars placed inside the near-tie cluster (float32 cannot tell its rows apart;
    float64 can), per row and shared; the three modes; split among threads or not."""
    monkeypatch.setattr(_search_sweep, "PARALLEL_MIN_WORK", 1)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        q, r, null = adversarial(d, seed=d + threads)
        x = np.concatenate([q, r])
        nulls = np.concatenate([np.zeros(len(q), bool), null])
        p = prep(x, nulls)
        s = reference(x, x, nulls)
        s[nulls, :] = -np.inf
        # Each row's bar at its 15th best score: inside the cluster for the rows near it.
        per_row = np.sort(np.where(np.isfinite(s), s, -2), axis=1)[:, -15]
        for thr in (per_row, np.full(len(x), float(np.median(per_row)))):
            for mode in (None, "upper", "exclude_self"):
                for exact in (True, False):
                    i, j, score = sk.threshold_pairs(
                        p, p, torch.from_numpy(thr), tile_bytes=1 << 12, mode=mode,
                        exact_scores=exact,
                    )  # fmt: skip
                    got = set(zip(i.tolist(), j.tolist()))
                    assert len(got) == len(i)
                    differ = got ^ brute_pairs(s, thr, np.arange(len(x)), mode)
                    # Only scores equal to the bar up to float64 rounding may differ.
                    assert all(abs(s[a, b] - thr[a]) < SAME for a, b in differ), mode
                    atol = SAME if exact else sk.margin(d)
                    np.testing.assert_allclose(score.numpy(), s[i, j], rtol=0, atol=atol)
        # A block of rows against all rows, with their positions given (row_pos).
        rows = torch.arange(30, 90)
        sub = p.take(rows)
        for mode in ("upper", "exclude_self"):
            i, j, _ = sk.threshold_pairs(
                sub, p, torch.from_numpy(per_row[30:90]), tile_bytes=1 << 12, row_pos=rows,
                mode=mode,
            )  # fmt: skip
            want = brute_pairs(s[30:90], per_row[30:90], rows.numpy(), mode)
            differ = set(zip(i.tolist(), j.tolist())) ^ want
            assert all(abs(s[30 + a, b] - per_row[30 + a]) < SAME for a, b in differ)
    finally:
        torch.set_num_threads(previous)


def test_k_beyond_the_valid_rows(path: str) -> None:
    q, r, null = adversarial(7, seed=5)
    s = reference(q, r, null)
    res, _ = sk.topk(prep(q), prep(r, null), 400, tile_bytes=1 << 12)
    check_strict(res, s, 400)
    valid = np.isfinite(s).sum(axis=1)
    assert ((res.index >= 0).sum(dim=1).numpy() == valid).all()


def test_numba_and_torch_paths_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    q, r, null = adversarial(128, seed=9)
    got = []
    for hide in (False, True):
        if hide:
            hide_numba(monkeypatch)
        res, _ = sk.topk(prep(q), prep(r, null), 10, tile_bytes=1 << 14)
        got.append(res)
    # The queries at an angle to the near-tie cluster (the others meet ties at 1 - 1e-16,
    # which float64 rounding orders as it falls).
    assert torch.equal(got[0].index[:4], got[1].index[:4])
    torch.testing.assert_close(got[0].score, got[1].score, rtol=0, atol=SAME)


def test_raw_unit_rows_off_norm_one_within_the_tolerance(path: str) -> None:
    """Rows normalised in float32 serve as unit rows without a copy; rows up to the
    tolerance away from norm 1 widen the margin, and near-ties are still decided in
    float64 (their float32 scores are off by up to ~1e-6, the ties 1e-8 apart)."""
    rng = np.random.default_rng(11)
    d = 64
    base = rng.standard_normal(d)
    base /= np.linalg.norm(base)
    r = np.concatenate(
        [near_tie_rows(rng, base.astype(np.float32), 60), rng.standard_normal((100, d))]
    )
    r = (r / np.linalg.norm(r, axis=1, keepdims=True)).astype(np.float32)
    # Stretch rows by up to 3/4 of the tolerance: the exact cosines do not change.
    stretch = 1 + rng.uniform(-0.75, 0.75, len(r)) * sk.RAW_UNIT_TOLERANCE
    r = (r * stretch[:, None]).astype(np.float32)
    q = (base + 0.5 * rng.standard_normal(d))[None, :].astype(np.float32)
    pr = prep(r)
    if path == "numba":
        assert pr.unit.data_ptr() == pr.raw.data_ptr()  # no copy
        assert 2**-24 < pr.err <= sk.RAW_UNIT_TOLERANCE * 1.01
        assert sk.margin(d, pr.err, pr.err) > sk.margin(d)
    s = brute(q, r)
    for k in (1, 10, 30):
        res, _ = sk.topk(prep(q), pr, k, tile_bytes=1 << 12)
        check_strict(res, s, k)
    _, j, _ = sk.threshold_pairs(prep(q), pr, float(np.sort(s[0])[-20]), tile_bytes=1 << 12)
    assert sorted(j.tolist()) == sorted(np.argsort(-s[0], kind="stable")[:20].tolist())


@pytest.mark.parametrize("route", ["tiles", "direct"])
def test_rows_that_serve_as_unit_rows_beside_nan_inf_and_null_rows(
    route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Normalised rows serve as their own unit rows even when other rows hold NaN or inf
    (those never match: every scan skips them, as a query row and as a column)."""
    monkeypatch.setattr(sk, "DIRECT_MAX_QUERIES", 100 if route == "direct" else 0)
    q, r, null = adversarial(32, seed=31)
    x = np.concatenate([q, r])
    with np.errstate(invalid="ignore"):
        x = (x / np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True)).astype(np.float32)
    x[np.linalg.norm(np.nan_to_num(x), axis=1) == 0] = 0  # zero rows stay zero
    x[5, 3] = np.inf
    nulls = np.concatenate([np.zeros(len(q), bool), null])
    p = prep(x, nulls)
    assert p.unit.data_ptr() == p.raw.data_ptr()  # no copy
    s = reference(x, x, nulls)
    s[nulls, :] = -np.inf
    s_same = s.copy()
    np.fill_diagonal(s_same, -np.inf)
    for k in (1, 10):
        res, _ = sk.topk(p, p, k, tile_bytes=1 << 12, same=True)
        check_strict(res, s_same, k)
        res, _ = sk.topk(p.take(torch.arange(12)), p, k, tile_bytes=1 << 12)  # a few queries
        check_strict(res, s[:12], k)
    thr = np.full(len(x), 0.3)
    for mode in (None, "upper"):
        i, j, _ = sk.threshold_pairs(p, p, torch.from_numpy(thr), tile_bytes=1 << 12, mode=mode)
        differ = set(zip(i.tolist(), j.tolist())) ^ brute_pairs(s, thr, np.arange(len(x)), mode)
        assert all(abs(s[a, b] - 0.3) < SAME for a, b in differ)
