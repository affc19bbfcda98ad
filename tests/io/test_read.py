"""read_parquet: projection, files, globs, big files, hive folders, URLs, memory maps."""

from __future__ import annotations

import datetime
import decimal
import json
import os
import re
from pathlib import Path
from typing import Any

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import dask_cosim
from dask_cosim import io
from dask_cosim.io import read
from tests.helpers import no_computes, pairs_frame, random_pairs, reference, spy_on_reads


def test_read_parquet_reads_only_the_columns_used(tmp_path: Path) -> None:
    a, b = random_pairs(50, 4)
    pdf = pairs_frame(a, b, "fixed_size_list")
    pdf["text"] = ["some words"] * 50
    dd.from_pandas(pdf, npartitions=2).to_parquet(tmp_path)
    cos = dask_cosim.read_parquet(tmp_path).cosim.pairwise("embeds_a", "embeds_b")
    plan = cos.optimize(fuse=False).expr.walk()
    reads = [e for e in plan if type(e).__name__ == "FromMapProjectable"]
    assert len(reads) == 1 and reads[0].columns == ["embeds_a", "embeds_b"]
    np.testing.assert_allclose(cos.compute().to_numpy(), reference(a, b), atol=1e-6)


@pytest.mark.parametrize("how", ["ours", "dask's"])
def test_columns_as_one_name_reads_a_series_as_dasks_reader_does(tmp_path: Path, how: str) -> None:
    """``columns="emb"`` is a Series of that column (it was read as the columns "e", "m",
    "b"); a tuple or an Index is a list of names."""
    a, b = random_pairs(20, 4)
    tmp_path /= "d"
    dask_cosim.to_parquet(dd.from_pandas(pairs_frame(a, b, "fixed_size_list"), 2), tmp_path)
    more = {} if how == "ours" else {"split_row_groups": False}  # dask's reader reads it
    got = dask_cosim.read_parquet(tmp_path, columns="embeds_a", **more)
    expected = dd.read_parquet(tmp_path, columns="embeds_a")
    assert isinstance(got, dd.Series) and isinstance(expected, dd.Series)
    assert got.name == "embeds_a" and got.dtype == got.compute().dtype
    np.testing.assert_array_equal(np.stack(got.compute().to_numpy()), a)
    for listed in [("id", "embeds_b"), pd.Index(["id", "embeds_b"])]:
        frame = dask_cosim.read_parquet(tmp_path, columns=listed, **more)
        assert frame.columns.tolist() == ["id", "embeds_b"]
        assert frame.compute().columns.tolist() == ["id", "embeds_b"]


@pytest.mark.parametrize("layout", ["ours", "plain"])
def test_an_empty_projection_reads_the_index_alone(
    tmp_path: Path, monkeypatch: Any, layout: str
) -> None:
    """``df[[]]`` (what counting rows projects) reads no column but the index (and those
    a filter tests), and gives partitions with no column, as its meta says."""
    a, b = random_pairs(60, 4)
    pdf = pairs_frame(a, b, "fixed_size_list")
    if layout == "ours":
        dask_cosim.to_parquet(dd.from_pandas(pdf, npartitions=2), tmp_path / "d")
    else:
        (tmp_path / "d").mkdir()
        for i in range(2):
            half = {
                "embeds_a": io.encode_vectors(a[30 * i : 30 * i + 30]),
                "id": pdf["id"][30 * i : 30 * i + 30],
            }
            pq.write_table(pa.table(half), tmp_path / "d" / f"p{i}.parquet")
    asked = spy_on_reads(monkeypatch)
    got = dask_cosim.read_parquet(tmp_path / "d")[[]].compute()
    assert got.columns.tolist() == [] and got.index.tolist() == list(range(60))
    assert asked == [[], []]
    asked.clear()
    filtered = dask_cosim.read_parquet(tmp_path / "d", filters=[("id", ">=", 45)])
    assert filtered[[]].map_partitions(len).compute().tolist() == [0, 15]
    assert asked == [[], []]
    assert filtered[[]].compute().index.tolist() == list(range(45, 60))


def test_read_parquet_files_globs_and_big_files(tmp_path: Path, monkeypatch: Any) -> None:
    a, b = random_pairs(90, 3)
    table = pa.table(
        {
            "id": np.arange(90),
            "embeds_a": io.encode_vectors(a).cast(pa.list_(pa.float32())),
            "embeds_b": io.encode_vectors(b),
        }
    )
    for i in range(3):  # part.2 sorts before part.10: natural order
        pq.write_table(table.slice(30 * i, 30), tmp_path / f"part.{[2, 10, 11][i]}.parquet")
    expected = reference(a, b)
    by_glob = dask_cosim.read_parquet(str(tmp_path / "part.*.parquet"))
    by_list = dask_cosim.read_parquet(sorted(tmp_path.iterdir(), key=lambda p: (len(p.name), p)))
    for df in (by_glob, by_list):
        assert df.npartitions == 3
        got = df.cosim.pairwise("embeds_a", "embeds_b").compute().to_numpy()
        np.testing.assert_allclose(got, expected, atol=1e-6)

    # Big files are split by row groups (thresholds shrunk to test sizes).
    pq.write_table(table, tmp_path / "big.parquet", row_group_size=10)
    monkeypatch.setattr(io.read, "_SPLIT_FILE_BYTES", 1)
    monkeypatch.setattr(io.read, "TARGET_PARTITION_BYTES", 300)
    big = dask_cosim.read_parquet(tmp_path / "big.parquet")
    assert big.npartitions > 1
    got = big.cosim.pairwise("embeds_a", "embeds_b").compute().to_numpy()
    np.testing.assert_allclose(got, expected, atol=1e-6)
    half = dask_cosim.read_parquet(tmp_path / "big.parquet", filters=[("id", ">=", 45)])
    assert half.compute()["id"].tolist() == list(range(45, 90))


def test_globs_skip_the_names_folder_readers_skip(tmp_path: Path) -> None:
    """A glob over a folder we wrote skips our manifest, as a folder's listing does, and
    so other "_" and "." names (_SUCCESS, _common_metadata, hidden files and folders);
    a pattern that spells the "_" still names such a file."""
    a, b = random_pairs(20, 3)
    pdf = pairs_frame(a, b, "fixed_size_list")
    dask_cosim.to_parquet(dask_cosim.from_pandas(pdf, npartitions=2), tmp_path / "ours")
    (tmp_path / "ours" / "_SUCCESS").write_bytes(b"")
    (tmp_path / "ours" / "_common_metadata").write_bytes(b"not parquet")
    (tmp_path / "ours" / ".part.0.parquet.crc").write_bytes(b"not parquet")
    (tmp_path / "ours" / "_temporary").mkdir()
    pq.write_table(pa.table({"id": [-1]}), tmp_path / "ours" / "_temporary" / "part.parquet")
    for pattern in ("ours/*", "ours/*.parquet", "*/*"):
        got = dask_cosim.read_parquet(str(tmp_path / pattern))
        assert got.npartitions == 2, pattern
        pd.testing.assert_frame_equal(got.compute(), pdf, check_index_type=False)
    with pytest.raises(FileNotFoundError, match="no files match"):
        dask_cosim.read_parquet(str(tmp_path / "*" / "*" / "*"))  # only in _temporary/
    with pytest.raises(ValueError, match=r"_dask_cosim\.json' is not a Parquet file"):
        dask_cosim.read_parquet(str(tmp_path / "ours" / "_*.json"))


