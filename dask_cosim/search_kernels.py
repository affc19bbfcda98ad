"""Exact cosine search kernels: pure torch, any device, no dataframes, no config.

Two reductions over blocks of the score matrix ``S = U_q @ U_r.T`` of two sets of
unit vectors, one tile at a time (the whole matrix never exists):

- :func:`topk`: for each query row its ``k`` best rows, by a running top-k merge;
- :func:`threshold_pairs`: every pair (i, j, score) with score >= a threshold.

Exactness.  Tiles are float32 products, but every answer is decided on float64 scores
re-computed from the original values for the candidates only: a float32 score differs
from the exact one by at most ``margin(D) = (D + 8) * 2**-24`` (the worst-case bound of a
float32 dot product of two unit vectors), so keeping every candidate within that margin
of the boundary and re-scoring it in float64 gives the float64 answer.  Ties of the
float64 score are broken by position (the lower position first), so the result does not
depend on how the rows were split into tiles or partitions.

Validity.  Rows holding NaN or inf, and rows marked null, are invalid: they never match
and get no matches.  A zero vector is valid and scores 0.0 with every row (the numerics
policy: cos = (a / max(|a|, eps)) . (b / max(|b|, eps))).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dask_cosim import staging

__all__ = ["Prepared", "TopK", "margin", "prepare", "rescore", "threshold_pairs", "topk"]

_NEG_INF = float("-inf")


@dataclass
class Prepared:
    """One side of a search, normalised once.

    ``unit`` (N, D) float32 rows of length 1 (0 for zero and invalid rows) for the tile
    products; ``raw`` the original values, and ``inv`` (1 / max |x|) and ``scale``
    (max |x| / max(|x|_2, eps)), float64, for the exact re-score
    ``(raw_i * inv_i) . (raw_j * inv_j) * scale_i * scale_j``, which cannot overflow even
    for values near 1e308.  ``valid`` (N,) bool marks rows that take part.
    """

    unit: torch.Tensor
    raw: torch.Tensor
    inv: torch.Tensor
    scale: torch.Tensor
    valid: torch.Tensor

    def __len__(self) -> int:
        return int(self.unit.shape[0])

    @property
    def dim(self) -> int:
        return int(self.unit.shape[1])

    def to(self, device: torch.device) -> Prepared:
        """This side on ``device`` (itself when it is there already); from the host to a
        GPU through pinned staging buffers (:mod:`dask_cosim.staging`)."""
        if self.unit.device == device:
            return self
        staged = self.unit.device.type == "cpu" and device.type == "cuda"
        fields = (self.unit, self.raw, self.inv, self.scale, self.valid)
        # A placeholder without memory (a lean side's expanded unit rows) is not staged.
        return Prepared(
            *(
                staging.to_device([t], device) if staged and t.is_contiguous() else t.to(device)
                for t in fields
            )
        )

    def take(self, rows: torch.Tensor) -> Prepared:
        """The rows at positions ``rows`` (int64), in that order."""
        return Prepared(
            self.unit[rows], self.raw[rows], self.inv[rows], self.scale[rows], self.valid[rows]
        )


@dataclass
class TopK:
    """Per query row its best rows: ``index`` (n, k) int64 positions (-1: none) and
    ``score`` (n, k) float64 (-inf: none), sorted by score descending, then position."""

    index: torch.Tensor
    score: torch.Tensor


def margin(dim: int) -> float:
    """Largest difference between a float32 tile score and the exact score of two unit
    vectors of ``dim`` values: the worst-case rounding bound of the dot product plus the
    normalisation."""
    return (dim + 8) * 2.0**-24


def prepare(
    x: torch.Tensor,
    null: torch.Tensor | None = None,
    *,
    eps: float,
    device: torch.device | str | None = None,
) -> Prepared:
    """Normalise (N, D) rows once: see :class:`Prepared`.

    ``null`` (N,) bool marks null rows (their values are ignored).  Any real dtype.  A few
    passes over the rows, no N x D temporary but ``unit`` itself.
    """
    target = torch.device(device) if device is not None else x.device
    raw = x.to(target)
    if not raw.is_floating_point():
        raw = raw.to(torch.float64)
    work = raw if raw.dtype in (torch.float32, torch.float64) else raw.to(torch.float32)
    n, d = work.shape
    f64 = torch.float64
    if n and d:
        # NaN propagates through max/min; inf stays inf: one test for both.
        m = torch.maximum(work.amax(dim=1), -work.amin(dim=1)).to(f64)
    else:
        m = torch.zeros(n, dtype=f64, device=target)
    valid = torch.isfinite(m)
    if null is not None:
        valid &= ~torch.as_tensor(null, device=target).to(torch.bool)
    # Zero and invalid rows: any finite positive scale keeps their products at 0.
    m = torch.where(valid & (m > 0), m, torch.ones_like(m))
    # Norms in float64: exact enough for the re-score, and float32 values can neither
    # overflow nor underflow there.
    norm = torch.linalg.vector_norm(work, dim=1, dtype=f64) if d else torch.zeros_like(m)
    scale = m / torch.clamp(norm, min=eps)
    unit = torch.mul(work, (scale / m).to(work.dtype)[:, None]).to(torch.float32)
    if work.dtype == f64:
        # float64 squares overflow past ~1e154 and lose precision below ~1e-154: those
        # rows again, divided by their largest value first.
        redo = valid & ((m > 1e150) | (m < 1e-150))
        if bool(redo.any()):
            rows = redo.nonzero().squeeze(1)
            y = work[rows] / m[rows, None]
            ny = torch.linalg.vector_norm(y, dim=1)
            scale[rows] = torch.where(ny * m[rows] >= eps, 1.0 / ny, m[rows] / eps)
            unit[rows] = (y * scale[rows, None]).to(torch.float32)
    if not bool(valid.all()):
        unit[~valid] = 0.0
        scale = torch.where(valid, scale, torch.zeros_like(scale))
    return Prepared(unit.contiguous(), raw, 1.0 / m, scale, valid)


def rescore(
    q: Prepared, i: torch.Tensor, r: Prepared, j: torch.Tensor, *, chunk: int = 65536
) -> torch.Tensor:
    """float64 cos(q[i[t]], r[j[t]]) for each t, clamped to [-1, 1]."""
    out = torch.empty(len(i), dtype=torch.float64, device=q.unit.device)
    for s in range(0, len(i), chunk):
        ii, jj = i[s : s + chunk], j[s : s + chunk]
        a = q.raw[ii].to(torch.float64) * q.inv[ii, None]
        b = r.raw[jj].to(torch.float64) * r.inv[jj, None]
        out[s : s + chunk] = (a * b).sum(dim=1) * q.scale[ii] * r.scale[jj]
    return out.clamp_(-1.0, 1.0)


# The most bytes of one tile of a threshold-only search on a CPU (see threshold_pairs):
# benchmarks/NOTES.md, section 8, has the measurement.
THRESHOLD_CPU_TILE_BYTES = 4 * 2**20


def _tiles(nq: int, nr: int, tile_bytes: int) -> tuple[int, int]:
    elems = max(1, tile_bytes // 4)
    tq = max(1, min(nq, 1024, elems // max(1, min(nr, 1024))))
    tr = max(1, min(nr, elems // tq))
    return tq, tr


class _Tile:
    """One score buffer reused for every tile: a fresh 32 MiB block per tile would be
    mapped and page-faulted each time where malloc returns large blocks to the OS (dask
    workers set MALLOC_TRIM_THRESHOLD_)."""

    def __init__(self, tq: int, tr: int, device: torch.device) -> None:
        self.flat = torch.empty(tq * tr, dtype=torch.float32, device=device)

    def product(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """a @ b.T into the buffer (a contiguous view)."""
        out = self.flat[: a.shape[0] * b.shape[0]].view(a.shape[0], b.shape[0])
        return torch.mm(a, b.T, out=out)


class _Running:
    """The running top-``kk`` of float32 scores for n rows, and the best score dropped."""

    def __init__(self, n: int, kk: int, device: torch.device) -> None:
        self.kk = kk
        self.score = torch.full((n, kk), _NEG_INF, dtype=torch.float32, device=device)
        self.index = torch.full((n, kk), -1, dtype=torch.int64, device=device)
        self.dropped = torch.full((n,), _NEG_INF, dtype=torch.float32, device=device)

    def merge(self, rows: slice, s: torch.Tensor, col0: int) -> None:
        kk = self.kk
        kt = min(kk + 1, s.shape[1])
        ts, ti = torch.topk(s, kt, dim=1)
        ti += col0
        if kt == kk + 1:
            torch.maximum(self.dropped[rows], ts[:, kk], out=self.dropped[rows])
            ts, ti = ts[:, :kk], ti[:, :kk]
        cs = torch.cat([self.score[rows], ts], dim=1)
        ci = torch.cat([self.index[rows], ti], dim=1)
        ms, mi = torch.topk(cs, kk + 1, dim=1)
        torch.maximum(self.dropped[rows], ms[:, kk], out=self.dropped[rows])
        self.score[rows] = ms[:, :kk]
        # A masked entry (invalid row, the row itself) is no candidate, even while a
        # row has fewer than kk real ones.
        self.index[rows] = torch.gather(ci, 1, mi[:, :kk]).masked_fill_(ms[:, :kk] == _NEG_INF, -1)


def _order(score: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Column order per row: score descending, then position ascending (-1 last)."""
    key = torch.where(index < 0, torch.iinfo(torch.int64).max, index)
    by_pos = torch.argsort(key, dim=1, stable=True)
    s = torch.gather(score, 1, by_pos)
    by_score = torch.argsort(s, dim=1, descending=True, stable=True)
    return torch.gather(by_pos, 1, by_score)


