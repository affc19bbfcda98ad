"""What the bad-input tables of ``pairwise`` share (tests/test_bad_input_values.py and
tests/test_bad_input_columns.py, and the two-frame and property tests beside them):
the rows ``A``, ``B`` and their labels, columns built cell by cell (Arrow fixed-size and
variable lists, numpy arrays, torch tensors, object cells), the records of a case
(``Case``, and what it gives: ``Result`` or ``Raises``) and the two runs every case
gets: ``check_eager`` through the eager pandas accessor, ``check_dask`` through
``dask_cosim.from_pandas(...).cosim.pairwise(...).compute()``, where the table also says
when the error comes: in ``from_pandas`` (object columns are stacked there), when the
graph is built (anything the metadata tells) or at compute time (what only the data
tells).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

import dask_cosim
from tests.helpers import no_computes, random_pairs

# --------------------------------------------------------------------------- columns

N, D = 6, 4
A, B = random_pairs(N, D, seed=5)
LABELS = pd.Index([f"r{i}" for i in range(N)], name="key")  # sorted: dask keeps the order


def cells(values: list[Any]) -> np.ndarray:
    """An object column, cell by cell (numpy would call __array__ on tensors and lists)."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def fixed(x: np.ndarray, null: Sequence[int] = ()) -> pd.arrays.ArrowExtensionArray:
    """Arrow fixed_size_list<D> of x's dtype; rows in ``null`` are null."""
    t = pa.list_(pa.from_numpy_dtype(x.dtype), x.shape[1])
    rows = [None if i in null else x[i] for i in range(len(x))]
    return pd.array(pa.array(rows, t), dtype=pd.ArrowDtype(t))


def variable(rows: list[Any], value: pa.DataType | None = None) -> pd.arrays.ArrowExtensionArray:
    """Arrow list<value>, float32 by default (rows of any length, None for null)."""
    t = pa.list_(pa.float32() if value is None else value)
    return pd.array(pa.array(rows, t), dtype=pd.ArrowDtype(t))


def arrays(x: np.ndarray) -> np.ndarray:
    return cells([row.copy() for row in x])


def tensors(
    x: np.ndarray, dtype: torch.dtype | None = None, shape: tuple[int, ...] = (-1,)
) -> np.ndarray:
    return cells([torch.from_numpy(row.copy()).to(dtype).reshape(shape) for row in x])


def frame(a: Any, b: Any, index: pd.Index | None = None) -> pd.DataFrame:
    n = len(a)
    index = LABELS[:n] if index is None and n <= N else index
    return pd.DataFrame({"a": a, "b": b, "id": np.arange(n)}, index=index)


def with_rows(x: np.ndarray, **rows: Any) -> np.ndarray:
    """A copy of x with some rows (r0=..., r3=...) or values (r1=(col, value)) replaced."""
    out = x.copy()
    for name, value in rows.items():
        i = int(name[1:])
        if isinstance(value, tuple):
            out[i, value[0]] = value[1]
        else:
            out[i] = value
    return out


# --------------------------------------------------------------------------- the cases


@dataclass(frozen=True)
class Result:
    """Expected values (NaN where NaN; exact 0.0 and NaN are the documented special
    values and must come out exactly) and the result dtype."""

    values: np.ndarray
    dtype: type = np.float32
    atol: float = 1e-6


@dataclass(frozen=True)
class Raises:
    """The error, and where the dask path raises it: "from_pandas", "graph" (when
    ``pairwise`` builds the graph, from ``_meta``) or "compute".  ``dask_match``: a
    different message on the dask path (its partitions or converted columns)."""

    error: type[Exception]
    match: str
    dask_stage: str
    dask_match: str | None = None


@dataclass(frozen=True)
class Case:
    id: str
    frame: Callable[[], pd.DataFrame]
    expect: Callable[[], Result | Raises]
    a: str = "a"
    b: str = "b"
    kwargs: dict[str, Any] = field(default_factory=dict)
    npartitions: int = 2
    # Applied to the pandas frame and to the dask frame alike (a filter).
    select: Callable[[Any], Any] | None = None


# What both tables take: the float64 rows and the two messages of columns that hold no
# vectors of numbers.
A64, B64 = A.astype(np.float64), B.astype(np.float64)
NOT_VECTORS = "which is not a column of vectors; expected Arrow fixed_size_list or list of floats"
NOT_NUMBERS = (
    "not a vector of numbers; expected one numpy array, torch tensor or list of numbers per row"
)


# --------------------------------------------------------------------------- the two runs


def _check_result(res: Any, pdf: pd.DataFrame, want: Result, name: Any = "cos") -> None:
    assert isinstance(res, pd.Series) and res.name == name
    assert len(res) == len(pdf) and list(res.index) == list(pdf.index)  # nothing lost, index kept
    assert res.index.name == pdf.index.name
    assert res.dtype == want.dtype
    got = res.to_numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want.values))
    exact = want.values == 0  # the documented zero-vector result is exact
    np.testing.assert_array_equal(got[exact], 0.0)
    np.testing.assert_allclose(got, want.values, atol=want.atol, rtol=0)


def check_eager(case: Case) -> None:
    """The case through the eager pandas accessor."""
    pdf = case.frame()
    if case.select is not None:
        pdf = case.select(pdf)
    want = case.expect()
    if isinstance(want, Raises):
        with pytest.raises(want.error, match=want.match):
            pdf.cosim.pairwise(case.a, case.b, **case.kwargs)
        return
    _check_result(pdf.cosim.pairwise(case.a, case.b, **case.kwargs), pdf, want)


def check_dask(case: Case) -> None:
    """The case through dask: the error at its stage, or the values (and a meta that
    agrees with them)."""
    pdf = case.frame()
    want = case.expect()
    stage = want.dask_stage if isinstance(want, Raises) else None
    expect_error = (
        pytest.raises(want.error, match=want.dask_match or want.match)
        if isinstance(want, Raises)
        else None
    )
    if stage == "from_pandas":
        assert expect_error is not None
        with expect_error:
            dask_cosim.from_pandas(pdf, npartitions=case.npartitions)
        return
    ddf = dask_cosim.from_pandas(pdf, npartitions=case.npartitions)
    if case.select is not None:
        ddf, pdf = case.select(ddf), case.select(pdf)
        sizes = ddf.map_partitions(len).compute().tolist()
        assert 0 in sizes and sum(sizes) == len(pdf)
    with no_computes():  # validation reads _meta only
        if stage == "graph":
            assert expect_error is not None
            with expect_error:
                ddf.cosim.pairwise(case.a, case.b, **case.kwargs)
            return
        lazy = ddf.cosim.pairwise(case.a, case.b, **case.kwargs)
    assert isinstance(lazy, dd.Series) and lazy.divisions == ddf.divisions
    if stage == "compute":
        assert expect_error is not None
        with expect_error:
            lazy.compute()
        return
    assert isinstance(want, Result)
    assert lazy.dtype == want.dtype  # the meta agrees with the partitions
    _check_result(lazy.compute(), pdf, want)
