"""The float64 answers of ``benchmarks.search_gpu``'s cases, by brute force on the device.

Every pair score is computed in float64 by one matrix product per block of rows, with
nothing pruned: ``cos(q_i, r_j) = (raw_i inv_i) . (raw_j inv_j) scale_i scale_j``, clamped
to [-1, 1], the formula of our float64 re-score on the normalisation :func:`prepare
<dask_cosim.search_kernels.prepare>` gives each row.  So the answers share only that
normalisation with the search they judge (whose float64 decisions come from a
low-precision pass, its error bound and a re-score of the pairs it kept): a pair the
search pruned wrongly, or a tie broken the other way, shows as a changed decision.

Only the order of the float64 sums differs from the re-score's, which moves a score by
a few units in its last place: a decision within that of its bar could differ without
either side being wrong.  :func:`near_bar` counts such pairs; on the benchmark's data there
are none (a pair within 1e-15 of a threshold is a chance of about 1e-9).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from dask_cosim import search_kernels as sk

BLOCK_BYTES = 2**30  # float64 scores of one block product


def _units(p: sk.Prepared, rows: slice) -> torch.Tensor:
    return p.raw[rows].to(torch.float64) * p.inv[rows, None]


def _blocks(n: int, width: int) -> Iterator[slice]:
    for s in range(0, n, width):
        yield slice(s, min(n, s + width))


def _scores(q: sk.Prepared, qs: slice, r: sk.Prepared, rs: slice) -> torch.Tensor:
    s = _units(q, qs) @ _units(r, rs).T
    s *= q.scale[qs, None]
    s *= r.scale[None, rs]
    s.clamp_(-1.0, 1.0)
    s[~q.valid[qs]] = -torch.inf
    s[:, ~r.valid[rs]] = -torch.inf
    return s


def _first_k(v: torch.Tensor, i: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``k`` of each row of candidates by float64 score descending, ties by
    position ascending (two stable sorts)."""
    o = torch.argsort(i, dim=1, stable=True)
    v, i = v.gather(1, o), i.gather(1, o)
    o = torch.argsort(v, dim=1, descending=True, stable=True)[:, :k]
    return v.gather(1, o), i.gather(1, o)


def topk(q: sk.Prepared, r: sk.Prepared, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores, positions), each (len(q), k): every row of ``q``'s ``k`` rows of ``r``
    of highest float64 score, ties to the earlier row (the search's own rule)."""
    nq, nr = len(q.raw), len(r.raw)
    width = max(k + 1, BLOCK_BYTES // (8 * max(1, nq)))
    best_v = torch.empty(nq, 0, dtype=torch.float64, device=q.raw.device)
    best_i = torch.empty(nq, 0, dtype=torch.long, device=q.raw.device)
    for rs in _blocks(nr, width):
        s = _scores(q, slice(0, nq), r, rs)
        # k + 8 candidates a row, unless a tie at the k-th reaches past them: then all.
        m = min(s.shape[1], k + 8)
        v, i = torch.topk(s, m, dim=1)
        if m > k and bool((v[:, m - 1] == v[:, k - 1]).any()):
            v, i = s, torch.arange(s.shape[1], device=s.device).expand_as(s)
        v, i = torch.cat([best_v, v], 1), torch.cat([best_i, i + rs.start], 1)
        best_v, best_i = _first_k(v, i, k)
    return best_v, best_i


def self_pairs(x: sk.Prepared, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes i * n + j, scores): every pair i < j of rows of ``x`` with float64 score at
    or above ``threshold``, sorted by code."""
    n = len(x.raw)
    width = max(1, int((BLOCK_BYTES / 8) ** 0.5))
    codes, scores = [], []
    for a in _blocks(n, width):
        for b in _blocks(n, width):
            if b.stop <= a.start:
                continue
            s = _scores(x, a, x, b)
            hit = s >= threshold
            if b.start < a.stop:  # the diagonal block: pairs i < j only
                ii = torch.arange(a.start, a.stop, device=s.device)[:, None]
                jj = torch.arange(b.start, b.stop, device=s.device)[None, :]
                hit &= ii < jj
            i, j = hit.nonzero(as_tuple=True)
            codes.append((i + a.start) * n + (j + b.start))
            scores.append(s[i, j])
    code = torch.cat(codes)
    order = torch.argsort(code)
    return code[order], torch.cat(scores)[order]


def near_bar(scores: torch.Tensor, bar: torch.Tensor | float, dim: int) -> int:
    """How many of ``scores`` lie within the float64 rounding of the re-score of ``bar``
    (where a sum in another order may decide the other way)."""
    from dask_cosim.search_prepare import rescore_error

    return int(((scores - bar).abs() <= 2 * rescore_error(dim)).sum())
