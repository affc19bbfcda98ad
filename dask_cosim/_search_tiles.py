"""How an exact search walks its score matrix: tile shapes, the one tile buffer, and the
state a top-k search keeps per row between tiles.

Kernels only (tensors in, tensors out; used by :mod:`dask_cosim.search_kernels`).  Two
interchangeable states hold, per row, the float32 top-``kk`` candidates and the best
float32 score outside them: :class:`Running` (``torch.topk`` merges, any device) and
:class:`Heaps` (the numba kernels of :mod:`dask_cosim._search_numba`, CPUs).
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

__all__ = [
    "Heaps",
    "Running",
    "Tile",
    "cpu_bfloat16",
    "cpu_tile_bytes",
    "numba_kernels",
    "tiles",
]

_NEG_INF = float("-inf")

# The most query rows of one tile: beyond it the product gains nothing, and the rows of
# r read per tile would outgrow the caches.
_MAX_TILE_ROWS = 1024
_MiB = 2**20


@functools.cache
def _cache_per_core() -> int:
    """Bytes of last-level cache per CPU that shares it (Linux sysfs; 16 MiB, a 2-core
    share of 32 MiB, where unknown)."""
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for index in sorted(root.glob("index*")):
            if (index / "level").read_text().strip() == "3":
                size = (index / "size").read_text().strip().upper()
                scale = {"K": 2**10, "M": _MiB, "G": 2**30}.get(size[-1:], 1)
                nbytes = int(size.rstrip("KMG")) * scale
                shared = (index / "shared_cpu_list").read_text().strip()
                cpus = sum(
                    int(b) - int(a) + 1 if "-" in part else 1
                    for part in shared.split(",")
                    for a, _, b in [part.partition("-")]
                )
                return max(_MiB, nbytes // max(1, cpus))
    except (OSError, ValueError):
        pass
    return 16 * _MiB


def cpu_tile_bytes(op: str) -> int:
    """The most bytes of one tile of scores on a CPU for ``op``: a share of the
    last-level cache of each core, which multiplies and then scans its own tiles.

    "topk" (and the self-join's both-ways top-k): a quarter of the share, 1-8 MiB (its
    products gain from larger tiles); "threshold": an eighth, 0.5-4 MiB (its scan
    writes pairs, which compete for the cache).  On 2 cores sharing 32 MiB: 4 and 2 MiB,
    the best of 0.5-8 MiB measured there (benchmarks/NOTES.md, section 8).
    """
    share = _cache_per_core()
    if op == "threshold":
        return min(4 * _MiB, max(_MiB // 2, share // 8))
    return min(8 * _MiB, max(_MiB, share // 4))


@functools.cache
def cpu_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512_BF16 or AMX: Linux's CPU
    flags): there a bfloat16 matrix product runs at about twice the float32 rate
    (measured 2.15x on a Zen 4 core: benchmarks/NOTES.md, section 12); elsewhere it is slower."""
    if not torch.backends.mkldnn.is_available():  # oneDNN runs torch's bfloat16 products
        return False
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), [])  # fmt: skip
    return "avx512_bf16" in flags or "amx_bf16" in flags


@functools.cache
def numba_kernels(module: str = "_search_numba") -> ModuleType | None:
    """A module of this package's numba kernels (default: the search's), imported on first
    use, or None where numba does not import (torch does it all)."""
    try:
        return importlib.import_module(f"dask_cosim.{module}")
    except Exception:  # numba missing or broken: the torch path gives the same answer
        return None


