"""The dask-cosim command line, end to end through subprocesses (as users run it)."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path

import click
import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

import dask_cosim
from dask_cosim import _cli, io
from dask_cosim._cli import InputError, cli_spelling, one_line_errors
from dask_cosim.cli import main
from tests.helpers import cli_here, pairs_frame, random_pairs, reference


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dask_cosim", *args], capture_output=True, text=True, timeout=timeout
    )


# --scheduler gives up after distributed.comm.timeouts.connect (30 s by default).
QUICK_CONNECT_CONFIG = {"distributed.comm.timeouts.connect": "2s"}


def write_pairs(folder: Path, a: np.ndarray, b: np.ndarray, files: int = 3) -> Path:
    """list<float> Parquet, as pandas/dask/Spark users hold it, with an id column."""
    folder.mkdir()
    for i, rows in enumerate(np.array_split(np.arange(len(a)), files)):
        table = pa.table(
            {
                "id": pa.array(rows),
                "embeds_a": io.encode_vectors(a[rows]).cast(pa.list_(pa.float32())),
                "embeds_b": io.encode_vectors(b[rows]).cast(pa.list_(pa.float32())),
            }
        )
        pq.write_table(table, folder / f"part.{i}.parquet")
    return folder


def test_pairwise_writes_result_and_summary(tmp_path: Path) -> None:
    a, b = random_pairs(600, 16)
    pairs = write_pairs(tmp_path / "pairs", a, b)
    out = tmp_path / "out"
    proc = cli("pairwise", str(pairs), "-a", "embeds_a", "-b", "embeds_b", "-o", str(out),
               "--keep", "id", "--workers", "2", "--memory-limit", "1.5GiB", "--quiet")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for line in ("rows        600", "nulls       0", "mean", "min / max", "pairs/s", "histogram"):
        assert line in proc.stdout
    assert "cluster     2 workers of 1.50 GiB, dashboard http://127.0.0.1:" in proc.stderr
    result = dask_cosim.read_parquet(out).compute()
    assert list(result.columns) == ["id", "cos"]
    np.testing.assert_array_equal(result["id"].to_numpy(), np.arange(600))
    np.testing.assert_allclose(result["cos"].to_numpy(), reference(a, b), atol=1e-6)

    again = cli("pairwise", str(pairs), "-a", "embeds_a", "-b", "embeds_b", "-o", str(out))
    assert again.returncode == 2
    assert again.stderr.strip() == f"Error: '{out}' exists; pass --overwrite to replace it"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-a", "embeds_a", "-b", "nope"], "column 'nope' not found; the vector columns are"),
        (["-a", "id", "-b", "embeds_b"], "column 'id' has dtype int64, which is not a column"),
        (["-a", "embeds_a", "-b", "embeds_b", "--keep", "x"], "--keep column 'x' not found; available:"),
        (["-a", "embeds_a", "-b", "embeds_b", "--scheduler", "tcp://127.0.0.1:1", "--workers",
          "2"], "give one or the other"),
        (["-a", "embeds_a", "-b", "embeds_b", "--dtype", "int8"], "Invalid value for '--dtype'"),
        (["-a", "embeds_a", "-b", "embeds_b", "--memory-limit", "lots"],
         "Invalid value for '--memory-limit': 'lots' is not a size; give e.g. 4GiB"),
        (["-a", "embeds_a"], "Missing option '-b'"),
        (["-a", "embeds_a", "-b", "embeds_b", "--device", "tpu"],
         "Error: --device tpu is not a device; use 'auto', 'cpu'"),
        (["-a", "embeds_a", "-b", "embeds_b", "--eps", "-1"],
         "Error: --eps -1.0 must be a finite number >= 0"),
        # The kept column was overwritten by the result, without a word.
        (["-a", "embeds_a", "-b", "embeds_b", "--keep", "id", "--name", "id"],
         "Error: --keep id would overwrite the result column 'id' (--name); keep others, "
         "or give the result another --name"),
    ],
)  # fmt: skip
def test_pairwise_usage_errors_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    a, b = random_pairs(20, 4)
    pairs = write_pairs(tmp_path / "pairs", a, b, files=1)
    proc = cli_here("pairwise", str(pairs), "-o", str(tmp_path / "out"), *args)
    assert proc.returncode == 2, proc.stdout  # 1 for an exception the command let through
    assert message in proc.stdout
    assert not (tmp_path / "out").exists()


def test_an_output_inside_an_input_folder_or_holding_the_working_directory_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OUTPUT inside a folder it reads was written (the next read of that folder took the
    output's files for rows with null vectors); OUTPUT holding the working directory
    was replaced with --overwrite, deleting the directory, and a relative path then
    failed ("No such file or directory", exit 2, after the replacement)."""
    pairs = write_pairs(tmp_path / "pairs", *random_pairs(20, 4), files=1)
    vectors = ["-a", "embeds_a", "-b", "embeds_b"]
    for command in (["pairwise", str(pairs), *vectors], ["dedup", str(pairs), "--on",
                    "embeds_a", "--threshold", "0.9"]):  # fmt: skip
        proc = cli_here(*command, "-o", str(pairs / "out"))
        assert proc.returncode == 2, proc.stdout
        assert f"Error: '{pairs / 'out'}' is inside the input folder '{pairs}': " in proc.stdout
        assert not (pairs / "out").exists()
    proc = cli_here("dedup", str(pairs), "--on", "embeds_a", "--threshold", "0.9", "-o",
                    str(tmp_path / "kept"), "--removed", str(pairs / "gone"))  # fmt: skip
    assert proc.returncode == 2 and "'" + str(pairs / "gone") + "' is inside" in proc.stdout
    (tmp_path / "old" / "c").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "old" / "c")
    proc = cli_here("pairwise", "../../pairs", *vectors, "-o", "..", "--overwrite")
    assert proc.returncode == 2, proc.stdout
    assert "Error: '..' holds the working directory " in proc.stdout
    assert (tmp_path / "old" / "c").is_dir()