def _finish(
    run: _Running, q: Prepared, r: Prepared, k: int, tile_bytes: int, self_pos: bool
) -> TopK:
    n, kk = run.index.shape
    ci = run.index
    s64 = torch.full((n, kk), _NEG_INF, dtype=torch.float64, device=ci.device)
    found = ci >= 0
    rows = torch.arange(n, device=ci.device)[:, None].expand(n, kk)
    s64[found] = rescore(q, rows[found], r, ci[found])
    order = _order(s64, ci)[:, :k]
    score = torch.gather(s64, 1, order)
    index = torch.gather(ci, 1, order)
    # A row is certain when nothing it dropped can reach its k-th float64 score.
    delta = margin(q.dim)
    kth = score[:, k - 1] if score.shape[1] == k else torch.full_like(score[:, 0], _NEG_INF)
    dropped = run.dropped.to(torch.float64)
    unsure = torch.isfinite(dropped) & (dropped + delta >= kth)
    if bool(unsure.any()):
        u = unsure.nonzero().squeeze(1)
        sub = q.take(u)
        ii, jj, ss = threshold_pairs(
            sub,
            r,
            kth[u],
            tile_bytes=tile_bytes,
            row_pos=u if self_pos else None,
            mode="exclude_self" if self_pos else None,
        )
        fix = _top_of_pairs(len(u), ii, jj, ss, k)
        index[u], score[u] = fix.index, fix.score
    index[~q.valid] = -1
    score[~q.valid] = _NEG_INF
    return TopK(index, score)


