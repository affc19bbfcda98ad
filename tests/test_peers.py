"""benchmarks/peers.py at tiny size: every peer builds, runs and agrees with float64."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distributed import Client, LocalCluster

# The repository root is on sys.path (as for tests.helpers), and spawned workers and ranks
# copy it, so they import benchmarks.peers too.
from benchmarks.peers import Case, file_peers, in_memory_peers
from tests.helpers import random_pairs

N, D, SAMPLE = 500, 16, 100


def float64_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return (a64 * b64).sum(1) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1))


def write_list_parquet(a: np.ndarray, b: np.ndarray, path: Path, files: int) -> None:
    """part.0.parquet, part.1.parquet, ...: "id", and a, b as list<float> columns."""
    path.mkdir()
    bounds = np.linspace(0, len(a), files + 1).astype(int)
    value = pa.from_numpy_dtype(a.dtype)
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        table = pa.table(
            {
                "id": pa.array(np.arange(lo, hi, dtype=np.int64)),
                "embeds_a": pa.array(list(a[lo:hi]), type=pa.list_(value)),
                "embeds_b": pa.array(list(b[lo:hi]), type=pa.list_(value)),
            }
        )
        pq.write_table(table, path / f"part.{i}.parquet")


def check(case: Case, expected: np.ndarray) -> None:
    result = case.run()
    assert result.shape == (case.rows,), case.name
    np.testing.assert_allclose(result, expected[: case.rows], atol=1e-5, err_msg=case.name)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_in_memory_peers() -> None:
    a, b = random_pairs(N, D)
    a[3] = 0  # a zero vector: every recipe guards it (cos 0)
    expected = np.nan_to_num(float64_reference(a, b))
    cases = in_memory_peers(a, b, sample_rows=SAMPLE)
    assert [c.name for c in cases] == [
        "peer: F.cosine_similarity",
        "peer: numpy einsum",
        "peer: normalize then dot",
        "peer: object column + torch.stack",
        "peer: pandas row by row",
    ]
    assert [c.rows for c in cases] == [N, N, N, N, SAMPLE]
    for case in cases[:-1]:
        check(case, expected)
    # Row by row divides by the norms unguarded, as users write it: 0/0 is nan there.
    row_by_row = cases[-1].run()
    assert np.isnan(row_by_row[3])
    np.testing.assert_allclose(np.delete(row_by_row, 3), np.delete(expected[:SAMPLE], 3), atol=1e-5)


@pytest.fixture
def client() -> Iterator[Client]:
    """Worker processes, as the runner's LocalCluster has; the default client while open."""
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


def test_file_peers(client: Client, tmp_path: Path) -> None:
    a, b = random_pairs(N, D, seed=1)
    write_list_parquet(a, b, tmp_path / "pairs", files=3)
    workdir = tmp_path / "work"
    cases = file_peers(tmp_path / "pairs", a, b, workdir, processes=2)
    assert [c.name for c in cases] == [
        "peer: torch.multiprocessing spawn + gloo",
        "peer: dask read_parquet + F.cosine_similarity",
    ]
    expected = float64_reference(a, b)
    for case in cases:
        check(case, expected)
    check(cases[0], expected)  # a second run: a fresh port, no collision with the first
    for case in cases:
        if case.cleanup is not None:
            case.cleanup()
    assert list(workdir.iterdir()) == []
