"""read_parquet of hive-partitioned folders (``key=value/`` subfolders): rows numbered
across the folder as pandas numbers them, with known divisions; the keys as the
categoricals dask's reader gives; filters on keys pruning whole folders; columns; a
stored index kept; searches that name rows."""

from __future__ import annotations

import warnings
from pathlib import Path

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import dask_cosim
from dask_cosim import io
from tests.helpers import no_computes

N, D = 60, 4


def source(n: int = N) -> pd.DataFrame:
    rng = np.random.default_rng(5)
    return pd.DataFrame(
        {
            "id": np.arange(n) * 7,
            "year": np.tile([2019, 2021, 2020], n // 3),
            "lang": np.repeat(["fr", "en", "de", "en"], n // 4),
            "emb": io.vectors_to_arrow(rng.standard_normal((n, D)).astype(np.float32)),
        }
    )


def hive_folder(folder: Path, pdf: pd.DataFrame) -> Path:
    """pdf written in two halves (up to two files per leaf folder) by plain pyarrow (no
    pandas metadata, as Spark writes), nested year=/lang=."""
    table = pa.Table.from_pandas(pdf, preserve_index=False).replace_schema_metadata(None)
    for i, half in enumerate((table.slice(0, len(pdf) // 2), table.slice(len(pdf) // 2))):
        pq.write_to_dataset(
            half, folder, partition_cols=["year", "lang"], basename_template=f"p{i}-{{i}}.parquet"
        )
    return folder


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return hive_folder(tmp_path / "hive", source())


def test_rows_are_numbered_across_the_folder_as_pandas_numbers_them(folder: Path) -> None:
    with no_computes():  # the divisions come from the footers
        df = dask_cosim.read_parquet(folder)
    assert df.npartitions == len(list(folder.rglob("*.parquet"))) > 9 and df.known_divisions
    got = df.compute()
    want = pd.read_parquet(folder)
    starts = np.cumsum([0, *df.map_partitions(len).compute()])
    assert got.index.is_unique and df.divisions == (*starts[:-1], N - 1)
    pd.testing.assert_frame_equal(got.drop(columns="emb"), want.drop(columns="emb"))
    np.testing.assert_array_equal(np.stack(got["emb"].to_numpy()), np.stack(want["emb"]))
    # The keys are the categoricals of dask's reader (all values, sorted: known).
    theirs = dd.read_parquet(folder).dtypes.drop("emb")  # (vectors: object columns there)
    assert df.dtypes.drop("emb").to_dict() == theirs.to_dict()
    assert list(got["year"].cat.categories) == [2019, 2020, 2021]
    assert df["lang"].cat.known


def test_filters_on_keys_prune_folders_and_keep_labels(folder: Path) -> None:
    whole = dask_cosim.read_parquet(folder).compute()
    paths = [p.relative_to(folder).as_posix() for p in folder.rglob("*.parquet")]
    for filters, rows, in_folders in (
        ([("lang", "==", "en")], whole["lang"] == "en", ["lang=en"]),
        (
            [("year", "in", [2019, 2020]), ("id", ">", 100)],
            whole["year"].isin([2019, 2020]) & (whole["id"] > 100),
            ["year=2019", "year=2020"],
        ),
        (
            [[("lang", "==", "de")], [("year", "==", 2021)]],
            (whole["lang"] == "de") | (whole["year"] == 2021),
            ["lang=de", "year=2021"],
        ),
        (pc.field("lang") == "fr", whole["lang"] == "fr", ["lang=fr"]),
    ):
        df = dask_cosim.read_parquet(folder, filters=filters)
        # Only the files in the folders the filter names are read (id > 100: all of them).
        files = sum(any(f"{name}/" in p for name in in_folders) for p in paths)
        assert df.npartitions == files < len(paths) and df.known_divisions, filters
        pd.testing.assert_frame_equal(
            df.compute().drop(columns="emb"), whole[rows].drop(columns="emb")
        )
        # A key a filter compares need not be read: columns= and dask's projection.
        ids = dask_cosim.read_parquet(folder, columns=["id"], filters=filters).compute()
        pd.testing.assert_frame_equal(ids, whole.loc[rows, ["id"]])
        pd.testing.assert_series_equal(df["id"].compute(), whole.loc[rows, "id"])
    nothing = dask_cosim.read_parquet(folder, filters=[("lang", "==", "xx")])
    assert len(nothing.compute()) == 0


def test_columns_may_name_keys_in_any_order(folder: Path) -> None:
    whole = dask_cosim.read_parquet(folder).compute()
    for columns in (["lang", "id"], ["year"], ["emb", "year", "lang"]):
        df = dask_cosim.read_parquet(folder, columns=columns)
        assert list(df.columns) == list(dd.read_parquet(folder, columns=columns).columns)
        got = df.compute()
        assert list(got.columns) == columns
        pd.testing.assert_frame_equal(
            got.drop(columns="emb", errors="ignore"),
            whole[columns].drop(columns="emb", errors="ignore"),
        )
    assert (dask_cosim.read_parquet(folder)["lang"].compute() == whole["lang"]).all()


def test_a_stored_index_stays_the_label(tmp_path: Path) -> None:
    pdf = source().drop(columns="emb")
    named = pdf.set_index(pd.Index([f"doc {i}" for i in range(N)], name="doc"))
    named.to_parquet(tmp_path / "pandas", partition_cols=["lang"])
    df = dask_cosim.read_parquet(tmp_path / "pandas")
    assert not df.known_divisions
    pd.testing.assert_frame_equal(
        df.compute(), pd.read_parquet(tmp_path / "pandas"), check_index_type=False
    )
    # dask's partition_on: the index it stored unnamed comes back unnamed, as in its reader.
    dd.from_pandas(pdf, npartitions=3).to_parquet(tmp_path / "dask", partition_on=["lang"])
    ours = dask_cosim.read_parquet(tmp_path / "dask", filters=[("lang", "!=", "fr")])
    theirs = dd.read_parquet(tmp_path / "dask", filters=[("lang", "!=", "fr")])
    assert ours.dtypes.to_dict() == theirs.dtypes.to_dict()
    pd.testing.assert_frame_equal(ours.compute().sort_index(), theirs.compute().sort_index())


def test_files_are_in_natural_order_and_hidden_names_skipped(tmp_path: Path) -> None:
    """year=9 before year=10, part.2 before part.10, as in a flat folder (pandas sorts
    them as text); "_" and "." names at any depth are not data, as in pyarrow."""
    for year in (10, 9):
        for part in (10, 2):
            where = tmp_path / "h" / f"year={year}"
            where.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({"id": [year * 100 + part]}), where / f"part.{part}.parquet")
    (tmp_path / "h" / "_SUCCESS").write_bytes(b"")
    (tmp_path / "h" / "year=9" / "_temporary").mkdir()
    pq.write_table(pa.table({"id": [-1]}), tmp_path / "h" / "year=9" / "_temporary" / "x.parquet")
    got = dask_cosim.read_parquet(tmp_path / "h").compute()
    assert got["id"].tolist() == [902, 910, 1002, 1010] and got.index.tolist() == [0, 1, 2, 3]
    assert got["year"].dtype == pd.CategoricalDtype(pd.Index([9, 10], dtype="int32"))


def test_null_keys_plain_subfolders_and_keys_the_files_hold(tmp_path: Path) -> None:
    """A null key (__HIVE_DEFAULT_PARTITION__) reads as NaN (pandas and dask's reader
    refuse such folders); subfolders that name no key are read like one folder; a key
    the files also hold as a column is read from the files."""
    table = pa.table({"id": np.arange(6), "lang": ["en", None, "de", "en", None, "fr"]})
    pq.write_to_dataset(table, tmp_path / "nulls", partition_cols=["lang"])
    got = dask_cosim.read_parquet(tmp_path / "nulls").compute()
    assert got["lang"].isna().tolist() == [True, True, False, False, False, False]
    assert list(got["lang"].cat.categories) == ["de", "en", "fr"]
    assert got.index.tolist() == list(range(6)) and got["id"].tolist() == [1, 4, 2, 0, 3, 5]
    for sub, ids in (("a", [0, 1]), ("b", [2])):
        (tmp_path / "plain" / sub).mkdir(parents=True)
        pq.write_table(pa.table({"id": ids}), tmp_path / "plain" / sub / "x.parquet")
    plain = dask_cosim.read_parquet(tmp_path / "plain")
    assert plain.divisions == (0, 2, 2) and plain.compute()["id"].tolist() == [0, 1, 2]
    (tmp_path / "held" / "lang=en").mkdir(parents=True)
    pq.write_table(table.slice(0, 1), tmp_path / "held" / "lang=en" / "x.parquet")
    assert dask_cosim.read_parquet(tmp_path / "held").columns.tolist() == ["id", "lang"]
    # The first file holding the key as no value (Arrow null: pandas' all-None column).
    for value, held in (("__HIVE_DEFAULT_PARTITION__", pa.nulls(1)), ("en", pa.array(["en"]))):
        (tmp_path / "nulls_held" / f"lang={value}").mkdir(parents=True)
        rows = pa.table({"id": [len(value)], "lang": held})
        pq.write_table(rows, tmp_path / "nulls_held" / f"lang={value}" / "x.parquet")
    got = dask_cosim.read_parquet(tmp_path / "nulls_held").compute()
    assert got["lang"].isna().tolist() == [True, False] and got["lang"].iloc[1] == "en"


@pytest.mark.parametrize(
    "stored", [pa.int64(), pa.float64(), pa.string(), pa.dictionary(pa.int8(), pa.string())]
)
def test_keys_the_files_hold_with_a_type_of_their_own(tmp_path: Path, stored: pa.DataType) -> None:
    """polars' partition_by keeps the key in each file (year=2020/ holding year as
    int64): pyarrow's discovery, which types the folder names' numbers as int32, failed
    ("Unable to merge: Field year has incompatible types: int64 vs int32").  The key is
    read from the files, with their type."""
    rng = np.random.default_rng(2)
    tables = []
    for year in (2020, 2021):
        number = pa.types.is_integer(stored) or pa.types.is_floating(stored)
        years = pa.array([year] * 3, stored) if number else pa.array([str(year)] * 3).cast(stored)
        emb = io.vectors_to_arrow(rng.standard_normal((3, D)).astype(np.float32))
        tables.append(pa.table({"year": years, "emb": emb}))
        (tmp_path / "polars" / f"year={year}").mkdir(parents=True)
        pq.write_table(tables[-1], tmp_path / "polars" / f"year={year}" / "00000000.parquet")
    df = dask_cosim.read_parquet(tmp_path / "polars")
    got = df.compute()
    want = pa.concat_tables(tables).to_pandas()["year"]
    assert got.columns.tolist() == ["year", "emb"]
    assert got["year"].astype(str).tolist() == want.astype(str).tolist()
    one = dask_cosim.read_parquet(tmp_path / "polars", filters=[("year", "==", want[3])])
    assert one.compute()["year"].astype(str).tolist() == want[3:].astype(str).tolist()
    assert len(df.cosim.neighbors("emb", threshold=-1.0).compute()) == 15  # each pair once


def test_describe_and_search_a_hive_folder(folder: Path) -> None:
    described = io.describe_parquet(folder)
    files = len(list(folder.rglob("*.parquet")))
    assert described["rows"] == N and described["files"] == described["partitions"] == files
    assert described["columns"]["lang"] == {"dtype": "category"}
    assert described["columns"]["emb"] == {
        "dtype": described["columns"]["emb"]["dtype"],
        "dim": D,
        "values": "float32",
    }
    df = dask_cosim.read_parquet(folder)
    whole = df.compute()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # labels are unique: nothing to warn about
        top = df.cosim.topk(np.stack(whole["emb"].to_numpy()[:3]), "emb", k=1)
    assert whole.loc[top["match"], "id"].tolist() == whole["id"].iloc[:3].tolist()
