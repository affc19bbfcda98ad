"""The kernels under the clustered search: the bounds of the skip rule against float64
(the float32 and bfloat16 centroid scores within their error, no match ever skipped,
homes and radii where scores crowd), row lengths in float64, the numba routing deciding
as the torch path, routed rows kept in their dtype across the shuffle, the stats'
dtypes, and k-means (the generator, centroids within their bound, shards giving the
k-means of the whole).  The search itself: tests/test_clustered_results.py."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

from dask_cosim import clustered, clustered_rows
from dask_cosim import clustered_kernels as ck
from dask_cosim import clustered_kmeans as km
from dask_cosim import clustered_partition as cp
from dask_cosim import search_kernels as sk
from dask_cosim.datasets import embedding_arrays
from tests.clustered_data import adversarial, frame, unit

# --------------------------------------------------------------------------- the bounds


@pytest.mark.parametrize("rows", ["float64 with short rows", "float32 of norm about 1"])
def test_score_error_bounds_the_float32_scores(rows: str) -> None:
    d = 300
    x = adversarial(2000, d=d, seed=1, dtype=np.float64)[:, :d]
    x = x[np.isfinite(x).all(axis=1) & (np.abs(x).sum(axis=1) > 0)]
    if rows.startswith("float64"):
        x[:50] *= 1e-15  # far shorter than eps
    else:
        # Rows within 2**-20 of norm 1 serve as their own unit rows (no normalised copy).
        stretch = 1.0 + np.random.default_rng(0).uniform(-(2.0**-21), 2.0**-21, (len(x), 1))
        x = (unit(x) * stretch).astype(np.float32)
    prep = sk.prepare(torch.from_numpy(x), eps=1e-8)
    dirs, has, e_d = ck.directions(prep)
    assert bool(has.all())
    assert (prep.unit is prep.raw) == rows.startswith("float32")
    cent = km.kmeans(dirs, 20, iters=3, seed=0)
    s = (dirs @ cent.T).double()
    c64 = cent.double() / torch.linalg.vector_norm(cent.double(), dim=1, keepdim=True)
    exact = torch.from_numpy(unit(x.astype(np.float64))) @ c64.T
    err = float((s - exact).abs().max())
    delta = ck.product_error(d, e_d)
    assert 0 < err <= delta
    assert delta < 2 * sk.margin(d)


def force_bfloat16(monkeypatch: pytest.MonkeyPatch) -> None:
    """Centroid scores from bfloat16 products first on any CPU (where it has no bfloat16
    units, they are slow, and the same numbers)."""
    monkeypatch.setattr(ck, "use_bfloat16", lambda wanted, d: d.device.type == "cpu")


@pytest.fixture(params=["numba", "torch", "bfloat16"])
def routing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Routing on CPUs by the numba kernel, by the torch path (as on GPUs), or by the
    numba kernel on scores from bfloat16 products (the radii too)."""
    if request.param == "torch":
        monkeypatch.setattr(ck, "_clustered_fast", lambda: None)
    else:
        assert ck._clustered_fast() is not None
    if request.param == "bfloat16":
        force_bfloat16(monkeypatch)
    return str(request.param)


def test_skip_rules_never_skip_a_match(routing: str) -> None:
    """For every pair of rows scoring at least t (float64), the row in the lower-numbered
    cluster probes the other's cluster."""
    x = adversarial(1500, d=16, seed=5)
    x = x[np.isfinite(x).all(axis=1) & (np.abs(x).sum(axis=1) > 0)]
    prep = sk.prepare(torch.from_numpy(x), eps=1e-8)
    dirs, _, e_d = ck.directions(prep)
    cent = km.kmeans(dirs, 25, iters=2, seed=3)
    delta = ck.product_error(16, e_d)
    _, radius = ck.cluster_stats(dirs, cent, delta, 2**20)
    for t in (0.6, 0.85, 0.97):
        home, prow, pclu = ck.route(
            dirs, cent, ck.floors(radius, t, 16, delta), t, delta, None, 2**20
        )
        probes = set(zip(prow.tolist(), pclu.tolist(), strict=True))
        i, j, _ = sk.threshold_pairs(prep, prep, t, tile_bytes=2**20, mode="upper")
        a, b = home[i], home[j]
        cross = a != b
        assert int(cross.sum()) > 5
        for r, s, ca, cb in zip(i[cross], j[cross], a[cross], b[cross], strict=True):
            low, high = (int(r), int(cb)) if ca < cb else (int(s), int(ca))
            assert (low, high) in probes
        # The exact mode probes only upwards; n_probe mode at most n_probe clusters.
        assert bool((pclu > home[prow]).all())
        _, prow2, _ = ck.route(dirs, cent, ck.floors(radius, t, 16, delta), t, delta, 2, 2**20)
        assert int(torch.bincount(prow2).max()) <= 2