def _top_of_pairs(n: int, i: torch.Tensor, j: torch.Tensor, s: torch.Tensor, k: int) -> TopK:
    """The k best (score desc, position asc) of each row from a list of pairs."""
    index = torch.full((n, k), -1, dtype=torch.int64, device=i.device)
    score = torch.full((n, k), _NEG_INF, dtype=torch.float64, device=i.device)
    if len(i) == 0:
        return TopK(index, score)
    o = torch.argsort(j, stable=True)
    o = o[torch.argsort(-s[o], stable=True)]
    o = o[torch.argsort(i[o], stable=True)]
    i, j, s = i[o], j[o], s[o]
    starts = torch.searchsorted(i, i, right=False)
    rank = torch.arange(len(i), device=i.device) - starts
    keep = rank < k
    index[i[keep], rank[keep]] = j[keep]
    score[i[keep], rank[keep]] = s[keep]
    return TopK(index, score)


def topk(
    q: Prepared,
    r: Prepared,
    k: int,
    *,
    tile_bytes: int,
    same: bool = False,
    both: bool = False,
    precision: str = "fp32",
) -> tuple[TopK, TopK | None]:
    """For each row of ``q`` its ``k`` best rows of ``r`` (and, with ``both``, for each row
    of ``r`` its ``k`` best rows of ``q``, from the same tiles).

    Parameters
    ----------
    q, r : Prepared
        The two sides (same D).
    k : int
        Matches per row, >= 1; fewer when ``r`` has fewer valid rows.
    tile_bytes : int
        Budget for one float32 tile of scores.
    same : bool, default False
        ``q`` and ``r`` are the same rows: a row never matches itself.
    both : bool, default False
        Also reduce the columns (the self-join's off-diagonal partition pairs).
    precision : {"fp32", "exact", "fast"}, default "fp32"
        On CUDA, "exact" and "fast" hand over to :mod:`dask_cosim.search_twopass` (a
        float16 first pass; "fast" ranks on it alone); elsewhere all three run this.

    Returns
    -------
    (TopK, TopK or None)
        Exact float64 results, ties broken by position.
    """
    if precision != "fp32" and q.unit.device.type == "cuda":
        from dask_cosim import search_twopass

        exact = precision == "exact"
        return search_twopass.topk_prepared(q, r, k, same=same, both=both, exact=exact)
    device = q.unit.device
    nq, nr = len(q), len(r)
    kk = k + max(k, 8)  # candidates kept per row: room below the k-th for near-ties
    run_q = _Running(nq, kk, device)
    run_r = _Running(nr, kk, device) if both else None
    tq, tr = _tiles(nq, nr, tile_bytes)
    tile = _Tile(tq, tr, device)
    r_invalid = ~r.valid
    q_invalid = ~q.valid
    mask_r = bool(r_invalid.any())
    mask_q = both and bool(q_invalid.any())
    with torch.no_grad():
        for a0 in range(0, nq, tq):
            a1 = min(nq, a0 + tq)
            for c0 in range(0, nr, tr):
                c1 = min(nr, c0 + tr)
                s = tile.product(q.unit[a0:a1], r.unit[c0:c1])
                if mask_r:
                    s.masked_fill_(r_invalid[None, c0:c1], _NEG_INF)
                if same and a0 < c1 and c0 < a1:
                    s.diagonal(a0 - c0).fill_(_NEG_INF)
                run_q.merge(slice(a0, a1), s, c0)
                if run_r is not None:
                    st = s.T
                    if mask_q:
                        st = st.masked_fill(q_invalid[None, a0:a1], _NEG_INF)
                    run_r.merge(slice(c0, c1), st, a0)
        res_q = _finish(run_q, q, r, k, tile_bytes, same)
        res_r = _finish(run_r, r, q, k, tile_bytes, False) if run_r is not None else None
    return res_q, res_r