def test_an_output_that_is_an_input_or_holds_one_exits_2_even_with_overwrite(
    tmp_path: Path,
) -> None:
    """With --overwrite, OUTPUT equal to an input (in any spelling) or holding one
    replaced the rows read, lost (a typo away): the input of convert, pairwise, a
    search, topk's --queries, and a folder holding the input."""
    (tmp_path / "in").mkdir()
    pairs = write_pairs(tmp_path / "in" / "pairs", *random_pairs(20, 4), files=1)
    np.save(tmp_path / "q.npy", np.eye(4, dtype=np.float32))
    before = sorted(p.name for p in pairs.iterdir())
    cases = [
        (["convert", str(pairs)], str(pairs), "is the input"),
        (["pairwise", str(pairs), "-a", "embeds_a", "-b", "embeds_b"], f"{pairs}/", "is the input"),
        (["dedup", str(pairs), "--on", "embeds_a", "--threshold", "0.9"], str(tmp_path / "in"),
         "holds the input"),
        (["topk", str(pairs), "--on", "embeds_a", "--queries", str(tmp_path / "q.npy")],
         str(tmp_path / "q.npy"), "is the input"),
    ]  # fmt: skip
    for command, output, what in cases:
        proc = cli_here(*command, "-o", output, "--overwrite")
        assert proc.returncode == 2, proc.stdout
        assert f"{what} " in proc.stdout and "would be lost" in proc.stdout, proc.stdout
    assert sorted(p.name for p in pairs.iterdir()) == before
    assert (tmp_path / "q.npy").is_file()


def test_the_runs_take_one_path_as_they_take_a_list(tmp_path: Path) -> None:
    """dask_cosim.runs (public) given one path as a string iterated its letters: "/" among
    them, a listing of the whole filesystem."""
    from dask_cosim import runs

    a, b = random_pairs(20, 4)
    pairs = write_pairs(tmp_path / "pairs", a, b, files=2)
    for one in (str(pairs), pairs):
        assert len(runs.read_inputs(one, "reads").compute()) == 20
    with dask.config.set(scheduler="sync"):
        written = runs.pairwise(str(pairs), "embeds_a", "embeds_b", str(tmp_path / "out"))()
    assert written.rows == 20
    got = dask_cosim.read_parquet(tmp_path / "out").compute()["cos"].to_numpy()
    np.testing.assert_allclose(got, reference(a, b), atol=1e-6)


def test_ragged_rows_exit_2(tmp_path: Path) -> None:
    """Found on a worker, said in one line (a missing input: the test below)."""
    a, b = random_pairs(30, 4)
    rows_b = [list(r) for r in b]
    rows_b[17] = rows_b[17][:3]
    table = pa.table({"embeds_a": pa.array([list(r) for r in a]), "embeds_b": pa.array(rows_b)})
    pq.write_table(table, tmp_path / "ragged.parquet")
    proc = cli("pairwise", str(tmp_path / "ragged.parquet"), "-a", "embeds_a", "-b",
               "embeds_b", "-o", str(tmp_path / "out"), "--workers", "1")  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "column 'embeds_b': row 17 has 3 values but row 0 has 4" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


