"""The errors users see, built in one place: each function returns the exception to raise.

Every message names the argument, column, row or file, shows the value with ``!r``, says
what was expected and how to fix it.  A message that several modules raise (a column not
found, vectors of different lengths, a file that is not Parquet) is written here once;
messages only one place raises stay beside the check that raises them.  This module
imports nothing of the package: every layer may use it.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from collections.abc import Iterable
from typing import Any

__all__ = [
    "ACCEPTED",
    "CosimWarning",
    "ExactInsteadWarning",
    "QueryWarning",
    "RepeatedLabelsWarning",
    "ResultTooLargeError",
    "StalePreparedWarning",
    "StringColumnError",
    "binary_column",
    "caller_stacklevel",
    "cell_not_vector",
    "column_not_found",
    "did_you_mean",
    "dims_differ",
    "labels_may_repeat",
    "nested_lists",
    "not_parquet",
    "not_vectors",
    "queries_unusable",
    "ragged",
    "repeated_column",
    "string_column",
]

#: The column formats that hold vectors, as error messages describe them.
ACCEPTED = (
    "Arrow fixed_size_list or list of floats (pd.ArrowDtype(pa.list_(pa.float32(), D))), "
    "an object column holding one numpy array or torch tensor per row, "
    "or a cudf list column"
)


# Characters of a cell's text that a message quotes, at most.
CELL_TEXT_CHARS = 40


def shortened(text: str) -> str:
    """``text`` as a message quotes a cell: whole up to :data:`CELL_TEXT_CHARS`
    characters, else its start and "..." in that many."""
    if len(text) <= CELL_TEXT_CHARS:
        return text
    return text[: CELL_TEXT_CHARS - 3] + "..."


def did_you_mean(name: Any, candidates: Iterable[Any]) -> str:
    """ "; did you mean 'embeds_b'?" for the closest of ``candidates``, or ""."""
    by_text = {str(c): c for c in candidates}
    close = difflib.get_close_matches(str(name), list(by_text), n=1)
    return f"; did you mean {by_text[close[0]]!r}?" if close else ""


def repeated_column(column: Any, count: int, what: str = "column") -> ValueError:
    """A column label the frame holds more than once (``pd.concat(axis=1)`` of frames
    with a column in common): ``frame[column]`` is then a frame, not a column."""
    return ValueError(
        f"{what} {column!r} is the name of {count} columns of the frame, so it names no one "
        f"column: rename or drop the copies first (pandas: "
        f"df = df.loc[:, ~df.columns.duplicated()] keeps the first)"
    )


def column_not_found(
    column: Any,
    available: Iterable[Any],
    what: str = "column",
    *,
    where: Any = None,
    vectors: Iterable[Any] = (),
) -> KeyError:
    """KeyError("column 'embed_b' not found; did you mean 'embeds_b'? available: [...]").

    ``column`` may be a list of the missing columns (the hint is for the first);
    ``where`` names the file or frame looked in.  ``vectors``, the columns that hold
    vectors (for a lookup of an embedding column), are suggested when no name is close:
    "did you mean 'emb', the only vector column?" or "the vector columns are [...]".
    """
    available, vectors = list(available), list(vectors)
    first = column[0] if isinstance(column, list) and column else column
    hint = did_you_mean(first, available)
    if not hint and len(vectors) == 1:
        hint = f"; did you mean {vectors[0]!r}, the only vector column?"
    elif not hint and vectors:
        hint = f"; the vector columns are {vectors!r};"
    place = "" if where is None else f" in {where!r}"
    return KeyError(f"{what} {column!r} not found{place}{hint or ';'} available: {available!r}")


def is_label(value: Any) -> bool:
    """Whether ``value`` can be a column's name: hashable and not an array, tensor or
    frame (torch tensors and dask collections hash)."""
    try:
        hash(value)
    except TypeError:
        return False
    return getattr(value, "ndim", 0) == 0


def not_a_column_name(argument: str, value: Any) -> TypeError:
    """TypeError("on= must name a column of the frame; got a ndarray"); for a column
    given itself (a Series, as pandas habit passes it), its name to pass instead."""
    name = getattr(value, "name", None)
    hint = f": pass its name, {argument}={name!r}" if name is not None and is_label(name) else ""
    return TypeError(
        f"{argument}= must name a column of the frame; got a {type(value).__name__}{hint}"
    )


def arguments_swapped(method: str, first: str, name: str, column: str) -> TypeError:
    """TypeError for ``df.cosim.topk("emb", queries)``: the column given where ``first``
    (the queries, the right frame; ``name`` in the example call) goes, and an array or
    frame where the column goes."""
    return TypeError(
        f"df.cosim.{method} takes the {first} first, then the column: "
        f"df.cosim.{method}({name}, {column!r}, k=10)"
    )


def queries_frame(columns: list[Any], vectors: list[Any], on: str) -> TypeError:
    """``topk`` given a frame whose columns are not all numbers as its queries: say which
    Series to give (a vector column of it: ``vectors``, else ``on`` where it has one), and
    ``join`` for matching every row of another frame."""
    candidates = [*vectors, *(c for c in columns if c == on), *columns]
    column = candidates[0] if candidates else on
    return TypeError(
        f"queries is a DataFrame (columns {columns!r}); give the Series of its embedding "
        f"column, e.g. df.cosim.topk(queries[{column!r}], {on!r}, k=10), or a 2-D array "
        f"(n, D). For the best matches of every row of another frame, use "
        f"df.cosim.join(other, {on!r}, k=10)"
    )


def join_not_frame(right: Any, on: str, right_on: str) -> TypeError:
    """``join`` given something other than a frame as its right side: a Series (say how
    to make it a frame) or an array of vectors (how to make a frame of it, and ``topk``,
    which takes vectors as they are)."""
    where = f"join's right side is of type {type(right).__name__}, not a DataFrame"
    if hasattr(right, "index") and hasattr(right, "dtype"):  # a Series
        return TypeError(f"{where}; make it one: right.to_frame({right_on!r})")
    return TypeError(
        f"{where}; make one with a vector column {right_on!r}, e.g. "
        f"pd.DataFrame({{{right_on!r}: list(vectors)}}), or, for the best rows of the left "
        f"frame for each vector, use df.cosim.topk(vectors, {on!r}, k=10)"
    )


def dims_differ(what_a: str, dim_a: int, what_b: str, dim_b: int, row: Any = None) -> ValueError:
    """Vectors of two lengths where one is needed: from the metadata (two columns, or a
    column and the queries), or at ``row`` of one frame (two columns of that row; where
    one is empty, a placeholder for a missing vector often, say to make it null)."""
    if row is None:
        return ValueError(
            f"{what_a} holds vectors of {dim_a} values and {what_b} of {dim_b}; cosine "
            "similarity needs vectors of the same length"
        )
    empty = what_a if dim_a == 0 else what_b if dim_b == 0 else None
    hint = (
        ""
        if empty is None
        else f"; {empty} holds an empty vector there: for a row without a vector, store "
        f"null (None), not an empty one: row {row!r} then scores null"
    )
    return ValueError(
        f"row {row!r}: {what_a} has {dim_a} values and {what_b} has {dim_b}; both columns "
        f"need vectors of the same length{hint}"
    )


def unnamed_vector_columns(columns: list[Any], vectors: list[Any]) -> TypeError:
    """``columns`` of a dask frame hold vectors in object cells (arrays or tensors),
    which its meta (dtype object) does not tell: ``to_parquet`` needs them named."""
    many = len(columns) > 1
    return TypeError(
        f"column{'s' * many} {', '.join(map(repr, columns))} of this dask frame "
        f"hold{'' if many else 's'} vectors as Python objects (arrays or tensors per row), "
        f"which its metadata (dtype object) does not say: name {'them' if many else 'it'}, "
        f"to_parquet(df, path, vectors={vectors!r}), to store {'them' if many else 'it'} "
        "as vectors (a map_partitions step can return them as Arrow vectors instead: "
        "dask_cosim.io.vectors_to_arrow)"
    )


def empty_vectors(column: str, row: Any) -> ValueError:
    """Every row of a column read at once (the column, or a dask partition of it; an
    object column or Arrow lists) that is not null holds a vector of no values, ``row``
    first: no length D to compare, most often an embedding step that failed or empty
    placeholders for missing vectors."""
    return ValueError(
        f"column {column!r}: row {row!r} holds an empty vector, and so does every other row "
        "read with it that is not null (the column's, or on dask its partition's): vectors "
        "with no values (D = 0) have no cosine. Check the step that made them; for a row "
        "without a vector, store null (None), not an empty one: that row then scores null"
    )


class RaggedError(ValueError):
    """Rows of one vector column with vectors of different lengths."""


def ragged(column: str, label: Any, length: int, first_label: Any, dim: int) -> RaggedError:
    """Two rows of one column with vectors of different lengths; where one is empty (a
    placeholder for a missing vector, often), say to make it null instead."""
    empty = label if length == 0 else first_label if dim == 0 else None
    hint = (
        ""
        if empty is None
        else f"; for a row without a vector, store null (None), not an empty one: row "
        f"{empty!r} then scores null"
    )
    return RaggedError(
        f"column {column!r}: row {label!r} has {length} values but row {first_label!r} "
        f"has {dim}; every row of an embedding column needs the same length{hint}"
    )


def ragged_partitions(column: str, part_a: int, dim_a: int, part_b: int, dim_b: int) -> ValueError:
    """One column with vectors of different lengths in two partitions (each partition is
    checked on its own when it is read)."""
    return ValueError(
        f"column {column!r} holds vectors of {dim_a} values in partition {part_a} and of "
        f"{dim_b} in partition {part_b}; every row of an embedding column needs the same "
        f"length: fix those rows, or keep one length first (for an Arrow list column, "
        f"df[df[{column!r}].list.len() == {dim_a}])"
    )


class StringColumnError(TypeError):
    """Strings where vectors were expected; ``sample`` (a cell, or None when none was
    looked at) tells text from vectors that became text."""

    def __init__(self, message: str, dtype: Any, sample: str | None) -> None:
        super().__init__(message)
        self.dtype = dtype
        self.sample = sample


class ResultTooLargeError(RuntimeError):
    """A task of a search found more pairs than ``cosim.search.max-result-bytes`` lets it
    hold (:mod:`dask_cosim.search_budget` says how much and why); raised on the worker
    in place of running it out of memory.  Not a MemoryError: nothing should retry it."""


# str() of a numpy array, torch tensor, list or tuple: "[0.1 0.2 ...]", "tensor([[0.1],
# ...", and of a list of numpy or torch scalars, as list(row) makes of an array or tensor
# row: "[np.float32(0.1), ...", "[tensor(0.1000), ...".
_VECTOR_TEXT = re.compile(
    r"^\s*(tensor\(|array\()?\s*[\[(]+\s*(np\.\w+\(|tensor\()?\s*[-+]?(\d|\.\d|nan|inf)",
    re.I,
)

_EMBED = (
    "Embed the text first, e.g. with sentence-transformers: model = "
    "SentenceTransformer('all-MiniLM-L6-v2'); pdf['embedding'] = "
    "list(model.encode(pdf[{column!r}].tolist())); then use the embedding column"
)

_STRINGIFIED = (
    "dask turns object columns of arrays or tensors into text such as '[0.1 0.2 ...]' "
    "(its 'dataframe.convert-string', in dd.from_pandas, dd.from_delayed, dd.from_map and "
    "dd.from_dict alike), truncated. Build the dask frame with dask_cosim.from_pandas(pdf) "
    "instead: it stores them as Arrow vectors; partitions of your own can hold them so "
    "(pdf['emb'] = dask_cosim.io.vectors_to_arrow(np.stack(pdf['emb'])), in a meta too). "
    "(dask.config.set({'dataframe.convert-string': False}) before building the frame "
    "keeps them too, as Python objects that dask hashes one by one: about 200x slower in "
    "benchmarks/from_pandas.py.)"
)


def string_column(
    column: str,
    dtype: Any,
    sample: Any = None,
    vectors: Iterable[Any] = (),
    lazy: bool = False,
    empty: bool = False,
) -> StringColumnError:
    """Strings where vectors were expected: text (``sample`` a cell that is no vector
    written out: say how to embed it), vectors that dask turned into text (``sample``
    such as '[0.1 0.2 ...]': say how to keep them; where it is JSON, '[0.1, 0.2]', as a
    CSV file holds vectors, say how to parse it first, on a dask frame when ``lazy``), or,
    with no ``sample``, both cases.  ``vectors``: the columns of the frame that do hold
    vectors; ``empty``: the column is known to hold nulls alone (a ``dd.from_pandas``
    column of None, which dask made strings)."""
    text = None if sample is None else str(sample)
    vectors = list(vectors)
    others = f" The frame's vector columns: {vectors!r}." if vectors else ""
    short = None if text is None else shortened(text)
    if text is not None and _VECTOR_TEXT.match(text):
        message = f"column {column!r} holds strings ({dtype}), not vectors. "
        if is_json_numbers(text):
            # What a CSV or JSON file of embeddings gives pandas (OpenAI's cookbook files,
            # for one): dask_cosim.from_pandas alone would not help.
            parse = (
                f"read the file with dask_cosim.io.read_text(path) (lists read as Arrow "
                f"lists), or df[{column!r}] = df[{column!r}].map(json.loads, "
                f"meta=({column!r}, object))"
                if lazy
                else f"e.g. pdf[{column!r}] = pdf[{column!r}].map(json.loads)"
            )
            message += (
                f"Its cells are lists of numbers written as text, such as {short!r}, as "
                f"read from a CSV or JSON file: parse them first, {parse}."
            )
            # A frame in memory was read so; only a dask frame may have been made text.
            if lazy:
                message += " If they were lists before dd.from_pandas: " + _STRINGIFIED
        else:
            message += _STRINGIFIED
    elif text is not None:
        message = (
            f"column {column!r} holds text ({dtype}) such as {short!r}, not vectors: cosine "
            f"similarity compares embeddings, one vector of numbers per row. "
            f"{_EMBED.format(column=column)}.{others}"
        )
    elif empty:
        message = (
            f"column {column!r} holds no values, every row null, which dask made a column "
            f"of strings ({dtype}). {_STRINGIFIED} (A search of it then finds no matches.)"
        )
    else:
        message = (
            f"column {column!r} holds strings ({dtype}), not vectors. If it holds text, "
            f"{_EMBED[0].lower()}{_EMBED[1:].format(column=column)}. If its cells are "
            f"vectors written as text: {_STRINGIFIED}{others}"
        )
    return StringColumnError(message, dtype, text)


def is_json_numbers(text: str, flat: bool = False) -> bool:
    """Whether ``text`` is a JSON list of numbers (or, unless ``flat``, of lists of them):
    "[0.1, 0.2]", not numpy's "[0.1 0.2]" or torch's "tensor([...])"."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    if not isinstance(value, list):
        return False
    if flat:
        cells = value
    else:
        cells = [v for row in value for v in (row if isinstance(row, list) else [row])]
    numbers = (isinstance(v, (int, float)) and not isinstance(v, bool) for v in cells)
    return bool(cells) and all(numbers)


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
    return TypeError(
        f"column {column!r}: row {row!r} holds {type(cell).__name__} {shortened(repr(cell))}, "
        "not a vector of numbers; expected one numpy array, torch tensor or list of numbers "
        "per row"
    )


