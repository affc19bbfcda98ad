"""The .cosim accessor on dask and pandas frames: lazy, meta-correct, every error early."""

from __future__ import annotations

import json
import os
from pathlib import Path

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from sklearn.metrics.pairwise import paired_cosine_distances

import dask_cosim
from tests.helpers import FORMATS, counting_computes, pairs_frame, random_pairs, reference


def dask_frame(
    fmt: str, n: int = 101, d: int = 300, npartitions: int = 7, dtype: type = np.float32
) -> tuple[dd.DataFrame, np.ndarray, np.ndarray]:
    a, b = random_pairs(n, d, dtype=dtype)
    pdf = pairs_frame(a, b, fmt, index=pd.Index(np.arange(n) * 10, name="key"))
    with dask.config.set({"dataframe.convert-string": False}):
        return dd.from_pandas(pdf, npartitions=npartitions), a, b


@pytest.mark.parametrize("npartitions", [1, 2, 7])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_on_dask_partitions(fmt: str, npartitions: int) -> None:
    ddf, a, b = dask_frame(fmt, npartitions=npartitions)
    cos = ddf.cosim.pairwise("embeds_a", "embeds_b")
    assert cos.npartitions == npartitions and cos.divisions == ddf.divisions
    result = cos.compute()
    assert result.index.equals(ddf.index.compute())
    np.testing.assert_allclose(result.to_numpy(), reference(a, b), atol=1e-6)
    np.testing.assert_allclose(result.to_numpy(), 1 - paired_cosine_distances(a, b), atol=1e-6)


def test_lazy_until_compute() -> None:
    ddf, _, _ = dask_frame("fixed_size_list")
    with counting_computes() as calls:
        cos = ddf.cosim.pairwise("embeds_a", "embeds_b")
        ddf["cos"] = cos
        assert calls == []
        cos.sum().compute()
    assert len(calls) == 1


def test_meta_name_dtype_and_float64_rule() -> None:
    ddf, _, _ = dask_frame("fixed_size_list")
    cos = ddf.cosim.pairwise("embeds_a", "embeds_b")
    assert isinstance(cos, dd.Series) and cos.name == "cos" and cos.dtype == np.float32
    assert cos._meta.index.name == "key"
    assert ddf.cosim.pairwise("embeds_a", "embeds_b", name="sim").name == "sim"
    assert ddf.cosim.pairwise("embeds_a", "embeds_b", dtype="float64").dtype == np.float64
    d64, a, b = dask_frame("fixed_size_list", dtype=np.float64)
    r64 = d64.cosim.pairwise("embeds_a", "embeds_b")
    assert r64.dtype == np.float64
    np.testing.assert_allclose(r64.compute().to_numpy(), reference(a, b), atol=1e-12)
    # Object columns cannot reveal their dtype from the meta: float32 unless asked.
    obj, _, _ = dask_frame("object_numpy", dtype=np.float64)
    r = obj.cosim.pairwise("embeds_a", "embeds_b")
    assert r.dtype == np.float32 and r.compute().dtype == np.float32
    with dask.config.set({"cosim.dtype": "float64"}):
        assert obj.cosim.pairwise("embeds_a", "embeds_b").compute().dtype == np.float64


def test_reductions_assign_and_persist() -> None:
    ddf, a, b = dask_frame("fixed_size_list", n=200)
    ref = reference(a, b)
    ddf["cos"] = ddf.cosim.pairwise("embeds_a", "embeds_b")
    assert ddf["cos"].mean().compute() == pytest.approx(ref.mean(), abs=1e-6)
    desc = ddf["cos"].describe().compute()
    assert desc["count"] == 200 and desc["max"] == pytest.approx(ref.max(), abs=1e-6)
    top = ddf.nlargest(5, "cos").compute()
    np.testing.assert_allclose(top["cos"].to_numpy(), np.sort(ref)[::-1][:5], atol=1e-6)
    assert (top["id"].to_numpy() == np.argsort(ref)[::-1][:5]).all()
    persisted = ddf.persist()
    assert persisted["cos"].sum().compute() == pytest.approx(ref.sum(), abs=1e-4)
    assigned = ddf.assign(other=ddf.cosim.pairwise("embeds_b", "embeds_a"))
    np.testing.assert_allclose(assigned["other"].compute().to_numpy(), ref, atol=1e-6)


def test_writes_to_parquet(tmp_path: object) -> None:
    ddf, a, b = dask_frame("fixed_size_list", npartitions=3)
    out = ddf[["id"]].assign(cos=ddf.cosim.pairwise("embeds_a", "embeds_b"))
    out.to_parquet(str(tmp_path))  # type: ignore[arg-type]
    back = pd.read_parquet(str(tmp_path)).sort_values("id")
    np.testing.assert_allclose(back["cos"].to_numpy(), reference(a, b), atol=1e-6)


