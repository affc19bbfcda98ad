"""The job of issue 23 end to end, as a new user runs it: a folder of Parquet files written
by plain pyarrow (an id, some text, a fixed-size embedding), searched from Python and from
the command line.  Results name their rows, the folders written read back whole in every
reader, and no message gives wrong advice."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from distributed import LocalCluster

import dask_cosim
from dask_cosim.cli import main
from dask_cosim.io import encode_vectors
from tests.helpers import READERS, assert_same, brute

FILES, ROWS, D, THR = 4, 120, 16, 0.9


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray]:
    """The folder, its vectors and ids: near-duplicates planted across files."""
    rng = np.random.default_rng(23)
    n = FILES * ROWS
    x = rng.standard_normal((n, D)).astype(np.float32)
    x[300:320] = x[:20] + 0.05 * rng.standard_normal((20, D)).astype(np.float32)
    x[200:205] = x[300:305] + 0.05 * rng.standard_normal((5, D)).astype(np.float32)
    ids = 10_000 + 7 * np.arange(n)
    folder = tmp_path_factory.mktemp("rows") / "src"
    folder.mkdir()
    for f in range(FILES):
        rows = slice(f * ROWS, (f + 1) * ROWS)
        table = pa.table(
            {
                "id": ids[rows],
                "text": [f"document {i}" for i in ids[rows]],
                "embedding": encode_vectors(x[rows]),
            }
        )
        pq.write_table(table, folder / f"part-{f}.parquet")  # no pandas metadata, no index
    return folder, x, ids


def pairs_by_id(s: np.ndarray, ids: np.ndarray) -> list[tuple[int, int]]:
    return sorted((ids[i], ids[j]) for i, j in zip(*np.nonzero(np.triu(s >= THR, 1))))


def dropped_by_id(s: np.ndarray, ids: np.ndarray) -> dict[int, int]:
    """Each dropped row's id -> the id of its earlier match of highest score."""
    out = {}
    for r in range(len(s)):
        hits = np.flatnonzero(s[r, :r] >= THR)
        if len(hits):
            out[ids[r]] = ids[hits[np.lexsort((hits, -s[r, hits]))[0]]]
    return out


def read_everywhere(
    folder: Path, want: pd.DataFrame, vectors: tuple[str, ...] = (), index: bool = True
) -> None:
    """Every reader gets ``want`` back; without ``index`` (search results written by the
    command line, whose index is not stored) the readers' own numbering is not compared:
    dask's starts each file at 0, the others number the rows across the folder."""
    for reader, read in READERS.items():
        got = read(folder)
        if not index:
            got, want = got.reset_index(drop=True), want.reset_index(drop=True)
        assert_same(got, want, reader, vectors)


def test_from_python(data: tuple[Path, np.ndarray, np.ndarray], tmp_path: Path) -> None:
    folder, x, ids = data
    s = brute(x, x)
    df = dask_cosim.read_parquet(folder)
    # Files without an index are numbered across the folder: labels are row positions.
    assert df.npartitions == FILES and df.divisions == (0, 120, 240, 360, 479)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about: labels are unique
        pairs = df.cosim.neighbors("embedding", threshold=THR, columns=["id"]).compute()
        kept, removed = df.cosim.dedup("embedding", THR, return_removed=True, columns=["id"])
    assert list(pairs.columns) == ["left", "right", "score", "left_id", "right_id"]
    assert sorted(zip(pairs["left_id"], pairs["right_id"])) == pairs_by_id(s, ids)
    assert (ids[pairs["left"]] == pairs["left_id"]).all()
    assert (ids[pairs["right"]] == pairs["right_id"]).all()
    removed = removed.compute()
    assert dict(zip(removed["right_id"], removed["left_id"])) == dropped_by_id(s, ids)
    kept = kept.compute()
    assert len(kept) + len(removed) == len(x)
    groups = df.cosim.groups("embedding", THR).compute()
    first = dict(zip(groups["id"], ids[groups["group"]]))  # each row's group, by first id
    assert all(first[a] == first[b] for a, b in zip(pairs["left_id"], pairs["right_id"]))

    # Written folders read back whole in every reader.
    dask_cosim.to_parquet(kept, tmp_path / "kept", layout="list")
    read_everywhere(tmp_path / "kept", kept, ("embedding",))
    dask_cosim.to_parquet(pairs, tmp_path / "pairs", layout="list")
    read_everywhere(tmp_path / "pairs", pairs)
    by_id = dask_cosim.read_parquet(folder, index="id")
    dask_cosim.to_parquet(by_id, tmp_path / "by_id", layout="list")
    read_everywhere(tmp_path / "by_id", by_id.compute(), ("embedding",))
    assert pd.read_parquet(tmp_path / "by_id").index.name == "id"

    # A text column is told it holds text, and how to embed it.
    with pytest.raises(TypeError) as raised:
        df.cosim.topk(x[:2], "text")
    assert "holds text" in str(raised.value) and "from_pandas" not in str(raised.value)


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    """One in-process cluster for every command (each command's own would take seconds)."""
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster:  # fmt: skip
        yield cluster.scheduler_address


