"""CSV and JSON Lines files of embeddings as dask frames whose vectors are vectors.

Embeddings often travel as text: a CSV file whose vector cells are JSON lists
(``"[0.1, 0.2, ...]"``, as ``pandas.to_csv`` writes a list and OpenAI's cookbook files hold
them), or JSON Lines with one record per row (``{"id": 1, "emb": [0.1, 0.2, ...]}``).
dask splits the file into blocks of about 64 MiB, one partition each, and every vector
column becomes an Arrow ``list<double>`` column there:

- CSV (``dd.read_csv``): a column of strings whose first cell is a JSON list of numbers
  is split and cast by pyarrow's compute functions (several times faster than
  ``json.loads`` per cell);
- JSON Lines (dask's ``read_bytes``, cut at line ends): pyarrow's JSON reader reads each
  block with the schema of the first, lists of numbers as ``list<double>`` (a string
  column whose first value is the JSON text of one is parsed as CSV's cells are).

Every row of a vector column must hold as many numbers as its first row: a block with a
row of another length raises, naming the file, the column and the cell (the labels of a
block count from 0, so the cell's text is what finds it).

The numbers keep the float64 values the text spells (shortest round-trip text of float32
values reads back as those values, widened).  Each block's index starts at 0, as dask
gives it: write the frame without its index (``dask-cosim convert`` does), and
:func:`~dask_cosim.io.read.read_parquet` numbers the rows across the folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from dask import delayed
from dask.bytes import read_bytes

from dask_cosim import errors
from dask_cosim.backends.pandas import ragged_rows

CSV_SUFFIXES = (".csv", ".tsv")
JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
TEXT_SUFFIXES = CSV_SUFFIXES + JSON_SUFFIXES

# Bytes of text per partition.
BLOCK_BYTES = 64 * 2**20

# What a vector column becomes, in Arrow and in pandas.
VECTOR_TYPE = pa.list_(pa.float64())
VECTORS = pd.ArrowDtype(VECTOR_TYPE)


def is_text_file(path: str | Path) -> bool:
    """Whether ``path`` names a CSV or JSON (Lines) file, by its suffix."""
    return Path(path).suffix.lower() in TEXT_SUFFIXES


def read_text(path: str | Path, blocksize: int | None = None) -> dd.DataFrame:
    """A CSV (.csv, .tsv) or JSON Lines (.jsonl, .ndjson, .json) file as a dask frame, one
    partition per ``blocksize`` bytes of text (default :data:`BLOCK_BYTES`), its vector
    columns as Arrow
    ``list<double>`` (found from the first rows: see the module docstring).

    Raises ``ValueError`` when the file is empty, or no column holds vectors, naming the
    columns and what a vector cell looks like; a cell that is not a list of numbers
    raises when its block is read, naming the file, the column and the cell.  JSON Lines
    may hold vectors as lists or as their JSON text (``"[0.1, 0.2]"``), as CSV does."""
    source = Path(path)
    suffix = source.suffix.lower()
    blocksize = BLOCK_BYTES if blocksize is None else blocksize
    where = str(path)
    if source.is_file():
        with open(source, "rb") as f:
            if not f.read(4096).strip():
                raise ValueError(f"{where!r} is empty: no header, no rows")
    if suffix in CSV_SUFFIXES:
        sep = "\t" if suffix == ".tsv" else ","
        df = dd.read_csv(str(source), sep=sep, blocksize=blocksize)
        head = df.head(5, npartitions=1, compute=True)
        columns = [c for c in head.columns if _holds_vectors(head[c])]
        _check_found(path, columns, list(head.columns))
        meta = df._meta.assign(**{str(c): pd.Series([], dtype=VECTORS) for c in columns})
        return df.map_partitions(_parse_columns, columns, where, meta=meta, token="cosim-read-text")
    _, (blocks,) = read_bytes(str(source), delimiter=b"\n", blocksize=blocksize, sample=False)
    first = bytes(blocks[0].compute()) if blocks else b""
    if first.lstrip().startswith(b"["):
        raise ValueError(
            f"{str(path)!r} is one JSON array, not JSON Lines (one record per line, "
            "{...}); write it as JSON Lines first, e.g. with jq -c '.[]'"
        )
    schema, as_text = _json_schema(first)
    columns = [*_vector_fields(schema), *as_text]
    _check_found(path, columns, schema.names)
    meta = _json_frame(b"", schema, as_text, where)
    parts = [delayed(_json_frame)(block, schema, as_text, where) for block in blocks]
    return dd.from_delayed(parts, meta=meta, verify_meta=False)


def _check_found(path: str | Path, columns: list[Any], names: list[Any]) -> None:
    if not columns:
        raise ValueError(
            f"{str(path)!r} has no column of vectors among {names!r}: a vector cell is a "
            'JSON list of numbers, e.g. "[0.1, 0.2, 0.3]"'
        )


def _vector_fields(schema: pa.Schema) -> list[str]:
    return [f.name for f in schema if f.type == VECTOR_TYPE]


def _json_schema(first: bytes) -> tuple[pa.Schema, list[str]]:
    """The schema every block of a JSON Lines file is read with, from its first block
    (``first``): lists of numbers as ``list<double>``, columns with no value there as
    strings, the rest as pyarrow infers them; and the string columns whose first value
    is the JSON text of a list of numbers (vectors as text)."""
    if not first.strip():
        return pa.schema([]), []
    try:
        table = pj.read_json(pa.BufferReader(first))
    except pa.ArrowInvalid:  # a bad cell in the block: its first line tells the columns
        table = pj.read_json(pa.BufferReader(first.lstrip().split(b"\n", 1)[0]))
    inferred = table.schema
    as_text = [
        f.name
        for f in inferred
        if pa.types.is_string(f.type) and _holds_vectors(table.column(f.name).to_pandas())
    ]
    fields = []
    for field in inferred:
        kind = field.type
        if pa.types.is_list(kind) and (
            pa.types.is_integer(kind.value_type) or pa.types.is_floating(kind.value_type)
        ):
            kind = VECTOR_TYPE
        elif pa.types.is_null(kind):
            kind = pa.string()
        fields.append(pa.field(field.name, kind))
    return pa.schema(fields), as_text


def _json_frame(block: bytes, schema: pa.Schema, as_text: list[str], where: str) -> pd.DataFrame:
    """One block of JSON Lines (of the file ``where``) as a pandas frame of Arrow columns
    (the same dtypes in every block: pandas' own would make ints with nulls floats in
    some blocks only); the ``as_text`` columns parsed as CSV's vector cells are."""
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    try:
        table = (
            pj.read_json(pa.BufferReader(block), parse_options=options)
            if block.strip()
            else schema.empty_table()
        )
    except pa.ArrowInvalid as error:
        table = _mixed_block(block, schema, as_text)
        if table is None:
            raise _first_bad_line(block, schema, error, where) from None
        for column in as_text:  # parsed already: checked as the list columns are
            _check_lengths(table.column(column), column, where)
        as_text = []
    for column in _vector_fields(schema):
        _check_lengths(table.column(column), column, where)
    df = table.to_pandas(types_mapper=pd.ArrowDtype)
    return _parse_columns(df, as_text, where) if as_text else df