def test_eager_pandas_frame() -> None:
    a, b = random_pairs(20, 300)
    pdf = pairs_frame(a, b, "object_torch_300x1")
    res = pdf.cosim.pairwise("embeds_a", "embeds_b")
    assert isinstance(res, pd.Series) and res.name == "cos"
    np.testing.assert_allclose(res.to_numpy(), reference(a, b), atol=1e-6)


@pytest.mark.parametrize("lazy", [True, False])
def test_errors_at_graph_build_time(lazy: bool) -> None:
    a, b = random_pairs(6, 4)
    pdf = pairs_frame(a, b, "fixed_size_list")
    pdf["text"] = ["x"] * 6
    pdf["score"] = np.linspace(0, 1, 6)
    t5 = pa.list_(pa.float32(), 5)
    pdf["five"] = pd.array(pa.array([[0.0] * 5] * 6, t5), dtype=pd.ArrowDtype(t5))
    frame = dd.from_pandas(pdf, npartitions=2) if lazy else pdf
    acc = frame.cosim
    with pytest.raises(
        KeyError,
        match=r"column 'embeds_c' not found; did you mean 'embeds_b'\? available: \['embeds_a', 'embeds_b', 'id', 'text', 'score', 'five'\]",
    ):
        acc.pairwise("embeds_a", "embeds_c")
    # No close name: the vector columns (by dtype) are the suggestion.
    with pytest.raises(
        KeyError,
        match=r"column 'embedding' not found; the vector columns are \['embeds_a', 'embeds_b', "
        r"'five'\]; available: \[",
    ):
        acc.pairwise("embedding", "embeds_b")
    with pytest.raises(
        TypeError,
        match="column 'id' has dtype int64, which is not a column of vectors; expected Arrow",
    ):
        acc.pairwise("id", "embeds_b")
    with pytest.raises(
        TypeError, match="column 'score' has dtype float64, which is not a column of vectors"
    ):
        acc.pairwise("embeds_a", "score")
    # Text is told it is text, and how to embed it (not the advice for stringified vectors).
    with pytest.raises(TypeError, match=r"column 'text' holds text \(\w+\) such as 'x'") as raised:
        acc.pairwise("text", "embeds_b")
    assert "SentenceTransformer" in str(raised.value)
    assert "from_pandas" not in str(raised.value)
    assert "vector columns: ['embeds_a', 'embeds_b', 'five']" in str(raised.value)
    with pytest.raises(
        ValueError, match="column 'embeds_a' holds vectors of 4 values and column 'five' of 5"
    ):
        acc.pairwise("embeds_a", "five")
    with pytest.raises(ValueError, match="eps=-1 must be a finite number >= 0"):
        acc.pairwise("embeds_a", "embeds_b", eps=-1)
    with pytest.raises(
        ValueError, match="device='tpu' is not a device; use 'auto', 'cpu', 'cuda' or 'cuda:N'"
    ):
        acc.pairwise("embeds_a", "embeds_b", device="tpu")
    with pytest.raises(ValueError, match="dtype='float16' is not supported"):
        acc.pairwise("embeds_a", "embeds_b", dtype="float16")
    # The columns themselves (a pandas habit) are told to be given by name.
    with pytest.raises(
        TypeError,
        match=r"^a= must name a column of the frame; got a Series: pass its name, a='embeds_a'$",
    ):
        acc.pairwise(frame["embeds_a"], "embeds_b")
    with pytest.raises(TypeError, match=r"^b= must name a column of the frame; got a list$"):
        acc.pairwise("embeds_a", ["embeds_b"])


def test_dd_from_pandas_string_trap_is_explained() -> None:
    """The usual recipe turns tensors into text; the accessor says so and names the fix."""
    a, b = random_pairs(4, 300)
    pdf = pairs_frame(a, b, "object_torch_300x1")
    with dask.config.set({"dataframe.convert-string": True}):
        ddf = dd.from_pandas(pdf, npartitions=2)
    with pytest.raises(
        TypeError,
        match=r"column 'embeds_a' holds strings .*convert-string.*dask_cosim.from_pandas\(pdf\)",
    ):
        ddf.cosim.pairwise("embeds_a", "embeds_b")
    # Filtered, the column is still the text in memory behind it, and named so.
    with pytest.raises(TypeError, match=r"column 'embeds_a' holds strings .*convert-string"):
        ddf[ddf["id"] >= 0].cosim.pairwise("embeds_a", "embeds_b")
    # dd.from_delayed turns them into text too: the message names it and the fix that
    # fits partitions of one's own (it named dd.from_pandas alone).
    parts = [dask.delayed(pdf.iloc.__getitem__)(slice(i, i + 2)) for i in (0, 2)]
    with dask.config.set({"dataframe.convert-string": True}):
        delayed = dd.from_delayed(parts, meta=pdf.iloc[:0])
    with pytest.raises(TypeError, match=r"dd.from_delayed.*dask_cosim.io.vectors_to_arrow"):
        delayed.cosim.pairwise("embeds_a", "embeds_b")