def test_a_recursive_glob_reads_every_level(tmp_path: Path) -> None:
    """``**`` matches folders at any depth, as dask's reader and fsspec take it (it read
    one level only), still skipping the "_" and "." names it matches, not those the
    pattern spells ("_in" here)."""
    root = tmp_path / "_in"
    for i, sub in enumerate(("", "a", "a/b", "a/_tmp", "a/.hidden", "_c")):
        (root / sub).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"id": [i, i]}), root / sub / "x.parquet")
    got = dask_cosim.read_parquet(str(root / "**" / "*.parquet")).compute()
    assert sorted(got["id"]) == [0, 0, 1, 1, 2, 2]
    got = dask_cosim.read_parquet(str(root / "a" / "**" / "x.parquet")).compute()
    assert sorted(got["id"]) == [1, 1, 2, 2]
    # A trailing ** matches the folders on the way too, the first the one before it: each
    # file once (every row was read twice: as a file, and in its folder read whole).
    got = dask_cosim.read_parquet(str(root / "a" / "**")).compute()
    assert sorted(got["id"]) == [1, 1, 2, 2]
    # Folders the pattern matches are read whole, once (b is inside a).
    got = dask_cosim.read_parquet(str(root / "**" / "[ab]")).compute()
    assert sorted(got["id"]) == [1, 1, 2, 2]
    # Through a hive folder's key=value/ folders, whose files alone would lose the keys:
    # a wildcard that matches such a folder, on the way to the files or as the folder
    # read, is refused (the files of hive/**/*.parquet were read without their keys).
    hive = tmp_path / "hive"
    pd.DataFrame({"g": ["x", "y"], "v": [1, 2]}).to_parquet(hive, partition_cols=["g"])
    for pattern in ("**", "hive/**/*.parquet", "hive/*/*.parquet", "hive/*", "hive/g=*/*"):
        with pytest.raises(
            ValueError,
            match=re.escape(
                f"reaches {str(hive / 'g=x')!r}, a folder of the hive-partitioned "
                f"folder {str(hive)!r} (key=value/ subfolders)"
            ),
        ):
            dask_cosim.read_parquet(str(tmp_path / pattern))
    # A key=value folder spelt out is read as named (its key, known to the reader, left).
    got = dask_cosim.read_parquet(str(hive / "g=x" / "*.parquet")).compute()
    assert got.columns.tolist() == ["v"] and got["v"].tolist() == [1]


def test_a_path_that_exists_is_no_glob(tmp_path: Path) -> None:
    """A folder named "run[1]" or "day?" is that folder, as pandas reads it and as
    to_parquet wrote it; as a glob it read the sibling "run1", or "day2" beside it."""
    for name, decoy in (("run[1]", "run1"), ("day?", "day2")):
        for folder, start in ((name, 0), (decoy, 100)):
            rows = pd.DataFrame({"x": np.arange(start, start + 3)})
            dask_cosim.to_parquet(rows.assign(emb=list(np.ones((3, 2), "f4"))), tmp_path / folder)
        assert dask_cosim.read_parquet(str(tmp_path / name)).compute()["x"].tolist() == [0, 1, 2]
        got = dask_cosim.read_parquet([str(tmp_path / name), str(tmp_path / decoy)]).compute()
        assert got["x"].tolist() == [0, 1, 2, 100, 101, 102], name


def test_several_folders_are_read_one_after_the_other(tmp_path: Path) -> None:
    """A list of paths may name folders (ours, and plain ones) beside files: their files
    in order (it was "not files: [...]", and the command line's INPUTS... so too)."""
    a, b = random_pairs(30, 3)
    pdf = pairs_frame(a, b, "fixed_size_list")
    dask_cosim.to_parquet(dask_cosim.from_pandas(pdf.iloc[:10], npartitions=2), tmp_path / "ours")
    (tmp_path / "plain").mkdir()
    pdf.iloc[10:20].to_parquet(tmp_path / "plain" / "x.parquet")
    pdf.iloc[20:].to_parquet(tmp_path / "last.parquet")
    paths = [tmp_path / "ours", str(tmp_path / "plain"), tmp_path / "last.parquet"]
    got = dask_cosim.read_parquet(paths)
    assert got.npartitions == 4
    pd.testing.assert_frame_equal(got.compute(), pdf, check_index_type=False)
    with pytest.raises(FileNotFoundError, match=r"not found: \['.*nowhere'\]"):
        dask_cosim.read_parquet([tmp_path / "ours", str(tmp_path / "nowhere")])
    # A folder of plain subfolders (no key=value/ names) is no hive folder: its files.
    (tmp_path / "nested" / "2024").mkdir(parents=True)
    pdf.iloc[:5].to_parquet(tmp_path / "nested" / "2024" / "x.parquet")
    got = dask_cosim.read_parquet([tmp_path / "nested", tmp_path / "last.parquet"]).compute()
    assert got["id"].tolist() == [*pdf["id"].iloc[:5], *pdf["id"].iloc[20:]]


def test_read_parquet_hive_folders_and_missing_paths(tmp_path: Path) -> None:
    a, b = random_pairs(40, 3)
    pdf = pairs_frame(a, b, "fixed_size_list")
    pdf["group"] = np.repeat(["x", "y"], 20)
    pdf.to_parquet(tmp_path / "hive", partition_cols=["group"])
    df = dask_cosim.read_parquet(tmp_path / "hive")  # key=value/ folders (test_hive.py)
    assert isinstance(df.dtypes["embeds_a"], pd.ArrowDtype)
    got = df.compute().sort_values("id")
    assert got["group"].astype(str).tolist() == pdf["group"].tolist()
    with pytest.raises(FileNotFoundError, match="'nowhere' not found"):
        dask_cosim.read_parquet("nowhere")
    with pytest.raises(FileNotFoundError, match="no files match"):
        dask_cosim.read_parquet(str(tmp_path / "*.nothing"))


