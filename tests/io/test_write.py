"""to_parquet: round trips in every layout and dtype, atomic commits, arguments."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

import dask_cosim
from dask_cosim import io
from tests.helpers import pairs_frame, random_pairs, reference


def test_round_trip_through_parquet(tmp_path: object) -> None:
    a, b = random_pairs(30, 12)
    pdf = pairs_frame(a, b, "object_torch_300x1", index=pd.Index(np.arange(30) * 3, name="key"))
    path = str(tmp_path)
    dask_cosim.from_pandas(pdf, npartitions=3).to_parquet(path)
    ddf = dask_cosim.read_parquet(path)
    assert ddf.index.name == "key"
    back = ddf.compute()
    np.testing.assert_array_equal(np.stack(back["embeds_b"].to_numpy()), b)
    assert back.index.tolist() == list(np.arange(30) * 3)


# --------------------------------------------------------------------------- to_parquet


@pytest.mark.parametrize("layout", ["binary", "list"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_to_parquet_round_trip(tmp_path: Path, layout: str, dtype: type) -> None:
    a, b = random_pairs(60, 7, dtype=dtype)
    null = np.zeros(60, bool)
    null[[5, 41]] = True
    pdf = pairs_frame(
        a, b, "object_numpy", index=pd.Index(np.arange(60) * 2, name="key"), null_a=null
    )
    ddf = dask_cosim.from_pandas(pdf, npartitions=4)
    out = tmp_path / "pairs"
    manifest = dask_cosim.to_parquet(ddf, out, layout=layout)

    assert manifest["layout"] == layout and manifest["rows"] == 60
    want = {"dim": 7, "dtype": np.dtype(dtype).name}
    assert manifest["vectors"] == {"embeds_a": want, "embeds_b": want}
    names = sorted(p.name for p in out.iterdir())
    assert names[0] == io.MANIFEST and len(names) == 5
    # part.<number>.<this write>.parquet: the numbers in order, one write's tail.
    parts = [re.fullmatch(r"part\.(\d{5})\.([0-9a-f]{12})\.parquet", n) for n in names[1:]]
    assert [int(m[1]) for m in parts] == list(range(4)) and len({m[2] for m in parts}) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["pairs"]  # no staging folder left

    back = dask_cosim.read_parquet(out)
    assert back.npartitions == 4 and back.divisions == ddf.divisions
    assert back.dtypes["embeds_a"].pyarrow_dtype.list_size == 7
    got = back.compute()
    assert got.index.name == "key" and got.index.tolist() == list(np.arange(60) * 2)
    assert got["embeds_a"].isna().tolist() == null.tolist()
    np.testing.assert_array_equal(np.stack(got["embeds_b"].to_numpy()), b)
    np.testing.assert_array_equal(np.stack(got["embeds_a"][~null].to_numpy()), a[~null])
    cos = back.cosim.pairwise("embeds_a", "embeds_b").compute().to_numpy()
    np.testing.assert_allclose(
        cos[~null], reference(a, b)[~null], atol=1e-3 if dtype == np.float16 else 1e-6
    )
    assert np.isnan(cos[null]).all()

    only_b = dask_cosim.read_parquet(out, columns=["embeds_b"])
    assert list(only_b.columns) == ["embeds_b"] and only_b.index.name == "key"
    assert len(only_b.compute()) == 60
    with pytest.raises(KeyError, match=r"columns \['nope'\] not found .* available: "):
        dask_cosim.read_parquet(out, columns=["nope"])


def test_to_parquet_is_atomic(tmp_path: Path) -> None:
    a, b = random_pairs(40, 3)
    pdf = pairs_frame(a, b, "object_numpy")
    out = tmp_path / "p"
    dask_cosim.to_parquet(pdf, out)
    with pytest.raises(FileExistsError, match="exists; pass overwrite=True"):
        dask_cosim.to_parquet(pdf, out)

    # A partition that fails mid-job: the old folder stays, no staging folder is left.
    ragged = dask_cosim.from_pandas(pdf, npartitions=4)
    ragged = ragged.map_partitions(_break_partition, 2, meta=ragged._meta)
    with pytest.raises(ValueError, match="has 2 values but row"):
        dask_cosim.to_parquet(ragged, out, overwrite=True, vectors=["embeds_a", "embeds_b"])
    assert [p.name for p in tmp_path.iterdir()] == ["p"]
    assert len(dask_cosim.read_parquet(out).compute()) == 40

    # Partitions that disagree on D fail when the job commits, with the same guarantee.
    short = dask_cosim.from_pandas(pairs_frame(a[:, :2], b[:, :2], "object_numpy"))
    mixed = dd.concat([dask_cosim.from_pandas(pdf), short])
    with pytest.raises(
        ValueError, match=r"partition 1 holds 2-long float32 vectors but partition 0 holds"
    ):
        dask_cosim.to_parquet(mixed, out, overwrite=True, vectors=["embeds_a", "embeds_b"])
    assert [p.name for p in tmp_path.iterdir()] == ["p"]

    pdf2 = pdf.iloc[:10]
    dask_cosim.to_parquet(pdf2, out, overwrite=True)
    assert len(dask_cosim.read_parquet(out).compute()) == 10
    assert [p.name for p in tmp_path.iterdir()] == ["p"]


def test_a_write_task_that_starts_after_its_write_failed_leaves_nothing(tmp_path: Path) -> None:
    """dask reports a failed write at its first failed task, while tasks already handed
    to threads or workers still run; the folder is then discarded.  A task that started
    after that made the staging folder again (the partitions made it, each as it began)
    and left it beside the output.  The folder is made once, by a task every partition
    waits for: a late task finds it gone, and fails, making nothing."""
    from dask_cosim.io import vector_dims, write

    a, b = random_pairs(4, 3)
    staging = tmp_path / ".p.cosim-gone"
    files = vector_dims.FileWriter(pafs.LocalFileSystem(), str(staging), "binary", [], None, None)
    with pytest.raises(OSError):
        write._write_partition(pairs_frame(a, b, "fixed_size_list"), files, None)
    assert list(tmp_path.iterdir()) == []
    # An object store has no folder whose absence stops the write: the file is written,
    # then deleted, as the folder's marker says the write was given up.
    fs, root = io.files.filesystem(f"memory://{tmp_path.name}/out")
    files = vector_dims.FileWriter(fs, f"{root}-staging", "binary", [], None, None)
    with pytest.raises(RuntimeError, match="was given up"):
        write._write_partition(pairs_frame(a, b, "fixed_size_list"), files, None)
    everything = pafs.FileSelector(f"/{tmp_path.name}", recursive=True, allow_not_found=True)
    assert [i.path for i in fs.get_file_info(everything)] == []
    io.files.open_staging(fs, files.staging)  # as the write's first task makes it
    write._write_partition(pairs_frame(a, b, "fixed_size_list"), files, None)
    listed = fs.get_file_info(pafs.FileSelector(files.staging))
    assert sorted(i.base_name[:5] for i in listed) == [".writ", "part."]


def test_discard_names_a_folder_it_cannot_delete_and_raises_nothing(tmp_path: Path) -> None:
    """discard runs while an error is raised (a failed write): an error of its own hid
    that one (a Ctrl-C came out as "OSError: Cannot delete directory ... not empty")."""
    from fsspec.implementations.memory import MemoryFileSystem
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    class Stuck(MemoryFileSystem):
        def rm(self, *args: Any, **kwargs: Any) -> None:
            raise PermissionError("refused")

    fs = PyFileSystem(FSSpecHandler(Stuck()))
    path = f"/{tmp_path.name}/.out.cosim-staging"
    io.files.open_staging(fs, path)
    staging = io.files.Staging(fs, path, f"/{tmp_path.name}/out", False)
    with pytest.warns(UserWarning, match=r"staging folder .* could not be deleted .*refused"):
        io.files.discard([staging])


def _break_partition(df: pd.DataFrame, number: int) -> pd.DataFrame:
    """Partitions from row 20 on get one short row (so writing them fails)."""
    if len(df) and df["id"].iloc[0] >= 20:
        cells = [np.asarray(v, np.float32) for v in df["embeds_a"]]
        cells[-1] = cells[-1][:number]
        column = np.empty(len(cells), dtype=object)
        column[:] = cells
        df = df.assign(embeds_a=column)
    return df


def test_to_parquet_lazy_empty_partitions_and_results(tmp_path: Path) -> None:
    a, b = random_pairs(30, 6)
    ddf = dask_cosim.from_pandas(pairs_frame(a, b, "fixed_size_list"), npartitions=3)
    ddf = ddf[ddf["id"] >= 10]  # partition 0 becomes empty
    ddf["cos"] = ddf.cosim.pairwise("embeds_a", "embeds_b")
    out = tmp_path / "r"
    job = dask_cosim.to_parquet(ddf[["id", "cos"]], out, compute=False)
    # Nothing written before it is computed (its hidden folder was made when it was built).
    assert list(tmp_path.iterdir()) == []
    manifest = job.compute()
    assert manifest["vectors"] == {} and manifest["rows"] == 20
    assert [f["path"][:11] for f in manifest["files"]] == ["part.00001.", "part.00002."]
    back = dask_cosim.read_parquet(out).compute()
    np.testing.assert_allclose(back["cos"].to_numpy(), reference(a, b)[10:], atol=1e-6)
    # Computed again, it writes again: refused without overwrite (it failed "Failed to
    # open local file" in the folder the first computation had renamed), no folder left.
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        job.compute()
    assert [p.name for p in tmp_path.iterdir()] == ["r"]
    again = dask_cosim.to_parquet(ddf[["id", "cos"]], out, compute=False, overwrite=True)
    again.compute()
    assert again.compute()["rows"] == 20 and [p.name for p in tmp_path.iterdir()] == ["r"]


def test_to_parquet_checks_arguments(tmp_path: Path) -> None:
    a, b = random_pairs(4, 3)
    pdf = pairs_frame(a, b, "fixed_size_list")
    with pytest.raises(ValueError, match=r"layout='csv'; use one of \('binary', 'list'\)"):
        dask_cosim.to_parquet(pdf, tmp_path / "x", layout="csv")
    with pytest.raises(KeyError, match=r"vector columns \['nope'\] not found"):
        dask_cosim.to_parquet(pdf, tmp_path / "x", vectors=["nope"])
    with pytest.raises(TypeError, match="expects a dask or pandas DataFrame, got list"):
        dask_cosim.to_parquet([1], tmp_path / "x")
    # A search's or pairwise's Series: the fix is to_frame() (it was told from_pandas).
    cos = dask_cosim.from_pandas(pdf, npartitions=2).cosim.pairwise("embeds_a", "embeds_b")
    for series in (cos, cos.compute()):
        with pytest.raises(TypeError, match=r"Series \('cos'\): write series.to_frame\(\)"):
            dask_cosim.to_parquet(series, tmp_path / "x")
    # Names that are not strings came back as strings, or the folder failed to read (the
    # columns named 0 and 1 of two partitions: "expected bytes, int found").
    numbered = pdf.rename(columns={"embeds_a": 0, "embeds_b": 1})
    for frame in (numbered, dd.from_pandas(numbered, npartitions=2)):
        with pytest.raises(
            ValueError,
            match=r"name of column 0 is not a string \(int\): .* df\.rename\(columns=str\)",
        ):
            dask_cosim.to_parquet(frame, tmp_path / "x")
    with pytest.raises(
        ValueError, match=r"index's name 0 is not a string \(int\): .* df\.rename_axis\('0'\)"
    ):
        dask_cosim.to_parquet(pdf.rename_axis(0), tmp_path / "x")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- any Parquet


@pytest.mark.parametrize("layout", ["binary", "list"])
@pytest.mark.parametrize(
    "index",
    [
        None,
        pd.RangeIndex(10, 40, 3),
        pd.Index(np.arange(10) * 2),
        pd.Index(np.arange(10) * 2, name="embeds_a"),
    ],
)
def test_file_schema_without_the_data_is_the_written_schema(layout: str, index: Any) -> None:
    """The schema the GPU writer stores (built from empty slices, D from the metadata or
    the first row) is the schema pyarrow gives the whole frame; an index named like a
    vector column is stored as "__index_level_0__", under its own name."""
    from dask_cosim.io.write import _file_schema, frame_to_table

    a, b = random_pairs(10, 6)
    for fmt in ("fixed_size_list", "list"):
        pdf = pairs_frame(a, b, fmt, index=index)
        got = _file_schema(pdf, layout, ["embeds_a", "embeds_b"], None)
        want = frame_to_table(pdf, layout=layout, vectors=["embeds_a", "embeds_b"]).schema
        assert got.equals(want, check_metadata=True), (got, want)
        for name in want.names:
            assert got.field(name).metadata == want.field(name).metadata
        assert len(set(want.names)) == len(want.names)


def test_binary_vectors_of_a_schema() -> None:
    from dask_cosim.io.layouts import binary_vectors, vector_field

    schema = pa.schema(
        [
            vector_field("v", pa.float32(), 8, "binary"),
            vector_field("w", pa.float64(), 3, "list"),
            pa.field("x", pa.binary(4)),
        ]
    )
    assert binary_vectors(schema) == {"v": (8, "float32")}


def test_cudf_writer_takes_binary_vectors_up_to_255_bytes() -> None:
    from dask_cosim.io import cudf_parquet
    from dask_cosim.io.layouts import vector_field

    narrow = pa.schema([vector_field("v", pa.float32(), 63, "binary"), pa.field("id", pa.int64())])
    wide = pa.schema([vector_field("v", pa.float32(), 64, "binary")])
    assert cudf_parquet.writer_takes(narrow)
    assert not cudf_parquet.writer_takes(wide)
    assert cudf_parquet.writer_takes(pa.schema([vector_field("v", pa.float32(), 300, "list")]))


def test_a_reader_of_a_replaced_folder_fails_rather_than_mixing(tmp_path: Path) -> None:
    """read_parquet lists the files when it is called; an overwrite then replaces the
    folder.  The old files' names are gone with it (each write names its own), so the
    late read fails, naming the file and the fix, instead of reading the new folder's
    files of the same names beside the old listing."""
    a, b = random_pairs(40, 4)
    out = tmp_path / "p"
    dask_cosim.to_parquet(
        dask_cosim.from_pandas(pairs_frame(a, b, "fixed_size_list"), npartitions=4), out
    )
    listed = dask_cosim.read_parquet(out)
    c, d = random_pairs(30, 4, seed=1)
    dask_cosim.to_parquet(dask_cosim.from_pandas(pairs_frame(c, d, "fixed_size_list"), npartitions=4), out,
                          overwrite=True)  # fmt: skip
    with pytest.raises(FileNotFoundError, match=r"part\.0000\d\.[0-9a-f]{12}\.parquet' is gone: "
                       r"it was deleted, or its folder replaced \(an overwrite\), after the "
                       r"read listed its files"):  # fmt: skip
        listed.compute()
    assert len(dask_cosim.read_parquet(out).compute()) == 30


def test_partitions_of_vectors_of_two_lengths_are_named_by_partition(tmp_path: Path) -> None:
    """A folder of list files of two D (read, then written): the error named the
    staging folder's files (part.00001.<write>.parquet), gone with it."""
    (tmp_path / "in").mkdir()
    for name, d in (("a", 4), ("b", 8)):
        rows = pa.array([list(np.ones(d))] * 2, pa.list_(pa.float32()))
        pq.write_table(pa.table({"emb": rows}), tmp_path / "in" / f"{name}.parquet")
    with pytest.raises(ValueError, match=re.escape(
        "column 'emb': partition 1 holds 8-long float32 vectors but partition 0 holds 4-long "
        "float32 ones; every partition needs the same D and dtype"
    )):  # fmt: skip
        dask_cosim.to_parquet(dask_cosim.read_parquet(tmp_path / "in"), tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_a_folder_changed_by_another_tool_says_how_its_manifest_reads_it(tmp_path: Path) -> None:
    """The manifest names the files a read takes.  A file another tool added beside them
    was skipped without a word; one deleted failed when its partition was read, advising
    to read the folder again, which failed alike (the manifest still lists it)."""
    a, b = random_pairs(40, 4)
    out = tmp_path / "p"
    dask_cosim.to_parquet(dask_cosim.from_pandas(pairs_frame(a, b, "list"), npartitions=2), out)
    extra = out / "extra.parquet"  # as `COPY ... TO 'p/extra.parquet'` in DuckDB adds one
    pairs_frame(a[:3], b[:3], "list").to_parquet(extra)
    with pytest.warns(UserWarning, match=re.escape(
        f"{str(out)!r} holds 1 file(s) that its manifest _dask_cosim.json does not list, "
        f"added after dask_cosim wrote it ({str(extra)!r}): they are not read; delete "
        "_dask_cosim.json to read every Parquet file of the folder"
    )):  # fmt: skip
        assert len(dask_cosim.read_parquet(out).compute()) == 40
    extra.unlink()
    (out / "README.md").write_text("not data")  # not Parquet: no word
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(dask_cosim.read_parquet(out).compute()) == 40
    (out / "README.md").unlink()
    first = sorted(out.glob("part.*.parquet"))[0]
    first.unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(
        f"{str(first)!r} is gone (1 of the 2 files that {str(out / '_dask_cosim.json')!r} "
        "lists): the folder is being replaced (an overwrite: read it again), or was changed "
        "after dask_cosim wrote it (write it again, or delete _dask_cosim.json to read the "
        "Parquet files it holds now"
    )):  # fmt: skip
        dask_cosim.read_parquet(out)
    (out / "_dask_cosim.json").unlink()
    assert len(dask_cosim.read_parquet(out).compute()) == 20


