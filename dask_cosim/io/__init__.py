"""Getting embedding frames into dask and onto disk without losing them.

- :func:`from_pandas` (:mod:`.convert`): object columns of per-row arrays/tensors ->
  Arrow fixed_size_list, then ``dd.from_pandas`` (which would otherwise turn them into
  truncated strings).
- :func:`to_parquet` (:mod:`.write`): a frame -> a folder of Parquet files in the layout
  that reads fastest, written atomically, described by a manifest and by each file's own
  metadata.
- :func:`read_parquet` (:mod:`.read`): our folders (any layout) zero-copy at pyarrow's
  speed; any other Parquet with list columns kept as Arrow lists (pandas) or cudf list
  columns.
- :mod:`.layouts`: the two ways a vector column is stored; :mod:`.files`: filesystems,
  listing, globs and the manifest.
"""

from dask_cosim.backends import arrow_vector_types
from dask_cosim.io.convert import from_pandas, vector_columns
from dask_cosim.io.files import MANIFEST
from dask_cosim.io.layouts import (
    LAYOUTS,
    encode_vectors,
    list_columns,
    restore_vectors,
    stored_vector,
    vectors_to_arrow,
)
from dask_cosim.io.read import describe_parquet, read_parquet
from dask_cosim.io.write import frame_to_table, to_parquet

__all__ = [
    "LAYOUTS",
    "MANIFEST",
    "arrow_vector_types",
    "describe_parquet",
    "encode_vectors",
    "frame_to_table",
    "from_pandas",
    "list_columns",
    "read_parquet",
    "restore_vectors",
    "stored_vector",
    "to_parquet",
    "vector_columns",
    "vectors_to_arrow",
]