def test_read_and_write_through_urls(tmp_path: Path) -> None:
    """file:// goes to pyarrow's own filesystem; other fsspec URLs (memory://) through
    fsspec, for reading and for the atomic write."""
    a, b = random_pairs(30, 4)
    pdf = pairs_frame(a, b, "fixed_size_list")
    dask_cosim.to_parquet(pdf, tmp_path / "p")
    # file://localhost/PATH is file:///PATH (RFC 8089), not ./localhost/PATH.
    for url in (f"file://{tmp_path / 'p'}", f"file://localhost{tmp_path / 'p'}"):
        local = dask_cosim.read_parquet(url)
        np.testing.assert_allclose(
            local.cosim.pairwise("embeds_a", "embeds_b").compute().to_numpy(),
            reference(a, b),
            atol=1e-6,
        )
    dask_cosim.to_parquet(pdf, "memory://cosim-test/p", layout="list")
    in_memory = dask_cosim.read_parquet("memory://cosim-test/p")
    assert in_memory.npartitions == 1 and len(in_memory.compute()) == 30
    with pytest.raises(FileExistsError, match="exists; pass overwrite=True"):
        dask_cosim.to_parquet(pdf, "memory://cosim-test/p")


@pytest.mark.parametrize("setting", ["auto", True, False])
def test_memory_map_setting(tmp_path: Path, setting: Any) -> None:
    """ "auto" maps our binary layout only: mapped pages count in a worker's memory."""
    a, b = random_pairs(50, 8)
    for layout in ("binary", "list"):
        dask_cosim.to_parquet(pairs_frame(a, b, "fixed_size_list"), tmp_path / layout,
                              layout=layout)  # fmt: skip
        schema = pq.read_schema(next((tmp_path / layout).glob("part.00000.*.parquet")))
        with dask.config.set({"cosim.read.memory-map": setting}):
            mapped = io.read._memory_map(schema)
            back = dask_cosim.read_parquet(tmp_path / layout).compute()
        assert mapped == (layout == "binary" if setting == "auto" else setting)
        np.testing.assert_array_equal(np.stack(back["embeds_a"].to_numpy()), a)
    with dask.config.set({"cosim.read.memory-map": "yes"}):
        with pytest.raises(
            ValueError, match=r"cosim\.read\.memory-map='yes'; use 'auto', true or false"
        ):
            dask_cosim.read_parquet(tmp_path / "list")


def test_gpu_pieces_read_small_files_together() -> None:
    """With the cudf backend, consecutive files are read together up to
    cosim.read.gpu-partition-bytes, divisions kept at the partitions' boundaries."""
    import dask
    import pyarrow.fs as pafs

    from dask_cosim.io.read import _gpu_pieces

    files = [f"part.{i}.parquet" for i in range(5)]
    with dask.config.set({"cosim.read.gpu-partition-bytes": 250}):
        pieces, divisions = _gpu_pieces(
            pafs.LocalFileSystem(), files, [100] * 5, [0, 10, 20, 30, 40, 49]
        )
    assert pieces == [
        (("part.0.parquet", "part.1.parquet"), None),
        (("part.2.parquet", "part.3.parquet"), None),
        ("part.4.parquet", None),
    ]
    assert divisions == [0, 20, 40, 49]
    with dask.config.set({"cosim.read.gpu-partition-bytes": "1GiB"}):
        pieces, divisions = _gpu_pieces(pafs.LocalFileSystem(), files, [100] * 5, None)
    assert pieces == [(tuple(files), None)] and divisions is None


@pytest.mark.parametrize("index", ["range", "stepped", "column"])
def test_gpu_reads_take_the_files_ranges_from_the_manifest(tmp_path: Path, index: str) -> None:
    """Files read together on the GPU each need their RangeIndex: our manifest gives the
    same ranges the footers hold, so workers read no footer again; an index stored as a
    column (or no manifest) gives none.  Folders written today store the index of a frame
    of several partitions as a column; folders written before kept each file's RangeIndex
    in its pandas metadata, as rewritten here."""
    import pyarrow.fs as pafs

    from dask_cosim.io import cudf_parquet
    from dask_cosim.io.files import parquet_files
    from dask_cosim.io.read import _gpu_pieces

    a, b = random_pairs(100, 4)
    pdf = pairs_frame(a, b, "fixed_size_list")
    if index == "stepped":
        pdf.index = pd.RangeIndex(10, 10 + 3 * len(pdf), 3, name="row")
    elif index == "column":
        pdf.index = pd.Index(np.arange(len(pdf)) * 2)
    dask_cosim.to_parquet(dask_cosim.from_pandas(pdf, npartitions=4), tmp_path / "d", layout="list")
    found = parquet_files(tmp_path / "d")
    assert found is not None
    files, sizes, manifest = found.files, found.sizes, found.manifest  # sizes: zeros (ours)
    assert cudf_parquet.manifest_ranges(pq.read_schema(files[0]), manifest) is None
    if index != "column":  # the layout of folders written before: RangeIndex metadata
        for file in files:
            part = pd.read_parquet(file)
            start = part.index[0]
            step = part.index[1] - start
            part.index = pd.RangeIndex(start, start + step * len(part), step, name=part.index.name)
            pq.write_table(pa.Table.from_pandas(part), file)
    schema = pq.read_schema(files[0])
    from_manifest = cudf_parquet.manifest_ranges(schema, manifest)
    assert from_manifest == cudf_parquet.footer_ranges(files)
    assert cudf_parquet.manifest_ranges(schema, None) is None
    if index == "column":
        assert from_manifest is None
        return
    assert from_manifest is not None
    name, ranges = from_manifest
    assert name == pdf.index.name and len(ranges) == 4
    start, stop, step = cudf_parquet.range_positions(ranges) or (0, 0, 0)
    assert pd.RangeIndex(start, stop, step).equals(pdf.index)
    assert cudf_parquet.range_positions([ranges[0], ranges[2]]) is None  # not in a row
    largest = max(Path(f).stat().st_size for f in files)
    with dask.config.set({"cosim.read.gpu-partition-bytes": 2 * largest + 1}):
        pieces, _ = _gpu_pieces(pafs.LocalFileSystem(), files, sizes, None, from_manifest)
    assert [p[0] for p in pieces] == [tuple(files[:2]), tuple(files[2:])]
    assert [p[2] for p in pieces] == [(name, ranges[:2]), (name, ranges[2:])]