def not_parquet(path: str, why: str, reads: str, how: str) -> ValueError:
    """A file that is not Parquet: ``why`` (what it starts with), what the caller
    ``reads``, and ``how`` to turn it into Parquet."""
    return ValueError(f"{path!r} is not a Parquet file ({why}); {reads}; {how}")


class CosimWarning(UserWarning):
    """What a dask_cosim call did, or found, that its caller may not expect; every
    warning of the library is one (the command line prints them as one line)."""


class RepeatedLabelsWarning(CosimWarning):
    """A search result names rows by index labels that may repeat across partitions."""


def labels_may_repeat(
    what: str,
    npartitions: int | None,
    names: str,
    columns: Iterable[Any],
    keyword: str,
    dask_read: bool = False,
) -> RepeatedLabelsWarning:
    """``what`` (a frame) has ``npartitions`` partitions and unknown divisions (None: an
    eager frame whose labels repeat, or a dask frame of one in memory), so the result's
    ``names`` columns may not tell its rows apart; ``columns``: the frame's, to suggest
    one to carry with ``keyword`` (``columns`` or ``right_columns``); ``dask_read``: the
    frame comes from dask's ``read_parquet``, whose labels ours would number across the
    files."""
    columns = list(columns)
    ids = [c for c in columns if "id" in str(c).lower()]
    carry = f"{keyword}=[{ids[0]!r}]" if ids else f"{keyword}=[...] (a column of your own)"
    if npartitions is None:
        return RepeatedLabelsWarning(
            f"{what}'s index labels repeat, so {names} cannot name its rows uniquely. Carry "
            f"a column that does: {carry}; or number the rows first (reset_index)."
        )
    start = (
        f"{what} has {npartitions} partitions and unknown divisions: its index labels may "
        "repeat across partitions"
    )
    if not dask_read:
        return RepeatedLabelsWarning(
            f"{start} (reset_index, concat and merge number each partition's rows from 0), "
            f"so {names} may not name rows uniquely. Carry a column that does: {carry}."
        )
    return RepeatedLabelsWarning(
        f"{start} (dd.read_parquet numbers each file from 0), so {names} may not name rows "
        f"uniquely. Carry a column that does: {carry}; or read the files with "
        "dask_cosim.read_parquet, which numbers files that store no index across the "
        "folder (hive-partitioned key=value/ folders too, except with the cudf backend)."
    )


