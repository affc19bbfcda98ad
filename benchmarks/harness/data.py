"""The data the benchmark scripts run on: generated pairs and vectors, written as Parquet,
and their float64 cosines (``reference``), which every timed result is checked against."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

import dask_cosim
from dask_cosim import io
from dask_cosim.datasets import pair_arrays

A, B = "embeds_a", "embeds_b"  # the pairs' columns in every frame and file written here


def generate_pairs(
    rows: int, dim: int, dtype: str = "float32", seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The demo's pairs (``dask_cosim.datasets.pair_arrays``: cosines spread over [-1, 1])
    in ``dtype``."""
    a, b = pair_arrays(rows, dim, seed)
    return a.astype(dtype, copy=False), b.astype(dtype, copy=False)


def normal_pairs(rows: int, dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two independent float32 standard normal (rows, dim) arrays (cosines near 0)."""
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((rows, dim), dtype=np.float32),
        rng.standard_normal((rows, dim), dtype=np.float32),
    )


def write_list_layout(a: np.ndarray, b: np.ndarray, folder: Path, files: int) -> None:
    """Columns id, A, B as list<float>, snappy, ``files`` files in row order: what pandas,
    dask and Spark users hold."""
    folder.mkdir(parents=True)
    per_file = math.ceil(len(a) / files)
    for i, start in enumerate(range(0, len(a), per_file)):
        stop = min(len(a), start + per_file)
        columns = {"id": pa.array(np.arange(start, stop))}
        for name, x in ((A, a), (B, b)):
            fixed = io.encode_vectors(x[start:stop], layout="list")
            columns[name] = fixed.cast(pa.list_(fixed.type.value_type))
        pq.write_table(pa.table(columns), folder / f"part.{i:05d}.parquet")


def write_our_layout(a: np.ndarray, b: np.ndarray, folder: Path, files: int) -> None:
    """Columns id, A, B as ``dask_cosim.to_parquet`` writes them, in ``files`` partitions."""
    pdf = pd.DataFrame(
        {"id": np.arange(len(a)), A: io.vectors_to_arrow(a), B: io.vectors_to_arrow(b)}
    )
    with dask.config.set(scheduler="threads"):  # in-process: the data is already here
        dask_cosim.to_parquet(dd.from_pandas(pdf, npartitions=files), folder)


def embeddings(n: int, d: int, seed: int, clusters: int = 0, noise: float = 0.3) -> np.ndarray:
    """float32 rows around ``clusters`` centres (as real embeddings are), L2-normalised."""
    rng = np.random.default_rng(seed)
    if clusters:
        centres = rng.standard_normal((clusters, d)).astype(np.float32)
        x = centres[rng.integers(0, clusters, n)]
        x = x + noise * rng.standard_normal((n, d)).astype(np.float32)
    else:
        x = rng.standard_normal((n, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def vector_frame(x: np.ndarray, column: str = "emb") -> pd.DataFrame:
    """A pandas frame of one Arrow fixed_size_list column holding the rows of ``x``."""
    return pd.DataFrame({column: io.vectors_to_arrow(x)})


def reference(a: Any, b: Any, block: int = 1 << 16) -> np.ndarray:
    """float64 cos per row of numpy arrays or torch tensors (on their device), in blocks so
    the float64 copies stay small: (a / max(|a|, 1e-8)) . (b / max(|b|, 1e-8)), clamped.
    The check of finite data; the tests hold the reference for NaN, inf and nulls."""
    x, y = torch.as_tensor(a), torch.as_tensor(b)
    out = torch.empty(len(x), dtype=torch.float64, device=x.device)
    for s in range(0, len(x), block):
        xs, ys = x[s : s + block].double(), y[s : s + block].double()
        nx = torch.linalg.vector_norm(xs, dim=1).clamp_(min=1e-8)
        ny = torch.linalg.vector_norm(ys, dim=1).clamp_(min=1e-8)
        out[s : s + block] = torch.einsum("ij,ij->i", xs, ys) / (nx * ny)
    return out.clamp_(-1, 1).cpu().numpy()
