"""Hive-partitioned folders: ``key=value/`` subfolders, as pyarrow's ``write_to_dataset``,
Spark and dask's ``to_parquet(partition_on=...)`` write them.

:func:`discover` finds the files and each one's keys with pyarrow's dataset discovery
(which skips names starting with "_" or "." at any depth) and puts the files in the
order of a flat folder's: the natural order of their paths (``part.2`` before
``part.10``).  The reader then numbers their rows across the folder like those of any
files that store no index (:mod:`.positions`).  Each key becomes a categorical column
whose categories are every value the folder names hold, sorted, as dask's reader gives
it; :func:`add_keys` appends the key columns to a file's rows, and :func:`kept` says
which files a filter leaves, from their folder names alone.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from dask.utils import natural_sort_key

__all__ = ["Keys", "add_keys", "discover", "file_columns", "kept"]


@dataclass(frozen=True)
class Keys:
    """The keys of a hive folder's files.

    ``dictionaries``: each key's values, sorted (the categories of its column), in the
    order of the keys in the folder names; ``values``: per file path, its values (None
    or missing where its folders name none, or ``__HIVE_DEFAULT_PARTITION__``: null);
    ``dataset``: pyarrow's, which :func:`kept` asks.
    """

    dictionaries: dict[str, pa.Array]
    values: dict[str, dict[str, Any]]
    dataset: ds.FileSystemDataset


def discover(
    fs: pafs.FileSystem, root: str
) -> tuple[list[str], list[int], Keys, list[pafs.FileInfo]]:
    """The Parquet files under the folder ``root`` (in natural order of their paths),
    their sizes, their keys (but those the first file holds as columns), and the
    listing's entries of the files."""
    # One listing, for the files and their sizes; the names pyarrow's own discovery skips
    # (a part of the path below ``root`` starting with "_" or ".") left out as it would.
    listed = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    entries = [
        info
        for info in listed
        if info.type == pafs.FileType.File
        and not any(p.startswith(("_", ".")) for p in info.path[len(root) :].split("/"))
    ]
    # In natural order: pyarrow unifies the keys' types with the first file's schema.
    entries.sort(key=lambda info: natural_sort_key(info.path))
    size_of = {info.path: info.size or 0 for info in entries}
    if not size_of:
        raise FileNotFoundError(f"no Parquet files in {root!r}")
    dataset = ds.dataset(
        list(size_of), filesystem=fs, format="parquet",
        partitioning=_partitioning(fs, root, list(size_of)), partition_base_dir=root,
    )  # fmt: skip
    fragments = sorted(dataset.get_fragments(), key=lambda f: natural_sort_key(f.path))
    files = [f.path for f in fragments]
    values = {f.path: ds.get_partition_keys(f.partition_expression) for f in fragments}
    found: dict[str, set[Any]] = {}
    for keys in values.values():
        for name, value in keys.items():
            found.setdefault(name, set()).update([] if value is None else [value])
    # The keys in the order of the folder levels (the dataset's schema ends with them); a
    # column the files hold themselves is read from them.
    schema, stored = dataset.schema, set(fragments[0].physical_schema.names)
    dictionaries = {
        name: pa.array(sorted(found[name]), schema.field(name).type)
        for name in schema.names
        if name in found and name not in stored
    }
    return files, [size_of[f] for f in files], Keys(dictionaries, values, dataset), entries


def _partitioning(fs: pafs.FileSystem, root: str, paths: list[str]) -> ds.PartitioningFactory:
    """The hive partitioning of ``paths`` (in natural order): each key typed as pyarrow
    infers it from the folder names (int32 for numbers, else strings), but a key the
    first file also holds values of typed as that column (polars' ``partition_by`` keeps
    the key, int64, in each file: pyarrow's own discovery failed, "Unable to merge:
    Field key has incompatible types: int64 vs int32")."""
    from dask_cosim.io.files import naming_non_parquet  # (files imports this module)

    options = ds.FileSystemFactoryOptions(partition_base_dir=root)
    options.partitioning_factory = ds.HivePartitioning.discover()
    factory = ds.FileSystemDatasetFactory(fs, paths, ds.ParquetFileFormat(), options)
    inferred = factory.inspect(fragments=0)  # the keys alone: no file is opened
    with naming_non_parquet(paths[0]):  # a stray file, named
        stored = pq.read_schema(paths[0], filesystem=fs)

    def typed(key: pa.Field) -> pa.Field:
        # A key the file holds no value of (Arrow null: an all-None column): as inferred.
        held = stored.field(key.name) if key.name in stored.names else None
        return key if held is None or pa.types.is_null(held.type) else held

    return ds.HivePartitioning.discover(schema=pa.schema([typed(f) for f in inferred]))


def kept(keys: Keys, filters: Any) -> set[str] | None:
    """The files whose keys ``filters`` (list form or pyarrow expression) leave, judged
    from the folder names only; None: all of them."""
    if filters is None or not keys.dictionaries:
        return None
    expression = pq.filters_to_expression(filters)
    return {f.path for f in keys.dataset.get_fragments(filter=expression)}


def file_columns(columns: list[str] | None, keys: Collection[str]) -> list[str] | None:
    """``columns`` without the ``keys``, which the files do not hold (None: all)."""
    return None if columns is None else [c for c in columns if c not in keys]


def add_keys(
    table: pa.Table,
    dictionaries: dict[str, pa.Array],
    values: dict[str, Any],
    columns: Collection[str] | None = None,
) -> pa.Table:
    """``table`` with the key columns among ``columns`` (None: all) appended: dictionary
    columns over ``dictionaries``, every row holding its file's value from ``values``
    (null where it has none)."""
    for name, dictionary in dictionaries.items():
        if columns is not None and name not in columns:
            continue
        value = values.get(name)
        at = -1 if value is None else pc.index(dictionary, value).as_py()
        indices = (
            pa.nulls(table.num_rows, pa.int32())
            if at < 0
            else pa.array(np.full(table.num_rows, at, np.int32))
        )
        table = table.append_column(name, pa.DictionaryArray.from_arrays(indices, dictionary))
    return table
