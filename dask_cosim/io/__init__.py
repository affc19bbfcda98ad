"""Getting embedding frames into dask and onto disk without losing them.

- :func:`from_pandas` (:mod:`.convert`): object columns of per-row arrays/tensors ->
  Arrow fixed_size_list, then ``dd.from_pandas`` (which would otherwise turn them into
  truncated strings).
- :func:`to_parquet` (:mod:`.write`): a frame -> a folder of Parquet files in the layout
  that reads fastest, written atomically, described by a manifest (:mod:`.manifest`) and
  by each file's own metadata; :func:`to_parquet_together`: several frames in one
  computation, committed together.
- :func:`read_parquet` (:mod:`.read`): our folders (any layout) zero-copy at pyarrow's
  speed; any other Parquet with list columns kept as Arrow lists (pandas) or cudf list
  columns, and files that store no index numbered across the read (:mod:`.positions`),
  those of hive-partitioned folders too, with their keys as columns (:mod:`.hive`).
  :func:`describe_parquet` (:mod:`.describe`) says what a read would give, from the
  metadata.
  :func:`check_parquet_inputs` (:mod:`.files`) names a local file that is not Parquet and
  how to convert it.
- :func:`numpy_frame`, :func:`numpy_vectors`, :func:`read_pickle`, :func:`source_frame`
  (:mod:`.convert`): .npy/.npz arrays and pandas pickles as frames, for ``dask-cosim
  convert`` and the queries of ``dask-cosim topk``; :func:`read_text` (:mod:`.text`):
  CSV and JSON Lines files of embeddings, their vectors parsed block by block.
- :mod:`.layouts`: the two ways a vector column is stored; :mod:`.files`: filesystems,
  listing, globs, the manifest and staging folders; :mod:`.divisions`: each file's index
  range and the divisions in the manifest; :mod:`.categories`: categoricals of numbers,
  which a Parquet read does not give back by itself; :mod:`.cudf_parquet`: cudf's GPU
  reader and writer, which the cudf backend of :mod:`.read` and :mod:`.write` use.
- :mod:`.scattered`: what the package scatters to a client's workers (``from_pandas``'s
  partitions, a search's eager inputs), gathered back by dask's local schedulers
  (``compute(scheduler="sync")``) when a graph names it.
"""

from dask_cosim.backends import arrow_vector_types
from dask_cosim.io.convert import (
    cast_vectors,
    from_pandas,
    numpy_frame,
    numpy_vectors,
    read_pickle,
    source_frame,
    vector_columns,
)
from dask_cosim.io.describe import describe_parquet
from dask_cosim.io.files import MANIFEST, check_parquet_inputs
from dask_cosim.io.layouts import (
    LAYOUTS,
    encode_vectors,
    list_columns,
    restore_vectors,
    stored_vector,
    vectors_to_arrow,
)
from dask_cosim.io.read import read_parquet
from dask_cosim.io.text import is_text_file, read_text
from dask_cosim.io.write import (
    compute_with_progress,
    frame_to_table,
    to_parquet,
    to_parquet_together,
)

__all__ = [
    "LAYOUTS",
    "MANIFEST",
    "arrow_vector_types",
    "cast_vectors",
    "check_parquet_inputs",
    "compute_with_progress",
    "describe_parquet",
    "encode_vectors",
    "frame_to_table",
    "from_pandas",
    "is_text_file",
    "list_columns",
    "numpy_frame",
    "numpy_vectors",
    "read_parquet",
    "read_pickle",
    "read_text",
    "restore_vectors",
    "source_frame",
    "stored_vector",
    "to_parquet",
    "to_parquet_together",
    "vector_columns",
    "vectors_to_arrow",
]