def threshold_pairs(
    q: Prepared,
    r: Prepared,
    threshold: float | torch.Tensor,
    *,
    tile_bytes: int,
    row_pos: torch.Tensor | None = None,
    mode: str | None = None,
    exact_scores: bool = True,
    precision: str = "fp32",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every pair with float64 cos(q[i], r[j]) >= threshold: (i, j, score), unsorted.

    ``threshold`` is one number or one per row of ``q``.  ``mode`` "upper" keeps only
    j > row_pos[i] (each unordered pair of a self-join once), "exclude_self" drops
    j == row_pos[i]; ``row_pos`` (default: 0..n-1) gives each row of ``q`` its position
    among the rows of ``r``.  The pair set is always decided on float64 scores; with
    ``exact_scores`` False only the pairs within :func:`margin` of the threshold are
    re-scored and the others keep their float32 tile score (within the margin of the
    exact one, typically 1e-7), which saves a gather of two rows per pair.  ``precision``
    as for :func:`topk` (one threshold for all rows, no ``row_pos``).
    """
    if precision != "fp32" and q.unit.device.type == "cuda" and row_pos is None:
        from dask_cosim import search_twopass

        exact = precision == "exact"
        return search_twopass.threshold_prepared(
            q, r, float(threshold), mode=mode, exact_scores=exact_scores, exact=exact
        )
    device = q.unit.device
    nq, nr = len(q), len(r)
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    if nq == 0 or nr == 0:
        return empty, empty.clone(), torch.zeros(0, dtype=torch.float64, device=device)
    thr = torch.as_tensor(threshold, dtype=torch.float64, device=device).expand(nq)
    # Invalid query rows get an unreachable bar.
    low = torch.where(q.valid, thr - margin(q.dim), torch.full_like(thr, math.inf))
    low32 = low.to(torch.float32)
    identity = row_pos is None  # row i of q is row i of r (the self-join's diagonal pair)
    if mode is not None and row_pos is None:
        row_pos = torch.arange(nq, device=device)
    if device.type == "cpu":
        # The scan for hits reads each tile again: a tile that stays in the CPU's cache
        # makes that scan cheap (top-k's merges, by contrast, gain from large tiles).
        tile_bytes = min(tile_bytes, THRESHOLD_CPU_TILE_BYTES)
    tq, tr = _tiles(nq, nr, tile_bytes)
    tile = _Tile(tq, tr, device)
    mask_r = not bool(r.valid.all())
    out_i, out_j, out_s = [], [], []
    with torch.no_grad():
        for a0 in range(0, nq, tq):
            a1 = min(nq, a0 + tq)
            for c0 in range(0, nr, tr):
                c1 = min(nr, c0 + tr)
                if mode == "upper" and row_pos is not None and c1 <= int(row_pos[a0:a1].min()):
                    continue  # the tile lies wholly on or below the diagonal
                s = tile.product(q.unit[a0:a1], r.unit[c0:c1])
                hit = s >= low32[a0:a1, None]
                if mask_r:
                    hit &= r.valid[None, c0:c1]
                if mode is not None and identity:
                    # Row i of the tile is row a0 + i of r: the diagonal is at c = i + a0 - c0.
                    if mode == "upper":
                        hit.triu_(a0 - c0 + 1)
                    elif a0 < c1 and c0 < a1:
                        hit.diagonal(a0 - c0).fill_(False)
                # One flat nonzero, then arithmetic: few ops per tile, each output-sized.
                flat = hit.view(-1).nonzero().squeeze(1)
                if mode is not None and not identity:
                    assert row_pos is not None
                    ii = torch.div(flat, c1 - c0, rounding_mode="floor")
                    cols = flat - ii * (c1 - c0) + c0
                    pos = row_pos[ii + a0]
                    flat = flat[(cols > pos) if mode == "upper" else (cols != pos)]
                if not len(flat):
                    continue
                ii = torch.div(flat, c1 - c0, rounding_mode="floor")
                out_i.append(ii + a0)
                out_j.append(flat - ii * (c1 - c0) + c0)
                out_s.append(s.view(-1)[flat])
        if not out_i:
            return empty, empty.clone(), torch.zeros(0, dtype=torch.float64, device=device)
        i = torch.cat(out_i)
        j = torch.cat(out_j)
        bar = thr[i]
        if exact_scores:
            score = rescore(q, i, r, j)
            keep = score >= bar
        else:
            score = torch.cat(out_s).to(torch.float64)
            near = (score - bar).abs_() < margin(q.dim)
            if bool(near.any()):
                score[near] = rescore(q, i[near], r, j[near])
            keep = score >= bar
    return i[keep], j[keep], score[keep]
