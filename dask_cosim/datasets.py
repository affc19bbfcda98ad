"""Generated embedding pairs with known similarity spread, for the demo, the benchmarks,
the notebooks and the tests.

The pairs are drawn as ``b = t*a + (1-|t|)*noise`` with ``t`` uniform in [-1, 1], so the
cosines spread over the whole of [-1, 1] and every run with the same seed is identical.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import dask
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dask_cosim.io.layouts import vectors_to_arrow

__all__ = ["make_pairs", "pair_arrays", "write_pairs", "write_pairs_folder"]


def pair_arrays(rows: int, dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(a, b), float32 (rows, dim), cosines spread over [-1, 1]: ``b = t*a + (1-|t|)*noise``."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((rows, dim), dtype=np.float32)
    t = rng.uniform(-1, 1, size=(rows, 1)).astype(np.float32)
    b = t * a + (1 - np.abs(t)) * rng.standard_normal((rows, dim), dtype=np.float32)
    return a, b


def make_pairs(rows: int, dim: int, seed: int, first_id: int = 0) -> pd.DataFrame:
    """:func:`pair_arrays` as a frame: "id", "embeds_a", "embeds_b" (fixed_size_list)."""
    a, b = pair_arrays(rows, dim, seed)
    ids = np.arange(first_id, first_id + rows, dtype=np.int64)
    return pd.DataFrame(
        {"id": ids, "embeds_a": vectors_to_arrow(a), "embeds_b": vectors_to_arrow(b)},
        index=pd.RangeIndex(first_id, first_id + rows),  # frames made in pieces stay unique
    )


def write_pairs(path: Path, rows: int, dim: int, first_id: int) -> None:
    """:func:`make_pairs` as one Parquet file, ids (and seed) starting at ``first_id``."""
    table = pa.Table.from_pandas(
        make_pairs(rows, dim, seed=first_id, first_id=first_id), preserve_index=False
    )
    pq.write_table(table.replace_schema_metadata(None), path)


def write_pairs_folder(folder: Path, rows: int, dim: int, files: int | None = None) -> int:
    """``rows`` pairs as :func:`write_pairs` files in ``folder`` (which must exist), about
    64 MiB each unless ``files`` says how many, written in parallel by the active dask
    scheduler (a ``distributed.Client`` if there is one).  Returns the number of files."""
    if files is None:
        files = max(1, min(rows, (rows * dim * 8) // (64 * 2**20)))
    bounds = np.linspace(0, rows, files + 1).astype(int)
    writes = [
        dask.delayed(write_pairs)(folder / f"part.{i:05d}.parquet", int(hi - lo), dim, int(lo))
        for i, (lo, hi) in enumerate(itertools.pairwise(bounds))
    ]
    dask.compute(*writes)
    return files
