"""Exact means exact: topk, join, neighbors, dedup and the clustered method's provable
mode against a plain float64 brute force on adversarial rows, through the accessor on
eager and dask frames (partitions of 0 and 1 rows included), for every precision that
claims the float64 answer on CPUs and every CPU kernel (numba with float32 or bfloat16
tiles, torch); then the minimal cases that once broke it.

The reference is ``tests.helpers.brute`` (numpy, float64), with the documented snap of
scores within ``rescore_error`` of +-1 to +-1.  Decisions exactly at a boundary (a
threshold equal to a pair's score, ties at the k-th) are taken on the library's own
float64 scores (``helpers.all_scores``), after checking them against the brute force:
two float64 brute forces may differ in the last bit, and the claim is that the search
decides as its float64 scores do, whatever partitions, tiles or kernel found them.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import dask
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dask_cosim import search_kernels as sk
from dask_cosim.errors import QueryWarning
from tests.helpers import as_column, brute, hide_numba, search_frame, split_frame
from tests.search_checks import (
    DTYPES,
    EPS,
    adversarial_rows,
    all_scores,
    expected_pair_set,
    expected_topk,
)

PROPERTY = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
# The CPU kernels: numba with float32 tiles, numba with bfloat16 tiles (what CPUs with
# bfloat16 units run for "exact"; any CPU computes them), torch (GPUs, no numba).
KERNELS = ("float32", "bfloat16", "torch")
# Every precision that claims the float64 answer on a CPU ("fast" runs exact there).
PRECISIONS = ("exact", "fp32", "fast")


@contextmanager
def kernel(name: str) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        if name == "torch":
            hide_numba(mp)
        else:
            mp.setattr(sk, "cpu_bfloat16", lambda: name == "bfloat16")
        yield


# --------------------------------------------------------------------------- rows


@dataclass
class Rows:
    """Rows of one dtype (a tensor: numpy has no bfloat16) and their null mask."""

    x: torch.Tensor
    null: np.ndarray

    def frame(self) -> pd.DataFrame:
        """An "emb" column (Arrow fixed-size lists; object cells for bfloat16) beside
        "id", indexed as ``search_frame`` does."""
        if self.x.dtype != torch.bfloat16:
            return search_frame(self.x.numpy(), null=self.null)
        pdf = search_frame(np.zeros((len(self.x), 1), np.float32))
        cells = np.empty(len(self.x), dtype=object)
        for i, row in enumerate(self.x):
            cells[i] = None if self.null[i] else row.clone()
        return pdf.assign(emb=cells)


def alter(x: np.ndarray, how: str, rng: np.random.Generator) -> None:
    """Make a random row of ``x`` (in place) ``how``: another row times 3 or -1, a
    float32 copy of one with a value moved by an ulp, its float16 rounding, scaled to a
    largest value of 1e-5 or 6e4, or to a norm below eps."""
    i, j = rng.integers(0, len(x), 2)
    if how in ("3x", "-x"):
        x[i] = (3.0 if how == "3x" else -1.0) * x[j]
    elif how == "ulp":
        x[i] = x[j].astype(np.float32)
        c = rng.integers(x.shape[1])
        x[i, c] = np.nextafter(np.float32(x[i, c]), np.float32(np.inf))
    elif how == "fp16":
        x[i] = x[i].astype(np.float16)
    elif how in ("1e-5", "6e4"):
        x[i] *= float(how) / max(np.abs(x[i]).max(), 1e-300)
    else:
        x[i] *= 1e-9 / max(np.linalg.norm(x[i]), 1e-300)


@st.composite
def rows(draw: st.DrawFn, max_rows: int = 24) -> Rows:
    """Adversarial rows (``helpers.adversarial_rows``: a cluster within 1e-7 of a cosine,
    duplicates, power-of-two multiples, near-parallel rows, extremes of the dtype, zero,
    NaN, inf and null rows), a subset of them, plus x and 3x, x and -x, rows one float32
    ulp apart, float16-representable values, magnitudes near float16's limits and rows
    shorter than eps."""
    dim = draw(st.sampled_from([1, 2, 7, 300]))
    dtype = draw(st.sampled_from(list(DTYPES)))
    seed = draw(st.integers(0, 2**16))
    target = draw(st.sampled_from([0.8, 0.3, -0.5, 1 - 1e-6]))
    base, null = adversarial_rows(max(40, max_rows), dim, dtype, seed=seed, target=target)
    x, null = base.double().numpy(), null.numpy().copy()
    hows = draw(st.lists(st.sampled_from(["3x", "-x", "ulp", "fp16", "1e-5", "6e4", "tiny"])))
    n = draw(st.integers(1, max_rows))
    rng = np.random.default_rng(seed)
    with np.errstate(all="ignore"):  # NaN and inf rows, scaled and rounded
        for how in hows[:6]:
            alter(x, how, rng)
        keep = np.sort(rng.choice(len(x), size=n, replace=False))
        t = torch.from_numpy(x[keep]).to(DTYPES[dtype])  # beyond float16's range: inf
    return Rows(t, null[keep])


@st.composite
def sizes(draw: st.DrawFn, n: int) -> list[int]:
    """Partition sizes summing to n, with empty and one-row partitions likely."""
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=3)))
    edges = [0, *cuts, n]
    return [b - a for a, b in itertools.pairwise(edges)]


# --------------------------------------------------------------------------- reference


def scores(q: Rows, r: Rows) -> torch.Tensor:
    """The float64 score of every pair (-inf where either row never matches): the
    library's re-score, checked against the numpy brute force within two re-score
    errors (each is within one of the exact cosine)."""
    qp = sk.prepare(q.x, torch.from_numpy(q.null), eps=EPS)
    rp = sk.prepare(r.x, torch.from_numpy(r.null), eps=EPS)
    c = all_scores(qp, rp)
    b = brute(q.x.double().numpy(), r.x.double().numpy(), eps=EPS)
    b[q.null, :] = -np.inf
    b[:, r.null] = -np.inf
    e = sk.rescore_error(q.x.shape[1])
    finite = np.isfinite(b)
    b[finite] = np.where(b[finite] >= 1 - e, 1.0, np.where(b[finite] <= e - 1, -1.0, b[finite]))
    assert (np.isfinite(c.numpy()) == finite).all(), "rows that never match differ"
    gap = np.abs(c.numpy()[finite] - b[finite])
    assert (gap <= 2 * e).all(), f"re-score {gap.max()} from the brute force"
    return c


def a_threshold(draw: st.DrawFn, c: torch.Tensor) -> float:
    """A threshold at a pair's float64 score, a float64 or float32 ulp beside one, or a
    round number (zero rows score 0.0; duplicates 1.0)."""
    finite = c[torch.isfinite(c)].tolist()
    how = draw(st.sampled_from(["at", "above", "below", "f32", "round"] if finite else ["round"]))
    if how == "round":
        return draw(st.sampled_from([1.0, 0.0, -1.0, 0.5]))
    t = draw(st.sampled_from(finite))
    if how in ("above", "below"):
        t = float(np.nextafter(t, 2.0 if how == "above" else -2.0))
    elif how == "f32":
        t = float(np.nextafter(np.float32(t), np.float32(2.0)))
    return min(1.0, max(-1.0, t))


def pairs_of(got: pd.DataFrame, left: str = "left", right: str = "right") -> list:
    """(left position, right position) of each result row, in order (ids 0..n-1)."""
    return list(zip(got[left].tolist(), got[right].tolist()))


def ranked(c: torch.Tensor, k: int, t: float | None, exclude_self: bool) -> list:
    """(row, match, score) of the float64 top-k lists, best first, ties by position."""
    want = expected_topk(c, k, exclude_self)
    out = []
    for i, (index, score) in enumerate(zip(want.index.tolist(), want.score.tolist())):
        out += [(i, j, s) for j, s in zip(index, score) if j >= 0 and (t is None or s >= t)]
    return out


def check_ranked(got: pd.DataFrame, want: list, left: str, right: str, ranks: bool = True) -> None:
    """``got`` lists the pairs of ``want`` in its order, with its float64 scores (in the
    result's dtype), ranked 0, 1, ... within each left row."""
    assert pairs_of(got, left, right) == [(i, j) for i, j, _ in want]
    dtype = got["score"].dtype
    assert (got["score"].to_numpy() == np.array([s for *_, s in want], dtype=dtype)).all()
    if ranks:
        assert (got["rank"].to_numpy() == got.groupby(left, sort=False).cumcount()).all()


def check_threshold(
    got: pd.DataFrame, c: torch.Tensor, t: float, mode: str | None, dim: int
) -> None:
    """The pairs of ``expected_pair_set`` in frame order; scores float64 ones, or float32
    tile scores within ``margin`` away from the threshold (float32 results)."""
    want = sorted(expected_pair_set(c, t, mode))
    assert pairs_of(got, "left_id", "right_id") == want
    exact = c[tuple(zip(*want))] if want else torch.zeros(0, dtype=torch.float64)
    score = torch.from_numpy(got["score"].to_numpy().astype(np.float64))
    if got["score"].dtype == np.float64:
        assert torch.equal(score, exact)
    else:
        assert bool(((score - exact).abs() <= sk.margin(dim)).all())


# --------------------------------------------------------------------------- properties


@st.composite
def frames(draw: st.DrawFn, pdf: pd.DataFrame) -> object:
    """``pdf`` itself or in dask partitions of drawn sizes, prepared (``cosim.prepare``)
    or not."""
    df = pdf if draw(st.booleans()) else split_frame(pdf, draw(sizes(len(pdf))))
    return df.cosim.prepare("emb") if draw(st.booleans()) else df


def computed(obj: object) -> pd.DataFrame:
    out = obj.compute() if hasattr(obj, "compute") else obj  # type: ignore[attr-defined]
    return out.reset_index(drop=True) if "id" not in out else out


def options(data: st.DataObject, precision: str) -> dict:
    blocks = data.draw(st.sampled_from([64, 2]))  # 2: partitions searched in blocks
    return {
        "cosim.search.precision": precision,
        "cosim.search.max-blocks": blocks,
        "cosim.search.split-every": 2,
        "scheduler": "sync",
    }


def check_dedup(kept: pd.DataFrame, removed: pd.DataFrame, c: torch.Tensor, t: float) -> None:
    """Kept: the rows with no earlier row at or above ``t``; removed: each dropped row
    with its earlier row of highest score (the earliest of equal ones)."""
    earlier = torch.triu(c >= t, diagonal=1)  # [i, j]: i < j
    dropped = earlier.any(dim=0)
    assert kept["id"].tolist() == (~dropped).nonzero().squeeze(1).tolist()
    want = []
    for j in dropped.nonzero().squeeze(1).tolist():
        best = c[:j, j].masked_fill(~earlier[:j, j], -np.inf)
        i = int(torch.argmax(best))  # the first of the maxima
        want.append((i, j, float(best[i])))
    check_ranked(removed, want, "left_id", "right_id", ranks=False)


# Every search property draws its rows, kernel and precision the same way.
ANY_SEARCH = given(
    data=st.data(),
    r=rows(),
    name=st.sampled_from(KERNELS),
    precision=st.sampled_from(PRECISIONS),
)


@PROPERTY
@ANY_SEARCH
def test_threshold_searches_equal_float64(
    data: st.DataObject, r: Rows, name: str, precision: str
) -> None:
    pdf, dim = r.frame(), r.x.shape[1]
    with kernel(name), dask.config.set(options(data, precision)):
        c = scores(r, r)
        t = a_threshold(data.draw, c)
        df = data.draw(frames(pdf))
        got = computed(df.cosim.neighbors("emb", threshold=t, columns="id"))
        check_threshold(got, c, t, "upper", dim)
        got = computed(df.cosim.join(df, "emb", threshold=t, columns="id"))
        check_threshold(got, c, t, None, dim)
        kept, removed = df.cosim.dedup("emb", t, return_removed=True, columns="id")
        check_dedup(computed(kept), computed(removed), c, t)


@pytest.mark.parametrize("name", KERNELS)
def test_fast_on_a_cpu_is_exact(name: str) -> None:
    """On a CPU "fast" gives what "exact" gives, scores too: its low-precision pass runs
    on CUDA only.  Its threshold searches reported the float32 tile scores ("fp32"'s),
    1.0 as 0.99999988 for a row with itself."""
    x = np.random.default_rng(6).standard_normal((300, 7)).astype(np.float32)
    df = split_frame(search_frame(np.concatenate([x, x[:20]])), [150, 170])
    results = {}
    for precision in ("exact", "fast"):
        with kernel(name), dask.config.set({"cosim.search.precision": precision}):
            results[precision] = [
                computed(df.cosim.neighbors("emb", threshold=0.5, columns="id")),
                computed(df.cosim.join(df, "emb", threshold=0.5)),
            ]
    for exact, fast in zip(results["exact"], results["fast"], strict=True):
        assert len(exact) > 1000 and exact.equals(fast)


@PROPERTY
@ANY_SEARCH
def test_ranked_searches_equal_float64(
    data: st.DataObject, r: Rows, name: str, precision: str
) -> None:
    pdf, n = r.frame(), len(r.x)
    k = data.draw(st.integers(1, n + 2))
    picks = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=20))
    q = Rows(r.x[picks], np.zeros(len(picks), bool))  # (16 queries or fewer: dot by dot)
    with kernel(name), dask.config.set(options(data, precision)):
        c = scores(r, r)
        t = a_threshold(data.draw, c) if data.draw(st.booleans()) else None
        df = data.draw(frames(pdf))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", QueryWarning)  # NaN and zero queries
            got = df.cosim.topk(q.x, "emb", k=k, columns="id")
        check_ranked(got, ranked(scores(q, r), k, None, False), "query", "id")
        got = computed(df.cosim.neighbors("emb", k=k, threshold=t, columns="id"))
        check_ranked(got, ranked(c, k, t, True), "left_id", "right_id")
        got = computed(df.cosim.join(df, "emb", k=k, threshold=t, columns="id"))
        check_ranked(got, ranked(c, k, t, False), "left_id", "right_id")