def tiles(nq: int, nr: int, tile_bytes: int, align: int = 1) -> tuple[int, int]:
    """Tile rows and columns: the queries in equal blocks of at most 1024 rows, the
    columns to fill ``tile_bytes`` (a multiple of ``align`` where the budget allows)."""
    elems = max(1, tile_bytes // 4)
    blocks = -(-max(nq, 1) // _MAX_TILE_ROWS)
    tq = max(1, min(-(-max(nq, 1) // blocks), elems // max(1, min(nr, _MAX_TILE_ROWS))))
    # More than 4096 columns per tile stopped paying (a few query rows, measured).
    tr = max(1, min(nr, elems // tq, 4096))
    if tr > align:
        tr -= tr % align
    return tq, tr


class Tile:
    """One score buffer reused for every tile: a fresh 32 MiB block per tile would be
    mapped and page-faulted each time where malloc returns large blocks to the OS (dask
    workers set MALLOC_TRIM_THRESHOLD_).  With ``low``, the operands are bfloat16: the
    product lands in a bfloat16 buffer (torch's CPU product has no float32 output for
    them) and is widened, exactly, into the float32 one."""

    def __init__(self, tq: int, tr: int, device: torch.device, low: bool = False) -> None:
        self.flat = torch.empty(tq * tr, dtype=torch.float32, device=device)
        self.low = torch.empty(tq * tr, dtype=torch.bfloat16, device=device) if low else None

    def product(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """a @ b.T into the float32 buffer (a contiguous view)."""
        m, n = a.shape[0], b.shape[0]
        out = self.flat[: m * n].view(m, n)
        if self.low is None:
            return torch.mm(a, b.T, out=out)
        return out.copy_(torch.mm(a, b.T, out=self.low[: m * n].view(m, n)))


class Running:
    """The running float32 top-``kk`` of n rows by ``torch.topk`` merges (any device),
    and the best score dropped.  ``own`` and ``other`` are the validity of the rows
    reduced and of their candidates; with ``same`` a row is no candidate of itself."""

    def __init__(
        self, n: int, kk: int, own: torch.Tensor, other: torch.Tensor, same: bool = False
    ) -> None:
        device = own.device
        self.kk, self.same = kk, same
        self.own_invalid = None if bool(own.all()) else ~own
        self.other_invalid = None if bool(other.all()) else ~other
        self.score = torch.full((n, kk), _NEG_INF, dtype=torch.float32, device=device)
        self.index = torch.full((n, kk), -1, dtype=torch.int64, device=device)
        self.dropped = torch.full((n,), _NEG_INF, dtype=torch.float32, device=device)

    def rows(self, s: torch.Tensor, a0: int, c0: int) -> None:
        """Tile ``s``: rows a0.. are this state's rows, columns c0.. their candidates."""
        a1, c1 = a0 + s.shape[0], c0 + s.shape[1]
        if self.other_invalid is not None:
            s.masked_fill_(self.other_invalid[None, c0:c1], _NEG_INF)
        if self.same and a0 < c1 and c0 < a1:
            s.diagonal(a0 - c0).fill_(_NEG_INF)
        self._merge(slice(a0, a1), s, c0)

    def cols(self, s: torch.Tensor, a0: int, c0: int) -> None:
        """Tile ``s``: columns c0.. are this state's rows, rows a0.. their candidates."""
        st = s.T
        if self.other_invalid is not None:
            st = st.masked_fill(self.other_invalid[None, a0 : a0 + s.shape[0]], _NEG_INF)
        self._merge(slice(c0, c0 + s.shape[1]), st, a0)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(index (n, kk), -1 padded; dropped (n,) float32, -inf: none)."""
        return self.index, self.dropped

    def _merge(self, rows: slice, s: torch.Tensor, col0: int) -> None:
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


class Heaps:
    """The same state kept by the numba kernels (CPU): per row a min-heap of its
    kk + 1 best candidates, whose root is the row's bar
    (:mod:`dask_cosim._search_numba`)."""

    def __init__(
        self,
        fast: ModuleType,
        n: int,
        kk: int,
        own: torch.Tensor,
        other: torch.Tensor,
        same: bool = False,
    ) -> None:
        self.fast, self.kk, self.same = fast, kk, same
        self.own, self.other = own.numpy(), other.numpy()
        self.hs = np.full((n, kk + 1), -np.inf, dtype=np.float32)
        # int32 positions: a third less memory for the widest state (a self-join's).
        self.hi = np.full((n, kk + 1), -1, dtype=np.int32)
        self.bar = np.full(n, -np.inf, dtype=np.float32)

    def rows(self, s: torch.Tensor, a0: int, c0: int) -> None:
        self.fast.scan_rows(
            s.numpy(), a0, c0, self.hs, self.hi, self.bar, self.other, self.own, self.same
        )

    def direct(self, q: np.ndarray, r: np.ndarray, c0: int, c1: int) -> None:
        """Rows c0:c1 of r against every query (unit rows), dot by dot with no tile."""
        self.fast.scan_direct(
            q, r, c0, c1, self.hs, self.hi, self.bar, self.other, self.own, self.same
        )

    def cols(self, s: torch.Tensor, a0: int, c0: int) -> None:
        self.fast.scan_cols(s.numpy(), a0, c0, self.hs, self.hi, self.bar, self.own, self.other)

    def scores(self) -> torch.Tensor:
        """(n, kk) float32: the scores of :meth:`result`'s candidates, -inf: none."""
        return torch.from_numpy(self.hs[:, 1:])

    def merge(self, other: Heaps) -> None:
        """Take in ``other``: the same rows' candidates among other columns."""
        self.fast.merge(self.hs, self.hi, self.bar, other.hs, other.hi)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self.bar)
        index = np.empty((n, self.kk), dtype=np.int64)
        dropped = np.empty(n, dtype=np.float32)
        self.fast.candidates(self.hs, self.hi, index, dropped)
        return torch.from_numpy(index), torch.from_numpy(dropped)