def test_a_missing_input_is_answered_before_the_library_is_imported(tmp_path: Path) -> None:
    """Every command that reads says a mistyped local path is not found, in the reader's
    words, before it imports torch, pandas, pyarrow or dask's dataframe and distributed
    (seconds; dask's config comes with dask_cosim): one process runs them all."""
    gone = str(tmp_path / "nowhere")
    pairs = write_pairs(tmp_path / "pairs", *random_pairs(4, 2), files=1)
    out = str(tmp_path / "out")
    commands = [
        ["pairwise", gone, "-a", "x", "-b", "y", "-o", out],
        ["convert", gone + ".npy", "-o", out],
        ["info", str(pairs), gone],
        ["topk", str(pairs), "--on", "x", "--queries", gone + ".npy", "-o", out],
        ["join", str(pairs), gone, "--on", "x", "-k", "1", "-o", out],
        ["neighbors", gone, "--on", "x", "-k", "1", "-o", out],
        ["dedup", gone, "--on", "x", "--threshold", "0.9", "-o", out],
    ]
    script = (
        "import json, sys\n"
        "from dask_cosim.cli import main\n"
        "codes = []\n"
        "for args in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        main(args, prog_name='dask-cosim')\n"
        "    except SystemExit as stop:\n"
        "        codes.append(stop.code)\n"
        "heavy = ('torch', 'pandas', 'pyarrow', 'dask.dataframe', 'distributed')\n"
        "print(json.dumps([codes, [m for m in heavy if m in sys.modules]]))\n"
    )
    import json

    proc = subprocess.run([sys.executable, "-c", script, json.dumps(commands)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    codes, heavy = json.loads(proc.stdout)
    assert codes == [2] * len(commands) and heavy == [], (codes, heavy, proc.stderr)
    lines = proc.stderr.splitlines()
    assert lines == [
        f"Error: {gone!r} not found",
        f"Error: {gone + '.npy'!r} not found",
        f"Error: {gone!r} not found",
        f"Error: {gone + '.npy'!r} not found",
        *[f"Error: {gone!r} not found"] * 3,
    ], proc.stderr
    assert not Path(out).exists()


def test_killed_run_leaves_no_output_and_old_output_untouched(tmp_path: Path) -> None:
    """A run killed (SIGKILL), then one interrupted (Ctrl-C: SIGINT to the process group,
    the workers included, as a terminal sends it) while writing."""
    a, b = random_pairs(400_000, 64)
    pairs = write_pairs(tmp_path / "pairs", a, b, files=40)
    out = tmp_path / "out"
    for old, sent in ((None, signal.SIGKILL), ("old output", signal.SIGINT)):
        if old is not None:
            out.mkdir()
            (out / "marker").write_text(old)
        before = set(tmp_path.glob(".out.cosim-*"))
        proc = subprocess.Popen(
            [sys.executable, "-m", "dask_cosim", "pairwise", str(pairs), "-a", "embeds_a",
             "-b", "embeds_b", "-o", str(out), "--workers", "1", "--overwrite", "--quiet"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a process group of its own, the workers in it
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while set(tmp_path.glob(".out.cosim-*")) <= before and time.monotonic() < deadline:
            time.sleep(0.05)  # until it has started writing (a staging folder of its own)
        os.killpg(proc.pid, sent)
        _, stderr = proc.communicate(timeout=60)
        if old is None:
            assert not out.exists()
        else:
            assert [p.name for p in out.iterdir()] == ["marker"]
            assert (out / "marker").read_text() == old
            # 128 + SIGINT, as the shell says of a process it ends; one word, no worker's
            # KeyboardInterrupt traceback.
            assert proc.returncode == 130, stderr
            assert stderr.splitlines()[-1:] == ["Aborted!"] and "Traceback" not in stderr, stderr
    # The interrupted run removed the killed one's staging folder, and its own.
    assert list(tmp_path.glob(".out.cosim-*")) == []
    # A live writer's staging folder (this process's) must survive the next run.
    live = tmp_path / f".out.cosim-{socket.gethostname()}-{os.getpid()}-0123456789ab"
    live.mkdir()
    # Re-running works, and removes the folders of the writers that died.
    rerun = cli("pairwise", str(pairs), "-a", "embeds_a", "-b", "embeds_b", "-o", str(out),
                "--workers", "1", "--overwrite", "--quiet")  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr
    assert len(dask_cosim.read_parquet(out).compute()) == 400_000
    assert list(tmp_path.glob(".out.cosim-*")) == [live]


def test_pairwise_on_a_running_cluster(tmp_path: Path) -> None:
    """dask scheduler + two dask worker processes, as on other machines; --scheduler."""
    a, b = random_pairs(900, 8)
    pairs = write_pairs(tmp_path / "pairs", a, b)
    bin_dir = Path(sys.executable).parent
    scheduler_file = tmp_path / "scheduler.json"
    procs = [
        subprocess.Popen(
            [str(bin_dir / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
             "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(scheduler_file)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        import json

        address = json.loads(scheduler_file.read_text())["address"]
        for _ in range(2):
            procs.append(
                subprocess.Popen(
                    [str(bin_dir / "dask"), "worker", address, "--nthreads", "1",
                     "--host", "127.0.0.1", "--no-dashboard"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
            )  # fmt: skip
        from distributed import Client

        with Client(address, timeout="30s") as client:
            client.wait_for_workers(2, timeout=60)
        out = tmp_path / "out"
        # In this process: the cluster, not the interpreter, is what this test is about.
        proc = cli_here("pairwise", str(pairs), "-a", "embeds_a", "-b", "embeds_b", "-o",
                        str(out), "--scheduler", address, "--keep", "id", "--quiet")  # fmt: skip
        assert proc.returncode == 0, proc.stdout
        assert "cluster     2 workers" in proc.stdout
        result = dask_cosim.read_parquet(out).compute().sort_values("id")
        np.testing.assert_allclose(result["cos"].to_numpy(), reference(a, b), atol=1e-6)
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    with dask.config.set(QUICK_CONNECT_CONFIG):  # in this process: a new one takes seconds
        bad = cli_here("pairwise", str(pairs), "-a", "embeds_a", "-b", "embeds_b", "-o",
                       str(tmp_path / "o2"), "--scheduler", "tcp://127.0.0.1:9")  # fmt: skip
    assert bad.returncode == 2 and "cannot connect to scheduler" in bad.stdout


class _Garbage(socketserver.BaseRequestHandler):
    """Answers anything with an HTTP error, which dask would decode as frames."""

    def handle(self) -> None:
        self.request.recv(65536)
        self.request.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


class _QuietHTTP(http.server.SimpleHTTPRequestHandler):
    """An HTTP server's handler that logs nothing (it logs to stderr, which the command
    run in this process shares)."""

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("server", ["http", "garbage"])
def test_scheduler_address_that_is_not_a_scheduler(tmp_path: Path, server: str) -> None:
    # A dashboard's port (an HTTP server) kept the CLI waiting for ever: distributed
    # bounds reaching the address, not the handshake after it.  Another server's reply
    # was decoded as frames (a MemoryError).
    a, b = random_pairs(10, 4)
    pairs = write_pairs(tmp_path / "pairs", a, b, files=1)
    handler = _QuietHTTP if server == "http" else _Garbage
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        port = httpd.server_address[1]
        start = time.monotonic()
        with dask.config.set(QUICK_CONNECT_CONFIG):  # in this process: a new one takes seconds
            proc = cli_here("pairwise", str(pairs), "-a", "embeds_a", "-b", "embeds_b", "-o",
                            str(tmp_path / "out"), "--scheduler", f"tcp://127.0.0.1:{port}")  # fmt: skip
        httpd.shutdown()
    assert proc.returncode == 2, proc.stdout
    assert time.monotonic() - start < 30
    assert proc.stdout.startswith(
        f"Error: --scheduler 'tcp://127.0.0.1:{port}': something answered there, but not a "
        "dask scheduler: "
    ), proc.stdout
    assert proc.stdout.rstrip().endswith(
        "the dashboard is usually port 8787, the scheduler port 8786: e.g. --scheduler "
        "tcp://127.0.0.1:8786"
    )
    assert len(proc.stdout.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_scheduler_given_the_dashboard_url(tmp_path: Path) -> None:
    proc = cli_here("pairwise", str(tmp_path), "-a", "a", "-b", "b", "-o",
                    str(tmp_path / "out"), "--scheduler", "http://10.0.0.5:8787/status")  # fmt: skip
    assert proc.returncode == 2
    assert proc.stdout.strip() == (
        "Error: --scheduler 'http://10.0.0.5:8787/status' is a web address (the dashboard's, "
        "perhaps), not a scheduler's; the dashboard is usually port 8787, the scheduler port "
        "8786: e.g. --scheduler tcp://10.0.0.5:8786"
    )


def test_scheduler_hint_at_the_default_port() -> None:
    """Something that is not dask answering on port 8786 already: the hint does not offer
    the address the user gave (it did), it says what to look for instead."""
    for address in ("tcp://10.0.0.5:8786", "10.0.0.5:8786"):
        hint = _cli._scheduler_hint(address)
        assert "10.0.0.5:8786" not in hint
        assert hint.endswith("give the address the scheduler printed when it started "
                             "('Scheduler at: tcp://...')")  # fmt: skip
    assert _cli._scheduler_hint("tcp://10.0.0.5:8787").endswith("--scheduler tcp://10.0.0.5:8786")


def test_convert_info_and_pickle_refusal(tmp_path: Path) -> None:
    """In this process (click's runner): convert and info start no cluster, and a new
    interpreter would spend 4-5 s a command importing torch (the commands run as a
    subprocess in the other tests here)."""
    a, b = random_pairs(50, 6)
    frame = pd.DataFrame(
        {
            "embeds_a": [torch.from_numpy(r.copy()).reshape(6, 1) for r in a],
            "embeds_b": [torch.from_numpy(r.copy()).reshape(6, 1) for r in b],
            "label": ["x"] * 50,
        }
    )
    frame.to_pickle(tmp_path / "frame.pkl")
    # A folder by its file:// URL, as read_parquet and info take it.
    dask_cosim.to_parquet(pairs_frame(a, b, "fixed_size_list"), tmp_path / "pq")
    by_url = cli_here("convert", (tmp_path / "pq").as_uri(), "-o", str(tmp_path / "c0"))
    assert by_url.returncode == 0, by_url.stdout
    assert len(dask_cosim.read_parquet(tmp_path / "c0").compute()) == 50
    refused = cli_here("convert", str(tmp_path / "frame.pkl"), "-o", str(tmp_path / "c1"))
    assert refused.returncode == 2 and "--allow-pickle" in refused.stdout
    assert "runs code" in refused.stdout and not (tmp_path / "c1").exists()
    with pytest.raises(PermissionError, match=r"runs code .*; pass allow_pickle=True if you"):
        dask_cosim.io.read_pickle(tmp_path / "frame.pkl")  # as Python spells it
    ok = cli_here("convert", str(tmp_path / "frame.pkl"), "-o", str(tmp_path / "c1"),
                  "--allow-pickle")  # fmt: skip
    assert ok.returncode == 0, ok.stdout
    assert "50 rows" in ok.stdout and "embeds_a 6 x float32" in ok.stdout

    np.save(tmp_path / "pairs.npy", np.stack([a, b], axis=1))
    assert (
        cli_here("convert", str(tmp_path / "pairs.npy"), "-o", str(tmp_path / "c2")).returncode == 0
    )
    np.savez(tmp_path / "pairs.npz", left=a, right=b)
    npz = cli_here("convert", str(tmp_path / "pairs.npz"), "-o", str(tmp_path / "c3"),
                   "--a", "left", "--b", "right", "--layout", "list")  # fmt: skip
    assert npz.returncode == 0, npz.stdout
    bad_npz = cli_here("convert", str(tmp_path / "pairs.npz"), "-o", str(tmp_path / "c4"))
    assert bad_npz.returncode == 2 and "has no arrays ['embeds_a', 'embeds_b']" in bad_npz.stdout
    np.save(tmp_path / "flat.npy", a)  # (N, D): one vector column
    flat = cli_here("convert", str(tmp_path / "flat.npy"), "-o", str(tmp_path / "c5"),
                    "--column", "emb")  # fmt: skip
    assert flat.returncode == 0 and "vectors: emb 6 x float32" in flat.stdout
    got = np.stack(dask_cosim.read_parquet(tmp_path / "c5").compute()["emb"].to_numpy())
    np.testing.assert_array_equal(got, a)
    np.save(tmp_path / "cube.npy", np.zeros((2, 3, 4)))
    cube = cli_here("convert", str(tmp_path / "cube.npy"), "-o", str(tmp_path / "c6"))
    assert (
        cube.returncode == 2 and "expected (N, D) (one vector per row) or (N, 2, D)" in cube.stdout
    )
    # numpy's refusals named no file ("Object arrays cannot be loaded when
    # allow_pickle=False").
    ragged = np.empty(2, dtype=object)
    ragged[:] = [np.zeros(2), np.zeros(3)]
    np.save(tmp_path / "objects.npy", ragged, allow_pickle=True)
    np.savez(tmp_path / "objects.npz", embeds_a=ragged, embeds_b=ragged)
    (tmp_path / "noise.npy").write_bytes(b"not an array")
    for name, why in (("objects.npy", "holds an array of Python objects"),
                      ("objects.npz", "holds an array of Python objects"),
                      ("noise.npy", "is not an array numpy reads: ")):  # fmt: skip
        done = cli_here("convert", str(tmp_path / name), "-o", str(tmp_path / "c7"))
        assert done.returncode == 2, done.stdout
        assert f"Error: {str(tmp_path / name)!r} {why}" in done.stdout, done.stdout

    for folder, left, right in (("c1", "embeds_a", "embeds_b"), ("c2", "embeds_a", "embeds_b"),
                                ("c3", "left", "right")):  # fmt: skip
        df = dask_cosim.read_parquet(tmp_path / folder)
        cos = df.cosim.pairwise(left, right).compute().to_numpy()
        np.testing.assert_allclose(cos, reference(a, b), atol=1e-6)

    described = cli_here("info", str(tmp_path / "c1"))
    assert described.returncode == 0, described.stdout
    assert "rows        50" in described.stdout and "layout      binary" in described.stdout
    assert "vectors of 6 x float32" in described.stdout and "label" in described.stdout
    assert cli_here("info", str(tmp_path / "nowhere")).returncode == 2


@pytest.mark.parametrize("writer", ["dask_cosim", "pandas", "dask"])
def test_info_shows_the_index_as_the_read_names_it(tmp_path: Path, writer: str) -> None:
    """An unnamed index is stored as "__index_level_0__" (pyarrow) or
    "__null_dask_index__" (dask) and read back unnamed: info showed the stored name."""
    pdf = pd.DataFrame({"x": np.arange(6.0)}, index=np.arange(6) * 3)
    folder = tmp_path / "out"
    if writer == "dask_cosim":
        dask_cosim.to_parquet(dd.from_pandas(pdf, npartitions=2), folder)
    elif writer == "dask":
        dd.from_pandas(pdf, npartitions=2).to_parquet(folder)
    else:
        folder.mkdir()
        pdf.to_parquet(folder / "part.0.parquet")
    assert dask_cosim.read_parquet(folder).index.name is None
    shown = CliRunner().invoke(main, ["info", str(folder)])
    assert shown.exit_code == 0, shown.output
    assert "index       (unnamed) int64\n" in shown.output and "__" not in shown.output
    assert io.describe_parquet(folder)["index"] == [{"name": None, "dtype": "int64"}]
    pdf.rename_axis("row").to_parquet(tmp_path / "named.parquet")  # a named one: its name
    named = CliRunner().invoke(main, ["info", str(tmp_path / "named.parquet")])
    assert "index       row int64\n" in named.output
    # A file given twice is read twice: info counted its rows once, its files twice.
    twice = [str(tmp_path / "named.parquet")] * 2
    assert io.describe_parquet(twice)["rows"] == len(dask_cosim.read_parquet(twice)) == 12


def test_dask_cli_entry_point() -> None:
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "dask"), "cosim", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    for command in ("pairwise", "convert", "info", "demo"):
        assert command in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_failed_computation_exits_1_without_output(tmp_path: Path) -> None:
    a, b = random_pairs(40, 4)
    pairs = write_pairs(tmp_path / "pairs", a, b, files=2)
    proc = cli("pairwise", str(pairs), "-a", "embeds_a", "-b", "embeds_b", "-o",
               str(tmp_path / "out"), "--workers", "1", "--device", "cuda")  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "Error: the computation failed: RuntimeError: --device cuda but " in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs"]  # no output, no staging


def test_a_failure_with_no_message_says_where_it_was_raised() -> None:
    # A bare `assert` in a library gave "the computation failed: AssertionError:", which
    # says nothing to look up.  Frames of installed packages are named from the package.
    library = compile("def check(x):\n    assert x\n", "/env/lib/site-packages/lib/mod.py", "exec")
    scope: dict[str, object] = {}
    exec(library, scope)
    with pytest.raises(AssertionError) as info:
        scope["check"](False)  # type: ignore[operator]
    assert _cli.failure_message(info.value) == (
        "the computation failed: AssertionError, with no message, raised at lib/mod.py:2 in check"
    )
    assert _cli.failure_message(AssertionError()).endswith(", raised at an unknown place")
    assert _cli.failure_message(ValueError("bad")) == "the computation failed: ValueError: bad"


def test_every_command_that_writes_vectors_takes_the_library_layouts() -> None:
    import inspect

    from dask_cosim import _cli, io
    from dask_cosim.cli import main

    assert _cli.LAYOUTS == io.LAYOUTS
    default = inspect.signature(io.to_parquet).parameters["layout"].default
    for command in ("pairwise", "convert", "topk", "join", "neighbors", "dedup"):
        option = next(p for p in main.commands[command].params if p.name == "layout")
        assert option.default == default, command


def test_convert_takes_the_library_vector_dtypes() -> None:
    from dask_cosim import _cli
    from dask_cosim.cli import main
    from dask_cosim.io import convert

    assert _cli.VECTOR_DTYPES == convert.VECTOR_DTYPES
    option = next(p for p in main.commands["convert"].params if p.name == "dtype")
    assert tuple(option.type.choices) == convert.VECTOR_DTYPES


def test_library_errors_in_cli_spellings() -> None:
    # A race (another process writes OUTPUT while the run computes) reaches the library's
    # own check, which names its argument, not the option.
    @one_line_errors
    def command() -> None:
        raise FileExistsError("'out' appeared while writing; pass overwrite=True")

    with pytest.raises(InputError) as raised:
        command()
    assert raised.value.message == "'out' appeared while writing; pass --overwrite"
    text = "write it with to_parquet(df, path, layout='list')"  # a Python call stays Python
    assert cli_spelling(text) == text
    # They named --columns and -k / --threshold as Python does.
    spelt = {
        "columns=['id', 'id'] names a column twice": "--columns id --columns id names a column",
        "right_columns: column 'id' not found; available": "--right-columns: column 'id' not",
        "columns (the right frame's too: right_columns= names others): column 'id' not": "--"
        "columns (the right frame's too: --right-columns names others): column 'id' not",
        "Carry a column that does: columns=['id']; or": "Carry a column that does: --columns id;",
        "give k (the best matches of each row), threshold (every pair scoring at least it), "
        "or both; e.g. k=10": "give -k (the best matches of each row), --threshold (every pair",
        # A config key the command line has no option for: its environment variable.
        "runs instead: the same pairs (cosim.search.clustered.exact-when-cheaper)": "runs "
        "instead: the same pairs (DASK_COSIM__SEARCH__CLUSTERED__EXACT_WHEN_CHEAPER=false "
        "keeps --method clustered)",
        # A search past its result budget (it gave the Python argument and config key).
        "raise the threshold, give k= to keep each row's k best matches, or set a larger "
        "cosim.search.max-result-bytes where": "raise the threshold, give -k to keep each "
        "row's k best matches, or set a larger DASK_COSIM__SEARCH__MAX_RESULT_BYTES where",
        "(cosim.search.max-result-bytes=1024)": "(DASK_COSIM__SEARCH__MAX_RESULT_BYTES=1024)",
        # topk's queries of another D, found on a worker (list-layout files tell no D).
        "argument 'queries' holds vectors of 32 values and column 'emb' (partition 0) of 16": (
            "--queries holds vectors of 32 values and column 'emb' (partition 0) of 16"
        ),
        # Column names, paths and functions that hold "cosim." are no config keys, nor
        # is a quoted name that is one.
        "column 'emb.cosim.unit' of dask_cosim.read_parquet": "column 'emb.cosim.unit' of "
        "dask_cosim.read_parquet",
        "'data/cosim.missing.parquet' not found": "'data/cosim.missing.parquet' not found",
        "column 'cosim.vec' not found": "column 'cosim.vec' not found",
        "column 'cosim.eps' not found": "column 'cosim.eps' not found",
    }
    for library, command_line in spelt.items():
        assert cli_spelling(library).startswith(command_line), cli_spelling(library)

    # A failed computation's message too (it was left as Python spells it).
    @one_line_errors
    def failing() -> None:
        raise RuntimeError("device='cuda' but no GPU is usable; use device='cpu'")

    with pytest.raises(click.ClickException) as failed:
        failing()
    assert failed.value.message.endswith("--device cuda but no GPU is usable; use --device cpu")


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """`dask-cosim info ... | head -1`: the pipe's reader leaves, and printing the rest
    failed as "the computation failed: BrokenPipeError", exit 1, on stderr."""
    code = (
        "import sys; from dask_cosim._cli import one_line_errors\n"
        "@one_line_errors\n"
        "def command():\n"
        "    for i in range(100000): print('line', i)\n"
        "command()\n"
    )
    proc = subprocess.run(f"{sys.executable} -c \"{code}\" | head -1", shell=True,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.stdout == "line 0\n" and proc.stderr == "", proc.stderr


def test_info_shows_columns_later_files_store_otherwise(tmp_path: Path) -> None:
    """Files written on different days: `info` described the first file alone ("vectors
    of 4") and the read failed later, on the file of 8."""

    def vectors(d: int) -> pa.Array:
        return pa.FixedSizeListArray.from_arrays(pa.array(np.ones(2 * d), pa.float32()), d)

    folder = tmp_path / "days"
    folder.mkdir()
    pq.write_table(pa.table({"id": [1, 2], "emb": vectors(4)}), folder / "1.parquet")
    pq.write_table(pa.table({"id": [3, 4], "emb": vectors(8)}), folder / "2.parquet")
    pq.write_table(pa.table({"emb": vectors(8)}), folder / "3.parquet")
    described = io.describe_parquet(folder)["columns"]
    assert described["id"]["elsewhere"] == [
        {"type": "absent", "files": 1, "first": str(folder / "3.parquet")}
    ]
    assert described["emb"]["elsewhere"] == [
        {"type": "fixed_size_list<element: float>[8]", "files": 2, "first": str(folder / "2.parquet")}
    ]  # fmt: skip
    proc = cli_here("info", str(folder))
    assert proc.returncode == 0, proc.stdout
    text, lines = proc.stdout, proc.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("id "))
    assert lines[at + 1].strip() == f"lacked by 1 file ({folder / '3.parquet'})"
    assert f"fixed_size_list<element: float>[8] in 2 files ({folder / '2.parquet'})" in text
    assert lines[-1].startswith("the read takes the first file's types: it casts")
    same = tmp_path / "same"
    same.mkdir()
    for i in range(2):
        pq.write_table(pa.table({"emb": vectors(4)}), same / f"{i}.parquet")
    assert "elsewhere" not in io.describe_parquet(same)["columns"]["emb"]
    assert "the read takes" not in cli_here("info", str(same)).stdout


def test_a_vector_column_without_a_vector_is_shown_without_a_length(tmp_path: Path) -> None:
    """A list column whose every row is null has no D: convert printed "emb 0 x float32"
    and info "vectors of None x float32"."""
    table = pa.table({"emb": pa.array([None, None], pa.list_(pa.float32())), "x": [1, 2]})
    pq.write_table(table, tmp_path / "in.parquet")
    for args in (["info", str(tmp_path / "in.parquet")],
                 ["convert", str(tmp_path / "in.parquet"), "-o", str(tmp_path / "out"),
                  "--column", "emb"],
                 ["info", str(tmp_path / "out")]):  # fmt: skip
        shown = CliRunner().invoke(main, args)
        assert shown.exit_code == 0, shown.output
        assert "float32 vectors of unknown length (no row " in shown.output
        assert "None" not in shown.output and " 0 x " not in shown.output


def test_info_finds_the_length_past_empty_and_null_rows(tmp_path: Path) -> None:
    """A list column whose first rows are empty or null (more than one batch of them)
    shows the length of its first vector: an empty first row had made info say "vectors
    of unknown length (no row holds one)" of a column of 3-vectors."""
    rows = [[]] * 1500 + [None] * 600 + [[1.0, 2.0, 3.0], [0.5, 0.1, 0.2]]
    pq.write_table(pa.table({"emb": pa.array(rows, pa.list_(pa.float32()))}), tmp_path / "a.pq")
    assert io.describe_parquet(tmp_path / "a.pq")["columns"]["emb"]["dim"] == 3
    assert "vectors of 3 x float32" in cli_here("info", str(tmp_path / "a.pq")).stdout


def test_columns_help_says_where_each_command_carries_them() -> None:
    """dedup's OUTPUT is the kept rows (every column): its --columns go to --removed,
    which they need; its help said "into the output", as join's and neighbors' do."""
    for command, where in (("dedup", "into --removed"), ("neighbors", "into the output"),
                           ("join", "into the output")):  # fmt: skip
        shown = CliRunner().invoke(main, [command, "--help"], terminal_width=400)
        line = next(s for s in shown.output.splitlines() if s.strip().startswith("--columns"))
        assert where in line, line


def test_ctrl_c_once_a_command_is_done_does_not_interrupt_the_shutdown(loop: object) -> None:
    """A Ctrl-C while the cluster shut down, the outputs written: the shutdown waited for
    ever, then the command said "Aborted!" of a run whose output was in place."""

    # The default handler for the test, whatever the process had: a Ctrl-C interrupts.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _shut_down_under_ctrl_c(loop)
    finally:
        handler = signal.signal(signal.SIGINT, before)
    assert handler is signal.default_int_handler  # put back as it was


def _shut_down_under_ctrl_c(loop: object) -> None:
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, processes=False, dashboard_address=None, loop=loop) as lc:
        with _cli.Cluster(scheduler=lc.scheduler_address).client() as client:
            close = client.close

            def interrupted_close(*args: object, **kwargs: object) -> None:
                client.close = close  # type: ignore[method-assign]  # once (__del__ too)
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)  # where the default handler raises KeyboardInterrupt
                close(*args, **kwargs)

            client.close = interrupted_close  # type: ignore[method-assign]
        assert client.status == "closed"


def test_a_cancelled_gather_is_not_logged_by_asyncio() -> None:
    """Ctrl-C during a computation: asyncio printed the traceback of distributed's
    cancelled gather ("Task exception was never retrieved ... AllExit") beside "Aborted!";
    the commands' filter drops that record alone."""
    import logging

    from distributed.client import AllExit

    def record(error: BaseException) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, "", 0, "Task exception was never "
                                 "retrieved", None, (type(error), error, None))  # fmt: skip

    assert not _cli.quiet_cancelled_gather(record(AllExit()))
    assert _cli.quiet_cancelled_gather(record(RuntimeError("a real failure")))


def test_only_our_warnings_are_printed_as_the_commands_own(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The commands print dask_cosim's warnings as one line ("Warning: ..."), in the
    command line's spelling; a library's (distributed's "Port 8787 is already in use",
    a ResourceWarning) went out as if they were ours, without their origin: they are
    shown as Python shows them."""
    import warnings

    from dask_cosim._cli import one_line_errors
    from dask_cosim.errors import CosimWarning

    @one_line_errors
    def command() -> None:
        warnings.warn("set cosim.search.max-result-bytes, it said", CosimWarning, stacklevel=1)
        warnings.warn("Port 8787 is already in use", UserWarning, stacklevel=1)

    shown: list[tuple[str, type[Warning]]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        # As Python would show it (its format: file, line, category, message).
        warnings.showwarning = lambda message, category, *_, **__: shown.append(
            (str(message), category)
        )
        command()
    assert capsys.readouterr().err == "Warning: set DASK_COSIM__SEARCH__MAX_RESULT_BYTES, it said\n"
    assert shown == [("Port 8787 is already in use", UserWarning)]
