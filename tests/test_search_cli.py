"""dask-cosim topk / join / dedup: Parquet in, Parquet out (atomic), exit codes."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dask.callbacks import Callback

import dask_cosim
from dask_cosim import io, runs
from tests.helpers import brute, cli_here


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
def test_topk_join_dedup_commands(
    tmp_path: Path, data: tuple[Path, np.ndarray], shared_cluster: str
) -> None:
    """Each command end to end, in this process, on a running cluster (--scheduler): a
    new interpreter and a local cluster of its own take seconds each (test_cli.py runs
    commands so)."""
    folder, x = data
    s = brute(x, x)
    running = ["--scheduler", shared_cluster, "--quiet"]

    out = tmp_path / "topk"
    queries = write_vectors(tmp_path / "queries", x[:4], files=1)
    proc = cli_here("topk", str(folder), "--on", "emb", "--queries", str(queries), "-k", "3",
                    "--keep", "id", "-o", str(out), *running)  # fmt: skip
    assert proc.returncode == 0, proc.stdout
    assert f"wrote       {out} (12 rows" in proc.stdout
    got = dask_cosim.read_parquet(out).compute()
    assert list(got.columns) == ["query", "rank", "match", "score", "id"]
    want = np.argsort(-s[:4], axis=1, kind="stable")[:, :3]
    np.testing.assert_array_equal(got["id"].to_numpy().reshape(4, 3), want)

    out = tmp_path / "join"
    proc = cli_here(
        "join",
        str(folder),
        str(folder),
        "--on",
        "emb",
        "--threshold",
        "0.99",
        "--right-columns",  # a column of the right side alone (the left carries none)
        "id",
        "-o",
        str(out),
        *running,
    )
    assert proc.returncode == 0, proc.stdout
    got = dask_cosim.read_parquet(out).compute()
    assert list(got.columns) == ["left", "right", "score", "right_id"]
    # Files that store no index are numbered across the folder: labels are positions.
    want_pairs = sorted(zip(*np.nonzero(s >= 0.99)))
    assert sorted(zip(got["left"], got["right"])) == want_pairs
    assert got["right_id"].tolist() == got["right"].tolist()

    out = tmp_path / "dedup"
    proc = cli_here("dedup", str(folder), "--on", "emb", "--threshold", "0.99", "-o", str(out),
                    *running)  # fmt: skip
    assert proc.returncode == 0, proc.stdout
    got = dask_cosim.read_parquet(out).compute()
    keep = ~np.tril(s >= 0.99, -1).any(axis=1)
    np.testing.assert_array_equal(got["id"].to_numpy(), np.flatnonzero(keep))
    assert len(got) < 300

    again = cli_here("dedup", str(folder), "--on", "emb", "--threshold", "0.99", "-o", str(out))
    assert again.returncode == 2
    assert again.stdout.strip() == f"Error: '{out}' exists; pass --overwrite to replace it"


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
        (["join", "--on", "emb"], "give -k (the best matches of each row), --threshold"),
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
    proc = cli_here(command, *inputs, *rest, "-o", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stdout  # 1 for an exception the command let through
    assert message in proc.stdout
    assert "cluster     " not in proc.stdout  # the line describing a cluster started
    assert not (tmp_path / "out").exists()
    assert len(pd.read_parquet(folder)) == 300


def test_topk_keep_named_like_a_result_column_exits_2_before_a_cluster_starts(
    tmp_path: Path,
) -> None:
    x = np.eye(4, dtype=np.float32)
    pq.write_table(
        pa.table({"score": [1, 2, 3, 4], "emb": io.encode_vectors(x)}), tmp_path / "in.parquet"
    )
    np.save(tmp_path / "q.npy", x[:1])
    for keep, message in (
        (["score"], "--keep score would overwrite the result columns ['score']"),
        # Found after the cluster started, in the library's spelling ("columns=[...]").
        (["emb", "emb"], "--keep emb emb names a column twice; name each once"),
    ):
        keeps = [a for c in keep for a in ("--keep", c)]
        proc = cli_here("topk", str(tmp_path / "in.parquet"), "--on", "emb", "--queries",
                        str(tmp_path / "q.npy"), *keeps, "-o", str(tmp_path / "out"))  # fmt: skip
        assert proc.returncode == 2, proc.stdout
        assert message in proc.stdout
        assert "cluster     " not in proc.stdout  # the line describing a cluster started
        assert not (tmp_path / "out").exists()


def test_topk_queries_of_another_length_exit_2_before_a_cluster_starts(
    tmp_path: Path, data: tuple[Path, np.ndarray]
) -> None:
    """A .npy's shape, or Parquet queries' metadata, tells the length of their vectors:
    queries of another D were found once a cluster had started (some 15 s later)."""
    x = data[1]  # vectors of 8 values
    fixed = tmp_path / "fixed.parquet"
    pq.write_table(pa.table({"emb": io.encode_vectors(x[:20])}), fixed)  # fixed_size_list
    np.save(tmp_path / "q.npy", np.ones((2, 5), dtype=np.float32))
    pq.write_table(pa.table({"emb": io.encode_vectors(np.ones((2, 5), np.float32))}),
                   tmp_path / "q.parquet")  # fmt: skip
    for queries in ("q.npy", "q.parquet"):
        proc = cli_here("topk", str(fixed), "--on", "emb", "--queries", str(tmp_path / queries),
                        "-o", str(tmp_path / "out"))  # fmt: skip
        assert proc.returncode == 2, proc.stdout
        assert "column 'emb' holds vectors of 8 values and the queries of 5" in proc.stdout
        assert "cluster     " not in proc.stdout  # the line describing a cluster started


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
    proc = cli_here("dedup", str(folder), "--on", "emb", "--threshold", "0.95", "-o", output,
                    "--removed", removed, "--overwrite")  # fmt: skip
    assert proc.returncode == 2, proc.stdout
    assert proc.stdout.startswith("Error: " + message.format(output=output, removed=removed))
    assert "give --removed a folder of its own" in proc.stdout
    assert "cluster" not in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows"]


@pytest.mark.parametrize(
    ("output", "removed", "message"),
    [
        ("same", "{url}/same", "--removed '{removed}' is the --output folder '{output}'"),
        ("out", "{url}/out/removed", "--removed '{removed}' is inside --output '{output}'"),
        ("{url}/both/out", "both", "--output '{output}' is inside --removed '{removed}'"),
    ],
)
def test_dedup_removed_apart_from_output_in_any_spelling(
    tmp_path: Path, data: tuple[Path, np.ndarray], output: str, removed: str, message: str
) -> None:
    """A file:// URL of the --output folder (or of a folder inside or holding it) is that
    folder: it was taken for another place, and dedup committed the removed rows over
    the kept ones and exited 0."""
    folder, _ = data
    output, removed = (
        p.format(url=tmp_path.as_uri()) if "{url}" in p else str(tmp_path / p)
        for p in (output, removed)
    )
    proc = cli_here("dedup", str(folder), "--on", "emb", "--threshold", "0.95", "-o", output,
                    "--removed", removed, "--overwrite")  # fmt: skip
    assert proc.returncode == 2, proc.stdout
    assert proc.stdout.startswith("Error: " + message.format(output=output, removed=removed))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows"]


def test_existing_output_as_a_url_is_refused_before_any_work(
    tmp_path: Path, data: tuple[Path, np.ndarray]
) -> None:
    """An existing --output (or --removed) given as a file:// URL is refused before a
    cluster starts, as its plain path is: it was taken for a new folder, a cluster was
    started, and only the write refused it."""
    folder, _ = data
    (tmp_path / "out").mkdir()
    for flag in ("-o", "--removed"):
        args = {"-o": str(tmp_path / "kept"), "--removed": str(tmp_path / "gone"), flag: ""}
        args[flag] = (tmp_path / "out").as_uri()
        proc = cli_here("dedup", str(folder), "--on", "emb", "--threshold", "0.95",
                        *(a for pair in args.items() for a in pair))  # fmt: skip
        assert proc.returncode == 2, proc.stdout
        assert proc.stdout.startswith(f"Error: {args[flag]!r} exists; pass --overwrite")
        assert "cluster     " not in proc.stdout  # refused before a cluster started


def test_object_store_outputs_are_compared_as_written() -> None:
    """Object-store URLs are compared as written, without making their filesystem (S3's
    would look up the bucket's region over the network)."""
    with pytest.raises(ValueError, match="is inside --output"):
        runs.check_removed("s3://bucket/out/removed/", "s3://bucket/out", overwrite=True)
    runs.check_removed("s3://bucket/out-removed", "s3://bucket/out", overwrite=True)


@pytest.mark.slow
def test_clustered_errors_and_warnings_in_cli_spellings(
    tmp_path: Path, data: tuple[Path, np.ndarray], shared_cluster: str
) -> None:
    folder, _ = data
    base = ["neighbors", str(folder), "--on", "emb", "--method", "clustered",
            "--scheduler", shared_cluster]  # fmt: skip
    proc = cli_here(*base, "-k", "3", "-o", str(tmp_path / "k"))
    assert proc.returncode == 2, proc.stdout
    assert "Error: -k 3 with --method clustered: " in proc.stdout
    assert proc.stdout.rstrip().endswith("for each row's k best use --method exact")
    assert "cluster     " not in proc.stdout  # refused before connecting to the cluster
    # Few clusters ruled out at a low threshold: the plan warns, in one line (no file,
    # line and source line of the library's call).
    proc = cli_here(*base, "--threshold", "0.1", "--clusters", "30", "-o", str(tmp_path / "t"),
                    "--quiet")  # fmt: skip
    assert proc.returncode == 0, proc.stdout
    warned = [line for line in proc.stdout.splitlines() if "skip rule" in line]
    assert len(warned) == 1, proc.stdout
    assert warned[0].startswith("Warning: --method clustered at --threshold 0.1: "), warned
    assert warned[0].endswith("--n-probe 2 bounds it (measure the recall with "
                              "dask_cosim.clustered_recall)")  # fmt: skip
    assert "UserWarning" not in proc.stdout and "warnings.warn(" not in proc.stdout


# --------------------------------------------------------------------------- dedup --removed


def dedup_outputs(folder: Path, calls: list[int] | None = None) -> tuple[Any, Any]:
    """dedup's kept and removed rows of ``folder``, lazily; each partition read is counted
    in ``calls``."""
    df = dask_cosim.read_parquet(folder)
    if calls is not None:
        df = df.map_partitions(lambda p: calls.append(len(p)) or p, meta=df._meta)
    return df.cosim.dedup("emb", 0.95, return_removed=True)


def write_pair(kept: Any, removed: Any, tmp_path: Path, overwrite: bool = False) -> None:
    jobs = [(kept, str(tmp_path / "kept"), True), (removed, str(tmp_path / "removed"), False)]
    runs.write_all(jobs, overwrite=overwrite, progress=False, layout="binary")


class AfterTheComputation(Callback):
    """Runs ``act`` once every task has run, before the computation returns: where a
    concurrent writer or cleaner of the output folders would strike between the
    computation and the renames."""

    def __init__(self, act: Callable[[], None]) -> None:
        super().__init__()
        self.act = act

    def _finish(self, dsk: Any, state: Any, errored: bool) -> None:
        if not errored:
            self.act()


def test_dedup_outputs_are_computed_once_and_committed(
    tmp_path: Path, data: tuple[Path, np.ndarray]
) -> None:
    calls: list[int] = []
    kept, removed = dedup_outputs(data[0], calls)
    with dask.config.set(scheduler="sync"):
        kept.compute()
        alone = sorted(calls)
        calls.clear()
        write_pair(kept, removed, tmp_path)
    # The removed rows cost no read (no computation) beyond the kept rows' own; the
    # counting step over the read runs once per partition, the search taking its vectors
    # from the rows it gives (search_graph.rereads_alike).
    assert sorted(calls) == alone and sum(alone) == 300
    kept, removed = pd.read_parquet(tmp_path / "kept"), pd.read_parquet(tmp_path / "removed")
    assert len(removed) >= 10 and len(kept) == 300 - len(removed)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "removed", "rows"]