@PROPERTY
@ANY_SEARCH
def test_clustered_provable_mode_equals_float64(
    data: st.DataObject, r: Rows, name: str, precision: str
) -> None:
    pdf, dim = r.frame(), r.x.shape[1]
    clusters = data.draw(st.integers(1, 4))
    with kernel(name), dask.config.set(options(data, precision)):
        c = scores(r, r)
        t = a_threshold(data.draw, c)
        t = t if t > 0 else 0.5  # the clustered method takes thresholds in (0, 1]
        df = data.draw(frames(pdf))
        kw = {"method": "clustered", "clusters": clusters, "columns": "id"}
        got = computed(df.cosim.neighbors("emb", threshold=t, **kw))
        check_threshold(got, c, t, "upper", dim)
        kept, removed = df.cosim.dedup("emb", t, return_removed=True, **kw)
        check_dedup(computed(kept), computed(removed), c, t)


# --------------------------------------------------------------------------- regressions


def test_float16_partitions_with_and_without_nulls_keep_the_tie_rule() -> None:
    """An Arrow float16 partition holding a null row comes out of the reader as float32,
    one without as float16; the float64 re-score summed the two dtypes in different
    orders, so copies of a row in two partitions scored a last bit apart and the later
    one could rank first (the reader now keeps float16, and the re-score no longer
    depends on the dtype)."""
    for seed in range(8):
        rng = np.random.default_rng(seed)
        a = rng.standard_normal(64).astype(np.float16)
        q = rng.standard_normal((1, 64))
        null = np.array([False, True, False])
        pdf = pd.DataFrame({"emb": as_column(np.stack([a, a, a]), "fixed_size_list", null)})
        got = split_frame(pdf.assign(id=[0, 1, 2]), [1, 2]).cosim.topk(q, "emb", k=2, columns="id")
        assert got["id"].tolist() == [0, 2], seed
        # Whatever dtype the reader gives, a 16-bit row scores as its float32 widening.
        qp, one = sk.prepare(torch.from_numpy(q), eps=EPS), torch.zeros(1, dtype=torch.int64)
        for dtype in (torch.float16, torch.bfloat16):
            row = torch.from_numpy(a[None, :]).to(dtype)
            got = [sk.rescore(qp, one, sk.prepare(r, eps=EPS), one) for r in (row, row.float())]
            assert torch.equal(*got), (seed, dtype)


