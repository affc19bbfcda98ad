"""Vector columns some partitions of which cannot tell D (no rows, or only null ones, of a
variable list): every layout writes the folder, and every reader the layout promises
reads it back whole, nulls as nulls, with the D of the other partitions where one has it."""

from __future__ import annotations

from pathlib import Path

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dask_cosim
from dask_cosim import io
from tests.helpers import READERS, assert_same

D = 4
LISTS = pd.ArrowDtype(pa.list_(pa.float32()))


def frame(nulls: int, n: int = 24, dtype: pd.ArrowDtype = LISTS) -> pd.DataFrame:
    """id, emb (``dtype``; its first ``nulls`` rows null, the others D-long), text."""
    x = np.arange(n * D, dtype=np.float32).reshape(n, D)
    rows = [None if i < nulls else x[i].tolist() for i in range(n)]
    text = pd.array([f"row {i}" for i in range(n)], dtype="str")
    return pd.DataFrame({"id": np.arange(n), "emb": pd.array(rows, dtype=dtype), "text": text})


def check(df: dd.DataFrame, folder: Path, layout: str, dim: int | None) -> None:
    """``df`` written in ``layout`` reads back whole in every reader the layout promises,
    each file storing the vectors D-long (``dim``), or as variable lists (None)."""
    want = df.compute()
    with dask.config.set(scheduler="sync"):
        manifest = dask_cosim.to_parquet(df, folder, layout=layout)
    readers = READERS if layout == "list" else {"dask_cosim": READERS["dask_cosim"]}
    for reader, read in readers.items():
        assert_same(read(folder), want, reader)
    back = dask_cosim.read_parquet(folder)
    got = back.compute()
    assert back._meta.dtypes.equals(got.dtypes)
    assert got["emb"].isna().tolist() == want["emb"].isna().tolist()
    files = sorted(folder.glob("*.parquet"))
    stored = {pq.read_schema(f).field("emb").type for f in files}
    if dim is None:
        assert len(stored) == 1 and pa.types.is_list(t := stored.pop())
        assert t.value_type == pa.float32()
        assert pa.types.is_list(got["emb"].dtype.pyarrow_dtype)
    else:
        assert len(stored) == 1  # one schema: each reader of a folder takes one file's
        assert got["emb"].dtype == pd.ArrowDtype(pa.list_(pa.float32(), dim))
        assert manifest["vectors"]["emb"] == {"dim": dim, "dtype": "float32"}


@pytest.mark.parametrize("layout", ["binary", "list"])
@pytest.mark.parametrize("nulls", [12, 20], ids=["first partition null", "first two null"])
def test_a_partition_of_null_vectors_takes_the_d_of_the_others(
    tmp_path: Path, layout: str, nulls: int
) -> None:
    """The binary layout failed ("Invalid FIXED_LEN_BYTE_ARRAY length: 0"); the list layout
    wrote fixed_size_list<0> beside <4>, which read back as objects."""
    pdf = frame(nulls)
    check(dd.from_pandas(pdf, npartitions=2, sort=False), tmp_path / "out", layout, D)
    check(dd.from_pandas(pdf, npartitions=3, sort=False), tmp_path / "out3", layout, D)


@pytest.mark.parametrize("layout", ["binary", "list"])
@pytest.mark.parametrize("rows", [0, 5], ids=["no rows", "null rows"])
def test_vectors_without_a_d_anywhere_stay_variable_lists(
    tmp_path: Path, layout: str, rows: int
) -> None:
    """No partition tells D: the nulls, which need none, are stored as variable lists."""
    pdf = frame(rows, n=rows)
    check(dd.from_pandas(pdf, npartitions=2, sort=False), tmp_path / "out", layout, None)
    check(dd.from_pandas(pdf, npartitions=1), tmp_path / "one", layout, None)


@pytest.mark.parametrize("layout", ["binary", "list"])
def test_null_partitions_of_fixed_size_lists_keep_their_d(tmp_path: Path, layout: str) -> None:
    pdf = frame(12, dtype=pd.ArrowDtype(pa.list_(pa.float32(), D)))
    check(dd.from_pandas(pdf, npartitions=2, sort=False), tmp_path / "out", layout, D)


@pytest.mark.parametrize("layout", ["binary", "list"])
def test_a_null_partition_rewritten_keeps_its_other_columns(tmp_path: Path, layout: str) -> None:
    """A null partition's file, rewritten with the folder's D, keeps its index, its
    categoricals (their recorded categories too) and its row groups."""
    pdf = frame(12).set_index(pd.Index(np.arange(24) * 3, name="key"))
    pdf["kind"] = pd.Categorical([1, 2, 3] * 8, categories=[3, 2, 1, 9], ordered=True)
    pdf["tag"] = pd.Categorical(["a", "b"] * 12, categories=["b", "a"])
    df = dd.from_pandas(pdf, npartitions=2, sort=False)
    with dask.config.set(scheduler="sync"):
        dask_cosim.to_parquet(df, tmp_path / "out", layout=layout, row_group_rows=5)
    back = dask_cosim.read_parquet(tmp_path / "out")
    assert back.divisions == (0, 36, 69)
    got = back.compute()
    want = df.compute()  # (the strings as dask gives them)
    pd.testing.assert_frame_equal(got.drop(columns="emb"), want.drop(columns="emb"))
    assert got["emb"].isna().sum() == 12
    first = pq.ParquetFile(sorted((tmp_path / "out").glob("*.parquet"))[0])
    assert first.metadata.num_row_groups == 3


def test_prepare_of_normalised_variable_lists_writes_and_reads_back(tmp_path: Path) -> None:
    """prepare's ``emb.cosim.unit`` of rows already of norm 1 is null in every row, and a
    variable list when the vectors are: no partition tells its D."""
    x = np.eye(D, dtype=np.float32)[np.arange(24) % D]
    pdf = pd.DataFrame({"id": np.arange(24), "emb": pd.array(x.tolist(), dtype=LISTS)})
    prepared = dd.from_pandas(pdf, npartitions=2, sort=False).cosim.prepare("emb")
    want = prepared.compute()
    assert want["emb.cosim.unit"].isna().all()
    for layout in io.LAYOUTS:
        with dask.config.set(scheduler="sync"):
            dask_cosim.to_parquet(prepared, tmp_path / layout, layout=layout)
        back = dask_cosim.read_parquet(tmp_path / layout)
        got = back.compute()
        assert back._meta.dtypes.equals(got.dtypes)
        assert_same(got, want, layout, vectors=("emb", "emb.cosim.unit"))
        assert got["emb.cosim.unit"].isna().all()
        found = back.cosim.topk(x[:2], "emb", k=3)
        assert (found["score"] > 0.99).all()
