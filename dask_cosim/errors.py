"""The errors users see, built in one place: each function returns the exception to raise.

Every message names the argument, column, row or file, shows the value with ``!r``, says
what was expected and how to fix it.  A message that several modules raise (a column not
found, vectors of different lengths, a file that is not Parquet) is written here once;
messages only one place raises stay beside the check that raises them.  This module
imports nothing of the package: every layer may use it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

__all__ = [
    "ACCEPTED",
    "binary_column",
    "cell_not_vector",
    "column_not_found",
    "did_you_mean",
    "dims_differ",
    "nested_lists",
    "not_parquet",
    "not_vectors",
    "ragged",
    "string_column",
]

#: The column formats that hold vectors, as error messages describe them.
ACCEPTED = (
    "Arrow fixed_size_list or list of floats (pd.ArrowDtype(pa.list_(pa.float32(), D))), "
    "an object column holding one numpy array or torch tensor per row, "
    "or a cudf list column"
)


def did_you_mean(name: Any, candidates: Iterable[Any]) -> str:
    """ "; did you mean 'embeds_b'?" for the closest of ``candidates``, or ""."""
    by_text = {str(c): c for c in candidates}
    close = difflib.get_close_matches(str(name), list(by_text), n=1)
    return f"; did you mean {by_text[close[0]]!r}?" if close else ""


def column_not_found(
    column: Any, available: Iterable[Any], what: str = "column", *, where: Any = None
) -> KeyError:
    """KeyError("column 'embed_b' not found; did you mean 'embeds_b'? available: [...]").

    ``column`` may be a list of the missing columns (the hint is for the first);
    ``where`` names the file or frame looked in.
    """
    available = list(available)
    first = column[0] if isinstance(column, list) and column else column
    hint = did_you_mean(first, available)
    place = "" if where is None else f" in {where!r}"
    return KeyError(f"{what} {column!r} not found{place}{hint or ';'} available: {available!r}")


def dims_differ(what_a: str, dim_a: int, what_b: str, dim_b: int, row: Any = None) -> ValueError:
    """Vectors of two lengths where one is needed: from the metadata (two columns, or a
    column and the queries), or at ``row`` of one frame (two columns of that row)."""
    if row is None:
        return ValueError(
            f"{what_a} holds vectors of {dim_a} values and {what_b} of {dim_b}; cosine "
            "similarity needs vectors of the same length"
        )
    return ValueError(
        f"row {row!r}: {what_a} has {dim_a} values and {what_b} has {dim_b}; both columns "
        "need vectors of the same length"
    )


def ragged(column: str, label: Any, length: int, first_label: Any, dim: int) -> ValueError:
    """Two rows of one column with vectors of different lengths."""
    return ValueError(
        f"column {column!r}: row {label!r} has {length} values but row {first_label!r} "
        f"has {dim}; every row of an embedding column needs the same length"
    )


def string_column(column: str, dtype: Any) -> TypeError:
    """Strings where vectors were expected, most often vectors that dask turned into text."""
    return TypeError(
        f"column {column!r} holds strings ({dtype}), not vectors. dd.from_pandas turns "
        "object columns of arrays or tensors into text such as '[0.1 0.2 ...]' (dask's "
        "'dataframe.convert-string'), truncated. Build the dask frame with "
        "dask_cosim.from_pandas(pdf) instead: it stores them as Arrow vectors. "
        "(dask.config.set({'dataframe.convert-string': False}) before dd.from_pandas keeps "
        "them too, as Python objects that dask hashes one by one: about 200x slower in "
        "benchmarks/from_pandas.py.)"
    )


def binary_column(column: str, dtype: Any, row: Any = None) -> TypeError:
    """Raw bytes: our "binary" Parquet layout read by a reader that knows nothing of it."""
    where = f"column {column!r}" if row is None else f"column {column!r}: row {row!r}"
    return TypeError(
        f"{where} holds bytes ({dtype}), not vectors: Parquet written by "
        "dask_cosim.to_parquet stores each vector as raw bytes (layout='binary'), which "
        "other readers such as pd.read_parquet and dd.read_parquet return as they are. "
        "Read the files with dask_cosim.read_parquet(path), or write them with "
        "dask_cosim.to_parquet(df, path, layout='list') for other tools."
    )


def not_vectors(column: str, dtype: Any) -> TypeError:
    """A dtype that holds no vectors at all (numbers, dates, ...)."""
    return TypeError(
        f"column {column!r} has dtype {dtype}, which is not a column of vectors; "
        f"expected {ACCEPTED}"
    )


def nested_lists(column: str, dtype: Any, flatten: str) -> TypeError:
    """Lists of lists; ``flatten`` says how the user's library flattens a row."""
    return TypeError(
        f"column {column!r} holds nested lists ({dtype}); flatten each row to one list of "
        f"D numbers ({flatten}, or reshape(-1) before writing)"
    )


def cell_not_vector(column: str, row: Any, cell: Any) -> TypeError:
    """One cell of an object column that is not a vector of real numbers."""
    text = repr(cell)
    short = text if len(text) <= 40 else text[:37] + "..."
    return TypeError(
        f"column {column!r}: row {row!r} holds {type(cell).__name__} {short}, not a vector "
        "of numbers; expected one numpy array, torch tensor or list of numbers per row"
    )


def not_parquet(path: str, why: str, reads: str, how: str) -> ValueError:
    """A file that is not Parquet: ``why`` (what it starts with), what the caller
    ``reads``, and ``how`` to turn it into Parquet."""
    return ValueError(f"{path!r} is not a Parquet file ({why}); {reads}; {how}")
