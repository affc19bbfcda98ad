"""Bad input, table-driven: every case ends in a clear error or a documented result.

Each row of ``CASES`` builds a pandas frame and states what ``pairwise`` gives for it:
either values (against the float64 ``reference``, or the documented special value: 0.0
for a zero vector, NaN for a row with NaN/inf or a null row), with one result per input
row and the index kept; or an error (type, and a regex that names the column, the row
label where there is one, and the fix).  Every case runs through the eager pandas
accessor and through ``dask_cosim.from_pandas(...).cosim.pairwise(...).compute()``; for
dask the table also says when the error comes: in ``from_pandas`` (object columns are
stacked there), when the graph is built (anything the metadata tells) or at compute
time (what only the data tells).

Then what a user does with two dask frames (assign, join, concat), and hypothesis
properties of the whole path: symmetry, scale invariance, range, cos(a, a) = 1, and the
same values for every partitioning with the index order kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import dask_cosim
from tests.helpers import no_computes, random_pairs, reference


@pytest.fixture(autouse=True)
def _synchronous() -> Iterator[None]:
    with dask.config.set(scheduler="sync"):
        yield


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


# --------------------------------------------------------------------------- the table


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


TINY32 = np.full((N, D), 1e-40, np.float32)  # float32 subnormals
TINY64 = np.full((N, D), 1e-310, np.float64)  # float64 subnormals
TINY16 = np.full((N, D), 1e-7, np.float16)  # float16 subnormals (6e-8 is the smallest)
_rng = np.random.default_rng(7)
BIG16_A = (_rng.uniform(1e3, 6e4, (4, 4096)) * _rng.choice([-1, 1], (4, 4096))).astype(np.float16)
BIG16_B = (_rng.uniform(1e3, 6e4, (4, 4096)) * _rng.choice([-1, 1], (4, 4096))).astype(np.float16)
BIG16_B[0], BIG16_B[1] = BIG16_A[0], -BIG16_A[1]
A64, B64 = A.astype(np.float64), B.astype(np.float64)
A16, B16 = A.astype(np.float16), B.astype(np.float16)
BF16 = torch.bfloat16
A_BF, B_BF = (torch.from_numpy(x).to(BF16).float().numpy() for x in (A, B))
INTS_A = np.arange(N * D).reshape(N, D) % 7 - 3
NOT_VECTORS = "which is not a column of vectors; expected Arrow fixed_size_list or list of floats"
NOT_NUMBERS = (
    "not a vector of numbers; expected one numpy array, torch tensor or list of numbers per row"
)
RAGGED = "every row of an embedding column needs the same length"
A_B_SIZES = "both columns need vectors of the same length"


def _empty_partitions(df: Any) -> Any:
    return df[(df["id"] < 2) | (df["id"] >= 6)]


CASES = [
    # ----------------------------------------------------------------- dtypes
    Case("fp32", lambda: frame(fixed(A), fixed(B)), lambda: Result(reference(A, B))),
    Case(
        "fp64 -> float64",
        lambda: frame(fixed(A64), fixed(B64)),
        lambda: Result(reference(A64, B64), np.float64, atol=1e-12),
    ),
    Case(
        "fp16 Arrow fixed_size_list<float16>",
        lambda: frame(fixed(A16), fixed(B16)),
        lambda: Result(reference(A16, B16)),
    ),
    Case(
        "fp16 Arrow list<float16>",
        lambda: frame(variable(list(A16), pa.float16()), variable(list(B16), pa.float16())),
        lambda: Result(reference(A16, B16)),
    ),
    Case(
        "fp16 numpy arrays",
        lambda: frame(arrays(A16), arrays(B16)),
        lambda: Result(reference(A16, B16)),
    ),
    Case(
        "bf16 torch tensors",
        lambda: frame(tensors(A, BF16), tensors(B, BF16)),
        lambda: Result(reference(A_BF, B_BF)),
    ),
    Case(
        "fp16 D=4096 values 1e3-6e4, Arrow",  # fp16 squared norms overflow: upcast first
        lambda: frame(fixed(BIG16_A), fixed(BIG16_B)),
        lambda: Result(reference(BIG16_A, BIG16_B)),
    ),
    Case(
        "fp16 D=4096 values 1e3-6e4, (D, 1) torch tensors",
        lambda: frame(
            tensors(BIG16_A, torch.float16, (4096, 1)), tensors(BIG16_B, torch.float16, (4096, 1))
        ),
        lambda: Result(reference(BIG16_A, BIG16_B)),
    ),
    Case(
        "mixed fp16 and fp64 columns -> float32",
        lambda: frame(fixed(A16), fixed(B64)),
        lambda: Result(reference(A16, B64)),
    ),
    # ----------------------------------------------------------------- special values
    Case(
        "zero vectors -> 0.0",
        lambda: frame(fixed(with_rows(A, r0=0, r2=0)), fixed(with_rows(B, r1=0, r2=0))),
        lambda: Result(reference(with_rows(A, r0=0, r2=0), with_rows(B, r1=0, r2=0))),
    ),
    Case(
        "NaN in a row -> NaN",
        lambda: frame(fixed(with_rows(A, r0=(1, np.nan))), fixed(with_rows(B, r3=(0, np.nan)))),
        lambda: Result(reference(A, B, null=[0, 3])),
    ),
    Case(
        "+inf / -inf in a row -> NaN",
        lambda: frame(
            fixed(with_rows(A, r0=(0, np.inf), r2=(1, np.inf))),
            fixed(with_rows(B, r1=(3, -np.inf), r2=(1, np.inf))),
        ),
        lambda: Result(reference(A, B, null=[0, 1, 2])),
    ),
    Case(
        "float32 subnormals (1e-40): norm < eps, counts as zero -> 0.0",
        lambda: frame(
            fixed(with_rows(TINY32, r2=A[2])), fixed(with_rows(TINY32, r1=B[1], r2=B[2]))
        ),
        # Row 1, 1e-40s against a vector of norm ~2: ~3e-32; row 2: two ordinary vectors.
        lambda: Result(np.r_[0.0, reference(TINY32, B)[1], reference(A, B)[2], 0.0, 0.0, 0.0]),
    ),
    Case(
        "float64 subnormals (1e-310) -> 0.0",
        lambda: frame(fixed(TINY64), fixed(with_rows(TINY64, r1=0))),
        lambda: Result(np.zeros(N), np.float64, atol=0),
    ),
    Case(
        "float16 subnormals (1e-7): upcast norm > eps, a real vector",
        lambda: frame(fixed(TINY16), fixed(with_rows(TINY16, r1=-TINY16[1]))),
        lambda: Result(reference(TINY16, with_rows(TINY16, r1=-TINY16[1]))),
    ),
    Case(
        "norm below eps but not zero (1e-10): clamped, cos x |a| / eps",
        lambda: frame(fixed(A * 1e-10 / np.linalg.norm(A, axis=1, keepdims=True)), fixed(B)),
        lambda: Result(reference(A * 1e-10 / np.linalg.norm(A, axis=1, keepdims=True), B)),
    ),
    Case(
        "float32 values 1e30 (sums overflow float32, redone in float64)",
        lambda: frame(fixed(A * np.float32(1e30)), fixed(with_rows(B, r2=B[2] * 1e25))),
        lambda: Result(reference(A * np.float32(1e30), with_rows(B, r2=B[2] * 1e25))),
    ),
    # ----------------------------------------------------------------- integers
    Case(
        "int Arrow fixed_size_list<int64> -> cast, float32",
        lambda: frame(fixed(INTS_A), fixed(B)),
        lambda: Result(reference(INTS_A, B)),
    ),
    Case(
        "int Arrow list<uint8> -> cast, float32",
        lambda: frame(variable([list(r) for r in INTS_A + 3], pa.uint8()), fixed(B)),
        lambda: Result(reference(INTS_A + 3, B)),
    ),
    Case(
        "int numpy arrays -> cast, float32",
        lambda: frame(arrays(INTS_A), arrays(B)),
        lambda: Result(reference(INTS_A, B)),
    ),
    Case(
        "Python float lists -> float64",
        lambda: frame(
            cells([list(map(float, r)) for r in A]), cells([list(map(float, r)) for r in B])
        ),
        lambda: Result(reference(A, B), np.float64, atol=1e-12),
    ),
    Case(
        "int64 scalar column",
        lambda: frame(np.arange(N), fixed(B)),
        lambda: Raises(TypeError, f"column 'a' has dtype int64, {NOT_VECTORS}", "graph"),
    ),
    Case(
        "float64 scalar column",
        lambda: frame(fixed(A), np.linspace(0, 1, N)),
        lambda: Raises(TypeError, f"column 'b' has dtype float64, {NOT_VECTORS}", "graph"),
    ),
    Case(
        "object column of Python scalars",
        lambda: frame(cells([1.5, 2, -3.0, 4, 5, 6]), fixed(B)),
        lambda: Raises(
            TypeError,
            f"column 'a': row 'r0' holds float 1.5, {NOT_NUMBERS}",
            "compute",  # an object column of scalars stays object: only the data tells
            dask_match=f"column 'a': row 'r[03]' holds (float 1.5|int 4), {NOT_NUMBERS}",
        ),
    ),
    Case(
        "object column of 0-d tensors",
        lambda: frame(cells([torch.tensor(float(i)) for i in range(N)]), fixed(B)),
        lambda: Raises(
            TypeError,
            f"column 'a': row 'r0' holds Tensor tensor\\(0.\\), {NOT_NUMBERS}",
            "from_pandas",
        ),
    ),
    # ----------------------------------------------------------------- not numbers
    Case(
        "string column",  # text: how to embed it, not the advice for stringified vectors
        lambda: frame(pd.array([f"v{i}" for i in range(N)], dtype="str"), fixed(B)),
        lambda: Raises(
            TypeError,
            r"column 'a' holds text \((str|object|string)\) such as 'v0', not vectors: (?!.*from_pandas).*SentenceTransformer",
            "graph",
        ),
    ),
    Case(
        "vectors turned into strings",
        lambda: frame(pd.array([str(r) for r in A], dtype="str"), fixed(B)),
        lambda: Raises(
            TypeError,
            r"column 'a' holds strings \((str|object|string)\), not vectors\..*dask_cosim.from_pandas",
            "graph",
        ),
    ),
    Case(
        "object column of string lists",
        lambda: frame(cells([["x", "y", "z", "w"]] * N), fixed(B)),
        lambda: Raises(
            TypeError,
            f"column 'a': row 'r0' holds list \\['x', 'y', 'z', 'w'\\], {NOT_NUMBERS}",
            "from_pandas",
        ),
    ),
    Case(
        "object column with a string cell",
        lambda: frame(cells([*A[:3], "oops", *A[4:]]), fixed(B)),
        lambda: Raises(
            TypeError, f"column 'a': row 'r3' holds str 'oops', {NOT_NUMBERS}", "from_pandas"
        ),
    ),
    Case(
        "object column of dicts",
        lambda: frame(cells([{"x": 1.0}] * N), fixed(B)),
        lambda: Raises(
            TypeError,
            f"column 'a': row 'r0' holds dict \\{{'x': 1.0\\}}, {NOT_NUMBERS}",
            "compute",
            dask_match=f"column 'a': row 'r[03]' holds dict \\{{'x': 1.0\\}}, {NOT_NUMBERS}",
        ),
    ),
    Case(
        "bool numpy arrays",
        lambda: frame(arrays(A > 0), fixed(B)),
        lambda: Raises(
            TypeError, f"column 'a': row 'r0' holds ndarray .*, {NOT_NUMBERS}", "from_pandas"
        ),
    ),
    Case(
        "complex torch tensors",
        lambda: frame(fixed(A), tensors(B, torch.complex64)),
        lambda: Raises(
            TypeError, f"column 'b': row 'r0' holds Tensor .*, {NOT_NUMBERS}", "from_pandas"
        ),
    ),
    Case(
        "nested lists of different lengths in a cell",
        lambda: frame(cells([*A[:2], [[1.0, 2.0], [3.0]], *A[3:]]), fixed(B)),
        lambda: Raises(
            TypeError,
            f"column 'a': row 'r2' holds list \\[\\[1.0, 2.0\\], \\[3.0\\]\\], {NOT_NUMBERS}",
            "from_pandas",
        ),
    ),
    Case(
        "Arrow list<bool>",
        lambda: frame(variable([list(r) for r in A > 0], pa.bool_()), fixed(B)),
        lambda: Raises(
            TypeError, f"column 'a' has dtype list<item: bool>\\[pyarrow\\], {NOT_VECTORS}", "graph"
        ),
    ),
    Case(
        "Arrow list<string>",
        lambda: frame(variable([["x"] * D] * N, pa.string()), fixed(B)),
        lambda: Raises(
            TypeError,
            f"column 'a' has dtype list<item: string>\\[pyarrow\\], {NOT_VECTORS}",
            "graph",
        ),
    ),
    Case(
        "Arrow nested list<list<float>>",
        lambda: frame(variable([[list(r)] for r in A], pa.list_(pa.float32())), fixed(B)),
        lambda: Raises(
            TypeError,
            "column 'a' holds nested lists .*; flatten each row to one list of D numbers",
            "graph",
        ),
    ),
    # ----------------------------------------------------------------- shapes
    Case(
        "ragged rows, Arrow list<float>",
        lambda: frame(variable([*map(list, A[:4]), list(A[4, :2]), list(A[5])]), fixed(B)),
        lambda: Raises(
            ValueError,
            f"column 'a': row 'r4' has 2 values but row 'r[0-3]' has 4; {RAGGED}",
            "compute",
        ),
    ),
    Case(
        "ragged rows, numpy arrays",
        lambda: frame(arrays(A), cells([*B[:4], B[4, :3], B[5]])),
        lambda: Raises(
            ValueError,
            f"column 'b': row 'r4' has 3 values but row 'r0' has 4; {RAGGED}",
            "from_pandas",
        ),
    ),
    Case(
        "ragged rows, (D, 1) torch tensors",
        lambda: frame(cells([torch.ones(4, 1)] * 3 + [torch.ones(5, 1)] * 3), fixed(B)),
        lambda: Raises(
            ValueError,
            f"column 'a': row 'r3' has 5 values but row 'r0' has 4; {RAGGED}",
            "from_pandas",
        ),
    ),
    Case(
        "a/b lengths differ, Arrow list<float>",
        lambda: frame(variable(list(map(list, A))), variable([[1.0] * 5] * N)),
        lambda: Raises(
            ValueError,
            f"row 'r[0-5]': column 'a' has 4 values and column 'b' has 5; {A_B_SIZES}",
            "compute",
        ),
    ),
    Case(
        "a/b lengths differ, fixed_size_list<4> and <5>",
        lambda: frame(fixed(A), fixed(np.ones((N, 5), np.float32))),
        lambda: Raises(
            ValueError,
            "column 'a' holds vectors of 4 values and column 'b' of 5; cosine similarity needs vectors of the same length",
            "graph",
        ),
    ),
    Case(
        "a/b lengths differ, numpy arrays (first row null in a)",
        lambda: frame(cells([None, *A[1:]]), arrays(np.ones((N, 5), np.float32))),
        lambda: Raises(
            ValueError,
            f"row 'r1': column 'a' has 4 values and column 'b' has 5; {A_B_SIZES}",
            "graph",  # from_pandas makes them fixed_size_list<4> and <5>: the meta tells
            dask_match="column 'a' holds vectors of 4 values and column 'b' of 5",
        ),
    ),
    Case(
        "ragged row in b where a is null (b itself is ragged)",
        lambda: frame(
            variable([*map(list, A[:5]), None]), variable([*map(list, B[:5]), [1.0] * 5])
        ),
        lambda: Raises(
            ValueError,
            f"column 'b': row 'r5' has 5 values but row 'r[0-3]' has 4; {RAGGED}",
            "compute",
        ),
    ),
    # ----------------------------------------------------------------- nulls
    Case(
        "null rows, Arrow fixed_size_list -> NaN",
        lambda: frame(fixed(A, null=[1, 4]), fixed(B, null=[4, 5])),
        lambda: Result(reference(A, B, null=[1, 4, 5])),
    ),
    Case(
        "null rows, Arrow list<float> of length 0 -> NaN",
        lambda: frame(
            variable([None, *map(list, A[1:])]),
            variable([*map(list, B[:3]), None, *map(list, B[4:])]),
        ),
        lambda: Result(reference(A, B, null=[0, 3])),
    ),
    Case(
        "null value inside a vector (Arrow) -> NaN",
        lambda: frame(
            variable([*map(list, A[:2]), [1.0, None, 2.0, 3.0], *map(list, A[3:])]), fixed(B)
        ),
        lambda: Result(reference(A, B, null=[2])),
    ),
    Case(
        "null cells None / NaN / pd.NA in object columns -> NaN",
        lambda: frame(cells([A[0], None, A[2], np.nan, A[4], A[5]]), cells([*B[:4], pd.NA, B[5]])),
        lambda: Result(reference(A, B, null=[1, 3, 4])),
    ),
    Case(
        "every row of a null -> all NaN",
        lambda: frame(cells([None] * N), fixed(B)),
        lambda: Result(np.full(N, np.nan)),
    ),
    # ----------------------------------------------------------------- frame shapes
    Case(
        "empty frame, object columns",
        lambda: frame(cells([]), cells([]), index=LABELS[:0]),
        lambda: Result(np.zeros(0)),
    ),
    Case(
        "empty frame, Arrow fixed_size_list<float64>",
        lambda: frame(fixed(A64[:0]), fixed(B64[:0]), index=LABELS[:0]),
        lambda: Result(np.zeros(0), np.float64),
    ),
    Case(
        "empty partitions (after a filter)",
        lambda: frame(fixed(np.r_[A, B[:2]]), arrays(np.r_[B, A[:2]]), index=pd.RangeIndex(8) * 10),
        lambda: Result(reference(np.r_[A, B[:2]], np.r_[B, A[:2]])[[0, 1, 6, 7]]),
        npartitions=4,
        select=_empty_partitions,
    ),
    Case(
        "one row",
        lambda: frame(arrays(A[:1]), arrays(B[:1])),
        lambda: Result(reference(A[:1], B[:1])),
    ),
    Case(
        "D=1: sign(a * b), 0.0 for 0",
        lambda: frame(
            fixed(np.array([[2.0], [-1.0], [0.0], [3.0]], np.float32)),
            fixed(np.array([[3.0], [3.0], [5.0], [-0.5]], np.float32)),
        ),
        lambda: Result(np.array([1.0, -1.0, 0.0, -1.0]), atol=0),
    ),
    Case(
        "duplicate index labels: every row kept",
        lambda: frame(
            fixed(A), fixed(B), index=pd.Index(["r0", "r1", "r1", "r1", "r2", "r3"], name="key")
        ),
        lambda: Result(reference(A, B)),
        npartitions=3,
    ),
    # ----------------------------------------------------------------- columns and options
    Case(
        "missing column",
        lambda: frame(fixed(A), fixed(B)),
        lambda: Raises(
            KeyError,
            r"column 'c' not found; the vector columns are \['a', 'b'\]; available: \['a', 'b', 'id'\]",
            "graph",
        ),
        b="c",
    ),
    Case(
        "same column twice: 1.0, 0.0 for a zero row, NaN for a null row",
        lambda: frame(fixed(with_rows(A, r1=0), null=[2]), fixed(B)),
        lambda: Result(np.array([1.0, 0.0, np.nan, 1.0, 1.0, 1.0])),
        b="a",
    ),
    Case(
        "eps=0: a zero vector gives NaN",
        lambda: frame(fixed(with_rows(A, r0=0)), fixed(B)),
        lambda: Result(reference(with_rows(A, r0=0), B, eps=0.0)),
        kwargs={"eps": 0.0},
    ),
]


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


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_eager_pandas(case: Case) -> None:
    pdf = case.frame()
    if case.select is not None:
        pdf = case.select(pdf)
    want = case.expect()
    if isinstance(want, Raises):
        with pytest.raises(want.error, match=want.match):
            pdf.cosim.pairwise(case.a, case.b, **case.kwargs)
        return
    _check_result(pdf.cosim.pairwise(case.a, case.b, **case.kwargs), pdf, want)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_dask(case: Case) -> None:
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


def test_the_fp16_case_overflows_in_fp16() -> None:
    """The large-value fp16 rows above would overflow without the upcast."""
    with np.errstate(over="ignore"):
        squares = np.sum(BIG16_A * BIG16_A, axis=1, dtype=np.float16)
    assert np.isinf(squares).all()


def test_from_pandas_makes_strings_only_of_strings() -> None:
    """dask's convert-string still applies to columns of strings; object columns that
    hold no string (empty, all null, scalars) stay object, and a user's
    convert-string=False is kept."""
    pdf = pd.DataFrame(
        {
            "v": cells(list(A)),
            "empty": cells([None] * N),
            "scalars": cells([1, 2.5, None, 4, 5, 6]),
            "text": ["x", None, "z", "w", "u", "t"],
            "words": cells(["x", None, "z", "w", "u", "t"]),
        },
        index=LABELS,
    )
    dtypes = dask_cosim.from_pandas(pdf, npartitions=2).dtypes
    assert isinstance(dtypes["v"], pd.ArrowDtype)
    assert dtypes["empty"] == np.dtype(object) == dtypes["scalars"]
    assert dtypes["text"] == pd.StringDtype("pyarrow") == dtypes["words"]
    back = dask_cosim.from_pandas(pdf, npartitions=2).compute()
    assert back["scalars"].tolist()[:2] == [1, 2.5] and list(back.index) == list(LABELS)
    with dask.config.set({"dataframe.convert-string": False}):
        kept = dask_cosim.from_pandas(pdf, npartitions=2).dtypes
    assert kept["text"] == pdf.dtypes["text"] and kept["empty"] == np.dtype(object)


# --------------------------------------------------------------------------- two frames

# The accessor takes two columns of one frame.  With the vectors in two dask frames,
# users put them in one first (assign, join, concat): dask aligns the rows by index label
# (repartitioning when the divisions differ), so the result is right by label; with
# unknown divisions assign/join shuffle (rows come back in another order, none lost) and
# concat(axis=1) refuses at compute time.  Labels missing from the second frame give null
# vectors, so NaN.


def _two_frames(
    divisions: str, drop: Sequence[int] = ()
) -> tuple[dd.DataFrame, dd.DataFrame, pd.Series]:
    n = 20
    a, b = random_pairs(n, 8, seed=3)
    index = pd.Index(np.arange(n) * 10, name="key")
    left = pd.DataFrame({"a": arrays(a), "id": np.arange(n)}, index=index)
    right = pd.DataFrame({"b": arrays(b)}, index=index).drop(index=[i * 10 for i in drop])
    df1 = dask_cosim.from_pandas(left, npartitions=3)
    df2 = dask_cosim.from_pandas(right, npartitions=5)
    assert df1.divisions != df2.divisions
    if divisions == "unknown":
        df1, df2 = df1.clear_divisions(), df2.clear_divisions()
    expected = pd.Series(reference(a, b, null=list(drop)), index=index, name="cos")
    return df1, df2, expected


COMBINE = {
    "assign": lambda df1, df2: df1.assign(b=df2["b"]),
    "join": lambda df1, df2: df1.join(df2),
    "concat": lambda df1, df2: dd.concat([df1, df2], axis=1),
}


@pytest.mark.parametrize("divisions", ["known", "unknown"])
@pytest.mark.parametrize("how", list(COMBINE))
def test_two_frames_with_different_partitions(how: str, divisions: str) -> None:
    df1, df2, expected = _two_frames(divisions)
    cos = COMBINE[how](df1, df2).cosim.pairwise("a", "b")
    if how == "concat" and divisions == "unknown":
        # dask's own error, when it plans the computation.
        with pytest.raises(
            ValueError, match="Unable to concatenate DataFrame with unknown division"
        ):
            cos.compute()
        return
    res = cos.compute()
    if divisions == "known":
        assert list(res.index) == list(expected.index)  # aligned, in order
    assert len(res) == len(expected) and res.index.is_unique
    np.testing.assert_allclose(res.loc[expected.index].to_numpy(), expected.to_numpy(), atol=1e-6)


@pytest.mark.parametrize("how", ["assign", "join"])
def test_two_frames_missing_labels_give_nan(how: str) -> None:
    df1, df2, expected = _two_frames("known", drop=[3, 15])
    res = COMBINE[how](df1, df2).cosim.pairwise("a", "b").compute()
    assert list(res.index) == list(expected.index)
    assert res.isna().to_numpy().nonzero()[0].tolist() == [3, 15]
    np.testing.assert_allclose(res.to_numpy(), expected.to_numpy(), atol=1e-6)


# --------------------------------------------------------------------------- properties


def _vectors(
    n: int, d: int, *, low: float = -1e3, high: float = 1e3
) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(np.float32, (n, d), elements=st.floats(low, high, width=32))


@st.composite
def _pairs(draw: st.DrawFn, **bounds: float) -> tuple[np.ndarray, np.ndarray]:
    n, d = draw(st.integers(1, 12)), draw(st.integers(1, 16))
    return draw(_vectors(n, d, **bounds)), draw(_vectors(n, d, **bounds))


def _eager(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out: np.ndarray = (
        frame(fixed(a), fixed(b), index=pd.RangeIndex(len(a))).cosim.pairwise("a", "b").to_numpy()
    )
    return out


def _norms_above(x: np.ndarray, bound: float) -> bool:
    return bool((np.linalg.norm(x.astype(np.float64), axis=1) > bound).all())


BIG32 = float(np.float32(1e30))
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(_pairs())
def test_property_symmetric(pair: tuple[np.ndarray, np.ndarray]) -> None:
    a, b = pair
    np.testing.assert_array_equal(_eager(a, b), _eager(b, a))


@PROPERTY
@given(
    _pairs(),
    st.floats(1e-3, 1e3),
    st.sampled_from([1.0, -1.0]),
)
def test_property_scale_invariant(
    pair: tuple[np.ndarray, np.ndarray], k: float, sign: float
) -> None:
    a, b = pair
    # Norms well above eps (and k * a too), so that no vector is clamped.
    assume(_norms_above(a, 1e-2) and _norms_above(b, 1e-2))
    ka = (a * np.float32(sign * k)).astype(np.float32)
    np.testing.assert_allclose(_eager(ka, b), sign * _eager(a, b), atol=2e-6, rtol=0)
    np.testing.assert_allclose(_eager(ka, b), sign * reference(a, b), atol=2e-6, rtol=0)


@PROPERTY
@given(
    _pairs(low=-BIG32, high=BIG32), st.lists(st.sampled_from([np.nan, np.inf, -np.inf]), max_size=2)
)
def test_property_within_minus_one_one(
    pair: tuple[np.ndarray, np.ndarray], specials: list[float]
) -> None:
    a, b = pair
    for i, value in enumerate(specials):
        (a if i % 2 else b)[i % len(a), 0] = value
    res, expected = _eager(a, b), reference(a, b)
    np.testing.assert_array_equal(np.isnan(res), np.isnan(expected))
    finite = ~np.isnan(res)
    assert (np.abs(res[finite]) <= 1).all()
    np.testing.assert_allclose(res[finite], expected[finite], atol=1e-6, rtol=0)


@PROPERTY
@given(_pairs())
def test_property_self_is_one(pair: tuple[np.ndarray, np.ndarray]) -> None:
    a, _ = pair
    assume(_norms_above(a, 1e-3))
    np.testing.assert_allclose(_eager(a, a), 1.0, atol=2e-6, rtol=0)
    pdf = frame(fixed(a), fixed(a), index=pd.RangeIndex(len(a)))
    np.testing.assert_allclose(pdf.cosim.pairwise("a", "a").to_numpy(), 1.0, atol=2e-6, rtol=0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_pairs(), st.randoms(use_true_random=False), st.sampled_from(["fixed", "objects"]))
def test_property_same_for_every_partitioning(
    pair: tuple[np.ndarray, np.ndarray], rnd: Any, layout: str
) -> None:
    a, b = pair
    labels = [f"k{i:03d}" for i in range(len(a))]
    rnd.shuffle(labels)  # an index that is neither sorted nor a range
    index = pd.Index(labels, name="key")
    cols = (fixed(a), fixed(b)) if layout == "fixed" else (arrays(a), arrays(b))
    pdf = frame(cols[0], cols[1], index=index)
    eager = pdf.cosim.pairwise("a", "b")
    np.testing.assert_allclose(eager.to_numpy(), reference(a, b), atol=1e-6, rtol=0)
    for k in (1, 2, 7):
        # sort=False keeps the rows in the frame's order; sort=True sorts them by label.
        kept = dask_cosim.from_pandas(pdf, npartitions=k, sort=False).cosim.pairwise("a", "b")
        kept_res = kept.compute()
        assert list(kept_res.index) == list(index)
        np.testing.assert_array_equal(kept_res.to_numpy(), eager.to_numpy())
        in_order = dask_cosim.from_pandas(pdf, npartitions=k).cosim.pairwise("a", "b").compute()
        assert list(in_order.index) == list(index.sort_values())
        np.testing.assert_array_equal(in_order.to_numpy(), eager.loc[in_order.index].to_numpy())
