"""partition.pairwise_partition on small pandas frames with known answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

from dask_cosim.partition import pairwise_partition
from tests.helpers import FORMATS, pairs_frame, random_pairs, reference

OPTS = {"eps": 1e-8}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_every_format_and_dtype(fmt: str, dtype: type) -> None:
    a, b = random_pairs(37, 300, dtype=dtype)
    index = pd.Index([f"r{i}" for i in range(37)], name="key")
    df = pairs_frame(a, b, fmt, index=index)
    res = pairwise_partition(df, "embeds_a", "embeds_b", name="cos", **OPTS)
    assert isinstance(res, pd.Series) and res.name == "cos"
    assert res.index.equals(index)
    # Eagerly, object columns report their real dtype; Python floats are float64.
    both64 = dtype == np.float64 or fmt == "object_lists"
    assert res.dtype == (np.float64 if both64 else np.float32)
    np.testing.assert_allclose(res.to_numpy(), reference(a, b), atol=1e-6)


@pytest.mark.parametrize("fmt", FORMATS)
def test_null_rows_give_nan(fmt: str) -> None:
    a, b = random_pairs(6, 5)
    null_a = np.array([0, 1, 0, 0, 0, 1], bool)
    null_b = np.array([0, 0, 0, 1, 0, 1], bool)
    df = pairs_frame(a, b, fmt, null_a=null_a, null_b=null_b)
    res = pairwise_partition(df, "embeds_a", "embeds_b", **OPTS).to_numpy()
    expected = reference(a, b)
    expected[null_a | null_b] = np.nan
    np.testing.assert_allclose(res, expected, atol=1e-6)


def test_requested_dtype() -> None:
    a, b = random_pairs(5, 7)
    df = pairs_frame(a, b, "fixed_size_list")
    res = pairwise_partition(df, "embeds_a", "embeds_b", dtype="float64", **OPTS)
    assert res.dtype == np.float64
    np.testing.assert_allclose(res.to_numpy(), reference(a, b), atol=1e-12)
    with pytest.raises(
        ValueError, match="dtype='int8' is not supported; use 'float32' or 'float64'"
    ):
        pairwise_partition(df, "embeds_a", "embeds_b", dtype="int8", **OPTS)


def test_arrow_chunks_and_slices_not_aligned() -> None:
    """Columns made of several Arrow chunks, cut at different rows, and sliced."""
    a, b = random_pairs(50, 8)
    t = pa.list_(pa.float32(), 8)
    ca = pa.chunked_array(
        [pa.array(list(a[:10]), t), pa.array(list(a[10:33]), t), pa.array(list(a[33:]), t)]
    )
    cb = pa.chunked_array([pa.array(list(b[:25]), t), pa.array(list(b[25:]), t)])
    df = pd.DataFrame(
        {"a": pd.arrays.ArrowExtensionArray(ca), "b": pd.arrays.ArrowExtensionArray(cb)}
    )
    res = pairwise_partition(df, "a", "b", **OPTS)
    np.testing.assert_allclose(res.to_numpy(), reference(a, b), atol=1e-6)
    part = df.iloc[7:41]
    res = pairwise_partition(part, "a", "b", **OPTS)
    assert res.index.equals(part.index)
    np.testing.assert_allclose(res.to_numpy(), reference(a[7:41], b[7:41]), atol=1e-6)


def test_variable_list_with_empty_null_rows_and_null_values() -> None:
    a, b = random_pairs(4, 3)
    t = pa.list_(pa.float32())
    col_a = pa.array([list(a[0]), None, list(a[2]), list(a[3])], t)  # null row of length 0
    col_b = pa.array([list(b[0]), list(b[1]), [1.0, None, 2.0], list(b[3])], t)  # a null value
    df = pd.DataFrame(
        {"a": pd.array(col_a, dtype=pd.ArrowDtype(t)), "b": pd.array(col_b, dtype=pd.ArrowDtype(t))}
    )
    res = pairwise_partition(df, "a", "b", **OPTS).to_numpy()
    assert np.isnan(res[1]) and np.isnan(res[2])
    np.testing.assert_allclose(res[[0, 3]], reference(a, b)[[0, 3]], atol=1e-6)


def test_same_column_twice() -> None:
    a, _ = random_pairs(5, 4)
    a[2] = 0
    df = pairs_frame(a, a, "fixed_size_list")
    res = pairwise_partition(df, "embeds_a", "embeds_a", **OPTS).to_numpy()
    np.testing.assert_allclose(res, [1, 1, 0, 1, 1], atol=1e-6)


def test_empty_frame_one_row_and_d1() -> None:
    a, b = random_pairs(1, 1)
    for fmt in FORMATS:
        df = pairs_frame(a, b, fmt)
        assert pairwise_partition(df, "embeds_a", "embeds_b", **OPTS).tolist() == pytest.approx(
            [float(np.sign(a[0, 0] * b[0, 0]))]
        )
        empty = pairwise_partition(df.iloc[:0], "embeds_a", "embeds_b", **OPTS)
        assert len(empty) == 0 and empty.dtype == np.float32


def test_all_null_column_gives_all_nan() -> None:
    a, b = random_pairs(3, 4)
    df = pairs_frame(a, b, "list", null_a=np.ones(3, bool))
    res = pairwise_partition(df, "embeds_a", "embeds_b", **OPTS)
    assert res.isna().all() and len(res) == 3


@pytest.mark.parametrize("fmt", ["list", "object_numpy", "object_torch_300x1", "object_lists"])
def test_ragged_rows_name_the_row(fmt: str) -> None:
    a, b = random_pairs(5, 4)
    df = pairs_frame(a, b, fmt, index=pd.Index([10, 11, 12, 13, 14]))
    short = a[3][:3]
    cell = {
        "list": list(short),
        "object_numpy": short,
        "object_lists": list(short),
        "object_torch_300x1": torch.from_numpy(short).reshape(3, 1),
    }[fmt]
    if fmt == "list":
        rows = [list(r) for r in a]
        rows[3] = cell
        t = pa.list_(pa.float32())
        df["embeds_a"] = pd.array(pa.array(rows, t), dtype=pd.ArrowDtype(t))
    else:
        df.at[13, "embeds_a"] = cell
    with pytest.raises(
        ValueError, match=r"column 'embeds_a': row 13 has 3 values but row 10 has 4"
    ):
        pairwise_partition(df, "embeds_a", "embeds_b", **OPTS)


def test_a_b_length_mismatch_names_the_row() -> None:
    a, _ = random_pairs(3, 4)
    _, b = random_pairs(3, 5)
    df = pd.DataFrame(
        {
            "a": pairs_frame(a, a, "list")["embeds_a"].array,
            "b": pairs_frame(b, b, "object_numpy")["embeds_b"].to_numpy(),
        },
        index=["x", "y", "z"],
    )
    df.loc["x", "a"] = None
    with pytest.raises(ValueError, match=r"row 'y': column 'a' has 4 values and column 'b' has 5"):
        pairwise_partition(df, "a", "b", **OPTS)


def test_non_numeric_cell_names_the_row() -> None:
    a, b = random_pairs(3, 4)
    df = pairs_frame(a, b, "object_numpy", index=pd.Index(["p", "q", "r"]))
    df.at["q", "embeds_b"] = "not a vector"
    with pytest.raises(
        TypeError, match=r"column 'embeds_b': row 'q' holds str 'not a vector', not a vector"
    ):
        pairwise_partition(df, "embeds_a", "embeds_b", **OPTS)


def test_bad_device() -> None:
    a, b = random_pairs(3, 4)
    df = pairs_frame(a, b, "fixed_size_list")
    with pytest.raises(ValueError, match="device='gpu7' is not a device"):
        pairwise_partition(df, "embeds_a", "embeds_b", device="gpu7", **OPTS)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="torch sees no CUDA device"):
            pairwise_partition(df, "embeds_a", "embeds_b", device="cuda", **OPTS)


def test_mixed_cell_kinds_and_grad_tensors() -> None:
    """Cells of different shapes/types take the checked path and agree with the fast one."""
    a, b = random_pairs(6, 4)
    cells = np.empty(6, dtype=object)
    cells[:] = [
        torch.from_numpy(a[0]).reshape(4, 1),
        a[1],
        list(a[2]),
        torch.from_numpy(a[3]),
        a[4].reshape(2, 2),
        a[5],
    ]
    grad = np.empty(6, dtype=object)
    for i, row in enumerate(b):  # item by item: numpy would call __array__ on a list
        grad[i] = torch.from_numpy(row.copy()).requires_grad_()
    df = pd.DataFrame({"a": cells, "b": grad})
    res = pairwise_partition(df, "a", "b", **OPTS)
    np.testing.assert_allclose(res.to_numpy(), reference(a, b), atol=1e-6)
