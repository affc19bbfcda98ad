"""Bad input, table-driven, part one: what the numbers are.  Each row of ``CASES``
builds a pandas frame and states what ``pairwise`` gives for it: values against the
float64 ``reference`` (or the documented special value: 0.0 for a zero vector, NaN for
a row with NaN/inf or a null row), with one result per input row and the index kept, or
an error (type, and a regex that names the column, the row label where there is one,
and the fix).  The rows here: dtypes (float16 to float64, bfloat16, mixed), special
values (zero, NaN, inf, subnormals, norms below eps, sums that overflow float32),
integers and scalar columns, and null rows and values.  Every case runs eagerly and
through dask (``check_eager``, ``check_dask`` of tests/bad_input_cases.py).  What the
columns hold and how the frame is shaped: tests/test_bad_input_columns.py.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

from tests.bad_input_cases import (
    A64,
    B64,
    NOT_NUMBERS,
    NOT_VECTORS,
    A,
    B,
    Case,
    D,
    N,
    Raises,
    Result,
    arrays,
    cells,
    check_dask,
    check_eager,
    fixed,
    frame,
    tensors,
    variable,
    with_rows,
)
from tests.helpers import reference

pytestmark = pytest.mark.usefixtures("sync_scheduler")


TINY32 = np.full((N, D), 1e-40, np.float32)  # float32 subnormals
TINY64 = np.full((N, D), 1e-310, np.float64)  # float64 subnormals
TINY16 = np.full((N, D), 1e-7, np.float16)  # float16 subnormals (6e-8 is the smallest)
_rng = np.random.default_rng(7)
BIG16_A = (_rng.uniform(1e3, 6e4, (4, 4096)) * _rng.choice([-1, 1], (4, 4096))).astype(np.float16)
BIG16_B = (_rng.uniform(1e3, 6e4, (4, 4096)) * _rng.choice([-1, 1], (4, 4096))).astype(np.float16)
BIG16_B[0], BIG16_B[1] = BIG16_A[0], -BIG16_A[1]
A16, B16 = A.astype(np.float16), B.astype(np.float16)
BF16 = torch.bfloat16
A_BF, B_BF = (torch.from_numpy(x).to(BF16).float().numpy() for x in (A, B))
INTS_A = np.arange(N * D).reshape(N, D) % 7 - 3


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
        "float32 subnormals (1e-40): norm < eps, clamped to it -> about 0 (0.0 if both)",
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
        # A JSON null read into a Python list: it raised "not a vector of numbers".
        "null value inside a vector (a list in an object column) -> NaN",
        lambda: frame(
            cells([*map(list, A[:2]), [1.0, None, 2.0, 3.0], *map(list, A[3:])]), fixed(B)
        ),
        lambda: Result(reference(A, B, null=[2])),
    ),
    Case(
        # pd.NA (a nullable column's null, kept by .tolist()) raised "not a vector of
        # numbers" where None gave NaN.
        "pd.NA inside a vector (a list, and a numpy object array) -> NaN",
        lambda: frame(
            cells([*map(list, A[:2]), [1.0, pd.NA, 2.0, 3.0], *map(list, A[3:])]),
            cells([*B[:4], np.array([pd.NA, 1.0, 2.0, 3.0], dtype=object), B[5]]),
        ),
        lambda: Result(reference(A, B, null=[2, 4]), np.float64, atol=1e-12),
    ),
    Case(
        "null cells None / NaN / pd.NA in object columns -> NaN",
        lambda: frame(cells([A[0], None, A[2], np.nan, A[4], A[5]]), cells([*B[:4], pd.NA, B[5]])),
        lambda: Result(reference(A, B, null=[1, 3, 4])),
    ),
    Case(
        # pandas counts NaT and numpy's NaN scalars as missing; NaT raised "not a vector".
        "null cells NaT / np.float32 NaN in object columns -> NaN",
        lambda: frame(cells([A[0], pd.NaT, *A[2:]]), cells([*B[:4], np.float32("nan"), B[5]])),
        lambda: Result(reference(A, B, null=[1, 4])),
    ),
    Case(
        # torch has no such type: it raised its own TypeError naming no column or row.
        "numpy longdouble arrays -> read as float64",
        lambda: frame(cells([r.astype(np.longdouble) for r in A64]), cells(list(B64))),
        lambda: Result(reference(A64, B64), np.float64, atol=1e-12),
    ),
    Case(
        # torch raised "reshape is not implemented for sparse tensors" (all sparse) or
        # "Concatenating sparse tensors, but a dense tensor was found" (mixed), naming no
        # column or row.
        "sparse torch tensors, alone and beside dense ones -> read as dense",
        lambda: frame(
            cells([torch.from_numpy(r.copy()).to_sparse() for r in A]),
            cells(
                [
                    torch.from_numpy(r.copy()).reshape(D, 1).to_sparse()
                    if i % 2
                    else torch.from_numpy(r.copy())
                    for i, r in enumerate(B)
                ]
            ),
        ),
        lambda: Result(reference(A, B)),
    ),
    Case(
        "every row of a null -> all NaN",
        lambda: frame(cells([None] * N), fixed(B)),
        lambda: Result(np.full(N, np.nan)),
    ),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_eager_pandas(case: Case) -> None:
    check_eager(case)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_dask(case: Case) -> None:
    check_dask(case)


def test_the_fp16_case_overflows_in_fp16() -> None:
    """The large-value fp16 rows above would overflow without the upcast."""
    with np.errstate(over="ignore"):
        squares = np.sum(BIG16_A * BIG16_A, axis=1, dtype=np.float16)
    assert np.isinf(squares).all()
