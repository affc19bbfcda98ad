"""Bad input, table-driven, part two: what the columns hold and how the frame is
shaped.  Each row of ``CASES`` builds a pandas frame and states what ``pairwise`` gives
for it, values or an error (type, and a regex that names the column, the row label where
there is one, and the fix), as in tests/test_bad_input_values.py.  The rows here:
columns that hold no numbers (text, stringified vectors and lists of scalars, vectors as
JSON text, string lists, dicts, bools, complex, nested lists, Arrow lists of bool or
string), shapes (ragged rows, a and b of different lengths), frame shapes (empty, empty
partitions, one row, D = 1, duplicate labels) and column names and options.  Every case
runs eagerly and through dask, where the case also says when the error comes
(``check_eager``, ``check_dask`` of tests/bad_input_cases.py).  Then what ``from_pandas``
makes strings of: only strings.
"""

from __future__ import annotations

import json
from typing import Any

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

import dask_cosim
from tests.bad_input_cases import (
    A64,
    B64,
    LABELS,
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


RAGGED = "every row of an embedding column needs the same length"
A_B_SIZES = "both columns need vectors of the same length"


def _empty_partitions(df: Any) -> Any:
    return df[(df["id"] < 2) | (df["id"] >= 6)]


CASES = [
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
    *(
        Case(
            f"{what} turned into strings",  # list(row) of an array, tuple(row) of a tensor
            lambda cells=cells: frame(pd.array([str(c) for c in cells()], dtype="str"), fixed(B)),
            lambda: Raises(
                TypeError,
                r"column 'a' holds strings \((str|object|string)\), not vectors\. (?!.*json)"
                r"(?!.*SentenceTransformer).*dask_cosim.from_pandas",
                "graph",
            ),
        )
        for what, cells in (
            ("lists of numpy scalars", lambda: [list(r) for r in A]),
            ("tuples of 0-d tensors", lambda: [tuple(torch.from_numpy(r)) for r in A]),
        )
    ),
    Case(
        "vectors as JSON text",  # what pd.read_csv gives for a CSV file of embeddings
        lambda: frame(pd.array([json.dumps(r.tolist()) for r in A], dtype="str"), fixed(B)),
        lambda: Raises(
            TypeError,
            # (A frame in memory was read so: dask's text conversion is not the cause.)
            r"column 'a' holds strings \((str|object|string)\), not vectors\. Its cells are "
            r"lists of numbers written as text, such as '\[.*pdf\['a'\] = "
            r"pdf\['a'\]\.map\(json\.loads\)\.$",
            "graph",
            # On a dask frame, fixes that work there (map needs its meta).
            r"column 'a' holds strings \((str|object|string)\), not vectors\. Its cells are "
            r"lists of numbers written as text, such as '\[.*parse them first, read the file "
            r"with dask_cosim\.io\.read_text\(path\) .*df\['a'\] = df\['a'\]\.map\("
            r"json\.loads, meta=\('a', object\)\)\. .*dask_cosim\.from_pandas",
        ),
    ),
    Case(
        "object column of string lists",
        lambda: frame(cells([["x", "y", "z", "w"]] * N), fixed(B)),
        lambda: Raises(
            TypeError,
            f"column 'a': row 'r0' holds list \\['x', 'y', 'z', 'w'\\], {NOT_NUMBERS}",
            "compute",  # from_pandas keeps a column of string lists as it is
            dask_match=f"column 'a': row 'r[03]' holds list \\['x', 'y', 'z', 'w'\\], {NOT_NUMBERS}",
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
        # The text error said "holds text" of one string that came first (in the frame or a
        # partition) and named the row of one that came later: both are one bad row.
        "object column with a string in its first row",
        lambda: frame(cells(["missing", *A[1:]]), fixed(B)),
        lambda: Raises(
            TypeError,
            f"column 'a': row 'r0' holds str 'missing', {NOT_NUMBERS}",
            "compute",  # from_pandas keeps a column whose first cell is a string as it is
        ),
    ),
    Case(
        "object column of text with a null",  # every non-null cell a string: text
        lambda: frame(cells(["x", None, "y", "z", "u", "v"]), fixed(B)),
        lambda: Raises(
            TypeError,
            r"column 'a' holds text \((str|object|string)\) such as 'x', not vectors: "
            r"(?!.*from_pandas).*SentenceTransformer",
            "graph",
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
            TypeError,
            f"column 'a': row 'r0' holds ndarray .*, {NOT_NUMBERS}",
            "compute",  # and a column of bool arrays (masks, say)
            dask_match=f"column 'a': row 'r[03]' holds ndarray .*, {NOT_NUMBERS}",
        ),
    ),
    Case(
        "complex torch tensors",
        lambda: frame(fixed(A), tensors(B, torch.complex64)),
        lambda: Raises(
            TypeError,
            f"column 'b': row 'r0' holds Tensor .*, {NOT_NUMBERS}",
            "compute",  # and of complex tensors
            dask_match=f"column 'b': row 'r[03]' holds Tensor .*, {NOT_NUMBERS}",
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
    *(
        Case(
            f"an empty row among vectors, {kind}",  # a placeholder for a missing vector
            lambda column=column: frame(column([*A[:3], [], *A[4:]]), fixed(B)),
            lambda when=when: Raises(
                ValueError,
                # The most common length is the rows' length, but in a dask partition of two
                # rows that starts at the empty one, which names the other.
                f"column 'a': row '(r3' has 0 values but row 'r[04]' has 4|r4' has 4 values but "
                f"row 'r3' has 0); {RAGGED}; for a row "
                "without a vector, store null \\(None\\), not an empty one: row 'r3' then "
                "scores null",
                when,
            ),
        )
        for kind, column, when in (
            ("Arrow list<float>", lambda rows: variable([list(r) for r in rows]), "compute"),
            ("lists", lambda rows: cells([list(r) for r in rows]), "from_pandas"),
        )
    ),
    *(
        Case(
            # D = 0 is a failed embedding step: every row scored 0.0.
            f"every vector empty, {kind}",
            lambda column=column: frame(column, arrays(B)),
            lambda: Raises(
                ValueError,
                "column 'a': row 'r[0-4]' holds an empty vector, and so does every other row "
                "read with it that is not null .*: vectors with no values \\(D = 0\\) have no "
                "cosine. .*store null \\(None\\), not an empty one",
                "compute",  # from_pandas keeps a column of empty lists as it is
            ),
        )
        for kind, column in (
            ("lists", cells([[]] * N)),
            # Against vectors of 4: it said "row 'r0': column 'a' has 0 values and column
            # 'b' has 4", without the hint.
            ("numpy arrays beside null rows", cells([np.zeros(0, np.float32), None] * 3)),
        )
    ),
    Case(
        "an empty vector beside null rows, Arrow list<float>",
        lambda: frame(variable([[], *[None] * (N - 1)]), fixed(B)),
        # Every row of 'a' that is not null is empty: D = 0, as for an object column.
        lambda: Raises(
            ValueError,
            "column 'a': row 'r0' holds an empty vector, and so does every other row read "
            "with it that is not null .* store null \\(None\\)",
            "compute",
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


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_eager_pandas(case: Case) -> None:
    check_eager(case)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_dask(case: Case) -> None:
    check_dask(case)


def test_a_string_first_in_a_partition_is_a_bad_row() -> None:
    """A frame of ``dd.from_pandas`` with object columns kept: a string that comes first
    in a partition other than the first is named by its row, as anywhere else (it was
    called a column of text)."""
    pdf = frame(cells([*A[:3], "missing", *A[4:]]), fixed(B))
    with dask.config.set({"dataframe.convert-string": False}):
        ddf = dd.from_pandas(pdf, npartitions=2)
    assert ddf.divisions == ("r0", "r3", "r5")
    lazy = ddf.cosim.pairwise("a", "b")
    with pytest.raises(TypeError, match=f"column 'a': row 'r3' holds str 'missing', {NOT_NUMBERS}"):
        lazy.compute()


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