def old_outputs(tmp_path: Path) -> None:
    for name in ("kept", "removed"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "marker").write_text(f"old {name}")


def assert_old_outputs(tmp_path: Path) -> None:
    for name in ("kept", "removed"):
        assert [p.name for p in (tmp_path / name).iterdir()] == ["marker"]
        assert (tmp_path / name / "marker").read_text() == f"old {name}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "removed", "rows"]


def test_a_failed_removed_computation_commits_neither_output(
    tmp_path: Path, data: tuple[Path, np.ndarray]
) -> None:
    """The removed rows fail last, once the rest has run (or a second has passed): an
    output committed by then would stay."""
    old_outputs(tmp_path)
    kept, removed = dedup_outputs(data[0])

    def broken(part: pd.DataFrame, partition_info: dict[str, Any]) -> pd.DataFrame:
        if partition_info["number"] < removed.npartitions - 1:
            return part
        deadline = time.monotonic() + 1
        while (tmp_path / "kept" / "marker").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        raise RuntimeError("disk full")

    removed = removed.map_partitions(broken, meta=removed._meta)
    with dask.config.set(scheduler="threads"), pytest.raises(RuntimeError, match="disk full"):
        write_pair(kept, removed, tmp_path, overwrite=True)
    assert_old_outputs(tmp_path)


