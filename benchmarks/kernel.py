"""Kernel against the memory floor and F.cosine_similarity, in-process, one run.

    python -m benchmarks.kernel --rows 1000000 --dim 300

A first measurement only; the full runner (dask, Parquet, peers, JSON and charts) is
still to come.  Prints the median of --repeat runs after a warm-up.
"""

from __future__ import annotations

import click
import numpy as np
import torch

from benchmarks.harness import median_seconds
from dask_cosim import kernels


@click.command()
@click.option("--rows", default=1_000_000, show_default=True)
@click.option("--dim", default=300, show_default=True)
@click.option("--repeat", default=5, show_default=True)
def main(rows: int, dim: int, repeat: int) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((rows, dim), dtype=np.float32)
    b = rng.standard_normal((rows, dim), dtype=np.float32)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    nbytes = a.nbytes + b.nbytes
    cases = {
        "floor: numpy sum of a and b": lambda: (a.sum(), b.sum()),
        "ours: kernels.pairwise_cosine": lambda: kernels.pairwise_cosine(ta, tb),
        "peer: F.cosine_similarity": lambda: torch.nn.functional.cosine_similarity(ta, tb),
        "peer: numpy einsum / norms": lambda: (
            np.einsum("ij,ij->i", a, b) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        ),
    }
    seconds = {name: median_seconds(fn, repeat) for name, fn in cases.items()}
    floor = seconds["floor: numpy sum of a and b"]
    print(f"N={rows:,} D={dim} float32, torch threads={torch.get_num_threads()}")
    print(f"{'case':34} {'s':>7} {'GB/s':>6} {'x floor':>8}")
    for name, s in seconds.items():
        print(f"{name:34} {s:7.3f} {nbytes / s / 1e9:6.1f} {floor / s:8.2f}")


if __name__ == "__main__":
    main()