@pytest.mark.parametrize("bfloat16", [False, True])
def test_homes_and_radii_hold_where_scores_crowd(
    bfloat16: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows whose scores with 40 centroids lie within about 1e-3 of each other (the
    bfloat16 products err by up to 4e-3 there): every home (k-means', the radii's, the
    routing's) is within 2 delta of the row's best float64 score, and every radius covers each row whose float64 score
    with that cluster is within 3 delta of its best (the rows a later pass may make its
    members)."""
    if bfloat16:
        force_bfloat16(monkeypatch)
    gen = torch.Generator().manual_seed(11)
    base = torch.randn(1, 64, generator=gen, dtype=torch.float64)
    x = base + 0.03 * torch.randn(3000, 64, generator=gen, dtype=torch.float64)
    prep = sk.prepare(x.to(torch.float32), eps=1e-8)
    dirs, _, e_d = ck.directions(prep)
    cent = km.unit_rows(base + 0.03 * torch.randn(40, 64, generator=gen, dtype=torch.float64))
    delta = ck.product_error(64, e_d)
    exact = (
        torch.nn.functional.normalize(x, dim=1)
        @ torch.nn.functional.normalize(cent.double(), dim=1).T
    )
    best = exact.max(dim=1).values
    assert float((exact >= best[:, None] - 4e-3).sum(dim=1).float().mean()) > 5  # crowded
    counts, radius = ck.cluster_stats(dirs, cent, delta, 2**18)
    assert int(counts.sum()) == len(x)
    near = exact >= best[:, None] - 3 * delta
    need = torch.where(near, torch.acos(exact.clamp(max=1.0)), -math.inf).max(dim=0).values
    assert bool((radius >= need - 1e-12).all())
    score, home = ck.nearest(dirs, cent, 2**18)  # k-means' assignment
    at = exact[torch.arange(len(x)), home]
    assert bool((at >= best - 2 * delta).all())
    assert float((score.double() - at).abs().max()) <= delta
    floor = ck.floors(radius, 0.999, 64, delta)
    for n_probe in (None, 2):
        home, _, _ = ck.route(dirs, cent, floor, 0.999, delta, n_probe, 2**18)
        assert bool((exact[torch.arange(len(x)), home] >= best - 2 * delta).all())


def test_row_lengths_in_float64() -> None:
    """The numba lengths of float32 rows agree with torch's float64 norm to float64
    rounding (directions() compares them with 1 at a tolerance of 2**-30)."""
    x = torch.randn(3001, 385) * torch.logspace(-30, 30, 3001)[:, None]
    x[7] = 0.0
    want = torch.linalg.vector_norm(x, dim=1, dtype=torch.float64)
    got = ck._lengths(x.float())
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=2.0**-50, atol=0.0)


@pytest.mark.parametrize("n_probe", [None, 0, 1, 3, 500])
def test_numba_routing_decides_as_torch(
    n_probe: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The numba pass makes the torch path's decisions: the same homes and probes."""
    x, _ = embedding_arrays(6000, 48, directions=60, duplicates=0.05, seed=2)
    cent = km.kmeans(x, 40, iters=3, seed=0)
    delta = ck.product_error(48, 2.0**-20)
    _, radius = ck.cluster_stats(x, cent, delta, 2**20)
    args = (x, cent, ck.floors(radius, 0.8, 48, delta), 0.8, delta, n_probe, 2**18)
    got = ck.route(*args)  # chunks of 819 rows: several
    monkeypatch.setattr(ck, "_clustered_fast", lambda: None)
    want = ck.route(*args)
    assert torch.equal(got[0], want[0])
    assert len(want[1]) == 0 if n_probe == 0 else len(want[1]) > len(x) // 10
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_routed_rows_keep_their_dtype(dtype: torch.dtype) -> None:
    """Rows cross the shuffle in their own dtype (a float16 row in 2 bytes a value), bit
    for bit, through a chunked Arrow column as the shuffle's concatenation leaves it."""
    x = torch.randn(37, 5, dtype=torch.float64).mul_(1e3).to(dtype)
    x[3, 1] = float("nan")
    x[4, 2] = -0.0
    encoded = clustered_rows.encode_rows(x)
    assert pa.array(encoded).buffers()[2].size == 37 * 5 * dtype.itemsize
    chunked = pd.Series(
        pd.arrays.ArrowExtensionArray(
            pa.chunked_array([pa.array(encoded)[:10], pa.array(encoded)[10:]])
        )
    )
    back = clustered_rows.decode_rows(chunked.iloc[1:], str(dtype).removeprefix("torch."), 5)
    assert back.dtype == dtype
    assert torch.equal(back.view(torch.uint8), x[1:].view(torch.uint8))


def test_stats_carry_the_input_dtype() -> None:
    """A float16 column is routed in float16; partitions of different dtypes in the one
    that holds them all."""
    x = adversarial(400, dtype=np.float16)
    cent = torch.nn.functional.normalize(torch.randn(3, 16), dim=1)
    parts = [
        cp.stats_partition(
            frame(x.astype(t)), "emb", cent, eps=1e-8, device="cpu", chunk_bytes=2**20
        )
        for t in (np.float16, np.float16, np.float32)
    ]
    assert parts[0].dtype == "float16"
    assert cp.merge_stats(*parts[:2]).dtype == "float16"
    assert cp.merge_stats(*parts).dtype == "float32"
    layout = clustered.plan(frame(x), "emb", 0.9, clusters=3).layout
    assert layout.dtype == "float16"
    routed = cp.route_partition(frame(x), "emb", layout, eps=1e-8, device="cpu", chunk_bytes=2**20)
    widths = pc.binary_length(pa.array(routed[cp.VEC].array))
    assert set(widths.to_pylist()) == {16 * 2}


def test_kmeans_and_generator() -> None:
    x, planted = embedding_arrays(4000, 32, directions=40, duplicates=0.05, seed=7)
    again, _ = embedding_arrays(4000, 32, directions=40, duplicates=0.05, seed=7)
    assert torch.equal(x, again)
    assert x.dtype == torch.float32
    torch.testing.assert_close(torch.linalg.vector_norm(x, dim=1), torch.ones(4000))
    got = (x[planted.copy].double() * x[planted.source].double()).sum(dim=1).numpy()
    np.testing.assert_allclose(got, planted.cosine, atol=1e-6)
    assert len(planted.copy) == 200 and not set(planted.copy) & set(planted.source)
    cent = km.kmeans(x, 50, iters=5, seed=0)
    assert cent.shape == (50, 32)
    torch.testing.assert_close(torch.linalg.vector_norm(cent, dim=1), torch.ones(50))
    assert len(km.kmeans(x[:3], 10, iters=2, seed=0)) == 3


@pytest.mark.parametrize("dim", [7, 384, 1536])
def test_centroids_lie_within_the_bound_of_their_direction(dim: int) -> None:
    """A centroid is within u + 2 (D + 4) 2**-53 of its direction (the c_u of the bound:
    clustered_kernels); torch's float32 normalisation missed it by up to 2u at D = 384."""
    sums = torch.randn(2000, dim, generator=torch.Generator().manual_seed(dim)) * 37.0
    sums[5] = 0.0
    cent = km.unit_rows(sums)
    assert not cent[5].any()
    length = torch.linalg.vector_norm(cent.double(), dim=1)[torch.arange(2000) != 5]
    assert float((length - 1.0).abs().max()) <= 2.0**-24 + 2.0 * (dim + 4) * 2.0**-53
    # Rows that sum to zero (x and -x, both scoring 0 with either centroid, so both go to
    # the first) keep their centroid.
    eye = torch.eye(dim if dim >= 3 else 3)
    cent = eye[[2, 1]]
    assert torch.equal(km.lloyd_step(cent, km.lloyd_sums(torch.stack([eye[0], -eye[0]]), cent))[0],
                       cent[0])  # fmt: skip


def test_kmeans_in_shards_is_kmeans_of_the_whole() -> None:
    """Split in shards, the sample gets the same seeds, the same assignment and the same
    restarts (at the least similar rows of the whole sample, wherever they lie)."""
    gen = torch.Generator().manual_seed(4)
    x = torch.rand(3000, 16, generator=gen)
    x[:, 12:] = 0.0  # the data never reach the last 4 axes: centroids there lose every row
    x[-4:, :12] = torch.eye(12)[:4]  # the least similar rows, all in the last shard
    x = torch.nn.functional.normalize(x, dim=1)
    cuts = [0, 100, 1700, 3000]
    shards = [x[a:b] for a, b in itertools.pairwise(cuts)]
    whole = km.first_centroids(km.seeds(x, 0, len(x), 40, 1))
    split = km.first_centroids(*[km.seeds(s, cuts[j], len(x), 40, 1) for j, s in enumerate(shards)])
    assert torch.equal(whole, split) and len(whole) == 40
    one = km.lloyd_sums(x, whole)
    parts = [km.lloyd_sums(s, whole) for s in shards]
    assert torch.equal(one.counts, sum(p.counts for p in parts))
    torch.testing.assert_close(km.lloyd_step(whole, one), km.lloyd_step(whole, *parts))
    # Four centroids no row is nearest to restart at the four least similar rows, in the
    # order of their scores (0.01 to 0.04 before normalising).
    real = torch.ones(1, 16)
    real[0, :4] = torch.tensor([0.01, 0.02, 0.03, 0.04])
    real[0, 12:] = 0.0
    cent = torch.cat([torch.nn.functional.normalize(real, dim=1), torch.eye(16)[12:]])
    new = km.lloyd_step(cent, *[km.lloyd_sums(s, cent) for s in shards])
    torch.testing.assert_close(new[1:], x[-4:])
    # A shard that offers fewer rows than there are empties: the rest keep their place.
    new = km.lloyd_step(cent, km.lloyd_sums(x[-2:], cent))
    torch.testing.assert_close(new[1:3], x[-2:])
    assert torch.equal(new[3:], cent[3:])