def _mixed_block(block: bytes, schema: pa.Schema, as_text: list[str]) -> pa.Table | None:
    """The block read line by line, for vector columns that hold lists in some rows and
    their JSON text in others (pyarrow's reader takes one kind a column): every vector
    cell as a list, the ``as_text`` columns ``list<double>`` as well.  None where the
    block fails for another reason (:func:`_first_bad_line` then names it)."""
    vectors = {*_vector_fields(schema), *as_text}
    records = []
    for line in block.splitlines():
        try:
            record = json.loads(line) if line.strip() else None
        except ValueError:
            return None
        if record is None:
            continue
        if not isinstance(record, dict):
            return None
        for column in vectors & record.keys():
            cell = record[column]
            if isinstance(cell, str) and errors.is_json_numbers(cell, flat=True):
                record[column] = json.loads(cell)
        records.append(record)
    fields = [pa.field(f.name, VECTOR_TYPE) if f.name in as_text else f for f in schema]
    try:
        return pa.Table.from_pylist(records, schema=pa.schema(fields))
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None


def _first_bad_line(block: bytes, schema: pa.Schema, error: Exception, where: str) -> ValueError:
    """The error naming the first vector cell of ``block`` (of the file ``where``) that
    is not a list of numbers, else pyarrow's own ``error``."""
    vectors = _vector_fields(schema)
    for line in block.splitlines():
        try:
            record = json.loads(line) if line.strip() else {}
        except ValueError:
            return ValueError(f"{where!r}: a line is not JSON: {line[:60]!r} ({error})")
        for column in vectors:
            cell = record.get(column) if isinstance(record, dict) else None
            if cell is not None and not errors.is_json_numbers(json.dumps(cell), flat=True):
                return _bad_cell(column, json.dumps(cell), where)
    return ValueError(f"{where!r}: {error}")