def test_manifest_ranges_refuse_bounds_that_are_not_a_range() -> None:
    """A file whose manifest bounds do not span its rows with the first file's step (its
    index was not a RangeIndex) sends the reader back to the footers."""
    from dask_cosim.io import cudf_parquet

    meta = {"index_columns": [{"kind": "range", "name": None, "start": 0, "stop": 5, "step": 1}]}
    schema = pa.schema([("x", pa.int64())], metadata={b"pandas": json.dumps(meta).encode()})
    files = [{"path": "p0", "rows": 5, "index": [0, 4]}, {"path": "p1", "rows": 3, "index": [5, 9]}]
    assert cudf_parquet.manifest_ranges(schema, {"files": files}) is None
    files[1]["index"] = [5, 7]
    assert cudf_parquet.manifest_ranges(schema, {"files": files}) == (None, [(0, 5, 1), (5, 3, 1)])
    files[1]["index"] = None
    assert cudf_parquet.manifest_ranges(schema, {"files": files}) is None


# --------------------------------------------------------------------------- row numbering


def plain_folder(folder: Path, sizes: list[int], row_group_size: int | None = None) -> Path:
    """Files as plain pyarrow writes them (no pandas metadata): id and a vector column."""
    folder.mkdir()
    start = 0
    for i, n in enumerate(sizes):
        table = pa.table(
            {"id": np.arange(start, start + n), "v": io.encode_vectors(np.ones((n, 3), "f4"))}
        )
        pq.write_table(table, folder / f"part-{i}.parquet", row_group_size=row_group_size)
        start += n
    return folder


