"""The D of vector columns that a partition cannot tell, and how the Parquet files of
:func:`~dask_cosim.io.to_parquet` are written (:class:`FileWriter`).

A partition of a variable-list (or object) vector column with no rows, or only null ones,
holds no vector to take D from, and neither does the frame's meta.  Its file stores the
column as a variable list of nulls (:func:`~dask_cosim.io.layouts.encode_column`), which
needs no D, so every partition is still written on its own, in parallel.  Once all are
written, :func:`sized_files` rewrites each such file that has rows with the D and dtype
the folder's other files store (its nulls in that field; its other columns, row groups
and metadata as they were), so every file has one schema: each reader of a folder
(pandas, dask, pyarrow datasets, DuckDB, ours) takes one file's schema.  Where no file
knows D, the files stay as written: the column reads back as the variable list of nulls
it was.  So for the other object columns, whose type pyarrow takes from each partition's
values (decimal128(2, 1) of 1.5 and decimal128(3, 1) of 10.5, int64 of ints and double
of floats, a list of nulls of empty lists): the files whose type is not the one all
unify to (pyarrow's permissive promotion) are rewritten with their values cast to it.
Only those files are rewritten, one by one, in the task that writes the manifest; files
of no rows are deleted there anyway.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from dask_cosim.io.layouts import stored_vector, vector_field

__all__ = ["FileWriter", "sized_files", "stored_vectors"]


@dataclass(frozen=True, eq=False)  # (its vectors, a list, would not hash)
class FileWriter:
    """How one :func:`~dask_cosim.io.to_parquet` call writes its files: into the folder
    ``staging`` on ``fs``, its ``vectors`` in ``layout``, uncompressed and without a
    dictionary, the other columns compressed with ``compression`` (one codec, or a dict
    per column), in row groups of ``row_group_rows``."""

    fs: pafs.FileSystem
    staging: str
    layout: str
    vectors: list[str]
    compression: str | dict[str, str] | None
    row_group_rows: int | None

    def write(self, table: pa.Table, name: str) -> None:
        """Write ``table`` (vectors already in :attr:`layout`) as the file ``name``."""
        compression = self.compression
        if not isinstance(compression, dict):
            codec = compression or "none"
            compression = {c: ("none" if c in self.vectors else codec) for c in table.column_names}
        pq.write_table(
            table,
            f"{self.staging}/{name}",
            filesystem=self.fs,
            compression=compression,
            # Distinct float vectors gain nothing from a dictionary: it only adds a pass to
            # every write and read.
            use_dictionary=[c for c in table.column_names if c not in self.vectors],
            row_group_size=self.row_group_rows,
        )


def stored_vectors(schema: pa.Schema, vectors: list[str]) -> dict[str, tuple[int, str]]:
    """{column: (D, dtype name)} of the ``vectors`` of a file of ``schema``; D is 0 for a
    column stored without one (a variable list: see the module's docstring)."""
    found = {}
    for column in vectors:
        field = schema.field(column)
        stored = stored_vector(field)
        if stored is None:
            stored = (0, np.dtype(field.type.value_type.to_pandas_dtype()).name)
        found[column] = stored
    return found


def sized_files(written: pd.DataFrame, files: FileWriter) -> pd.DataFrame:
    """``written`` (one row of :data:`~dask_cosim.io.manifest.WRITTEN_META` per file that
    ``files`` wrote) after each file with rows that stores a vector column without D while
    another file stores it with one is rewritten with that D and dtype (its nulls so
    stored), and each that stores another column with no type (Arrow null: an object
    column all None there) while another file stores a type, with that type (read from
    that file's footer), and each that stores an object column with another type than
    the one the files' types unify to, with that one (:func:`_unified_types`).
    ValueError naming the column and the file where such a file holds vectors of no
    values rather than nulls: D 0 cannot join the other files' D."""
    specs = [json.loads(spec) for spec in written["vectors"]]
    inferred = [json.loads(types) for types in written["inferred"]]
    untyped = [{c for c, t in types.items() if t == "null"} for types in inferred]
    known: dict[str, tuple[int, str]] = {}
    for spec in specs:
        for column, (dim, dtype) in spec.items():
            if dim:
                known.setdefault(column, (dim, dtype))
    unified = _unified_types(files, written, inferred)
    # (A column the files type otherwise has its type already: no footer read for it.)
    untyped_only = [nulls - unified.keys() for nulls in untyped]
    types = {**_stored_types(files, written, untyped_only), **unified}
    for file, rows, spec, nulls, kinds in zip(
        written["file"], written["rows"], specs, untyped, inferred, strict=True
    ):
        missing = {c: known[c] for c, (dim, _) in spec.items() if not dim and c in known}
        # Its columns of no type given the others' type, those of another type cast.
        retyped = {c: types[c] for c in nulls if c in types} | {
            c: t for c, t in unified.items() if kinds.get(c, "null") not in ("null", str(t))
        }
        if rows and (missing or retyped):
            _rewrite(files, file, missing, retyped)
            spec.update(missing)
    return written.assign(vectors=[json.dumps(spec) for spec in specs])


def _stored_types(
    files: FileWriter, written: pd.DataFrame, untyped: list[set[str]]
) -> dict[str, pa.DataType]:
    """The type the first file with rows that stores each of the ``untyped`` columns
    with one gives it (one footer read per column at most)."""
    types: dict[str, pa.DataType] = {}
    for column in set().union(*untyped):
        for file, rows, nulls in zip(written["file"], written["rows"], untyped):
            if rows and column not in nulls:
                schema = pq.read_schema(f"{files.staging}/{file}", filesystem=files.fs)
                types[column] = schema.field(column).type
                break
    return types


def _unified_types(
    files: FileWriter, written: pd.DataFrame, inferred: list[dict[str, str]]
) -> dict[str, pa.DataType]:
    """{column: the type its files' types unify to} for each object column that the
    files with rows store with more than one type (Arrow null aside), from one footer
    per type; ValueError naming two files where the types do not unify (int64 and
    string: the column holds numbers in one partition, text in another)."""
    firsts: dict[str, dict[str, str]] = {}  # column -> {type: the first file of it}
    for file, rows, kinds in zip(written["file"], written["rows"], inferred, strict=True):
        for column, kind in kinds.items():
            if rows and kind != "null":
                firsts.setdefault(column, {}).setdefault(kind, file)
    unified = {}
    for column, first in firsts.items():
        if len(first) < 2:
            continue
        fields = {
            file: pq.read_schema(f"{files.staging}/{file}", filesystem=files.fs).field(column)
            for file in first.values()
        }
        try:
            schema = pa.unify_schemas(
                [pa.schema([f]) for f in fields.values()], promote_options="permissive"
            )
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            (a, fa), (b, fb) = list(fields.items())[:2]
            raise ValueError(
                f"column {column!r} holds {fa.type} in {a} and {fb.type} in {b}: pyarrow "
                "takes an object column's type from each partition's values; give the "
                f"column one type before writing (e.g. df[{column!r}].astype(...))"
            ) from None
        unified[column] = schema.field(column).type
    return unified


def _rewrite(
    files: FileWriter,
    file: str,
    sizes: dict[str, tuple[int, str]],
    types: dict[str, pa.DataType] | None = None,
) -> None:
    """The file ``file`` of ``files`` written again, each column of ``sizes`` stored as
    nulls of its (D, dtype) in their layout, each of ``types`` as its type: nulls of it
    where the file stores the column with no type (Arrow null), else its values cast."""
    with files.fs.open_input_file(f"{files.staging}/{file}") as source:
        table = pq.ParquetFile(source).read()
    for column, kind in (types or {}).items():
        i = table.schema.get_field_index(column)
        values = table.column(i)
        stored = pa.nulls(len(table), kind) if pa.types.is_null(values.type) else values.cast(kind)
        table = table.set_column(i, table.schema.field(i).with_type(kind), stored)
    for column, (dim, dtype) in sizes.items():
        i = table.schema.get_field_index(column)
        if table.column(i).null_count != table.num_rows:
            raise ValueError(
                f"column {column!r}: {file} holds vectors of no values (D = 0) but other "
                f"partitions hold {dim}-long ones; every partition needs the same D "
                "(make those rows null, or drop them)"
            )
        field = vector_field(column, pa.from_numpy_dtype(np.dtype(dtype)), dim, files.layout)
        table = table.set_column(i, field, pa.nulls(table.num_rows, field.type))
    files.write(table, file)