def _holds_vectors(series: pd.Series) -> bool:
    """Whether the first non-null cell of ``series`` is the JSON text of a list of
    numbers."""
    cells = series.dropna()
    return bool(len(cells)) and errors.is_json_numbers(str(cells.iloc[0]), flat=True)


def _parse_columns(pdf: pd.DataFrame, columns: list[str], where: str) -> pd.DataFrame:
    """One block of the file ``where``: each of ``columns`` (JSON text) as
    ``list<double>``."""
    return pdf.assign(**{str(c): _vectors(pdf[c], str(c), where) for c in columns})


def _vectors(series: pd.Series, column: str, where: str) -> pd.Series:
    try:
        lists = _split_text(pa.array(series, from_pandas=True).cast(pa.large_string()))
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        raise _first_bad_cell(series, column, where) from None
    _check_lengths(lists, column, where)
    return pd.Series(pd.arrays.ArrowExtensionArray(lists), index=series.index, name=series.name)


def _split_text(text: pa.Array) -> pa.Array:
    """JSON lists of numbers ("[0.1, 0.2]") -> list<double>, null cells null."""
    inner = pc.utf8_trim(text, "[] \t\r\n")
    parts = pc.split_pattern(inner, ",")
    values = pc.cast(pc.utf8_trim_whitespace(parts.flatten()), pa.float64())
    # The split's own row bounds: its values are the ones just cast, one for one.
    return pa.ListArray.from_arrays(parts.offsets, values, mask=text.is_null())


def _check_lengths(lists: pa.Array | pa.ChunkedArray, column: str, where: str) -> None:
    """Raise when the rows of ``lists`` (nulls aside) hold vectors of different lengths,
    naming the file ``where`` and, by its values, the first row whose length is not the
    most common one (``backends.pandas.ragged_rows``: one odd first row is that row)."""
    lengths = pc.list_value_length(lists).to_numpy(zero_copy_only=False)
    valid = np.flatnonzero(~np.isnan(lengths.astype(float)))
    ragged = ragged_rows(lengths[valid].astype(np.int64))
    if ragged is None:
        return
    odd, usual = (int(valid[row]) for row in ragged)
    short = errors.shortened(json.dumps(lists[odd].as_py()))
    empty = 0 in (lengths[odd], lengths[usual])
    fix = "write null for a row without a vector" if empty else "fix or drop that row"
    raise ValueError(
        f"{where!r}: column {column!r} holds {short!r}, a vector of {int(lengths[odd])} "
        f"values, where most of its rows hold {int(lengths[usual])}; every row of an "
        f"embedding column needs the same length: {fix}"
    )


def _first_bad_cell(series: pd.Series, column: str, where: str) -> ValueError:
    """The error naming the first cell of ``series`` that is not a list of numbers (by its
    text: the labels of a block count from 0, not from the file's first row)."""
    for cell in series.dropna():
        if not errors.is_json_numbers(str(cell), flat=True):
            return _bad_cell(column, str(cell), where)
    return ValueError(f"{where!r}: column {column!r} holds a cell that is not a list of numbers")


def _bad_cell(column: str, text: str, where: str) -> ValueError:
    return ValueError(
        f"{where!r}: column {column!r} holds {errors.shortened(text)!r}, not a list of "
        'numbers such as "[0.1, 0.2, 0.3]": fix or drop that row'
    )