def test_a_failed_removed_commit_puts_the_kept_output_back(
    tmp_path: Path, data: tuple[Path, np.ndarray]
) -> None:
    """The removed rows' staging folder is gone when its turn to be renamed comes (removed
    by another process): the kept rows, renamed already, are put back as they were."""
    old_outputs(tmp_path)

    def clean_up() -> None:
        for staging in tmp_path.glob(".removed.cosim-*"):
            shutil.rmtree(staging)

    with dask.config.set(scheduler="sync"), AfterTheComputation(clean_up):
        with pytest.raises(FileNotFoundError):
            write_pair(*dedup_outputs(data[0]), tmp_path, overwrite=True)
    assert_old_outputs(tmp_path)


def test_a_removed_folder_appearing_meanwhile_leaves_no_kept_output(
    tmp_path: Path, data: tuple[Path, np.ndarray]
) -> None:
    """Another writer creates the removed rows' folder while dedup computes (no
    overwrite): neither output is written, and the other writer's folder stays."""

    def concurrent_writer() -> None:
        if not (tmp_path / "removed").exists():
            (tmp_path / "removed").mkdir()
            (tmp_path / "removed" / "theirs").write_text("theirs")

    with dask.config.set(scheduler="sync"), AfterTheComputation(concurrent_writer):
        with pytest.raises(FileExistsError, match="appeared while writing"):
            write_pair(*dedup_outputs(data[0]), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["removed", "rows"]
    assert [p.name for p in (tmp_path / "removed").iterdir()] == ["theirs"]


def test_a_column_of_lists_of_any_length_is_carried_as_it_is(
    tmp_path: Path, shared_cluster: str
) -> None:
    """A column of tags or token ids (lists of any length, some empty) beside the
    embedding: the commands store only the embedding (and its carried copies) as
    vectors.  Every list column was taken for one, and the write failed after the search
    ("row 2 has 0 values but row 1 has 1 ... name the columns that do: vectors=[...]",
    which no option of the command line gives); dedup, which writes every column, could
    not run on such a table at all."""
    x = np.random.default_rng(0).standard_normal((60, 8)).astype(np.float32)
    x[30:33] = x[0]  # duplicates of row 0
    tags = [list(range(i % 3)) for i in range(60)]
    frame = pd.DataFrame({"emb": list(x), "tags": tags, "id": range(60)})
    frame.to_parquet(tmp_path / "docs.parquet")
    np.save(tmp_path / "q.npy", x[:2])
    running = ["--scheduler", shared_cluster, "--quiet"]
    docs = str(tmp_path / "docs.parquet")
    for command in (
        ["dedup", docs, "--on", "emb", "--threshold", "0.99", "--removed", "r", "--columns",
         "tags"],
        ["neighbors", docs, "--on", "emb", "--threshold", "0.99", "--columns", "tags",
         "--columns", "emb"],
        ["topk", docs, "--on", "emb", "--queries", str(tmp_path / "q.npy"), "--keep", "tags",
         "--keep", "emb"],
        ["pairwise", docs, "-a", "emb", "-b", "emb", "--keep", "tags"],
    ):  # fmt: skip
        out = tmp_path / command[0]
        command = [c if c != "r" else str(tmp_path / "r") for c in command]
        proc = cli_here(*command, "-o", str(out), *running)
        assert proc.returncode == 0, (command, proc.stdout)
    kept = dask_cosim.read_parquet(tmp_path / "dedup").compute()
    assert kept["id"].tolist() == [i for i in range(60) if i not in (30, 31, 32)]
    assert [list(t) for t in kept["tags"]] == [tags[i] for i in kept["id"]]
    assert isinstance(kept["emb"].dtype, pd.ArrowDtype)  # stored as vectors still
    removed = dask_cosim.read_parquet(tmp_path / "r").compute()
    assert [list(t) for t in removed["right_tags"]] == [tags[i] for i in (30, 31, 32)]
    pairs = dask_cosim.read_parquet(tmp_path / "neighbors").compute()
    assert [list(t) for t in pairs["left_tags"]] == [tags[i] for i in pairs["left"]]
    top = dask_cosim.read_parquet(tmp_path / "topk").compute()
    assert [list(t) for t in top["tags"]] == [tags[i] for i in top["match"]]
    assert len(dask_cosim.read_parquet(tmp_path / "pairwise").compute()) == 60
