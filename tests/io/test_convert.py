"""from_pandas: per-row vectors into dask without becoming text."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

import dask_cosim
from tests.helpers import pairs_frame, random_pairs, reference


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


def test_from_pandas_takes_its_arguments_in_dasks_order() -> None:
    """``from_pandas(pdf, 2, False)`` is dd.from_pandas's ``sort=False``; it failed,
    "Exactly one of npartitions and chunksize must be specified" (chunksize came second)."""
    import dask.dataframe as dd

    a, b = random_pairs(20, 3)
    pdf = pairs_frame(a, b, "object_numpy").iloc[::-1]
    ours, dasks = dask_cosim.from_pandas(pdf, 2, False), dd.from_pandas(pdf[["id"]], 2, False)
    assert ours.npartitions == dasks.npartitions == 2
    assert ours.compute().index.tolist() == dasks.compute().index.tolist() == pdf.index.tolist()


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

    cells = np.empty(3, dtype=object)  # pandas 2 would call __array__ on a list of tensors
    for i in range(3):
        cells[i] = torch.ones(4, dtype=torch.bfloat16)
    bf = pd.DataFrame({"v": cells})
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
    with pytest.raises(TypeError, match=r"from_pandas expects a pandas\.DataFrame, got list"):
        dask_cosim.from_pandas([1, 2])  # type: ignore[arg-type]


def test_from_pandas_keeps_columns_that_hold_no_vectors() -> None:
    """Lists of strings, mixed tuples and bytes stay object (bytes were decoded as text and
    failed), lists of strings after an empty one too (the empty one, first, made them
    vectors: "not a vector of numbers") and empty lists alone too (they became vectors of
    length 0); numbers beside a None or pd.NA are a vector (NaN there);
    a ragged column of numbers is refused with the way to keep it, which then works."""
    a, b = random_pairs(4, 3)
    pdf = pairs_frame(a, b, "object_numpy")
    extras = {
        "tags": [["news"], ["sport", "uk"], [], ["tech"]],
        "labels": [[], (), ["sport"], []],
        "pairs": [("p", 1), ("q", 2), ("r", 3), ("s", 4)],
        "sha": [bytes([i, 0x82, 0xFF]) for i in range(4)],
        "no_tags": [[], [], None, []],
    }
    ddf = dask_cosim.from_pandas(pdf.assign(**extras), npartitions=2)
    back = ddf.compute()
    for column, cells in extras.items():
        assert ddf.dtypes[column] == np.dtype(object), column
        assert back[column].tolist() == cells, column
    cos = ddf.cosim.pairwise("embeds_a", "embeds_b").compute()
    np.testing.assert_allclose(cos.to_numpy(), reference(a, b), atol=1e-6)

    for null in (None, pd.NA):  # pd.NA made the column one of objects
        nulls = dask_cosim.from_pandas(pdf.assign(v=[[0.5, null, 1.0]] * 4)).compute()["v"]
        assert isinstance(nulls.dtype, pd.ArrowDtype), null
        assert np.isnan(nulls.iloc[0][1]) and nulls.iloc[0][2] == 1.0

    tokens = pdf.assign(ids=[[101, 7592, 102], [101, 102], [101, 2088, 102], [101, 5, 102]])
    with pytest.raises(
        ValueError,
        match=r"row 1 has 2 values but row 0 has 3.*If 'ids' holds "
        r"no embeddings .*pd\.ArrowDtype\(pa\.list_\(pa\.int64\(\)\)\)",
    ):
        dask_cosim.from_pandas(tokens)
    # Floats with an empty row: an embedding with a placeholder, told to store null, not
    # to cast to integers (which would make its values 0).
    empty = pdf.assign(v=[[0.5, 1.5], [0.5, 1.5], [], [1.0, 2.0]])
    with pytest.raises(ValueError, match=r"store null") as raised:
        dask_cosim.from_pandas(empty)
    assert "no embeddings" not in str(raised.value)
    tokens["ids"] = tokens["ids"].astype(pd.ArrowDtype(pa.list_(pa.int64())))
    assert dask_cosim.from_pandas(tokens).compute()["ids"].iloc[1] == [101, 102]