def test_from_the_command_line(
    data: tuple[Path, np.ndarray, np.ndarray], tmp_path: Path, scheduler: str
) -> None:
    folder, x, ids = data
    s = brute(x, x)

    def run(*args: str, code: int = 0) -> str:
        result = CliRunner().invoke(main, [str(a) for a in args])
        assert result.exit_code == code, (result.output, result.exception)
        return result.output

    cluster = ["--scheduler", scheduler, "--quiet"]
    out = tmp_path / "pairs"
    run("neighbors", folder, "--on", "embedding", "--threshold", THR, "--columns", "id",
        "--layout", "list", "-o", out, *cluster)  # fmt: skip
    got = pd.read_parquet(out)
    assert list(got.columns) == ["left", "right", "score", "left_id", "right_id"]
    # Each pair once, no row with itself, named by id.
    assert sorted(zip(got["left_id"], got["right_id"])) == pairs_by_id(s, ids)
    read_everywhere(out, got, index=False)

    kept, removed = tmp_path / "kept", tmp_path / "removed"
    run("dedup", folder, "--on", "embedding", "--threshold", THR, "--removed", removed,
        "--columns", "id", "--layout", "list", "-o", kept, *cluster)  # fmt: skip
    gone = pd.read_parquet(removed)
    read_everywhere(removed, gone, index=False)
    assert dict(zip(gone["right_id"], gone["left_id"])) == dropped_by_id(s, ids)
    left = pd.read_parquet(kept)
    assert sorted(left["id"]) == sorted(set(ids) - set(gone["right_id"]))
    assert (ids[left.index] == left["id"]).all()  # the input's labels: row positions
    assert isinstance(left["embedding"].iloc[0], np.ndarray)  # list layout: real vectors
    read_everywhere(kept, left, ("embedding",))

    queries = tmp_path / "q.npy"
    np.save(queries, x[[5, 305]])
    out = tmp_path / "topk"
    run("topk", folder, "--on", "embedding", "--queries", queries, "-k", "2", "--keep", "id",
        "-o", out, *cluster)  # fmt: skip
    hits = dask_cosim.read_parquet(out).compute()
    assert hits["query"].tolist() == [0, 0, 1, 1] and hits["id"].iloc[0] == ids[5]

    out = tmp_path / "join"
    run("join", folder, folder, "--on", "embedding", "-k", "1", "--columns", "id", "-o", out,
        *cluster)  # fmt: skip
    assert (dask_cosim.read_parquet(out).compute()["left_id"].to_numpy() == ids).all()

    converted = tmp_path / "converted"
    assert "vectors: embedding 16 x float32" in run("convert", queries, "-o", converted)

    text = run("topk", folder, "--on", "text", "--queries", queries, "-o", tmp_path / "t",
               *cluster, code=2)  # fmt: skip
    assert "holds text" in text and "SentenceTransformer" in text
    assert "from_pandas" not in text