def test_a_pair_scores_the_same_both_ways_on_the_torch_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The torch re-score (GPUs, installs without numba) multiplied its sum by the two
    rows' scales one after the other, so cos(a, b) and cos(b, a) could differ in the last
    bit: row a listed b at a threshold that row b's list did not reach."""
    hide_numba(monkeypatch)
    x = np.random.default_rng(0).standard_normal((40, 7))
    got = search_frame(x).cosim.neighbors("emb", k=39)
    score = dict(zip(zip(got["left"], got["right"]), got["score"]))
    assert len(score) == 40 * 39
    differ = [(a, b) for a, b in score if score[a, b] != score[b, a]]
    assert not differ, f"{len(differ)} pairs score differently both ways, e.g. {differ[0]}"


def test_integer_vectors_beside_a_null_row_are_read_exactly() -> None:
    """A fixed-size list column of int64 with a null row was cast to float32 for the
    null's NaN, which Arrow refuses beyond 2**24 (ArrowInvalid, in search and pairwise
    alike); float32 would also have tied rows 0 and 2 here, which float64 tells apart."""
    t = pa.list_(pa.int64(), 2)
    x = [[2**30 + 1, 2**30], None, [2**30 + 2, 2**30]]
    df = pd.DataFrame({"emb": pd.array(pa.array(x, type=t), dtype=pd.ArrowDtype(t))})
    assert df.cosim.topk(np.array([[1.0, 0.0]]), "emb", k=2)["match"].tolist() == [2, 0]
    got = df.cosim.pairwise("emb", "emb", dtype="float64")
    np.testing.assert_array_equal(got.to_numpy(), [1.0, np.nan, 1.0])


