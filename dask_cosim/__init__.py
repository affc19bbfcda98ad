"""dask_cosim: row-wise cosine similarity of embedding columns, on dask, pandas and cudf.

``import dask_cosim`` loads the ``cosim`` config defaults and registers the ``.cosim``
accessor on pandas and dask DataFrames as soon as pandas or dask.dataframe is imported (at
once if they already are), and on cudf DataFrames as soon as cudf is. The public functions
are imported on first use, so that ``import dask_cosim`` alone (and ``dask-cosim --help``)
does not wait for torch, pandas and distributed.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

import wrapt

from dask_cosim import config_keys

config_keys.load_defaults()

__version__ = "0.1.0"

# Public name -> the module that defines it (a submodule's own name: the submodule).
_LAZY = {
    "CosimAccessor": "dask_cosim.accessor",
    "clustered_recall": "dask_cosim.clustered_recall",
    "Summary": "dask_cosim.summary",
    "from_pandas": "dask_cosim.io",
    "io": "dask_cosim.io",
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
    "io",
    "kernels",
    "local_cluster",
    "pairwise_cosine",
    "pairwise_partition",
    "read_parquet",
    "summarize",
    "to_parquet",
]

if TYPE_CHECKING:
    from dask_cosim import clustered_recall, io, kernels
    from dask_cosim.accessor import CosimAccessor
    from dask_cosim.cluster import local_cluster
    from dask_cosim.io import from_pandas, read_parquet, to_parquet
    from dask_cosim.partition import pairwise_cosine, pairwise_partition
    from dask_cosim.summary import Summary, summarize


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None and not name.startswith("_"):
        # Any submodule (dask_cosim.search, .clustered, ...), as docs/api.md names them:
        # else an attribute only once something had imported it.
        if importlib.util.find_spec(f"dask_cosim.{name}") is not None:
            module_name = f"dask_cosim.{name}"
    if module_name is None:
        raise AttributeError(f"module 'dask_cosim' has no attribute {name!r}")
    module = importlib.import_module(module_name)
    value = module if module_name == f"dask_cosim.{name}" else getattr(module, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


class _Forward(type):
    # pd.DataFrame.cosim.topk (help(), docs tools) finds the real accessor's members.
    def __getattr__(cls, name: str) -> Any:
        from dask_cosim.accessor import CosimAccessor

        return getattr(CosimAccessor, name)


class _Deferred(metaclass=_Forward):
    """What ``.cosim`` is registered as: on first use on a frame it makes the real
    :class:`~dask_cosim.accessor.CosimAccessor` (which pandas and dask then cache on the
    frame).  Registering the real class would import the accessor, and with it every
    search module, the moment pandas is imported: when that import is made by one of
    our own modules (a worker unpickling a task of ``dask_cosim.search_partition``), that
    module is still half loaded, and the accessor's imports fail on it."""

    def __new__(cls, obj: Any) -> Any:
        from dask_cosim.accessor import CosimAccessor

        return CosimAccessor(obj)


def _registered(frame_type: type) -> bool:
    """Whether ``frame_type.cosim`` is a ``_Deferred`` already: registered by this module
    before it was loaded again (``importlib.reload``, a notebook's autoreload), which
    registering again would warn about ("overriding a preexisting attribute")."""
    current = getattr(frame_type, "cosim", None)
    return getattr(current, "__module__", None) == __name__ and (
        getattr(current, "__qualname__", None) == _Deferred.__qualname__
    )


def _on_dask_dataframe(module: Any) -> None:
    from dask.dataframe.extensions import register_dataframe_accessor

    if not _registered(module.DataFrame):
        register_dataframe_accessor("cosim")(_Deferred)


def _on_pandas_or_cudf(module: Any) -> None:
    if not _registered(module.DataFrame):
        module.api.extensions.register_dataframe_accessor("cosim")(_Deferred)


# Each runs now if its module is already imported, else right after the user imports it:
# cudf in particular is never imported by us.
wrapt.register_post_import_hook(_on_dask_dataframe, "dask.dataframe")
wrapt.register_post_import_hook(_on_pandas_or_cudf, "pandas")
wrapt.register_post_import_hook(_on_pandas_or_cudf, "cudf")
