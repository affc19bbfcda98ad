"""backends: the dtype checks, zero-copy views, null and chunk handling, results and
Arrow round trips of the pandas registrations (the cudf ones are in tests/test_gpu.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

from dask_cosim import backends


def _arrow_series(array: pa.Array | pa.ChunkedArray, index: pd.Index | None = None) -> pd.Series:
    return pd.Series(pd.arrays.ArrowExtensionArray(array), index=index)


@pytest.mark.parametrize(
    ("arrow_type", "spec"),
    [
        (pa.list_(pa.float32(), 4), backends.VectorSpec(4, np.dtype(np.float32))),
        (pa.list_(pa.float64()), backends.VectorSpec(None, np.dtype(np.float64))),
        (pa.large_list(pa.float16()), backends.VectorSpec(None, np.dtype(np.float16))),
        (pa.list_(pa.int8(), 3), backends.VectorSpec(3, np.dtype(np.int8))),
        (pa.list_view(pa.float32()), backends.VectorSpec(None, np.dtype(np.float32))),
        (pa.large_list_view(pa.float64()), backends.VectorSpec(None, np.dtype(np.float64))),
    ],
)
def test_vector_spec_reads_the_dtype_only(
    arrow_type: pa.DataType, spec: backends.VectorSpec
) -> None:
    meta = pd.Series([], dtype=pd.ArrowDtype(arrow_type))
    assert backends.vector_spec(meta, "v") == spec
    assert backends.vector_spec(pd.Series([], dtype=object), "v") == backends.VectorSpec(None, None)


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        (pd.Series([], dtype=pd.ArrowDtype(pa.string())), "column 'v' holds strings"),
        (pd.Series([], dtype="string"), "column 'v' holds strings"),
        (
            pd.Series([], dtype="float64"),
            "column 'v' has dtype float64, which is not a column of vectors",
        ),
        (
            pd.Series([], dtype=pd.ArrowDtype(pa.list_(pa.list_(pa.float32())))),
            "column 'v' holds nested lists",
        ),
        (
            pd.Series([], dtype=pd.ArrowDtype(pa.list_(pa.string()))),
            "which is not a column of vectors",
        ),
    ],
)
def test_vector_spec_says_what_is_wrong(meta: pd.Series, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        backends.vector_spec(meta, "v")


def test_fixed_size_list_is_a_zero_copy_view_even_when_sliced() -> None:
    values = np.arange(40, dtype=np.float32).reshape(10, 4)
    array = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), 4).slice(3, 5)
    vectors = backends.to_vectors(_arrow_series(array), "v")
    assert vectors.length == 5 and vectors.dim == 4 and vectors.null is None
    (block,) = vectors.blocks
    np.testing.assert_array_equal(block.numpy(), values[3:8])
    # The tensor reads the Arrow buffer itself: no copy was made.
    buffer = array.values.buffers()[1]
    assert block.data_ptr() == buffer.address + (3 * 4) * 4


def test_one_block_per_chunk_and_nulls_kept_in_place() -> None:
    first = pa.array([[1.0, 0.0], None], type=pa.list_(pa.float64(), 2))
    second = pa.array([[0.0, 2.0]], type=pa.list_(pa.float64(), 2))
    s = _arrow_series(pa.chunked_array([first, second]), index=pd.Index([10, 11, 12]))
    vectors = backends.to_vectors(s, "v")
    assert [tuple(b.shape) for b in vectors.blocks] == [(2, 2), (1, 2)]
    assert vectors.null.tolist() == [False, True, False]
    assert vectors.blocks[0].dtype == torch.float64


def test_variable_lists_with_empty_null_rows_and_ragged_rows() -> None:
    s = _arrow_series(pa.array([[1.0, 2.0], None, [3.0, 4.0]], type=pa.list_(pa.float32())))
    vectors = backends.to_vectors(s, "v")
    np.testing.assert_array_equal(vectors.blocks[0].numpy(), [[1, 2], [0, 0], [3, 4]])
    assert vectors.null.tolist() == [False, True, False]
    ragged = _arrow_series(
        pa.array([[1.0, 2.0], [3.0]], type=pa.list_(pa.float32())), pd.Index(["x", "y"])
    )
    with pytest.raises(ValueError, match="column 'v': row 'y' has 1 values but row 'x' has 2"):
        backends.to_vectors(ragged, "v")


def test_a_ragged_row_is_named_against_the_most_common_length() -> None:
    """A column whose first row is the odd one named the second row as odd ("row 1 has 3
    values but row 0 has 4"): a partition, or a range of rows a search cut, may start at
    the odd row.  On a tie the earliest row's length counts as the common one."""
    rows = [[1.0, 2.0, 3.0, 4.0], None, [1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]
    arrow = _arrow_series(pa.array(rows, type=pa.list_(pa.float32())))
    objects = pd.Series([None if r is None else np.array(r) for r in rows])
    for s in (arrow, objects):
        with pytest.raises(ValueError, match=r"^column 'v': row 0 has 4 values but row 2 has 3"):
            backends.to_vectors(s, "v")
        with pytest.raises(ValueError, match=r"^column 'v': row 2 has 3 values but row 0 has 4"):
            backends.to_vectors(s.iloc[:3], "v")


@pytest.mark.parametrize("view", [pa.ListViewArray, pa.LargeListViewArray])
def test_list_views_in_any_order_with_null_rows_and_ragged_rows(view: Any) -> None:
    """Arrow's list views (each row its own offset and size): rows in order read as a
    strided view; rows out of order, sharing values or with null rows of another size
    are gathered; ragged rows name the row."""
    values = pa.array(np.arange(8, dtype=np.float32))
    in_order = view.from_arrays(pa.array([0, 2, 4]), pa.array([2, 2, 2]), values)
    (block,) = backends.to_vectors(_arrow_series(in_order), "v").blocks
    np.testing.assert_array_equal(block.numpy(), [[0, 1], [2, 3], [4, 5]])
    assert block.data_ptr() == values.buffers()[1].address  # no copy
    mask = pa.array([False, True, False, False])
    shuffled = view.from_arrays(pa.array([6, 0, 0, 2]), pa.array([2, 0, 2, 2]), values, mask=mask)
    vectors = backends.to_vectors(_arrow_series(shuffled, pd.Index(list("wxyz"))), "v")
    np.testing.assert_array_equal(vectors.blocks[0].numpy(), [[6, 7], [0, 0], [0, 1], [2, 3]])
    assert vectors.null.tolist() == [False, True, False, False]
    ragged = view.from_arrays(pa.array([0, 2]), pa.array([2, 3]), values)
    with pytest.raises(ValueError, match="column 'v': row 1 has 3 values but row 0 has 2"):
        backends.to_vectors(_arrow_series(ragged), "v")


def test_a_list_null_row_of_another_length_does_not_shift_the_rows() -> None:
    """A null list row may hold values (Arrow allows any length): the rows after it are
    still read from their own offsets, not from a stride that the lengths happen to sum
    to."""
    values = pa.array(np.arange(8, dtype=np.float32))
    offsets = pa.array([0, 2, 2, 6, 8], pa.int32())  # row 1 null with 0 values, row 2 with 4
    lists = pa.ListArray.from_arrays(offsets, values, mask=pa.array([False, True, True, False]))
    vectors = backends.to_vectors(_arrow_series(lists), "v")
    np.testing.assert_array_equal(vectors.blocks[0].numpy(), [[0, 1], [0, 0], [0, 0], [6, 7]])
    assert vectors.null.tolist() == [False, True, True, False]


def test_a_null_inside_a_vector_becomes_nan() -> None:
    s = _arrow_series(pa.array([[1.0, None]], type=pa.list_(pa.float32(), 2)))
    (block,) = backends.to_vectors(s, "v").blocks
    assert np.isnan(block.numpy()[0, 1]) and block.numpy()[0, 0] == 1


def test_object_columns_stack_tensors_as_torch_and_arrays_as_numpy() -> None:
    tensors = np.empty(2, dtype=object)
    tensors[:] = [torch.ones(3, 1), torch.zeros(3, 1)]
    stacked, null = backends.stack_object_column(tensors, pd.RangeIndex(2), "v")
    assert isinstance(stacked, torch.Tensor) and tuple(stacked.shape) == (2, 3) and null is None
    mixed = np.empty(3, dtype=object)
    mixed[:] = [np.ones(3), None, [1, 2, 3]]
    stacked, null = backends.stack_object_column(mixed, pd.RangeIndex(3), "v")
    assert isinstance(stacked, np.ndarray) and null.tolist() == [False, True, False]
    np.testing.assert_array_equal(stacked[1], 0)
    bad = np.empty(2, dtype=object)
    bad[:] = [np.ones(3), "text"]
    with pytest.raises(
        TypeError, match="column 'v': row 1 holds str 'text', not a vector of numbers"
    ):
        backends.stack_object_column(bad, pd.RangeIndex(2), "v")


def test_sparse_tensor_cells_are_read_dense() -> None:
    """Sparse tensor cells beside numpy arrays are stacked dense, and an eager frame of
    them has a token (for graph keys) that depends on their values, as dense cells do;
    both raised torch's own RuntimeError, naming no column or row."""
    x = torch.tensor([[1.0, 0.0, 2.0], [0.0, 0.0, 3.0]])
    mixed = np.empty(2, dtype=object)
    mixed[0], mixed[1] = x[0].numpy(), x[1].to_sparse()  # cell by cell: no __array__
    stacked, null = backends.stack_object_column(mixed, pd.RangeIndex(2), "v")
    assert null is None
    np.testing.assert_array_equal(stacked, x.numpy())

    def token(rows: torch.Tensor) -> str:
        return backends.data_token(pd.DataFrame({"v": [r.to_sparse() for r in rows]}))

    assert token(x) == token(x.clone()) != token(x * 2)
    assert token(x) != backends.data_token(pd.DataFrame({"v": list(x)}))


def test_make_result_masks_null_rows_and_keeps_the_index() -> None:
    like = pd.Series([0, 0, 0], index=pd.Index(["a", "b", "c"]))
    out = backends.make_result(
        like, torch.tensor([0.5, 0.25, 1.0]), np.array([False, True, False]), "cos"
    )
    assert out.name == "cos" and list(out.index) == ["a", "b", "c"]
    assert out.dtype == np.float32 and np.isnan(out["b"]) and out["c"] == 1.0


def test_frame_from_arrow_keeps_vectors_as_arrow_lists_and_restores_the_index() -> None:
    pdf = pd.DataFrame(
        {
            "v": pd.arrays.ArrowExtensionArray(
                pa.array([[1.0, 2.0]], type=pa.list_(pa.float32(), 2))
            ),
            "x": [1],
        },
        index=pd.Index([7], name="id"),
    )
    back = backends.frame_from_arrow(pa.Table.from_pandas(pdf))
    assert back["v"].dtype == pd.ArrowDtype(pa.list_(pa.float32(), 2))
    assert back.index.name == "id" and back.index[0] == 7
    assert backends.arrow_vector_types(pa.int64()) is None


def test_row_label_gives_plain_python_values() -> None:
    label = backends.row_label(pd.Index(np.array([5, 6], dtype=np.int64)), 1)
    assert label == 6 and type(label) is int
    # A MultiIndex's label: each level's value (messages showed "('y', np.int64(2))").
    label = backends.row_label(pd.MultiIndex.from_tuples([("x", 1), ("y", 2)]), 1)
    assert label == ("y", 2) and [type(v) for v in label] == [str, int]
    assert repr(label) == "('y', 2)"