def test_files_without_an_index_are_numbered_across_the_read(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Row i of the read is labelled i (what pd.read_parquet gives the folder), with known
    divisions, from the footers alone; an empty file adds no partition."""
    folder = plain_folder(tmp_path / "plain", [30, 0, 25, 45])
    with no_computes():
        df = dask_cosim.read_parquet(folder)
    assert df.divisions == (0, 30, 55, 99)
    got = df.compute()
    pd.testing.assert_index_equal(got.index, pd.read_parquet(folder).index, exact="equiv")
    assert (got.index == got["id"]).all()
    assert (dask_cosim.read_parquet(folder, columns=["v"]).compute().index == got.index).all()
    # Filters keep each row's label.
    half = dask_cosim.read_parquet(folder, filters=[("id", ">=", 40)]).compute()
    assert half.index.tolist() == half["id"].tolist() == list(range(40, 100))
    # A big file split by row groups is numbered across its pieces.
    monkeypatch.setattr(io.read, "_SPLIT_FILE_BYTES", 1)
    monkeypatch.setattr(io.read, "TARGET_PARTITION_BYTES", 300)
    big = dask_cosim.read_parquet(plain_folder(tmp_path / "big", [100], row_group_size=20))
    assert big.npartitions > 1 and big.known_divisions
    assert (big.compute().index == np.arange(100)).all()


def test_filters_compare_columns_that_are_not_read(tmp_path: Path) -> None:
    """A filter may compare a column that columns= (or dask's projection) leaves out: it
    is read for the filter, then dropped; rows keep their labels."""
    import pyarrow.compute as pc

    folder = plain_folder(tmp_path / "plain", [30, 25, 45])
    for filters in (
        [("id", ">=", 40), ("id", "<", 60)],
        [[("id", ">=", 40), ("id", "<", 50)], [("id", ">=", 50), ("id", "<", 60)]],
        (pc.field("id") >= 40) & (pc.field("id") < 60),
    ):
        got = dask_cosim.read_parquet(folder, columns=["v"], filters=filters).compute()
        assert got.columns.tolist() == ["v"] and got.index.tolist() == list(range(40, 60))
        projected = dask_cosim.read_parquet(folder, filters=filters)["v"].compute()
        assert projected.index.tolist() == list(range(40, 60))
    # A stored index comes along too.
    pdf = pd.DataFrame({"id": np.arange(6), "x": np.arange(6.0)}, index=pd.Index(list("abcdef")))
    pdf.to_parquet(tmp_path / "indexed.parquet")
    got = dask_cosim.read_parquet(tmp_path / "indexed.parquet", filters=[("id", ">", 3)])
    assert got["x"].compute().to_dict() == {"e": 4.0, "f": 5.0}


def test_a_stored_index_is_read_as_stored(tmp_path: Path) -> None:
    pdf = pd.DataFrame({"id": np.arange(6), "x": np.arange(6.0)})
    pdf.set_index(pd.Index([5, 3, 9, 1, 0, 2], name="key")).to_parquet(tmp_path / "cols.parquet")
    assert dask_cosim.read_parquet(tmp_path / "cols.parquet").compute().index.tolist() == [
        5, 3, 9, 1, 0, 2
    ]  # fmt: skip
    # One file with a RangeIndex in its metadata keeps it, as pandas does.
    pdf.set_index(pd.RangeIndex(10, 22, 2, name="r")).to_parquet(tmp_path / "range.parquet")
    got = dask_cosim.read_parquet(tmp_path / "range.parquet")
    assert got.divisions == (10, 20)
    pd.testing.assert_index_equal(got.compute().index, pd.RangeIndex(10, 22, 2, name="r"))
    # Our folders written without an index are numbered too.
    labelled = dd.from_pandas(pdf.set_index(pd.Index(np.arange(100, 106), name="k")), 3)
    manifest = dask_cosim.to_parquet(labelled, tmp_path / "ours", write_index=False)
    ours = dask_cosim.read_parquet(tmp_path / "ours")
    assert ours.known_divisions and ours.compute().index.tolist() == list(range(6))
    # Its manifest records no range of the labels left out (it gave 100-105).
    assert [f["index"] for f in manifest["files"]] == [None] * 3
    assert manifest["divisions"] is None


def test_an_index_dask_stored_unnamed_comes_back_unnamed(tmp_path: Path) -> None:
    """dd.to_parquet stores an unnamed index as "__null_dask_index__"; dask's reader gives
    it back named None, and so does ours (a named one keeps its name)."""
    pdf = pd.DataFrame({"id": np.arange(10), "x": np.arange(10.0)}, index=np.arange(10) * 3)
    dd.from_pandas(pdf, npartitions=3).to_parquet(tmp_path / "dd")
    df = dask_cosim.read_parquet(tmp_path / "dd")
    assert df.index.name is None and df._meta.index.name is None
    pd.testing.assert_frame_equal(df.compute(), dd.read_parquet(tmp_path / "dd").compute())
    pd.testing.assert_frame_equal(df.compute(), pdf)
    one = dask_cosim.read_parquet(tmp_path / "dd" / "part.1.parquet", filters=[("id", ">", 4)])
    assert one.compute().index.name is None and one.compute()["id"].tolist() == [5, 6]
    dd.from_pandas(pdf.rename_axis("row"), npartitions=2).to_parquet(tmp_path / "named")
    assert dask_cosim.read_parquet(tmp_path / "named").compute().index.name == "row"


def test_a_pandas_file_of_fixed_size_lists_reads_any_projection(tmp_path: Path) -> None:
    """pandas writes an ArrowDtype column's type as a string into the file's metadata,
    which it cannot parse back for a fixed_size_list ("type specific parameters"): a
    projection that left such a column out failed on it, as pandas' own reader fails on
    every read of the file."""
    a, b = random_pairs(12, 4)
    pdf = pairs_frame(a, b, "fixed_size_list")
    pdf.to_parquet(tmp_path / "p.parquet")
    df = dask_cosim.read_parquet(tmp_path / "p.parquet")
    for columns in (["embeds_a"], ["id"], [], ["embeds_b", "id"]):
        pd.testing.assert_frame_equal(df[columns].compute(), df.compute()[columns])
    got = df.cosim.topk(a[:2], "embeds_a", k=1)
    assert got["match"].tolist() == [0, 1]


def test_list_views_read_as_vectors_not_text(tmp_path: Path) -> None:
    """A file whose vector column is an Arrow list view (as some engines write) reads as
    vectors; dask's reader made text of it before (object -> string)."""
    a, b = random_pairs(12, 4)
    views = {c: pa.array([list(r) for r in x], pa.list_view(pa.float32()))
             for c, x in (("embeds_a", a), ("embeds_b", b))}  # fmt: skip
    pq.write_table(pa.table({"id": pa.array(range(12)), **views}), tmp_path / "v.parquet")
    df = dask_cosim.read_parquet(tmp_path / "v.parquet")
    assert pa.types.is_list_view(df["embeds_a"].dtype.pyarrow_dtype)
    got = df.cosim.pairwise("embeds_a", "embeds_b").compute()
    np.testing.assert_allclose(got.to_numpy(), reference(a, b), atol=1e-6)
    assert df.cosim.topk(a[:2], "embeds_a", k=1)["match"].tolist() == [0, 1]


@pytest.mark.gpu
def test_cudf_reader_numbers_files_without_an_index(tmp_path: Path) -> None:
    pytest.importorskip("cudf")
    folder = plain_folder(tmp_path / "plain", [30, 0, 25, 45])
    with dask.config.set({"dataframe.backend": "cudf"}):
        df = dask_cosim.read_parquet(folder)
        assert df.known_divisions
        got = df.compute().to_pandas()
        filtered = dask_cosim.read_parquet(folder, filters=[("id", ">=", 40)]).compute()
    assert got.index.tolist() == got["id"].tolist() == list(range(100))
    assert filtered.to_pandas().index.tolist() == list(range(40, 100))


@pytest.mark.parametrize("convert_string", [True, False])
def test_a_string_index_reads_back_as_dask_reads_it(tmp_path: Path, convert_string: bool) -> None:
    """A string index (and string column) reads back with the dtype dask's reader gives
    the folder, in the meta as in the data: without ``convert-string``, pandas' own
    ``str``, as written (the meta said object); with it, dask's ``string[pyarrow]``."""
    pdf = pd.DataFrame(
        {"s": pd.Series(list("abcdef"), dtype="str"), "x": np.arange(6)},
        index=pd.Index([f"k{i}" for i in (5, 3, 9, 1, 0, 2)], dtype="str", name="key"),
    )
    with dask.config.set({"dataframe.convert-string": convert_string}):
        dask_cosim.to_parquet(dd.from_pandas(pdf, npartitions=2, sort=False), tmp_path / "out")
        back = dask_cosim.read_parquet(tmp_path / "out")
        theirs = dd.read_parquet(tmp_path / "out")
        got = back.compute()
        pd.testing.assert_frame_equal(got, theirs.compute())
        pd.testing.assert_index_equal(back._meta.index, got.index[:0])
        assert back._meta.dtypes.equals(got.dtypes)
    if not convert_string:
        pd.testing.assert_frame_equal(got, pdf)


@pytest.mark.parametrize("convert_string", [True, False])
def test_columns_pandas_makes_objects_of_read_arrow_backed_not_as_text(
    tmp_path: Path, convert_string: bool
) -> None:
    """bool with nulls, dates, times and decimals: pyarrow gives pandas Python objects for
    them, and dask's ``convert-string`` turned those into text ('False', a true value in a
    filter; '2020-01-01'; '1.00'), in the data while the meta said bool.  They read
    Arrow-backed, the values as stored, the meta as the data."""
    table = pa.table(
        {
            "flag": pa.array([True, None, False]),
            "day": pa.array([datetime.date(2020, 1, 1), None, datetime.date(1999, 12, 31)]),
            "ms": pa.array([datetime.date(2021, 5, 6)] * 3, pa.date64()),
            "at": pa.array([datetime.time(1, 2, 3), None, datetime.time(23, 59)], pa.time64("us")),
            "sec": pa.array([1, 2, None], pa.time32("s")),
            "money": pa.array(
                [decimal.Decimal("1.00"), None, decimal.Decimal("-2.50")], pa.decimal128(5, 2)
            ),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    stored = pq.read_table(tmp_path / "t.parquet")
    with dask.config.set({"dataframe.convert-string": convert_string}):
        df = dask_cosim.read_parquet(tmp_path / "t.parquet")
        got = df.compute()
    assert df._meta.dtypes.equals(got.dtypes), (df._meta.dtypes, got.dtypes)
    for name in table.column_names:
        assert got[name].dtype == pd.ArrowDtype(stored.schema.field(name).type), name
        assert pa.array(got[name]).equals(stored.column(name).combine_chunks()), name
    assert got["flag"].fillna(False).tolist() == [True, False, False]
    # Written by dask_cosim.to_parquet from object cells (bools beside a None): the same.
    pdf = pd.DataFrame({"flag": [True, None, False]}, dtype=object)
    dask_cosim.to_parquet(dask_cosim.from_pandas(pdf, npartitions=1), tmp_path / "ours")
    back = dask_cosim.read_parquet(tmp_path / "ours").compute()["flag"]
    assert back.dtype == pd.ArrowDtype(pa.bool_()) and back.tolist()[::2] == [True, False]
    # Where pandas' metadata records one dtype for every column of a type, that one.
    for pdf in (
        pd.DataFrame({"ok": [True, False, True], "n": [1, 2, 3]}),
        pd.DataFrame({"maybe": pd.array([True, None, False]), "n": [1, 2, 3]}),
    ):
        pdf.to_parquet(tmp_path / "pandas.parquet")
        got = dask_cosim.read_parquet(tmp_path / "pandas.parquet").compute()
        pd.testing.assert_frame_equal(got, pdf)


def test_files_of_a_folder_are_read_with_the_first_files_types(tmp_path: Path) -> None:
    """The frame's meta comes from the first file's schema; a later file's columns take
    its types (int32 as int64, lists as its fixed-size lists), a column it lacks is null
    (as pyarrow's datasets read it), and one that cannot take them is named with its file.
    Before: a lacking column was a KeyError at compute in pairwise, vectors of another
    length gave cosines of object columns, and ids as strings made the column object."""

    def vectors(d: int, n: int = 2, fixed: bool = True) -> pa.Array:
        values = pa.array(np.arange(n * d, dtype=np.float32) + 1)
        if fixed:
            return pa.FixedSizeListArray.from_arrays(values, d)
        return pa.ListArray.from_arrays(
            pa.array(np.arange(0, n * d + 1, d, dtype=np.int32)), values
        )

    def folder(name: str, second: dict[str, Any]) -> Path:
        (tmp_path / name).mkdir()
        first = {"id": pa.array([0, 1]), "a": vectors(4), "b": vectors(4)}
        pq.write_table(pa.table(first), tmp_path / name / "f0.parquet")
        pq.write_table(pa.table(second), tmp_path / name / "f1.parquet")
        return tmp_path / name

    ids = pa.array([2, 3], pa.int32())
    fine = folder("fine", {"id": ids, "a": vectors(4, fixed=False), "extra": [1, 2]})
    df = dask_cosim.read_parquet(fine)
    got = df.compute()
    assert df._meta.dtypes.equals(got.dtypes) and got["id"].tolist() == [0, 1, 2, 3]
    assert got["b"].isna().tolist() == [False, False, True, True]
    assert np.isnan(df.cosim.pairwise("a", "b").compute().to_numpy()).tolist() == [0, 0, 1, 1]
    for name, second, message in (
        ("longer", {"id": ids, "a": vectors(5), "b": vectors(5)},
         r"column 'a' of '.*longer/f1\.parquet' holds fixed_size_list<element: float>\[5\]"),
        ("text", {"id": ["x", "y"], "a": vectors(4), "b": vectors(4)},
         r"column 'id' of '.*text/f1\.parquet' holds string"),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=message + r".* the first file .*f0\.parquet"):
            dask_cosim.read_parquet(folder(name, second)).compute()
    # A stored index in one file and none in the next: each as its file has it.
    (tmp_path / "index").mkdir()
    pd.DataFrame({"x": [1.0, 2.0]}, index=pd.Index([10, 11], name="k")).to_parquet(
        tmp_path / "index" / "0.parquet"
    )
    pd.DataFrame({"x": [3.0, 4.0]}).to_parquet(tmp_path / "index" / "1.parquet", index=False)
    for columns in (None, ["x"]):
        got = dask_cosim.read_parquet(tmp_path / "index", columns=columns).compute()
        assert got.index.tolist() == [10, 11, 0, 1] and got["x"].tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("first", ["binary", "list"])
def test_a_later_folder_without_a_column_of_the_first_reads_it_as_null(
    tmp_path: Path, first: str
) -> None:
    """Two folders read together, the second without the first's vector column: its rows
    have nulls there, as a later file's do (and info says).  With the first in the binary
    layout its whole-file read asked pyarrow for the column: ArrowInvalid "No match for
    FieldRef.Name(emb)" at compute."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4) + 1
    pdf = pd.DataFrame({"id": [0, 1, 2], "emb": list(x)})
    dask_cosim.to_parquet(dask_cosim.from_pandas(pdf, 1), tmp_path / "a", layout=first)
    dask_cosim.to_parquet(dask_cosim.from_pandas(pdf[["id"]], 1), tmp_path / "b")
    df = dask_cosim.read_parquet([tmp_path / "a", tmp_path / "b"])
    got = df.compute()
    assert got["id"].tolist() == [0, 1, 2] * 2
    assert got["emb"].isna().tolist() == [False] * 3 + [True] * 3
    cos = df.cosim.pairwise("emb", "emb").compute().to_numpy()
    assert np.isnan(cos).tolist() == [False] * 3 + [True] * 3


@pytest.mark.parametrize(
    ("first", "later", "message"),
    [
        # pyarrow's cast made these inf, silently: the rows dropped out of every search.
        (pa.float32(), np.full(8, 1e300), "its values exceed that type's range (up to 1e+300"),
        (pa.float16(), np.full(8, 1e6), "its values exceed that type's range (up to 1000000.0"),
        # ... and parsed text as numbers ("00123" as 123), made timestamps and booleans
        # numbers.
        (pa.int64(), pa.array(["00123", "7"]), "holds string, but the first file"),
        (pa.int64(), pa.array([1, 2], pa.timestamp("us")), "holds timestamp[us], but"),
        (pa.float64(), pa.array([True, False]), "holds bool, but the first file"),
        (pa.int32(), pa.array([2**40, 1]), "(Integer value 1099511627776 not in range"),
        (pa.int64(), pa.array([3.5, 1.0]), "(Float value 3.5"),
        (pa.float32(), pa.array([decimal.Decimal("1e50")] * 2, pa.decimal256(76, 0)), "range"),
        (pa.decimal128(5, 2), pa.array([0.123, 1.0]), "holds double, but the first file"),
        (pa.float32(), pa.array([1e300, 1e300]).dictionary_encode(), "exceed that type's range"),
        (
            pa.date32(),
            pa.array([datetime.datetime(2024, 1, 2, 3)] * 2, pa.timestamp("ms")),
            "which changes its values",
        ),
        (
            pa.list_(pa.date32()),
            pa.array([[datetime.datetime(2024, 1, 2, 3)]] * 2, pa.list_(pa.timestamp("ms"))),
            "which changes its values",
        ),
        (pa.float32(), np.full(8, 1e-50), "some of its values are too small for that type"),
    ],
)
def test_a_later_file_whose_values_the_first_files_type_cannot_hold_is_refused(
    tmp_path: Path, first: pa.DataType, later: Any, message: str
) -> None:
    def column(values: Any, t: pa.DataType | None = None) -> pa.Array:
        if isinstance(values, pa.Array):
            return values
        return pa.FixedSizeListArray.from_arrays(pa.array(values, t), 4)  # vectors

    (tmp_path / "in").mkdir()
    vectors = not isinstance(later, pa.Array)
    if vectors:
        head = column(np.ones(8), first)
    elif pa.types.is_date(first):
        head = pa.array([datetime.date(2024, 1, 1)] * 2, first)
    elif pa.types.is_list(first):
        head = pa.array([[datetime.date(2024, 1, 1)]] * 2, first)
    else:
        head = pa.array([decimal.Decimal(1)] * 2 if pa.types.is_decimal(first) else [1, 2], first)
    pq.write_table(pa.table({"x": head}), tmp_path / "in" / "f0.parquet")
    pq.write_table(pa.table({"x": column(later, pa.float64())}), tmp_path / "in" / "f1.parquet")
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        dask_cosim.read_parquet(tmp_path / "in").compute()
    assert f"column 'x' of {str(tmp_path / 'in' / 'f1.parquet')!r} holds " in str(info.value)
    assert str(info.value).endswith("or rewrite this one with the first file's types")


def test_a_later_file_of_numbers_of_another_type_takes_the_first_files(tmp_path: Path) -> None:
    for name, first, later in (
        ("floats", pa.array([1.5, 2.5]), pa.array([3, 4])),
        ("integers", pa.array([1, 2]), pa.array([3.0, 4.0])),
        ("text", pa.array(["a", "b"]).dictionary_encode(), pa.array(["c", "d"], pa.large_string())),
        ("vectors", pa.array([[1, 2]], pa.list_(pa.float32(), 2)), pa.array([[1e30, 3]])),
        # What pyarrow's cast takes exactly, as it did before kinds were compared.
        ("empty lists", pa.array([[1, 2]], pa.list_(pa.float32())), pa.array([[]])),
        ("structs", pa.array([{"a": 1, "b": "x"}]), pa.array([{"b": "y", "a": 2}])),
        ("dates", pa.array([datetime.date(2024, 1, 1)]),
         pa.array([datetime.datetime(2024, 1, 2)], pa.timestamp("ms"))),
        ("decimals", pa.array([1.5]), pa.array([decimal.Decimal("2.25")])),
        ("bytes", pa.array(["a", "b"]), pa.array([b"c", b"d"])),
    ):  # fmt: skip
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"x": first}), tmp_path / name / "f0.parquet")
        pq.write_table(pa.table({"x": later}), tmp_path / name / "f1.parquet")
        got = dask_cosim.read_parquet(tmp_path / name).compute()["x"]
        want = pa.concat_arrays([first.cast(first.type), later.cast(first.type)])
        assert [np.asarray(v).tolist() if np.ndim(v) else v for v in got] == want.to_pylist()


def test_a_column_the_first_file_holds_no_value_of_takes_a_later_files_type(
    tmp_path: Path,
) -> None:
    """A column of no value in the first file (Arrow null: what pyarrow writes for an
    empty or all-None object column, an empty frame's vectors) takes the type of the
    first later file with values, as pyarrow's datasets unify them; it made every later
    file with values fail ("holds string, but the first file ... has null").  Past the
    files looked at, a file's values are read as they are."""
    (tmp_path / "notes").mkdir()
    pq.write_table(pa.table({"note": pa.nulls(2), "x": [1, 2]}), tmp_path / "notes" / "a.parquet")
    pq.write_table(pa.table({"note": ["u", None], "x": [3, 4]}), tmp_path / "notes" / "b.parquet")
    got = dask_cosim.read_parquet(tmp_path / "notes").compute()
    assert got["note"].tolist()[2] == "u" and got["x"].tolist() == [1, 2, 3, 4]

    (tmp_path / "vectors").mkdir()  # the first file an empty frame's
    fixed = pa.list_(pa.float32(), 3)
    empty = {"emb": pa.nulls(0), "id": pa.array([], pa.int64())}
    pq.write_table(pa.table(empty), tmp_path / "vectors" / "a.parquet")
    rows = {"emb": pa.array([[1, 2, 3], [1, 2, 3.5]], fixed), "id": [1, 2]}
    pq.write_table(pa.table(rows), tmp_path / "vectors" / "b.parquet")
    df = dask_cosim.read_parquet(tmp_path / "vectors")
    assert df.dtypes["emb"] == pd.ArrowDtype(fixed)
    pairs = df.cosim.neighbors("emb", threshold=0.9, columns=["id"]).compute()
    assert pairs[["left_id", "right_id"]].values.tolist() == [[1, 2]]

    (tmp_path / "late").mkdir()
    for i in range(read.NULL_TYPE_LOOKAHEAD + 1):
        pq.write_table(
            pa.table({"note": pa.nulls(1), "x": [i]}), tmp_path / "late" / f"{i:02}.parquet"
        )
    pq.write_table(pa.table({"note": ["late"], "x": [99]}), tmp_path / "late" / "99.parquet")
    assert dask_cosim.read_parquet(tmp_path / "late").compute()["note"].tolist()[-1] == "late"


def test_a_column_no_file_holds_a_value_of_reads_as_null_rows(tmp_path: Path) -> None:
    """A column of Arrow null in every file (an empty frame's vectors, written alone; a
    column of None) reads as Arrow-backed null, as pyarrow gives the other types it would
    make Python objects of, and the accessor takes it as null rows, as it takes such a
    column of :func:`dask_cosim.from_pandas`.  dask's ``convert-string`` made text of it:
    its empty frame failed "column 'emb' holds strings", and its rows gave 'None'."""
    fixed = np.ones(3, np.float32)
    pdf = pd.DataFrame({"emb": [fixed] * 4, "other": [fixed] * 4, "note": [None] * 4})
    dask_cosim.to_parquet(dask_cosim.from_pandas(pdf.iloc[:0], npartitions=1), tmp_path / "e")
    empty = dask_cosim.read_parquet(tmp_path / "e")
    assert (empty.dtypes == pd.ArrowDtype(pa.null())).all()
    assert empty.cosim.pairwise("emb", "other").compute().empty
    assert empty.cosim.neighbors("emb", threshold=0.5).compute().empty

    dask_cosim.to_parquet(dask_cosim.from_pandas(pdf, npartitions=2), tmp_path / "n")
    df = dask_cosim.read_parquet(tmp_path / "n")
    got = df.compute()
    assert df.dtypes["note"] == got.dtypes["note"] == pd.ArrowDtype(pa.null())
    assert got["note"].isna().all()
    assert df.cosim.pairwise("emb", "note").compute().isna().all()
    assert df.cosim.join(df, "note", k=2).compute().empty


def test_other_keywords_go_to_dask_with_our_vectors_restored(tmp_path: Path) -> None:
    """A keyword this reader has not hands the read to dask's, which gave our binary
    layout's vectors as bytes (``.cosim`` then failed, telling to read the files with
    dask_cosim.read_parquet); they are vectors again.  ``engine="pyarrow"`` stays here:
    it changed which rows a filter kept (dask's ``!=`` keeps nulls)."""
    v = np.eye(4, dtype=np.float32)
    pdf = pd.DataFrame(
        {"s": ["en", None, "fr", None], "emb": list(v)},
        index=pd.Index([10, 11, 12, 13], name="rid"),
    )
    dask_cosim.to_parquet(dask_cosim.from_pandas(pdf, npartitions=2), tmp_path / "b")
    ours = dask_cosim.read_parquet(tmp_path / "b", filters=[("s", "!=", "en")])
    same = dask_cosim.read_parquet(tmp_path / "b", filters=[("s", "!=", "en")], engine="pyarrow")
    assert ours.compute().equals(same.compute()) and ours.compute().index.tolist() == [12]
    theirs = dask_cosim.read_parquet(tmp_path / "b", split_row_groups=False)
    assert theirs.dtypes["emb"] == pd.ArrowDtype(pa.list_(pa.float32(), 4))
    np.testing.assert_array_equal(np.stack(theirs.compute()["emb"].to_numpy()), v)
    assert theirs.cosim.pairwise("emb", "emb").compute().tolist() == [1.0] * 4
    fr = dask_cosim.read_parquet(tmp_path / "b", filters=[("s", "==", "fr")], blocksize=None)
    assert list(fr.compute()["emb"].iloc[0]) == [0, 0, 1, 0]


def test_a_file_rewritten_in_place_is_read_under_new_keys(tmp_path: Path) -> None:
    """The read's graph keys include the files' sizes and modification times, as dask's
    reader includes its files' checksum: a file rewritten under its name, with as many
    rows, kept the keys of the old contents, and a distributed scheduler that still held
    results under them answered with the old file's scores; in a folder to_parquet wrote,
    whose manifest such a rewrite leaves as it was, it still did.  Unchanged files, same
    keys."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"a": list(rng.normal(size=(50, 4))), "k": [1, 2] * 25})
    (tmp_path / "plain").mkdir()
    file = tmp_path / "plain" / "part.0.parquet"
    frame.to_parquet(file)
    pq.write_to_dataset(pa.Table.from_pandas(frame), tmp_path / "hive", partition_cols=["k"])
    in_hive = sorted((tmp_path / "hive").rglob("*.parquet"))[0]
    # Ours too: its manifest lists the files, and is unchanged by such a rewrite.
    dask_cosim.to_parquet(dask_cosim.from_pandas(frame, npartitions=2), tmp_path / "ours")
    in_ours = sorted((tmp_path / "ours").glob("*.parquet"))[1]
    for path, target in [
        (tmp_path / "plain", file),
        (file, file),
        (tmp_path / "hive", in_hive),
        (tmp_path / "ours", in_ours),
    ]:
        before = dask_cosim.read_parquet(path)
        assert dask_cosim.read_parquet(path)._name == before._name
        table = pq.read_table(target)  # as many rows, in another order, the same name
        pq.write_table(table.take(np.arange(len(table))[::-1]), target)
        stat = target.stat()  # a second later, wherever timestamps are coarse
        os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        assert dask_cosim.read_parquet(path)._name != before._name, path


def test_filters_are_checked_when_the_graph_is_built(tmp_path: Path) -> None:
    """A filter on no column, with an operator pyarrow has not, or malformed, fails when
    the read is built, naming what is wrong, as pyarrow and dask fail; it failed inside
    ``compute`` (``[[]]`` with a bare IndexError)."""
    pdf = pd.DataFrame({"s": ["en", None], "emb": list(np.eye(2, dtype="f4"))})
    pdf.index = pd.Index([10, 11], name="rid")
    dask_cosim.to_parquet(dask_cosim.from_pandas(pdf, npartitions=1), tmp_path / "b")
    with no_computes():
        with pytest.raises(
            KeyError, match=r"filters \['nope'\] not found .* \['s', 'emb', 'rid'\]"
        ):
            dask_cosim.read_parquet(tmp_path / "b", filters=[("nope", "==", 1)])
        with pytest.raises(ValueError, match=r"filters=\[\('s', 'is', None\)\]: \"is\" is not"):
            dask_cosim.read_parquet(tmp_path / "b", filters=[("s", "is", None)])
        with pytest.raises(ValueError, match=r"filters=\[\[\]\]: Malformed filters"):
            dask_cosim.read_parquet(tmp_path / "b", filters=[[]])
        # An expression too (it failed inside compute, then was a TypeError).
        with pytest.raises(
            KeyError, match=r"filters \['nope'\] not found .* \['s', 'emb', 'rid'\]"
        ):
            dask_cosim.read_parquet(tmp_path / "b", filters=pc.field("nope") == 1)
        ok = dask_cosim.read_parquet(
            tmp_path / "b", filters=[[("rid", ">", 10)], [("s", "==", "en")]]
        )
    assert ok.compute().index.tolist() == [10, 11]


def test_filters_of_the_wrong_type_name_the_column_and_the_value_to_give(tmp_path: Path) -> None:
    """A value pyarrow cannot compare with its column ("1" with int64, a date string with
    a timestamp, a number with a hive key of text) fails when the read is built, naming
    the column, its type and what to give; it was pyarrow's bare "Function 'equal' has no
    kernel matching input types", inside ``compute`` (for a key: when the graph was built,
    still bare)."""
    pdf = pd.DataFrame(
        {
            "n": [1, 2],
            "s": ["en", "fr"],
            "t": pd.to_datetime(["2024-01-01", "2024-02-01"]),
            "tz": pd.to_datetime(["2024-01-01", "2024-02-01"]).tz_localize("UTC"),
            "emb": list(np.eye(2, dtype="f4")),
        }
    )
    dask_cosim.to_parquet(dask_cosim.from_pandas(pdf, npartitions=1), tmp_path / "b")
    pq.write_to_dataset(pa.Table.from_pandas(pdf), tmp_path / "hive", partition_cols=["s"])
    with no_computes():
        for path, filters, says in (
            ("b", [("n", ">", 0), ("n", "==", "1")], r"column 'n' holds int64, .* '1' \(str\)"),
            ("b", [("t", ">", "2024-01-15")], r"'t' holds timestamp.*give a pandas.Timestamp"),
            ("b", [[("s", "==", 1)]], r"column 's' holds .*string.*give text, e.g. '1'"),
            # Passed on no rows, failed in compute: tried on a row of nulls.
            ("b", [("tz", ">", pd.Timestamp("2024-01-15"))], r"tz=UTC.*, tz='UTC'\)$"),
            ("b", [("t", ">", pd.Timestamp("2024-01-15", tz="UTC"))], r"column 't' holds"),
            ("hive", [("s", "==", 1)], r"column 's' holds string.*give text, e.g. '1'"),
            ("b", pc.field("n") == "1", r"cannot evaluate it on the columns \(n: int64, "),
        ):
            with pytest.raises(TypeError, match=says):
                dask_cosim.read_parquet(tmp_path / path, filters=filters)
    for path in ("b", "hive"):
        got = dask_cosim.read_parquet(tmp_path / path, filters=[("s", "==", "fr")]).compute()
        assert got["n"].tolist() == [2], path
    late = dask_cosim.read_parquet(tmp_path / "b", filters=[("t", ">", pd.Timestamp("2024-01-15"))])
    assert late.compute()["n"].tolist() == [2]
    zoned = pd.Timestamp("2024-01-15", tz="UTC")
    assert dask_cosim.read_parquet(tmp_path / "b", filters=[("tz", ">", zoned)]).compute()[
        "n"
    ].tolist() == [2]
