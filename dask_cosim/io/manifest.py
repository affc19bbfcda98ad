"""The manifest of a folder :func:`~dask_cosim.to_parquet` writes, ``_dask_cosim.json``:
what each partition's write reports (:data:`WRITTEN_META`, one row per file), and the
manifest made of those rows, written into the staging folder before it is renamed."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pyarrow.fs as pafs

from dask_cosim.io.divisions import index_range, manifest_entries
from dask_cosim.io.files import FORMAT_VERSION, MANIFEST

__all__ = ["WRITTEN_META", "write_manifest", "written_row"]

# One row per partition written: file name, rows, JSON of the index range (index_range:
# [min, max] of a sorted index, encoded or not, or null), JSON {column: [D, dtype]}, JSON
# {column: Arrow type as text} of the other columns whose type pyarrow took from the
# partition's values (object columns: "null" where the partition holds no value).
WRITTEN_META = pd.DataFrame(
    {
        "file": pd.Series([], dtype=object),
        "rows": pd.Series([], dtype="int64"),
        "index": pd.Series([], dtype=object),
        "vectors": pd.Series([], dtype=object),
        "inferred": pd.Series([], dtype=object),
    }
)


def written_row(
    name: str,
    df: Any,
    stored: dict[str, Any],
    inferred: dict[str, str] | None = None,
    index_stored: bool = True,
) -> pd.DataFrame:
    """The row of :data:`WRITTEN_META` for the file ``name`` holding ``df``, whose vector
    columns are stored as ``stored`` ({column: [D, dtype]}) and its object columns with
    the ``inferred`` Arrow types ({column: type as text}); the index's range null where
    ``to_parquet(write_index=False)`` left a labelled index out (the file's rows are then
    numbered by their positions)."""
    return pd.DataFrame(
        {
            "file": [name],
            "rows": [len(df)],
            "index": [json.dumps(index_range(df.index) if index_stored else None)],
            "vectors": [json.dumps(stored)],
            "inferred": [json.dumps(inferred or {})],
        }
    )


def _number(file: str) -> int:
    """The partition a file ``part.NNNNN.<write>.parquet`` holds."""
    return int(file.split(".")[1])


def write_manifest(
    written: pd.DataFrame, fs: pafs.FileSystem, staging: str, layout: str
) -> dict[str, Any]:
    """The folder's manifest, from the rows of :data:`WRITTEN_META` (every file's),
    written in ``staging``; the files of empty partitions are deleted (one is kept when
    all are empty).  Raises if the files hold vectors of different D or dtype."""
    vectors: dict[str, Any] = {}
    for file, spec in zip(written["file"], written["vectors"]):
        for column, (dim, dtype) in json.loads(spec).items():
            first = vectors.setdefault(column, {"dim": dim, "dtype": dtype, "file": file})
            if not first["dim"]:  # no rows, or only null ones, of a variable list: no D
                first.update(dim=dim, dtype=dtype, file=file)
            if (first["dim"], first["dtype"]) != (dim, dtype) and dim:
                # Named by partition: the files are the staging folder's, given up.
                raise ValueError(
                    f"column {column!r}: partition {_number(file)} holds {dim}-long {dtype} "
                    f"vectors but partition {_number(first['file'])} holds {first['dim']}-long "
                    f"{first['dtype']} ones; every partition needs the same D and dtype (a "
                    "read of files of several: read those of each D on their own)"
                )
    for spec in vectors.values():
        del spec["file"]
    files = [
        {"path": file, "rows": int(rows), "index": json.loads(index)}
        for file, rows, index in zip(written["file"], written["rows"], written["index"])
    ]
    nonempty = [f for f in files if f["rows"]] or files[:1]
    for f in files:
        if f not in nonempty:
            fs.delete_file(f"{staging}/{f['path']}")
    ranges, divisions = manifest_entries([f["index"] for f in nonempty])
    for f, bounds in zip(nonempty, ranges):
        f["index"] = bounds
    manifest = {
        "format": "dask_cosim",
        "version": FORMAT_VERSION,
        "layout": layout,
        "vectors": vectors,
        "rows": int(sum(f["rows"] for f in nonempty)),
        **divisions,  # "divisions", and for encoded labels "index_type", "encoded_divisions"
        "files": nonempty,
    }
    with fs.open_output_stream(f"{staging}/{MANIFEST}") as out:
        out.write(json.dumps(manifest, indent=1).encode())
    return manifest