def test_float32_tile_scores_are_clamped_to_one() -> None:
    """Threshold-only searches with "fp32" report float32 tile scores away from the
    threshold; the tile score of two copies of a row can round above 1 (1.0000001 here),
    outside the [-1, 1] every score is clamped to."""
    x = np.array([[0.02550155483186245, 0.29467862844467163]] * 2, np.float32)
    pdf = search_frame(x)
    with dask.config.set({"cosim.search.precision": "fp32"}):
        assert pdf.cosim.neighbors("emb", threshold=0.5)["score"].tolist() == [1.0]
        assert pdf.cosim.join(pdf, "emb", threshold=0.5)["score"].tolist() == [1.0] * 4


@pytest.mark.parametrize("kernel_name", KERNELS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_zero_rows_with_eps_zero_score_zero_as_with_any_eps(kernel_name: str, dtype: str) -> None:
    """``cosim.eps = 0`` (allowed: "a finite number >= 0") with a zero row raised a raw
    ZeroDivisionError from the numba norms (1 / max(0, 0)), and gave NaN unit rows on the
    torch path.  A zero row scores 0.0 in a search whatever eps is, from its vectors
    and from a prepared frame (whose numbers do not depend on eps) alike."""
    x = np.array([[1, 0], [0, 1], [0, 0], [3, 4]], dtype)
    pdf = search_frame(x)
    want = {}
    with kernel(kernel_name):
        for eps in (1e-8, 0.0):
            with dask.config.set({"cosim.eps": eps}):
                for frame in (pdf, pdf.cosim.prepare("emb")):
                    got = (
                        frame.cosim.neighbors("emb", k=3),
                        frame.cosim.neighbors("emb", threshold=-1.0),
                        frame.cosim.dedup("emb", 0.0)[["id"]],
                    )
                    for name, result in zip(("topk", "threshold", "dedup"), got):
                        want.setdefault(name, result)
                        pd.testing.assert_frame_equal(result, want[name], obj=f"{name} eps={eps}")
    scores = want["topk"].set_index(["left", "right"])["score"]
    assert scores[pdf.index[2], pdf.index[0]] == 0.0
    assert scores[pdf.index[0], pdf.index[3]] == pytest.approx(0.6, abs=1e-15)


@pytest.mark.parametrize("kernel_name", KERNELS)
def test_float64_rows_below_the_range_factor_cap_with_eps_zero(kernel_name: str) -> None:
    """A float64 row whose largest value is below 2**-1000 (its range factor capped at
    2**1000) with ``cosim.eps = 0``: its unit row was inv * scale * x with inv * scale
    past float64's range, inf, and it matched no row with a zero or a value of the other
    sign (inf * 0, inf - inf: NaN).  Its scores are those of its direction, (1, 1)."""
    s = 2**-0.5
    x = np.array([[1e-310, 1e-310], [1.0, 0.0], [-1.0, 1.0], [3e-320, 3e-320]])
    pdf = search_frame(x)
    ids = pdf.index
    with kernel(kernel_name), dask.config.set({"cosim.eps": 0.0}):
        for frame in (pdf, pdf.cosim.prepare("emb")):
            pairs = frame.cosim.neighbors("emb", threshold=0.5)
            assert list(zip(pairs["left"], pairs["right"])) == [
                (ids[0], ids[1]), (ids[0], ids[3]), (ids[1], ids[3])
            ]  # fmt: skip
            np.testing.assert_allclose(pairs["score"], [s, 1.0, s], rtol=1e-15)
            ranked = frame.cosim.neighbors("emb", k=1)
            assert ranked["right"].tolist() == [ids[3], ids[0], ids[0], ids[0]]
            assert frame.cosim.dedup("emb", 0.7)["id"].tolist() == [0, 2]


# --------------------------------------------------------------------------- seeded mix

# (dim, dtype, column format, index, partition sizes, clusters): frames larger than the
# properties draw, every search on one frame, labels that repeat or are out of order.
MIXES = [
    (3, "float32", "list", "repeated", [0, 60, 1, 99], 5),
    (64, "float16", "object_numpy", "shuffled", [70, 0, 90], 2),
    (7, "float64", "fixed_size_list", "repeated", [160], 1),
    (300, "bfloat16", "object", "shuffled", [30, 50, 0, 80], 5),
]


def expected_groups(c: torch.Tensor, t: float) -> list[int]:
    """Each row's component under the pairs at or above ``t``, named by its first row."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    i, j = torch.triu(c >= t, diagonal=1).nonzero(as_tuple=True)
    graph = coo_matrix((np.ones(len(i)), (i.numpy(), j.numpy())), shape=c.shape)
    label = connected_components(graph, directed=False)[1]
    first = {lab: pos for pos, lab in reversed(list(enumerate(label)))}
    return [first[lab] for lab in label]


@pytest.mark.parametrize("seed", range(len(MIXES)))
def test_a_seeded_adversarial_mix_equals_float64(seed: int) -> None:
    """The fuzzer's most adversarial mix, fixed: 160 rows with a crowd within 1e-7 of
    the threshold, exact and scaled copies (x, 3x, -x), zero, NaN, inf and null rows,
    extremes of the dtype; labels repeated or shuffled, empty partitions; neighbors,
    dedup, groups and the clustered method against the float64 answer."""
    dim, dtype, fmt, labels, parts, clusters = MIXES[seed]
    x, null = adversarial_rows(160, dim, dtype, seed=seed, target=0.9)
    raw, null = x.double().numpy(), null.numpy()
    rng = np.random.default_rng(seed)
    with np.errstate(all="ignore"):
        for how in ("3x", "-x", "3x", "ulp", "tiny"):
            alter(raw, how, rng)
        r = Rows(torch.from_numpy(raw).to(DTYPES[dtype]), null)
    pdf = r.frame() if fmt == "object" else search_frame(r.x.numpy(), fmt=fmt, null=null)
    index = rng.integers(0, 20, 160) if labels == "repeated" else rng.permutation(160)
    df = split_frame(pdf.set_axis(pd.Index(index, name="key")), parts)
    with dask.config.set(scheduler="sync"):
        c = scores(r, r)
        t = float(c[0, 1 + 40 // 2])  # a crowd pair's float64 score: ties at the threshold
        got = computed(df.cosim.neighbors("emb", threshold=t, columns="id"))
        check_threshold(got, c, t, "upper", dim)
        assert (got["left"].to_numpy() == index[got["left_id"].to_numpy()]).all()
        got = computed(df.cosim.neighbors("emb", k=159, columns="id"))
        check_ranked(got, ranked(c, 159, None, True), "left_id", "right_id")
        kept, removed = df.cosim.dedup("emb", t, return_removed=True, columns="id")
        check_dedup(computed(kept), computed(removed), c, t)
        assert computed(df.cosim.groups("emb", t))["group"].tolist() == expected_groups(c, t)
        kw = {"method": "clustered", "clusters": clusters, "columns": "id"}
        got = computed(df.cosim.neighbors("emb", threshold=t, **kw))
        check_threshold(got, c, t, "upper", dim)
        kept, removed = df.cosim.dedup("emb", t, return_removed=True, **kw)
        check_dedup(computed(kept), computed(removed), c, t)
