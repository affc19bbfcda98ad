"""What :func:`~dask_cosim.io.read_parquet` would give, from the files' metadata."""

from __future__ import annotations

from typing import Any

import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from dask_cosim import backends
from dask_cosim.io.files import naming_non_parquet, parquet_files
from dask_cosim.io.read import _index_columns, _read_files, _read_schema

__all__ = ["describe_parquet"]


def describe_parquet(path: Any) -> dict[str, Any]:
    """What :func:`.read_parquet` would give, from the files' metadata (no data is read,
    except, per variable-length list column, the first file's rows up to its first
    vector, to learn its D).

    Returns a dict: ``rows``, ``files``, ``partitions``, ``layout`` ("binary"/"list" for
    our folders, else None), ``index``: one {"name", "dtype"} per level of a stored index,
    named as the read names it (None where the files store none: the read numbers the
    rows), ``columns``: name -> {"dtype", "dim", "values"} (dim and values only for
    vector columns; a hive folder's keys are "category" columns), and "elsewhere" where
    later files store the column otherwise than the first file (whose types the read
    takes): one {"type", "files", "first"} per other Arrow type ("absent": the file lacks
    the column), with the count of such files and the first of them.  (Files that
    ``to_parquet`` wrote are alike: their footers are not opened.)
    """
    found = parquet_files(path)
    if found is None:
        raise ValueError(
            f"{path!r} is a glob in a URL: read it with dask_cosim.read_parquet and look at "
            "the result instead"
        )
    fs, files, manifest = found.fs, found.files, found.manifest
    df = _read_files(*found, columns=None, filters=None, backend="pandas")
    opened = {}
    if manifest is not None:
        rows = int(manifest["rows"])
    else:
        opened = {f: _open(f, fs) for f in files}
        # Per path given: a file given twice is read twice (its footer opened once).
        rows = sum(opened[f].metadata.num_rows for f in files)
    # The read's own index, not the stored columns: pyarrow stores an unnamed index as
    # "__index_level_0__" (dask as "__null_dask_index__"), and the read names it None.
    index = df._meta.index
    levels = [index.get_level_values(i) for i in range(index.nlevels)]
    # (The first file's footer once: the one opened for the row count, where there is one.)
    schema = opened[files[0]].schema_arrow if opened else _read_schema(files[0], fs)
    stored = bool(_index_columns(schema))
    columns: dict[str, dict[str, Any]] = {}
    for name in df.columns:
        info: dict[str, Any] = {"dtype": str(df.dtypes[name])}
        spec = None
        try:
            spec = backends.vector_spec(df._meta[name], str(name))
        except TypeError:
            pass
        if spec is not None and spec.dtype is not None:
            dim = spec.dim
            if dim is None:  # a variable list: the first file's first vector tells
                dim = _first_length(opened.get(files[0]) or _open(files[0], fs), name)
            info.update(dim=dim, values=spec.dtype.name)
        elsewhere = _elsewhere(str(name), files, opened)
        if elsewhere:
            info["elsewhere"] = elsewhere
        columns[str(name)] = info
    return {
        "rows": rows,
        "files": len(files),
        "partitions": df.npartitions,
        "layout": manifest["layout"] if manifest else None,
        "index": [{"name": i.name, "dtype": str(i.dtype)} for i in levels] if stored else None,
        "columns": columns,
    }


def _first_length(file: pq.ParquetFile, name: str) -> int | None:
    """The length of the first vector (list neither null nor empty) in the column ``name``
    of ``file``, read a batch at a time until one holds it; None where no row does.  (An
    empty first row had been taken for "no vectors" when every other row held one.)"""
    for batch in file.iter_batches(batch_size=1024, columns=[name]):
        lengths = pc.drop_null(batch.column(0).value_lengths())
        held = pc.filter(lengths, pc.greater(lengths, 0))
        if len(held):
            return int(held[0].as_py())
    return None


def _elsewhere(
    name: str, files: list[str], opened: dict[str, pq.ParquetFile]
) -> list[dict[str, Any]]:
    """The types other than the first file's that the files in ``opened`` store the
    column ``name`` with: [{"type", "files", "first"}], in the order of the files."""
    if not opened:
        return []

    def stored(file: str) -> str:
        schema = opened[file].schema_arrow
        return str(schema.field(name).type) if name in schema.names else "absent"

    first = stored(files[0])
    others: dict[str, dict[str, Any]] = {}
    for file in dict.fromkeys(files):
        kind = stored(file)
        if kind != first:
            others.setdefault(kind, {"type": kind, "files": 0, "first": file})["files"] += 1
    return list(others.values())


def _open(file: str, fs: pafs.FileSystem) -> pq.ParquetFile:
    with naming_non_parquet(file):
        return pq.ParquetFile(file, filesystem=fs)
