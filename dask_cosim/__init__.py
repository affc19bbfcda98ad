"""dask_cosim: row-wise cosine similarity of embedding columns, on dask, pandas and cudf.

``import dask_cosim`` registers the ``.cosim`` accessor on dask and pandas DataFrames (and
on cudf DataFrames as soon as cudf is imported) and loads the ``cosim`` config defaults.
"""

from __future__ import annotations

import wrapt

from dask_cosim import options

options.load_defaults()

from dask_cosim import kernels  # noqa: E402
from dask_cosim.accessor import CosimAccessor, register_cudf_accessor  # noqa: E402
from dask_cosim.cluster import local_cluster  # noqa: E402
from dask_cosim.io import from_pandas, read_parquet, to_parquet  # noqa: E402
from dask_cosim.kernels import pairwise_cosine  # noqa: E402
from dask_cosim.partition import pairwise_partition  # noqa: E402
from dask_cosim.summary import Summary, summarize  # noqa: E402

# Runs now if cudf is already imported, else right after the user imports it: cudf itself
# is never imported by us.
wrapt.register_post_import_hook(register_cudf_accessor, "cudf")

__version__ = "0.1.0"

__all__ = [
    "CosimAccessor",
    "from_pandas",
    "kernels",
    "local_cluster",
    "pairwise_cosine",
    "pairwise_partition",
    "read_parquet",
    "Summary",
    "summarize",
    "to_parquet",
]
