"""dedup and groups keep at most one entry a row of the pairs they scan: the rows with
a match, each row's best match, edges that connect the rows.  A pair task whose pairs
pass its budget (all pairs of many identical rows) searches again by blocks of rows,
keeping that much block by block, and gives the answer it gives within the budget;
those tasks raised ResultTooLargeError."""

from __future__ import annotations

from typing import Any

import dask
import numpy as np
import pandas as pd
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from dask_cosim import search_dedup as sd
from dask_cosim import search_kernels as sk
from dask_cosim import search_partition as sp
from dask_cosim import search_reduced
from dask_cosim.search_budget import PAIR_BYTES
from tests.helpers import brute, prepare_rows, search_frame, search_vectors, to_dask

THRESHOLD = 0.9


def adversarial(n: int = 700, d: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Rows past a few blocks of :data:`search_reduced._MIN_BLOCK`: 300 copies of one
    direction (scaled: the same unit row), pairs a float32 ulp either side of the
    threshold, duplicates of other rows, a NaN, a zero and a null row."""
    x = search_vectors(n, d, seed=11).astype(np.float64)
    rng = np.random.default_rng(12)
    x[100:400] = x[3] * rng.uniform(0.5, 2.0, size=(300, 1))
    for k, row in enumerate(range(450, 470)):  # cos(x[row], x[row + 20]) next to THRESHOLD
        a = x[row] / np.linalg.norm(x[row])
        b = rng.standard_normal(d)
        b -= (b @ a) * a
        b /= np.linalg.norm(b)
        c = THRESHOLD + (k - 10) * 2.0**-24
        x[row + 20] = c * a + np.sqrt(1 - c * c) * b
    x[520:540] = x[600:620]
    x[650], x[651] = np.nan, 0.0
    null = np.zeros(n, dtype=bool)
    null[652] = True
    return x.astype(np.float32), null


def _search(df: Any, op: str) -> Any:
    if op == "groups":
        out = df.cosim.groups("emb", THRESHOLD)
    else:
        out = df.cosim.dedup("emb", THRESHOLD, return_removed=op == "dedup-removed")
    return dask.compute(out, scheduler="sync")[0]


@pytest.mark.parametrize("op", ["dedup", "dedup-removed", "groups"])
@pytest.mark.parametrize("npartitions", [None, 2])
def test_past_the_budget_the_same_answer(op: str, npartitions: int | None) -> None:
    x, null = adversarial()
    pdf = search_frame(x, null=null)
    df = pdf if npartitions is None else to_dask(pdf, npartitions)
    want = _search(df, op)
    # 2,000 pairs a task: the 300 copies alone make 44,850.
    with dask.config.set({"cosim.search.max-result-bytes": 2000 * PAIR_BYTES}):
        got = _search(df, op)
    for w, g in zip(*(([want], [got]) if op != "dedup-removed" else (want, got)), strict=True):
        pd.testing.assert_frame_equal(g, w)
    if op == "dedup":  # and the answer is the float64 one
        y = np.where(null[:, None], np.nan, x)
        kept = ~np.tril(brute(y, y) >= THRESHOLD, -1).any(axis=1)
        assert got["id"].tolist() == np.flatnonzero(kept).tolist()


@pytest.mark.parametrize("keep", search_reduced.KEEPS)
@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("data", ["adversarial", "one row"])
def test_by_blocks_keeps_what_the_pairs_give(keep: str, upper: bool, data: str) -> None:
    """Blocks of 256 rows (the fewest), over 700 x 700 or 700 x 600 rows; "one row":
    every row one vector (scaled), where blocks are skipped (rows matched, a best score
    of 1, rows connected already)."""
    x, null = adversarial()
    if data == "one row":
        x = (x[3] * np.linspace(0.5, 2.0, len(x))[:, None]).astype(np.float32)
        null[:] = False
    q = prepare_rows(x, null)
    r = q if upper else prepare_rows(x[50:650], null[50:650])
    i, j, s = sk.threshold_pairs(q, r, THRESHOLD, tile_bytes=2**16,
                                 mode="upper" if upper else None)  # fmt: skip
    got_i, got_j, got_s = search_reduced.by_blocks(
        keep, q, r, THRESHOLD, upper=upper, most=1, tile_bytes=2**16
    )
    if keep == "rows":
        assert got_j.tolist() == sorted(set(j.tolist()))
    elif keep == "best":
        order = np.lexsort((i.numpy(), -s.numpy(), j.numpy()))
        first = np.r_[True, np.diff(j.numpy()[order]) != 0]
        assert got_j.tolist() == j.numpy()[order][first].tolist()
        assert got_i.tolist() == i.numpy()[order][first].tolist()
        assert got_s is not None and got_s.tolist() == s.numpy()[order][first].tolist()
    else:
        _same_components(i.numpy(), j.numpy(), got_i.numpy(), got_j.numpy(), len(q), len(r), upper)


def _labels(i: np.ndarray, j: np.ndarray, nq: int, nr: int, upper: bool) -> np.ndarray:
    nodes = nq if upper else nq + nr
    v = j if upper else j + nq
    graph = coo_matrix((np.ones(len(i)), (i, v)), shape=(nodes, nodes))
    return connected_components(graph, directed=False)[1]


def _same_components(
    i: np.ndarray, j: np.ndarray, fi: np.ndarray, fj: np.ndarray, nq: int, nr: int, upper: bool
) -> None:
    """The forest (fi, fj) joins what the pairs (i, j) join, and no more, with one edge
    fewer than the rows of each set; each edge a left and a right row (upper: i < j)."""
    want = _labels(i, j, nq, nr, upper)
    got = _labels(fi, fj, nq, nr, upper)
    # The same partition of the rows: each label of one maps to one label of the other.
    pairs = set(zip(want.tolist(), got.tolist(), strict=True))
    assert len(pairs) == len(set(want.tolist())) == len(set(got.tolist()))
    touched = np.zeros(len(want), dtype=bool)
    touched[i] = True
    touched[j if upper else j + nq] = True
    sets = len(set(want[touched].tolist()))
    assert len(fi) == touched.sum() - sets
    assert (fi >= 0).all() and (fi < nq).all()
    assert (fj >= 0).all() and (fj < (nq if upper else nr)).all()
    if upper:
        assert (fi < fj).all()


@pytest.mark.gpu
@pytest.mark.parametrize("keep", search_reduced.KEEPS)
def test_two_pass_search_turns_to_blocks_on_a_gpu(keep: str) -> None:
    """On CUDA with precision "exact" the first pass's candidates are counted as the
    kernel writes them: 300 copies of one row (44,850 pairs) pass a limit of 1,000
    before they fill the device, and the search by blocks gives the CPU's answer."""
    import torch

    from dask_cosim._search_sweep import PairLimit

    x, null = adversarial()
    cpu = prepare_rows(x, null)
    gpu = cpu.to(torch.device("cuda"))
    want = search_reduced.found(keep, cpu, cpu, THRESHOLD, upper=True, limit=None, tile_bytes=2**16)
    limit = PairLimit(1000)
    got = search_reduced.found(
        keep, gpu, gpu, THRESHOLD, upper=True, limit=limit, tile_bytes=2**16, precision="exact"
    )
    assert limit.found > 1000  # it stopped, and went on by blocks
    if keep == "forest":
        _same_components(*(t.cpu().numpy() for t in want[:2]),
                         *(t.cpu().numpy() for t in got[:2]), len(x), len(x), True)  # fmt: skip
    else:
        assert got[1].cpu().tolist() == want[1].tolist()
        if keep == "best":
            assert got[0].cpu().tolist() == want[0].tolist()
            assert got[2].cpu().tolist() == want[2].tolist()


@pytest.mark.parametrize("upper", [True, False])
def test_spanning_on_random_graphs(upper: bool) -> None:
    rng = np.random.default_rng(5)
    for _ in range(20):
        nq, nr = rng.integers(1, 60, size=2)
        nr = nq if upper else nr
        e = int(rng.integers(0, 80))
        i, j = rng.integers(0, nq, size=e), rng.integers(0, nr, size=e)
        if upper:
            keep = i != j
            i, j = np.minimum(i, j)[keep], np.maximum(i, j)[keep]
        fi, fj = search_reduced.spanning(i, j, int(nq), int(nr), upper)
        _same_components(i, j, fi, fj, int(nq), int(nr), upper)


def test_a_task_of_identical_rows_holds_a_row_each() -> None:
    """groups' pair task returns the edges of a forest, not the 44,850 pairs of 300
    copies of a row (nor the others'): fewer than its rows."""
    x, null = adversarial()
    side = sp.prepare_side(search_frame(x, null=null), "emb", 0, eps=1e-8)
    edges = sd.earlier_matches(side, None, THRESHOLD, {"cpu": 2**20, "cuda": 2**20}, edges=True)
    assert edges.shape[1] == 2 and 300 <= len(edges) < len(x)


def test_merged_forests_connect_what_their_edges_connect() -> None:
    """groups' merges: the edges of several tasks (keys of rows in several partitions,
    some edges repeated across tasks) reduced to a star forest around each connected
    set's smallest key: the same connected sets, one edge fewer than each set's rows."""
    rng = np.random.default_rng(7)
    for _ in range(20):
        parts = []
        for _task in range(int(rng.integers(1, 5))):
            e = int(rng.integers(0, 40))
            part = rng.integers(0, 3, size=(e, 2))
            pos = rng.integers(0, 30, size=(e, 2))
            parts.append((part << sp.POS_BITS) + pos)
        merged = sd.merged_forest(*parts)
        edges = np.concatenate(parts)
        keys, ends = np.unique(np.concatenate([edges, merged]), return_inverse=True)
        ends = ends.reshape(-1, 2)
        n, m = len(keys), len(edges)
        want = search_reduced.labels(ends[:m, 0], ends[:m, 1], n, 0, upper=True)
        got = search_reduced.labels(ends[m:, 0], ends[m:, 1], n, 0, upper=True)
        assert len(set(zip(want.tolist(), got.tolist()))) == len(set(want.tolist()))
        assert len(set(want.tolist())) == len(set(got.tolist()))
        touched = np.zeros(n, dtype=bool)
        touched[ends[:m].ravel()] = True
        assert len(merged) == touched.sum() - len(set(want[touched].tolist()))
        assert (merged[:, 0] < merged[:, 1]).all()


def test_best_by_rank_keeps_the_highest_score_then_the_earliest_rank() -> None:
    """``best`` with ``rank`` (a clustered block's rows, whose positions are not frame
    order): each right row's pair of highest score, then lowest rank, one of those that
    tie on both; against a sort."""
    import torch

    rng = np.random.default_rng(6)
    for _ in range(30):
        e = int(rng.integers(1, 60))
        i = torch.from_numpy(rng.integers(0, 20, size=e))
        j = torch.from_numpy(rng.integers(0, 15, size=e))
        s = torch.from_numpy(rng.choice([0.9, 0.95, 1.0], size=e))
        row_rank = torch.from_numpy(rng.permutation(100)[:20])
        rank = row_rank[i]
        gi, gj, gs = search_reduced.best(i, j, s, rank=rank)
        order = np.lexsort((rank.numpy(), -s.numpy(), j.numpy()))
        first = np.r_[True, np.diff(j.numpy()[order]) != 0]
        want = order[first]
        assert gj.tolist() == j.numpy()[want].tolist()
        assert gs.tolist() == s.numpy()[want].tolist()
        assert row_rank[gi].tolist() == rank.numpy()[want].tolist()