def test_an_overwrite_killed_between_its_moves_is_undone_by_the_next_write(
    tmp_path: Path,
) -> None:
    """Killed after moving the old folder aside and before moving the new one in, an
    overwrite left no folder at all; the next write to that path puts the old one back
    (then refuses to replace it without overwrite=True), and drops the dead staging."""
    import subprocess
    import sys

    a, b = random_pairs(12, 3)
    out = tmp_path / "p"
    dask_cosim.to_parquet(pairs_frame(a, b, "fixed_size_list"), out)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    stem = f".p.cosim-{io.files._HOST}-{int(dead.stdout)}-0123456789ab"
    (tmp_path / stem).mkdir()  # the new folder, complete or not
    out.rename(tmp_path / f"{stem}-old")
    # A read meanwhile names where the data is (it said "'p' not found" alone).
    with pytest.raises(FileNotFoundError, match=rf"left the previous folder at .*{stem}-old"):
        dask_cosim.read_parquet(out)
    with pytest.raises(FileExistsError, match="exists; pass overwrite=True"):
        dask_cosim.to_parquet(pairs_frame(b, a, "fixed_size_list"), out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]
    back = dask_cosim.read_parquet(out).compute()
    np.testing.assert_array_equal(np.stack(back["embeds_a"].to_numpy()), a)


