"""Generated data for the demo, the benchmarks, the notebooks and the tests.

- Embedding pairs with known similarity spread (:func:`pair_arrays`): ``b = t*a +
  (1-|t|)*noise`` with ``t`` uniform in [-1, 1], so the cosines spread over [-1, 1].
- Embeddings with the structure of real ones (:func:`embedding_arrays`): rows around a few
  thousand directions, themselves grouped by topic, with uneven popularity and spread,
  plus planted near-duplicates at known cosines.  Plain Gaussian vectors have no such
  structure, so no clustered search could prune them; these can be pruned, and say
  which pairs must be found.

Every run with the same seed is identical (on one device).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import dask
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from dask_cosim.io.layouts import vectors_to_arrow

__all__ = [
    "Planted",
    "embedding_arrays",
    "make_embeddings",
    "make_pairs",
    "pair_arrays",
    "write_pairs",
    "write_pairs_folder",
]


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


@dataclass
class Planted:
    """The near-duplicates :func:`embedding_arrays` planted: row ``copy[i]`` was made from
    row ``source[i]`` (a row that is no copy) at cosine ``cosine[i]`` (float64, up to the
    float32 rounding of the rows, about 1e-7)."""

    copy: np.ndarray
    source: np.ndarray
    cosine: np.ndarray


def embedding_arrays(
    rows: int,
    dim: int,
    *,
    directions: int = 2000,
    spread: tuple[float, float] = (0.5, 1.2),
    duplicates: float = 0.05,
    cosines: tuple[float, float] = (0.85, 1.0),
    seed: int = 0,
    part: int = 0,
    device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, Planted]:
    """Unit float32 rows (rows, dim) with the structure of real embeddings.

    Parameters
    ----------
    rows, dim : int
        Shape of the result.
    directions : int, default 2000
        Directions the rows gather around; ``directions // 20`` topics group them, so
        neighbouring directions share a topic (cosine about 0.5 between their centres)
        and pairs straddle the boundaries between clusters.  Popularity is uneven
        (weight ``1 / (rank + 10)``), as topics in a corpus are.
    spread : (float, float), default (0.5, 1.2)
        Noise-to-signal ratio of each direction, drawn uniformly in this range: a row lies
        at cosine about ``1 / sqrt(1 + s**2)`` from its direction (0.89 to 0.64), two rows
        of one direction at about ``1 / (1 + s**2)``.
    duplicates : float, default 0.05
        Fraction of rows that are planted near-duplicates of another row.
    cosines : (float, float), default (0.85, 1.0)
        The planted cosines are drawn uniformly in this range (both ends included: a
        cosine of 1.0 makes an exact copy).
    seed : int, default 0
    part : int, default 0
        Which piece of a bigger set this is: the directions come from ``seed`` alone, the
        rows (and the planted duplicates, within the piece) from ``seed`` and ``part``,
        so pieces made one by one (one per partition) share one structure.
    device : str or torch.device, default "cpu"
        Where the rows are generated and returned (a GPU makes 50M x 768 in seconds).

    Returns
    -------
    (torch.Tensor, Planted)
        The rows, and which rows were planted as copies of which at what cosine.
    """
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device)

    def uniform(n: int, low: float, high: float) -> torch.Tensor:
        return low + (high - low) * torch.rand(n, generator=gen, device=device, dtype=torch.float64)

    topics = torch.nn.functional.normalize(normal(max(1, directions // 20), dim), dim=1)
    home = torch.randint(len(topics), (directions,), generator=gen, device=device)
    centres = torch.nn.functional.normalize(
        topics[home] + normal(directions, dim) / math.sqrt(dim), dim=1
    )
    sigma = uniform(directions, *spread).to(torch.float32)
    weight = 1.0 / (torch.arange(directions, device=device, dtype=torch.float64) + 10.0)
    if part:
        gen.manual_seed(seed + 1_000_003 * part)
    x = torch.empty((rows, dim), dtype=torch.float32, device=device)
    step = max(1, 2**24 // max(1, dim))  # rows per chunk: a 64 MiB noise block
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        which = torch.multinomial(weight, n, replacement=True, generator=gen)
        noise = normal(n, dim) * (sigma[which] / math.sqrt(dim))[:, None]
        x[r0 : r0 + n] = torch.nn.functional.normalize(centres[which] + noise, dim=1)
    n_dup = min(round(duplicates * rows), rows // 2)
    order = torch.randperm(rows, generator=gen, device=device)
    copy, source = order[:n_dup], order[n_dup : 2 * n_dup]
    cos = uniform(n_dup, *cosines)
    cos[: max(1, n_dup // 100) if n_dup else 0] = cosines[1]  # some exact ends of the range
    if n_dup:
        src = x[source].to(torch.float64)
        z = normal(n_dup, dim).to(torch.float64)
        z -= (z * src).sum(dim=1, keepdim=True) * src  # orthogonal to the source row
        z = torch.nn.functional.normalize(z, dim=1)
        sin = torch.sqrt(torch.clamp(1.0 - cos * cos, min=0.0))
        x[copy] = (cos[:, None] * src + sin[:, None] * z).to(torch.float32)
    planted = Planted(copy.cpu().numpy(), source.cpu().numpy(), cos.cpu().numpy())
    return x, planted


def make_embeddings(rows: int, dim: int, **kwargs: object) -> tuple[pd.DataFrame, Planted]:
    """:func:`embedding_arrays` (on the CPU) as a frame: "id" and "emb" (fixed_size_list)."""
    x, planted = embedding_arrays(rows, dim, **kwargs)  # type: ignore[arg-type]
    frame = pd.DataFrame({"id": np.arange(rows, dtype=np.int64), "emb": vectors_to_arrow(x)})
    return frame, planted
