"""dask_cosim: row-wise cosine similarity of embedding columns, on dask, pandas and cudf.

``import dask_cosim`` loads the ``cosim`` config defaults and registers the ``.cosim``
accessor on pandas and dask DataFrames as soon as pandas or dask.dataframe is imported (at
once if they already are), and on cudf DataFrames as soon as cudf is. The public functions
are imported on first use, so that ``import dask_cosim`` alone (and ``dask-cosim --help``)
does not wait for torch, pandas and distributed.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

import wrapt

from dask_cosim import options

options.load_defaults()

__version__ = "0.1.0"

# Public name -> the module that defines it (a submodule's own name: the submodule).
_LAZY = {
    "CosimAccessor": "dask_cosim.accessor",
    "clustered_recall": "dask_cosim.clustered_recall",
    "Summary": "dask_cosim.summary",
    "from_pandas": "dask_cosim.io",
    "kernels": "dask_cosim.kernels",
    "local_cluster": "dask_cosim.cluster",
    "pairwise_cosine": "dask_cosim.partition",
    "pairwise_partition": "dask_cosim.partition",
    "read_parquet": "dask_cosim.io",
    "summarize": "dask_cosim.summary",
    "to_parquet": "dask_cosim.io",
}

__all__ = [
    "CosimAccessor",
    "Summary",
    "clustered_recall",
    "from_pandas",
    "kernels",
    "local_cluster",
    "pairwise_cosine",
    "pairwise_partition",
    "read_parquet",
    "summarize",
    "to_parquet",
]

if TYPE_CHECKING:
    from dask_cosim import clustered_recall, kernels
    from dask_cosim.accessor import CosimAccessor
    from dask_cosim.cluster import local_cluster
    from dask_cosim.io import from_pandas, read_parquet, to_parquet
    from dask_cosim.partition import pairwise_cosine, pairwise_partition
    from dask_cosim.summary import Summary, summarize


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'dask_cosim' has no attribute {name!r}")
    module = importlib.import_module(module_name)
    value = module if module_name == f"dask_cosim.{name}" else getattr(module, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


_dask_dataframe_imported = False


def _on_dask_dataframe(_module: Any) -> None:
    global _dask_dataframe_imported
    _dask_dataframe_imported = True
    importlib.import_module("dask_cosim.accessor")  # registers on pandas and dask frames


def _on_pandas(_module: Any) -> None:
    if "dask.dataframe" in sys.modules and not _dask_dataframe_imported:
        # pandas finished importing inside dask.dataframe's own import: the accessor
        # module needs dask.dataframe whole, so its hook registers both when it is done.
        return
    importlib.import_module("dask_cosim.accessor")


def _on_cudf(module: Any) -> None:
    from dask_cosim.accessor import register_cudf_accessor

    register_cudf_accessor(module)


# Each runs now if its module is already imported, else right after the user imports it:
# cudf in particular is never imported by us.
wrapt.register_post_import_hook(_on_dask_dataframe, "dask.dataframe")
wrapt.register_post_import_hook(_on_pandas, "pandas")
wrapt.register_post_import_hook(_on_cudf, "cudf")