def test_a_read_between_an_overwrites_two_renames_finds_the_new_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An overwrite renames the old folder aside, then the new one into place: a read in
    between failed, "'p' not found" (a loop beside a writer found the folder missing 45
    times in about 220 overwrites).  It looks again a moment later."""
    import threading

    a, b = random_pairs(12, 3)
    out = tmp_path / "p"
    dask_cosim.to_parquet(pairs_frame(a, b, "fixed_size_list"), tmp_path / "new")
    monkeypatch.setattr(io.files, "_REPLACED_WAIT", 2.0)
    threading.Timer(0.1, (tmp_path / "new").rename, [out]).start()  # the second rename
    back = dask_cosim.read_parquet(out).compute()
    np.testing.assert_array_equal(np.stack(back["embeds_a"].to_numpy()), a)


def test_overwrite_replaces_a_file(tmp_path: Path) -> None:
    a, b = random_pairs(12, 3)
    out = tmp_path / "p"
    out.write_text("an old file")
    dask_cosim.to_parquet(pairs_frame(a, b, "fixed_size_list"), out, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"] and out.is_dir()
    assert len(dask_cosim.read_parquet(out).compute()) == 12


def test_overwrite_refuses_the_folder_it_runs_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder that is, or holds, the working directory is not replaced (dask's writer
    refuses it too): the overwrite deleted the directory the process ran in, and a
    relative path then failed after the folder had been replaced."""
    a, b = random_pairs(12, 3)
    out = tmp_path / "p"
    dask_cosim.to_parquet(pairs_frame(a, b, "fixed_size_list"), out)
    (out / "here").mkdir()
    before = sorted(p.name for p in out.iterdir())
    for cwd, path in ((out, "."), (out / "here", ".."), (out / "here", str(out))):
        monkeypatch.chdir(cwd)
        with pytest.raises(ValueError, match=r"holds the working directory .*; write it elsewhere"):
            dask_cosim.to_parquet(pairs_frame(a, b, "list"), path, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == before  # no staging folder left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]


def test_frames_written_together_each_get_a_folder_of_their_own(tmp_path: Path) -> None:
    """Two writes to one folder (in any spelling), or one inside the other, are refused
    before any work: renamed into place one after the other, the second replaced the
    first (with overwrite=True), failed "appeared while writing; pass overwrite=True", or
    left the outer folder behind."""
    df = dask_cosim.from_pandas(pd.DataFrame({"emb": [[1.0, 2.0]] * 6, "x": range(6)}), 2)
    for second in ("a", str(tmp_path / "a" / "."), "a/inner"):
        with pytest.raises(ValueError, match="give each write a folder of its own"):
            io.to_parquet_together(
                [(df, tmp_path / "a", {"overwrite": True}), (df, tmp_path / second, {})]
            )
    assert list(tmp_path.iterdir()) == []
    io.to_parquet_together([(df, tmp_path / "a", {}), (df, tmp_path / "ab", {})])
    assert len(dask_cosim.read_parquet(tmp_path / "ab").compute()) == 6


def test_a_path_from_the_home_folder(tmp_path: Path, monkeypatch: Any) -> None:
    """``~`` names the home folder, as pandas and dask take it: to_parquet made a folder
    named "~" in the working directory, and read_parquet found nothing there."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    df = dask_cosim.from_pandas(pd.DataFrame({"emb": [[1.0, 2.0]] * 4, "x": range(4)}), 2)
    dask_cosim.to_parquet(df, "~/out")
    assert list((tmp_path / "work").iterdir()) == []
    assert (tmp_path / "home" / "out").is_dir()
    for path in ("~/out", "~/out/*.parquet", ["~/out"]):
        assert dask_cosim.read_parquet(path).compute()["x"].tolist() == [0, 1, 2, 3]


def test_dask_keywords_are_refused_naming_what_does_their_work(tmp_path: Path) -> None:
    """The keywords of dask's to_parquet that this writer has not are refused naming what
    does their work here (they failed as Python's bare "unexpected keyword argument", and
    to_parquet_together's named a private function); what is refused writes nothing."""
    df = dask_cosim.from_pandas(pd.DataFrame({"emb": [[1.0, 2.0]] * 4, "key": list("aabb")}), 2)
    out = tmp_path / "out"
    with pytest.raises(TypeError, match=r"'partition_on' \(dask's.*partition_on=\[\.\.\.\]"):
        dask_cosim.to_parquet(df, out, partition_on=["key"])
    with pytest.raises(TypeError, match=r"'append'.*read_parquet\(\[old, new\]\)"):
        dask_cosim.to_parquet(df, out, append=True)
    with pytest.raises(TypeError, match=r"'overwite'; it takes .*did you mean 'overwrite'"):
        dask_cosim.to_parquet(df, out, overwite=True)
    with pytest.raises(TypeError, match=r"to_parquet_together got an unexpected keyword 'compute'"):
        io.to_parquet_together([(df, out, {"compute": False})])
    with pytest.raises(TypeError, match=r"to_parquet_together does not take 'storage_options'"):
        io.to_parquet_together([(df, out, {"storage_options": {}})])
    with pytest.raises(TypeError, match="options must be a dict"):
        io.to_parquet_together([(df, out, None)])  # type: ignore[list-item]
    assert list(tmp_path.iterdir()) == []


def test_ragged_lists_that_are_no_embeddings_are_named_out_of_the_vectors(
    tmp_path: Path,
) -> None:
    """Every list column is a vector column by default: a ragged one (token ids) fails,
    and the error says how to leave it out, which then writes it as it is."""
    pdf = pd.DataFrame({"emb": [np.ones(3, "f4")] * 4})
    pdf["ids"] = pd.Series([[1, 2], [3], [4, 5, 6], [7]], dtype=pd.ArrowDtype(pa.list_(pa.int64())))
    df = dask_cosim.from_pandas(pdf, npartitions=2)
    with pytest.raises(ValueError, match=r"If 'ids' holds no embeddings, .*vectors=\[\.\.\.\]"):
        dask_cosim.to_parquet(df, tmp_path / "a")
    dask_cosim.to_parquet(df, tmp_path / "b", vectors=["emb"])
    back = dask_cosim.read_parquet(tmp_path / "b").compute()
    assert [list(i) for i in back["ids"]] == [[1, 2], [3], [4, 5, 6], [7]]


def test_file_names_sort_as_text_past_100000_partitions(tmp_path: Path) -> None:
    """Partition numbers are padded to the digits of the largest (at least 5): pandas,
    pyarrow's datasets and DuckDB list a folder's files as text, and with 5 digits
    part.100000 came between part.10000 and part.10001.  (The writer's partition
    function, given the digits to_parquet gives it for 100,001 partitions.)"""
    from dask_cosim.io import files, write
    from dask_cosim.io.vector_dims import FileWriter

    staging = tmp_path / ".out.cosim-abc"
    staging.mkdir()
    (staging / files.OPEN_MARKER).touch()
    writer = FileWriter(pafs.LocalFileSystem(), str(staging), "list", [], "snappy", None)
    for number in (99_999, 9_999, 100_000, 10_000):
        part = pd.DataFrame({"p": [number]})
        write._write_partition(part, writer, False, None, {"number": number}, digits=6)
    (staging / files.OPEN_MARKER).unlink()
    assert pd.read_parquet(staging)["p"].tolist() == [9_999, 10_000, 99_999, 100_000]
    frame = dask_cosim.from_pandas(pd.DataFrame({"p": range(12)}), npartitions=12)
    dask_cosim.to_parquet(frame, tmp_path / "small")
    assert sorted(p.name[:10] for p in (tmp_path / "small").glob("*.parquet"))[-1] == "part.00011"


@pytest.mark.parametrize("cell", ["tensor", "array"])
def test_a_lazy_object_column_of_vectors_is_named_or_refused(tmp_path: Path, cell: str) -> None:
    """The output of a map_partitions step (an embedding model) holds vectors in an
    object column, which its meta cannot tell: to_parquet without vectors= raised
    pyarrow's "did not recognize Python value type" for tensors, and wrote arrays as
    lists the manifest did not list (another layout than the eager frame's).  It now
    names the column and vectors=; named, the folder is the eager frame's."""
    import torch

    x = np.random.default_rng(2).standard_normal((40, 8)).astype(np.float32)

    def embed(part: pd.DataFrame) -> pd.DataFrame:
        rows = [torch.from_numpy(x[i]) if cell == "tensor" else x[i] for i in part["id"]]
        return part.assign(emb=pd.Series(rows, index=part.index, dtype=object))

    base = dask_cosim.from_pandas(pd.DataFrame({"id": np.arange(40)}), npartitions=2)
    df = base.map_partitions(embed, meta=embed(base._meta))
    with pytest.raises(TypeError, match=r"column 'emb' of this dask frame holds vectors .*"
                                        r"to_parquet\(df, path, vectors=\['emb'\]\)"):  # fmt: skip
        dask_cosim.to_parquet(df, tmp_path / "lazy")
    assert not (tmp_path / "lazy").exists()
    lazy = dask_cosim.to_parquet(df, tmp_path / "lazy", vectors=["emb"])
    eager = dask_cosim.to_parquet(df.compute(), tmp_path / "eager")
    assert lazy["vectors"] == eager["vectors"] == {"emb": {"dim": 8, "dtype": "float32"}}
    got = dask_cosim.read_parquet(tmp_path / "lazy").compute()
    np.testing.assert_array_equal(np.stack(got["emb"].to_numpy()), x)
    # Lists (token ids of any length) are lists, written as the eager frame's are.
    tags = df.assign(tokens=df["id"].map(lambda i: list(range(i % 3 + 1)), meta=("tokens", object)))
    written = dask_cosim.to_parquet(tags.drop(columns="emb"), tmp_path / "tags")
    assert written["vectors"] == {}
    back = dask_cosim.read_parquet(tmp_path / "tags").compute()
    assert [list(t) for t in back["tokens"][:3]] == [[0], [0, 1], [0, 1, 2]]