class QueryWarning(CosimWarning):
    """A query of ``topk`` that cannot find what the caller looks for."""


class ExactInsteadWarning(CosimWarning):
    """``method="clustered"`` runs exact all-pairs instead, where its plan expects that to
    cost no more: the same result (``cosim.search.clustered.exact-when-cheaper``)."""


class StalePreparedWarning(CosimWarning):
    """The columns ``prepare`` added beside a vector column are not its vectors' (it
    changed since): a search normalises the vectors itself."""


def _shown(labels: list[Any]) -> str:
    """The first five of ``labels`` as a message names them, "..." after."""
    return ", ".join(repr(x) for x in labels[:5]) + (", ..." if len(labels) > 5 else "")


def query_labels_repeat(labels: list[Any]) -> QueryWarning:
    """The queries' Series has ``labels`` more than once: ``query`` cannot tell them
    apart."""
    shown = _shown(labels)
    return QueryWarning(
        f"the queries' index labels repeat ({shown}), so the result's 'query' column does "
        "not tell those queries apart; give them labels of their own "
        "(queries.reset_index(drop=True): positions), or an array"
    )


def queries_unusable(labels: list[Any], by_position: bool, zero: bool) -> QueryWarning:
    """The queries at ``labels`` (positions, or the labels of a Series) hold NaN, inf or
    null (``zero`` False), or are zero vectors (``zero`` True)."""
    shown = _shown(labels)
    plural = "s" * (len(labels) > 1)
    noun = "position" if by_position else "label"
    which = f"{len(labels)} quer{'ies' if plural else 'y'} ({noun}{plural} {shown})"
    if zero:
        return QueryWarning(
            f"{which} of zero vectors, which score 0.0 with every row; their matches are the "
            "first valid rows in frame order, not similar rows. Check how they were embedded."
        )
    return QueryWarning(
        f"{which} with NaN, inf or null values, which match no row; the result has no rows for "
        "them. Check how they were embedded."
    )


def caller_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the user's line, for a
    ``warnings.warn`` in the function that calls this: the first frame outside dask_cosim
    and dask (the entry points reach a warning through different depths)."""
    frame, level = sys._getframe(2), 2
    while frame.f_back and frame.f_globals.get("__name__", "").startswith(("dask_cosim", "dask.")):
        frame, level = frame.f_back, level + 1
    return level
