"""Row positions as the index of Parquet files that store none.

Files written by plain pyarrow, by pandas with ``index=False``, by Spark or DuckDB, store
no index: read one at a time, each is numbered from 0 (dask's convention), so index labels
repeat across partitions, and a search result that names rows by label cannot be traced
back to them.  The row counts are in the footers: :func:`numbered_pieces` labels row ``i``
of the read (files in order, rows in order) ``i``, as ``pandas.read_parquet(folder)``
does, and gives the divisions, without reading data.  :func:`label_rows` then sets each
partition's labels when it is read; :func:`label` also gives a stored index that dask
wrote unnamed its name back (None).
"""

from __future__ import annotations

from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from dask_cosim.io.files import naming_non_parquet

__all__ = [
    "POSITION",
    "Numbering",
    "filtered",
    "label",
    "label_rows",
    "numbered_pieces",
    "numbering",
]

# The column that carries row positions through a filter (then taken out: the labels).
POSITION = "__dask_cosim_position__"

# The name dask's to_parquet stores an unnamed index under; its reader gives it back None.
DASK_UNNAMED_INDEX = "__null_dask_index__"

# (first label, step, name): row p of the read is labelled first + step * p.
Numbering = tuple[int, int, Any]

# Footers are read this many at a time (remote filesystems: one round trip each).
_FOOTER_THREADS = 16


def numbering(schema: pa.Schema, files: int, manifest: dict[str, Any] | None) -> Numbering | None:
    """How rows are labelled, or None when the files' own index stands: a stored index
    column, or the per-file RangeIndex metadata of a folder of ours.

    A single file whose pandas metadata holds a RangeIndex keeps its start, step and name
    (what pandas gives); anything else with no stored index is numbered 0, 1, 2, ...
    """
    entries = (schema.pandas_metadata or {}).get("index_columns") or []
    if any(isinstance(e, str) for e in entries):
        return None
    ranges = [e for e in entries if isinstance(e, dict) and e.get("kind") == "range"]
    if ranges and manifest is not None:
        return None
    if len(ranges) == 1 and files == 1 and int(ranges[0].get("step", 1)) > 0:
        r = ranges[0]
        return int(r.get("start", 0)), int(r.get("step", 1)), r.get("name")
    return 0, 1, None


def numbered_pieces(
    fs: pafs.FileSystem,
    pieces: list[tuple[Any, ...]],
    numbering: Numbering,
    keep: Collection[int] | None = None,
) -> tuple[list[int], list[Numbering], list[int] | None]:
    """Which ``pieces`` (a file, a tuple of files, or row groups of a file) to read, by
    index: the non-empty ones among ``keep`` (None: all); the numbering of each one's
    first row; and the divisions; from the footers alone.  Pieces left out of ``keep``
    (a filter rules out their files) still take their rows' numbers, as rows a filter
    drops do."""
    rows = _piece_rows(fs, pieces)
    start, step, name = numbering
    chosen, firsts, divisions = [], [], []
    position = last = 0
    for i, n in enumerate(rows):
        if n and (keep is None or i in keep):
            chosen.append(i)
            firsts.append((start + step * position, step, name))
            divisions.append(start + step * position)
            last = position + n - 1
        position += n
    if not chosen:  # nothing to number: one empty partition, as before
        return [0], [numbering], None
    return chosen, firsts, [*divisions, start + step * last]


def _piece_rows(fs: pafs.FileSystem, pieces: list[tuple[Any, ...]]) -> list[int]:
    # A piece may carry a third item (its files' ranges, cudf_parquet.manifest_ranges).
    files = sorted({f for file, *_ in pieces for f in ([file] if isinstance(file, str) else file)})
    with ThreadPoolExecutor(min(_FOOTER_THREADS, len(files))) as pool:
        footers = dict(zip(files, pool.map(lambda f: _footer(fs, f), files)))
    rows = []
    for file, row_groups, *_ in pieces:
        if not isinstance(file, str):
            rows.append(sum(footers[f].num_rows for f in file))
        elif row_groups is None:
            rows.append(footers[file].num_rows)
        else:
            rows.append(sum(footers[file].row_group(g).num_rows for g in row_groups))
    return rows


def _footer(fs: pafs.FileSystem, file: str) -> pq.FileMetaData:
    # A folder with no manifest may hold a stray file (a CSV, a CSV named .parquet):
    # named, not pyarrow's bare "magic bytes" error.
    with naming_non_parquet(file):
        return pq.read_metadata(file, filesystem=fs)


def filtered(
    table: pa.Table, expression: Any, first: Numbering | None
) -> tuple[pa.Table, np.ndarray | None]:
    """``table``'s rows that ``expression`` keeps, and with ``first`` their labels (their
    positions in the table before the filter, numbered from ``first``), kept apart from
    the table: a column of them would be taken for one of the file's own by its pandas
    metadata, which makes the names of columns labelled by numbers numbers again."""
    if first is None:
        return table.filter(expression), None
    start, step, _ = first
    labels = start + step * np.arange(table.num_rows, dtype=np.int64)
    table = table.append_column(POSITION, pa.array(labels)).filter(expression)
    return table.drop_columns([POSITION]), table.column(POSITION).to_numpy()


def label_rows(df: Any, first: Numbering, kept: np.ndarray | None = None) -> Any:
    """``df`` (pandas or cudf) labelled from ``first``: by ``kept`` when a filter dropped
    rows (:func:`filtered`), else consecutively."""
    start, step, name = first
    df.index = kept if kept is not None else range(start, start + step * len(df), step)
    df.index.name = name
    return df


def label(df: Any, first: Numbering | None, kept: np.ndarray | None = None) -> Any:
    """``df`` (pandas or cudf) labelled from ``first`` (:func:`label_rows`, ``kept``: the
    labels of the rows a filter kept), or, with ``first`` None, by its stored index, named
    None where dask stored it unnamed (:data:`DASK_UNNAMED_INDEX`), as dask's reader
    names it."""
    if first is not None:
        return label_rows(df, first, kept)
    if df.index.name == DASK_UNNAMED_INDEX:
        df.index.name = None
    return df
