"""dask-cosim topk / join / dedup: Parquet in, Parquet out (atomic), exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dask_cosim
from dask_cosim import io
from tests.helpers import brute


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dask_cosim", *args], capture_output=True, text=True, timeout=timeout
    )


def write_vectors(folder: Path, x: np.ndarray, files: int = 2) -> Path:
    folder.mkdir()
    for i, rows in enumerate(np.array_split(np.arange(len(x)), files)):
        table = pa.table(
            {"id": pa.array(rows), "emb": io.encode_vectors(x[rows]).cast(pa.list_(pa.float32()))}
        )
        pq.write_table(table, folder / f"part.{i}.parquet")
    return folder


@pytest.fixture
def data(tmp_path: Path) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 8)).astype(np.float32)
    x[150:160] = x[:10] + 0.01 * rng.standard_normal((10, 8)).astype(np.float32)
    return write_vectors(tmp_path / "rows", x), x


@pytest.mark.slow
def test_topk_join_dedup_commands(tmp_path: Path, data: tuple[Path, np.ndarray]) -> None:
    folder, x = data
    s = brute(x, x)
    common = ["--workers", "1", "--memory-limit", "1.5GiB", "--quiet"]

    out = tmp_path / "topk"
    queries = write_vectors(tmp_path / "queries", x[:4], files=1)
    proc = cli("topk", str(folder), "--on", "emb", "--queries", str(queries), "-k", "3",
               "--keep", "id", "-o", str(out), *common)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"wrote       {out} (12 rows" in proc.stdout
    got = dask_cosim.read_parquet(out).compute()
    assert list(got.columns) == ["query", "rank", "match", "score", "id"]
    want = np.argsort(-s[:4], axis=1, kind="stable")[:, :3]
    np.testing.assert_array_equal(got["id"].to_numpy().reshape(4, 3), want)

    out = tmp_path / "join"
    proc = cli(
        "join",
        str(folder),
        str(folder),
        "--on",
        "emb",
        "--threshold",
        "0.99",
        "-o",
        str(out),
        *common,
    )
    assert proc.returncode == 0, proc.stderr
    got = dask_cosim.read_parquet(out).compute()
    assert list(got.columns) == ["left", "right", "score"]
    # Files that store no index are numbered across the folder: labels are positions.
    want_pairs = sorted(zip(*np.nonzero(s >= 0.99)))
    assert sorted(zip(got["left"], got["right"])) == want_pairs

    out = tmp_path / "dedup"
    proc = cli("dedup", str(folder), "--on", "emb", "--threshold", "0.99", "-o", str(out), *common)
    assert proc.returncode == 0, proc.stderr
    got = dask_cosim.read_parquet(out).compute()
    keep = ~np.tril(s >= 0.99, -1).any(axis=1)
    np.testing.assert_array_equal(got["id"].to_numpy(), np.flatnonzero(keep))
    assert len(got) < 300

    again = cli("dedup", str(folder), "--on", "emb", "--threshold", "0.99", "-o", str(out))
    assert again.returncode == 2
    assert again.stderr.strip() == f"Error: '{out}' exists; pass --overwrite to replace it"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["dedup", "--on", "embs", "--threshold", "0.9"],
            "--on: column 'embs' not found; did you mean 'emb'? available: ['id', 'emb']",
        ),
        (
            ["dedup", "--on", "emb", "--threshold", "2"],
            "--threshold 2.0 must be a number in [-1, 1] (a cosine similarity), e.g. "
            "--threshold 0.9",
        ),
        (
            ["neighbors", "--on", "emb", "--threshold", "0.9", "--n-probe", "2"],
            "--n-probe is an option of --method clustered: add --method clustered or drop "
            "--n-probe",
        ),
        (["join", "--on", "emb"], "give k (the best matches of each row), threshold"),
        (["join", "--on", "emb", "-k", "0"], "Invalid value for '-k'"),
        (
            ["dedup", "--on", "id", "--threshold", "0.5"],
            "column 'id' has dtype int64, which is not a column of vectors",
        ),
    ],
)
def test_input_errors_exit_2_before_a_cluster_starts(
    tmp_path: Path, data: tuple[Path, np.ndarray], args: list[str], message: str
) -> None:
    folder, _ = data
    command, *rest = args
    inputs = [str(folder), str(folder)] if command == "join" else [str(folder)]
    proc = cli(command, *inputs, *rest, "-o", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "cluster     " not in proc.stderr  # the line describing a cluster started
    assert not (tmp_path / "out").exists()
    assert len(pd.read_parquet(folder)) == 300


@pytest.mark.parametrize(
    ("output", "removed", "message"),
    [
        ("same", "same/", "--removed '{removed}' is the --output folder '{output}'"),
        ("out", "out/removed", "--removed '{removed}' is inside --output '{output}'"),
        ("both/out", "both", "--output '{output}' is inside --removed '{removed}'"),
    ],
)
def test_dedup_removed_apart_from_output_before_a_cluster_starts(
    tmp_path: Path, data: tuple[Path, np.ndarray], output: str, removed: str, message: str
) -> None:
    # The two folders are committed one after the other: overlapping, the second found the
    # first there after the whole run, failed, and left it holding the removed rows.
    folder, _ = data
    output, removed = str(tmp_path / output), str(tmp_path / removed)
    proc = cli("dedup", str(folder), "--on", "emb", "--threshold", "0.95", "-o", output,
               "--removed", removed, "--overwrite")  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("Error: " + message.format(output=output, removed=removed))
    assert "give --removed a folder of its own" in proc.stderr
    assert "cluster" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows"]


@pytest.mark.slow
def test_clustered_errors_and_warnings_in_cli_spellings(
    tmp_path: Path, data: tuple[Path, np.ndarray]
) -> None:
    folder, _ = data
    base = ["neighbors", str(folder), "--on", "emb", "--method", "clustered", "--workers", "1"]
    proc = cli(*base, "-k", "3", "-o", str(tmp_path / "k"))
    assert proc.returncode == 2, proc.stderr
    assert "Error: -k 3 with --method clustered: " in proc.stderr
    assert proc.stderr.rstrip().endswith("for each row's k best use --method exact")
    assert "cluster     " not in proc.stderr  # refused before a cluster started
    # Few clusters ruled out at a low threshold: the plan warns, in one line (no file,
    # line and source line of the library's call).
    proc = cli(*base, "--threshold", "0.1", "--clusters", "30", "-o", str(tmp_path / "t"),
               "--quiet")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "skip rule" in line]
    assert len(warned) == 1, proc.stderr
    assert warned[0].startswith("Warning: --method clustered at --threshold 0.1: "), warned
    assert warned[0].endswith("--n-probe 2 bounds it (measure the recall with "
                              "dask_cosim.clustered_recall)")  # fmt: skip
    assert "UserWarning" not in proc.stderr and "warnings.warn(" not in proc.stderr