def test_a_column_parsed_from_text_is_not_judged_by_the_text() -> None:
    """Vectors as JSON text in a dd.from_pandas frame, parsed as the error advises
    (map(json.loads) with its meta): the check of the first cell read the text in
    memory behind the frame, not the parsed column, and raised the same error again."""
    a, b = random_pairs(4, 3)
    pdf = pd.DataFrame({c: [json.dumps(r.tolist()) for r in x] for c, x in (("a", a), ("b", b))})
    ddf = dd.from_pandas(pdf, npartitions=2)
    for c in "ab":
        ddf[c] = ddf[c].map(json.loads, meta=(c, object))
    cos = ddf.cosim.pairwise("a", "b").compute()
    np.testing.assert_allclose(cos.to_numpy(), reference(a, b), atol=1e-6)


def test_ragged_rows_fail_at_compute_naming_the_row() -> None:
    a, b = random_pairs(10, 4)
    rows = [list(r) for r in a]
    rows[6] = rows[6][:2]
    t = pa.list_(pa.float32())
    pdf = pd.DataFrame(
        {
            "a": pd.array(pa.array(rows, t), dtype=pd.ArrowDtype(t)),
            "b": pd.array(pa.array(list(b), t), dtype=pd.ArrowDtype(t)),
        },
        index=pd.Index(np.arange(10) + 100),
    )
    cos = dd.from_pandas(pdf, npartitions=3).cosim.pairwise("a", "b")
    with pytest.raises(ValueError, match="column 'a': row 106 has 2 values but row 104 has 4"):
        cos.compute()


def test_config_defaults_and_overrides() -> None:
    assert dask.config.get("cosim.eps") == 1e-8
    assert dask.config.get("cosim.device") == "auto"
    a = np.array([[1e-3, 0.0]], dtype=np.float32)
    b = np.array([[1e-3, 0.0]], dtype=np.float32)
    pdf = pairs_frame(a, b, "fixed_size_list")
    assert pdf.cosim.pairwise("embeds_a", "embeds_b").iloc[0] == pytest.approx(1.0)
    with dask.config.set({"cosim.eps": 1.0}):
        # Norms below eps are clamped: 1e-3 * 1e-3 / (1 * 1).
        assert pdf.cosim.pairwise("embeds_a", "embeds_b").iloc[0] == pytest.approx(1e-6)


def test_read_parquet_every_layout(tmp_path: object) -> None:
    import pyarrow.parquet as pq

    a, b = random_pairs(40, 16)
    base = str(tmp_path)
    for fmt in ("fixed_size_list", "list"):
        table = pa.Table.from_pandas(pairs_frame(a, b, fmt), preserve_index=False)
        folder = f"{base}/{fmt}"
        os.makedirs(folder)
        pq.write_table(table.slice(0, 25), f"{folder}/part0.parquet")
        pq.write_table(table.slice(25), f"{folder}/part1.parquet", row_group_size=5)
        ddf = dask_cosim.read_parquet(folder)
        assert isinstance(ddf.dtypes["embeds_a"], pd.ArrowDtype)
        assert ddf.dtypes["id"] == np.int64  # other columns keep their usual dtypes
        cos = ddf.cosim.pairwise("embeds_a", "embeds_b").compute()
        np.testing.assert_allclose(cos.to_numpy(), reference(a, b), atol=1e-6)
    # Files written by pandas/dask carry a dtype string pandas cannot parse back.
    dd.from_pandas(pairs_frame(a, b, "fixed_size_list"), npartitions=2).to_parquet(f"{base}/dask")
    ddf = dask_cosim.read_parquet(f"{base}/dask", columns=["embeds_a", "embeds_b"])
    assert list(ddf.columns) == ["embeds_a", "embeds_b"]
    np.testing.assert_allclose(
        ddf.cosim.pairwise("embeds_a", "embeds_b").compute().to_numpy(), reference(a, b), atol=1e-6
    )


def test_a_filtered_parquet_read_still_reads_only_the_columns_used(tmp_path: Path) -> None:
    """pairwise narrows its frame to the two columns only where dask pushes that into the
    graph (not on a frame in memory: tests/test_cluster.py); under a filter it does."""
    a, b = random_pairs(50, 4)
    pdf = pairs_frame(a, b, "fixed_size_list")
    pdf["text"] = ["some words"] * 50
    dd.from_pandas(pdf, npartitions=2).to_parquet(tmp_path)
    df = dask_cosim.read_parquet(tmp_path)
    cos = df[df["id"] >= 10].cosim.pairwise("embeds_a", "embeds_b")
    plan = cos.optimize(fuse=False).expr.walk()
    reads = [e for e in plan if type(e).__name__ == "FromMapProjectable"]
    assert len(reads) == 1 and sorted(reads[0].columns) == ["embeds_a", "embeds_b", "id"]
    np.testing.assert_allclose(cos.compute().to_numpy(), reference(a, b)[10:], atol=1e-6)
