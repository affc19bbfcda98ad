"""benchmarks/peers.py at tiny size: every peer builds, runs and agrees with float64."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from distributed import Client, LocalCluster

# The repository root is on sys.path (as for tests.helpers), and spawned workers and ranks
# copy it, so they import benchmarks.peers too.
from benchmarks.harness import Case, write_list_layout
from benchmarks.peers import file_peers, in_memory_peers
from tests.helpers import random_pairs, reference

N, D, SAMPLE = 500, 16, 100


def check(case: Case, expected: np.ndarray) -> None:
    result = case.run()
    assert result.shape == (case.rows,), case.name
    np.testing.assert_allclose(result, expected[: case.rows], atol=1e-5, err_msg=case.name)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_in_memory_peers() -> None:
    a, b = random_pairs(N, D)
    a[3] = 0  # a zero vector: every recipe guards it (cos 0)
    expected = reference(a, b)
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
    write_list_layout(a, b, tmp_path / "pairs", files=3)  # what the runner gives them
    workdir = tmp_path / "work"
    cases = file_peers(tmp_path / "pairs", a, b, workdir, processes=2)
    assert [c.name for c in cases] == [
        "peer: torch.multiprocessing spawn + gloo",
        "peer: dask read_parquet + F.cosine_similarity",
    ]
    expected = reference(a, b)
    for case in cases:
        check(case, expected)
    check(cases[0], expected)  # a second run: a fresh port, no collision with the first
    for case in cases:
        if case.cleanup is not None:
            case.cleanup()
    assert list(workdir.iterdir()) == []
