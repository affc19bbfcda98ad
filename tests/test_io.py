"""from_pandas keeps per-row vectors as vectors; read_parquet keeps them as Arrow lists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import dask_cosim
from dask_cosim import io
from tests.conftest import pairs_frame, random_pairs, reference


@pytest.mark.parametrize("fmt", ["object_numpy", "object_torch_300x1", "object_lists"])
def test_from_pandas_converts_object_columns(fmt: str) -> None:
    a, b = random_pairs(50, 300)
    pdf = pairs_frame(a, b, fmt, index=pd.Index(np.arange(50)[::-1], name="key"))
    pdf["label"] = ["x"] * 50
    ddf = dask_cosim.from_pandas(pdf, npartitions=4)
    t = ddf.dtypes["embeds_a"]
    assert isinstance(t, pd.ArrowDtype) and t.pyarrow_dtype.list_size == 300
    assert ddf.dtypes["id"] == np.int64 and ddf.npartitions == 4
    back = ddf.compute()
    assert back.index.name == "key" and sorted(back.index) == list(range(50))
    restored = np.stack(back.sort_values("id")["embeds_a"].to_numpy())
    np.testing.assert_array_equal(restored, a.astype(restored.dtype))
    cos = ddf.cosim.pairwise("embeds_a", "embeds_b").compute().sort_index(ascending=False)
    np.testing.assert_allclose(cos.to_numpy(), reference(a, b), atol=1e-6)


def test_from_pandas_keeps_dtypes_nulls_and_sizes() -> None:
    a, b = random_pairs(10, 3, dtype=np.float16)
    null = np.zeros(10, bool)
    null[[2, 7]] = True
    pdf = pairs_frame(a, b, "object_numpy", null_a=null)
    ddf = dask_cosim.from_pandas(pdf, chunksize=4)
    assert str(ddf.dtypes["embeds_a"].pyarrow_dtype.value_type) == "halffloat"
    assert ddf.npartitions == 3
    back = ddf.compute()
    assert back["embeds_a"].isna().tolist() == null.tolist()
    assert dask_cosim.from_pandas(pdf).npartitions == 1

    bf = pd.DataFrame({"v": [torch.ones(4, dtype=torch.bfloat16)] * 3})
    assert str(dask_cosim.from_pandas(bf).dtypes["v"].pyarrow_dtype.value_type) == "float"


def test_from_pandas_errors_name_column_and_row() -> None:
    a, b = random_pairs(4, 6)
    pdf = pairs_frame(a, b, "object_numpy", index=pd.Index(["w", "x", "y", "z"]))
    ragged = pdf.copy()
    ragged.at["y", "embeds_b"] = np.ones(5, np.float32)
    with pytest.raises(
        ValueError, match="column 'embeds_b': row 'y' has 5 values but row 'w' has 6"
    ):
        dask_cosim.from_pandas(ragged)
    words = pdf.copy()
    words.at["x", "embeds_a"] = np.array(["a", "b"])
    with pytest.raises(TypeError, match="column 'embeds_a': row 'x' holds ndarray"):
        dask_cosim.from_pandas(words)
    with pytest.raises(TypeError, match="from_pandas expects a pandas.DataFrame, got list"):
        dask_cosim.from_pandas([1, 2])  # type: ignore[arg-type]


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
    assert sorted(p.name for p in out.iterdir()) == [io.MANIFEST] + [
        f"part.{i:05d}.parquet" for i in range(4)
    ]
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


def test_binary_layout_is_zero_copy_and_self_describing(tmp_path: Path) -> None:
    a, b = random_pairs(10, 5)
    dask_cosim.to_parquet(pairs_frame(a, b, "object_numpy"), tmp_path / "p")
    schema = pq.read_schema(tmp_path / "p" / "part.00000.parquet")
    field = schema.field("embeds_a")
    assert field.type == pa.binary(20)
    assert field.metadata == {b"dask_cosim.dim": b"5", b"dask_cosim.dtype": b"float32"}
    # The pandas metadata describes only what pandas can read back.
    assert [c["name"] for c in schema.pandas_metadata["columns"]] == ["id"]
    table = pq.read_table(tmp_path / "p" / "part.00000.parquet")
    restored = io.restore_vectors(table)
    chunk = restored["embeds_a"].chunks[0]
    assert chunk.values.buffers()[1].address == table["embeds_a"].chunks[0].buffers()[1].address


def test_list_layout_reads_anywhere(tmp_path: Path) -> None:
    a, b = random_pairs(20, 4)
    out = tmp_path / "p"
    dask_cosim.to_parquet(pairs_frame(a, b, "fixed_size_list"), out, layout="list")
    plain = pd.read_parquet(out)  # the manifest starts with "_": readers skip it
    np.testing.assert_array_equal(np.stack(plain["embeds_a"].to_numpy()), a)
    plain_dask = dd.read_parquet(str(out)).compute()
    np.testing.assert_array_equal(np.stack(plain_dask["embeds_b"].to_numpy()), b)


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
    with pytest.raises(ValueError, match="part.00001.parquet holds 2-long float32 vectors but"):
        dask_cosim.to_parquet(mixed, out, overwrite=True, vectors=["embeds_a", "embeds_b"])
    assert [p.name for p in tmp_path.iterdir()] == ["p"]

    pdf2 = pdf.iloc[:10]
    dask_cosim.to_parquet(pdf2, out, overwrite=True)
    assert len(dask_cosim.read_parquet(out).compute()) == 10
    assert [p.name for p in tmp_path.iterdir()] == ["p"]


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
    assert not out.exists()
    manifest = job.compute()
    assert manifest["vectors"] == {} and manifest["rows"] == 20
    assert [f["path"] for f in manifest["files"]] == ["part.00001.parquet", "part.00002.parquet"]
    back = dask_cosim.read_parquet(out).compute()
    np.testing.assert_allclose(back["cos"].to_numpy(), reference(a, b)[10:], atol=1e-6)


def test_to_parquet_checks_arguments(tmp_path: Path) -> None:
    a, b = random_pairs(4, 3)
    pdf = pairs_frame(a, b, "fixed_size_list")
    with pytest.raises(ValueError, match=r"layout='csv'; use one of \('binary', 'list'\)"):
        dask_cosim.to_parquet(pdf, tmp_path / "x", layout="csv")
    with pytest.raises(KeyError, match=r"vector columns \['nope'\] not found"):
        dask_cosim.to_parquet(pdf, tmp_path / "x", vectors=["nope"])
    with pytest.raises(TypeError, match="expects a dask or pandas DataFrame, got list"):
        dask_cosim.to_parquet([1], tmp_path / "x")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- any Parquet


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
    monkeypatch.setattr(io, "_SPLIT_FILE_BYTES", 1)
    monkeypatch.setattr(io, "_TARGET_PARTITION_BYTES", 300)
    big = dask_cosim.read_parquet(tmp_path / "big.parquet")
    assert big.npartitions > 1
    got = big.cosim.pairwise("embeds_a", "embeds_b").compute().to_numpy()
    np.testing.assert_allclose(got, expected, atol=1e-6)
    half = dask_cosim.read_parquet(tmp_path / "big.parquet", filters=[("id", ">=", 45)])
    assert half.compute()["id"].tolist() == list(range(45, 90))


def test_read_parquet_hive_folders_and_missing_paths(tmp_path: Path) -> None:
    a, b = random_pairs(40, 3)
    pdf = pairs_frame(a, b, "fixed_size_list")
    pdf["group"] = np.repeat(["x", "y"], 20)
    pdf.to_parquet(tmp_path / "hive", partition_cols=["group"])
    df = dask_cosim.read_parquet(tmp_path / "hive")  # dask's reader: it knows key=value
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
    local = dask_cosim.read_parquet(f"file://{tmp_path / 'p'}")
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
    """"auto" maps our binary layout only: mapped pages count in a worker's memory."""
    a, b = random_pairs(50, 8)
    for layout in ("binary", "list"):
        dask_cosim.to_parquet(pairs_frame(a, b, "fixed_size_list"), tmp_path / layout,
                              layout=layout)  # fmt: skip
        schema = pq.read_schema(tmp_path / layout / "part.00000.parquet")
        with dask.config.set({"cosim.read.memory-map": setting}):
            mapped = io._memory_map(schema)
            back = dask_cosim.read_parquet(tmp_path / layout).compute()
        assert mapped == (layout == "binary" if setting == "auto" else setting)
        np.testing.assert_array_equal(np.stack(back["embeds_a"].to_numpy()), a)
    with dask.config.set({"cosim.read.memory-map": "yes"}):
        with pytest.raises(ValueError, match="cosim.read.memory-map='yes'; use 'auto', true or false"):
            dask_cosim.read_parquet(tmp_path / "list")
