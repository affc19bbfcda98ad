"""The rows the clustered tests search: ``adversarial`` rows around six centres (pairs
straddling the boundaries between clusters, exact and scaled duplicates, rows shorter
than eps, zero and NaN/inf rows), ``unit`` rows, ``frame``, rows as an embedding
column "emb" with an "id" column and a sorted, non-range index, and ``generated``,
embeddings as make_embeddings generates them, in a frame."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dask_cosim.datasets import make_embeddings
from tests.helpers import as_column


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def adversarial(n: int = 1200, d: int = 16, seed: int = 0, dtype: type = np.float32) -> np.ndarray:
    """Rows around six centres, with pairs straddling the boundaries between clusters,
    exact and scaled duplicates, rows shorter than eps, zero and NaN/inf rows."""
    rng = np.random.default_rng(seed)
    centres = unit(rng.standard_normal((6, d)))
    x = centres[rng.integers(0, 6, n)] + 0.5 * rng.standard_normal((n, d)) / math.sqrt(d)
    for k in range(60):  # two rows near the midpoint of two centres, one on each side
        a, b = rng.choice(6, 2, replace=False)
        mid = unit(centres[a] + centres[b])
        side = 0.06 * (centres[a] - centres[b])
        x[100 + 2 * k] = mid + side + 0.02 * rng.standard_normal(d)
        x[101 + 2 * k] = mid - side + 0.02 * rng.standard_normal(d)
    x[300:305] = x[7]  # exact duplicates: ties by frame order
    x[310] = 1e4 * x[8]  # a scaled duplicate: cosine 1
    x[320] = 1e-12 * x[9]  # shorter than eps: scores 1e-4 of its direction's
    x[321] = 3e-9 * x[9]  # shorter than eps by a factor 3: its scores are a third
    x[330] = 0.0
    x[340, 2] = np.nan
    x[341, 5] = np.inf
    return x.astype(dtype)


def frame(x: np.ndarray, null: np.ndarray | None = None) -> pd.DataFrame:
    n = len(x)
    return pd.DataFrame(
        {"emb": as_column(x, "fixed_size_list", null), "id": np.arange(n)},
        index=pd.Index(np.arange(n) * 10 + 3, name="key"),
    )


def generated() -> pd.DataFrame:
    """make_embeddings' frame ("id", "emb"): 1500 rows of 16 values around 30 directions,
    a tenth of them planted near-duplicates."""
    frame, _ = make_embeddings(1500, 16, directions=30, duplicates=0.1, seed=4)
    return frame
