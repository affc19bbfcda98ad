"""The GPU search benchmark's float64 answers (``benchmarks.search_reference``), which
judge every contender there, against numpy float64 on rows with exact duplicates (ties),
in blocks smaller than the rows so that the merges across blocks are exercised."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks import search_reference as ref
from dask_cosim import search_kernels as sk


def rows_with_ties(n: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim)).astype(np.float16)
    x[5::7] = x[3]  # exact duplicates: equal float64 scores, ties by position
    x[4::11] = x[1] * np.float16(2)  # a scaled copy: the same direction
    return x


def numpy_scores(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    a64 /= np.linalg.norm(a64, axis=1, keepdims=True)
    b64 /= np.linalg.norm(b64, axis=1, keepdims=True)
    return np.clip(a64 @ b64.T, -1, 1)


@pytest.mark.parametrize("block_bytes", [ref.BLOCK_BYTES, 8 * 40 * 13])
def test_topk_is_numpys_with_ties_to_the_earlier_row(
    monkeypatch: pytest.MonkeyPatch, block_bytes: int
) -> None:
    monkeypatch.setattr(ref, "BLOCK_BYTES", block_bytes)
    items, q = rows_with_ties(300, 24, 0), rows_with_ties(40, 24, 1)
    q[7] = items[3]  # a query whose best rows tie exactly (every copy of item 3)
    k = 6
    v, i = ref.topk(
        sk.prepare(torch.from_numpy(q), eps=1e-8), sk.prepare(torch.from_numpy(items), eps=1e-8), k
    )
    s = numpy_scores(q, items)
    want = np.lexsort((np.broadcast_to(np.arange(300), s.shape), -s), axis=1)[:, :k]
    assert np.array_equal(i.numpy(), want)
    assert list(i[7].numpy()) == [3, 5, 12, 19, 33, 40]  # 26 became a copy of row 1
    np.testing.assert_allclose(v.numpy(), np.take_along_axis(s, want, 1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("block_bytes", [ref.BLOCK_BYTES, 8 * 37 * 37])
def test_self_pairs_are_numpys(monkeypatch: pytest.MonkeyPatch, block_bytes: int) -> None:
    monkeypatch.setattr(ref, "BLOCK_BYTES", block_bytes)
    x = rows_with_ties(200, 16, 2)
    codes, scores = ref.self_pairs(sk.prepare(torch.from_numpy(x), eps=1e-8), 0.5)
    s = numpy_scores(x, x)
    i, j = np.nonzero(np.triu(s >= 0.5, 1))
    assert np.array_equal(codes.numpy(), np.sort(i * 200 + j))
    assert len(codes) > 100  # the duplicates' pairs at least
    np.testing.assert_allclose(scores.numpy(), s[i, j][np.argsort(i * 200 + j)], atol=1e-12)
    assert ref.near_bar(scores, 0.5, 16) == 0
    assert ref.near_bar(scores, float(scores[0]), 16) >= 1
