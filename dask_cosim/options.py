"""The ``cosim`` options and the arguments users give: one check (and one error text) each.

The defaults are in ``cosim.yaml`` alone (described by ``cosim-schema.yaml``; loaded, and
misspelt keys warned about, by :mod:`dask_cosim.config_keys`).  Every
option is read through ``dask.config`` under the ``cosim`` namespace, so it can be set per
block (``with dask.config.set({"cosim.eps": 1e-6}): ...``), in a YAML file in
``~/.config/dask/`` or through ``DASK_COSIM__EPS``-style environment variables.  The
functions below take the value a caller was given (None: use the config), check it and
return it in the form the lower layers take as plain arguments.  Arguments that no config
key holds are checked here too: the searches' ``k`` and ``threshold``, worker counts and
memory sizes.  The kernels read no config: only the layers above them call this module.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dask.utils import parse_bytes, parse_timedelta

from dask_cosim import config_keys

if TYPE_CHECKING:
    import torch

    from dask_cosim.placement import Rates

__all__ = [
    "DEVICE_HELP",
    "chunk_bytes",
    "clustered",
    "device",
    "eps",
    "gpu_partition_bytes",
    "integer",
    "k_or_threshold",
    "memory_map",
    "memory_size",
    "placement_rates",
    "positive_int",
    "search_k",
    "search_max_blocks",
    "search_max_result_bytes",
    "search_method",
    "search_precision",
    "search_split_every",
    "search_threshold",
    "search_tile_bytes",
    "torch_dtype",
]

DEVICE_HELP = "use 'auto', 'cpu', 'cuda' or 'cuda:N'"

# Names of the result dtypes; torch is imported only when one is asked for (`import
# dask_cosim`, which loads the defaults from here, stays fast for the command line).
_DTYPES = ("float32", "float64")
_DEVICE_KINDS = ("cpu", "cuda")


def _given(value: Any, key: str) -> Any:
    return config_keys.get(f"cosim.{key}") if value is None else value


def _source(value: Any, key: str, argument: str) -> tuple[Any, str]:
    """The value to check and its name in errors: ``argument`` (the Python name) when the
    caller gave it, ``cosim.<key>`` when it comes from the config."""
    if value is None:
        return config_keys.get(f"cosim.{key}"), f"cosim.{key}"
    return value, argument


def eps(value: Any = None) -> float:
    """``eps`` (config ``cosim.eps``): a finite number >= 0, as a float.  A bad value is
    named ``eps`` when given, ``cosim.eps`` when read from the config."""
    value, name = _source(value, "eps", "eps")
    try:
        number = math.nan if isinstance(value, bool) else float(value)  # True is no bound
    except (TypeError, ValueError):
        number = math.nan
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"{name}={value!r} must be a finite number >= 0 (default 1e-8)")
    return number


def device(value: Any = None) -> str:
    """``device`` (config ``cosim.device``): "auto", "cpu", "cuda" or "cuda:N"; a bad
    value is named as :func:`eps` names it.

    Only the spelling is checked: probing CUDA here would create a CUDA context in the
    client process, before the workers own their GPUs.
    """
    value, name = _source(value, "device", "device")
    text = str(value)
    if text in ("auto", "cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise ValueError(f"{name}={value!r} is not a device; {DEVICE_HELP}")


def torch_dtype(value: Any = None, *, from_config: bool = True) -> torch.dtype | None:
    """``dtype`` (config ``cosim.dtype``): None, "float32"/"float64", numpy or torch dtype
    -> torch dtype, or None (the result dtype follows the inputs); a bad value is named
    as :func:`eps` names it.

    ``from_config=False`` checks ``value`` alone (None stays None).
    """
    import numpy as np
    import torch

    name = "dtype"
    if from_config:
        value, name = _source(value, "dtype", "dtype")
    if value is None:
        return None
    if isinstance(value, torch.dtype):
        key = str(value).removeprefix("torch.")
    else:
        try:
            key = np.dtype(value).name
        except TypeError:
            key = str(value)
    if key not in _DTYPES:
        raise ValueError(f"{name}={value!r} is not supported; use 'float32' or 'float64'")
    dtype: torch.dtype = getattr(torch, key)
    return dtype


def chunk_bytes(value: Any = None) -> dict[str, int]:
    """``chunk_bytes`` (config ``cosim.chunk-bytes``) -> ``{"cpu": bytes, "cuda": bytes}``.

    ``value`` may be one size for both kinds of device (``"1MiB"``, ``1048576``) or a
    mapping by device kind; kinds it leaves out keep their configured size.  A bad size
    is named ``chunk_bytes['cpu']`` when given, ``cosim.chunk-bytes.cpu`` when configured.
    """
    return _device_sizes(value, "chunk-bytes", "chunk_bytes")


def search_tile_bytes(value: Any = None) -> dict[str, int]:
    """Config ``cosim.search.tile-bytes``: the most bytes of one tile of scores in search,
    by device kind, as :func:`chunk_bytes` reads its sizes."""
    return _device_sizes(value, "search.tile-bytes", "cosim.search.tile-bytes")


def integer(value: Any, low: int, what: str, more: str = "") -> int:
    """``value`` as an int, where it is an integer (numpy's too, not a bool) >= ``low``;
    else ValueError naming it as ``what`` (``more``: after the rule, e.g. an example)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{what}={value!r} must be an integer >= {low}{more}")
    return int(value)


def search_split_every(value: Any = None) -> int:
    """Config ``cosim.search.split-every``: partial results merged per task, an int >= 2."""
    return integer(_given(value, "search.split-every"), 2, "cosim.search.split-every")


SEARCH_PRECISIONS = ("exact", "fp32", "fast")


def search_precision(value: Any = None) -> str:
    """Config ``cosim.search.precision``: "exact", "fp32" or "fast"."""
    value = _given(value, "search.precision")
    if value not in SEARCH_PRECISIONS:
        raise ValueError(
            f"cosim.search.precision={value!r}; use 'exact' (float64 decisions, the "
            "default), 'fp32' (the same decisions from float32 tiles) or 'fast' "
            "(float16 alone on GPUs, approximate)"
        )
    return str(value)


def search_max_blocks(value: Any = None) -> int:
    """Config ``cosim.search.max-blocks``: an int >= 1."""
    value = _given(value, "search.max-blocks")
    return integer(value, 1, "cosim.search.max-blocks", ", e.g. 64")


def search_max_result_bytes(value: Any = None) -> int | str:
    """Config ``cosim.search.max-result-bytes``: "auto" (a share of the memory of the
    worker that runs each task, :mod:`dask_cosim.search_budget`) or a positive size in
    bytes (an int)."""
    value = _given(value, "search.max-result-bytes")
    if value == "auto":
        return "auto"
    return _positive_size(value, "cosim.search.max-result-bytes", "'auto' or '2GiB'")


@dataclass(frozen=True)
class Clustered:
    """Config ``cosim.search.clustered``, checked: see cosim.yaml."""

    iterations: int
    block_bytes: int
    sample_per_cluster: int
    min_sample: int
    route_bytes: int
    exact_when_cheaper: bool


def clustered() -> Clustered:
    """Config ``cosim.search.clustered``: the options of ``method="clustered"``."""
    key = "cosim.search.clustered"
    # Each value by its own key: dask.config.get matches "block-bytes" and "block_bytes"
    # (environment variables give the second), a lookup in the section's dict does not.
    counts = {}
    for name, low in (("iterations", 0), ("sample-per-cluster", 1), ("min-sample", 1)):
        counts[name] = integer(config_keys.get(f"{key}.{name}"), low, f"{key}.{name}")
    sizes = {
        name: _positive_size(config_keys.get(f"{key}.{name}"), f"{key}.{name}", "'256MiB'")
        for name in ("block-bytes", "route-bytes")
    }
    cheaper = config_keys.get(f"{key}.exact-when-cheaper")
    if not isinstance(cheaper, bool):
        raise ValueError(f"{key}.exact-when-cheaper={cheaper!r} must be true or false")
    return Clustered(
        counts["iterations"], sizes["block-bytes"], counts["sample-per-cluster"],
        counts["min-sample"], sizes["route-bytes"], cheaper,
    )  # fmt: skip


def _device_sizes(value: Any, key: str, label: str) -> dict[str, int]:
    """A size per device kind from one size or a mapping, the config filling the gaps.

    Errors name a size from ``value`` ``label['cpu']``, one from the config by its key
    (``cosim.<key>.cpu``, or ``cosim.<key>`` where the config holds one size for both).
    """
    configured = config_keys.get(f"cosim.{key}")
    if isinstance(configured, Mapping):
        names = {kind: f"cosim.{key}.{kind}" for kind in _DEVICE_KINDS}
    else:
        configured = dict.fromkeys(_DEVICE_KINDS, configured)
        names = dict.fromkeys(_DEVICE_KINDS, f"cosim.{key}")
    given = {} if value is None else value
    if not isinstance(given, Mapping):
        given = dict.fromkeys(_DEVICE_KINDS, given)
    for where, sizes in ((f"cosim.{key}", configured), (label, given)):
        unknown = sorted(set(sizes) - set(_DEVICE_KINDS))
        if unknown:
            raise ValueError(
                f"{where} has unknown device kinds {unknown!r}; use keys 'cpu' and 'cuda'"
            )
    names.update({kind: f"{label}[{kind!r}]" for kind in given})
    merged = {**configured, **given}
    return {
        kind: _positive_size(merged[kind], names[kind], "'512KiB' or 1048576")
        for kind in _DEVICE_KINDS
    }


def _positive_size(size: Any, label: str, example: str) -> int:
    """``size`` (bytes, or a string such as "1GiB") as a positive int, else one error."""
    try:
        number = parse_bytes(size) if isinstance(size, str) else int(size)
    except (TypeError, ValueError):
        number = 0
    if isinstance(size, bool) or number < 1:
        raise ValueError(f"{label}={size!r} must be a positive size such as {example}")
    return number


def memory_map(value: Any = None) -> str | bool:
    """``memory_map`` (config ``cosim.read.memory-map``): "auto", True or False."""
    value = _given(value, "read.memory-map")
    if value == "auto" or isinstance(value, bool):
        return value
    raise ValueError(f"cosim.read.memory-map={value!r}; use 'auto', true or false")


def gpu_partition_bytes(value: Any = None) -> int:
    """Config ``cosim.read.gpu-partition-bytes``: with the cudf backend, consecutive whole
    files are read as one partition of up to about this many bytes (their size on disk)."""
    value = _given(value, "read.gpu-partition-bytes")
    return _positive_size(value, "cosim.read.gpu-partition-bytes", "'1GiB'")


def placement_rates() -> Rates:
    """Config ``cosim.placement``: the measured constants of ``device="auto"`` for host data
    (:class:`dask_cosim.placement.Rates`): three rates, positive sizes per second such as
    "51.4GB", and a duration such as "1ms"."""
    from dask_cosim.placement import Rates

    # Each value by its own key, as in clustered(): environment variables give
    # "gpu_fixed" for "gpu-fixed".
    rates = {
        key: float(
            _positive_size(
                config_keys.get(f"cosim.placement.{key}"), f"cosim.placement.{key}",
                "'51.4GB' (per second)",
            )
        )
        for key in ("cpu-fused", "cpu-torch", "host-to-gpu")
    }  # fmt: skip
    fixed = config_keys.get("cosim.placement.gpu-fixed")
    try:
        seconds = parse_timedelta(fixed)
    except (TypeError, ValueError, KeyError):
        seconds = None
    if isinstance(fixed, bool) or seconds is None or not seconds >= 0:
        raise ValueError(f"cosim.placement.gpu-fixed={fixed!r} must be a duration such as '1ms'")
    return Rates(rates["cpu-fused"], rates["cpu-torch"], rates["host-to-gpu"], float(seconds))


# --------------------------------------------------------------------------- arguments
# Checked here too, though no config key holds them: one error text per argument.


def search_k(value: Any, *, required: bool = False) -> int | None:
    """``k`` of the searches: an integer >= 1, or None (unless ``required``)."""
    if value is None and required:
        raise ValueError("k=None: topk needs k, an integer >= 1")
    if value is None:
        return None
    return integer(value, 1, "k", " (the matches kept per row)")


def search_threshold(value: Any, *, required: bool = False) -> float | None:
    """``threshold`` of the searches: a cosine similarity in [-1, 1], or None (unless
    ``required``)."""
    if value is None and not required:
        return None
    try:
        # True would read as 1.0: a flag in the threshold's place, most likely; text is
        # refused as k refuses it (float("0.5") would take it).
        number = math.nan if isinstance(value, (bool, str, bytes)) else float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not -1.0 <= number <= 1.0:
        raise ValueError(
            f"threshold={value!r} must be a number in [-1, 1] (a cosine similarity), "
            "e.g. threshold=0.9"
        )
    return number


SEARCH_METHODS = ("exact", "clustered")


def search_method(
    method: Any,
    *,
    k: Any = None,
    threshold: Any = None,
    n_probe: Any = None,
    clusters: Any = None,
) -> tuple[str, int | None, int | None]:
    """``method`` of neighbors / dedup ("exact" or "clustered") with the arguments that go
    with it: (method, n_probe, clusters), ints (n_probe >= 0, clusters >= 1) or None.
    ``n_probe`` and ``clusters`` need "clustered"; "clustered" needs a threshold above 0
    and no ``k``."""
    if method not in SEARCH_METHODS:
        raise ValueError(
            f"method={method!r}; use 'exact' (all pairs, the default) or 'clustered' "
            "(k-means first, for millions of rows: docs/clustered.md)"
        )
    if n_probe is not None and (
        isinstance(n_probe, bool) or not isinstance(n_probe, numbers.Integral) or n_probe < 0
    ):
        raise ValueError(
            f"n_probe={n_probe!r} must be an integer >= 0 or None (every cluster that may "
            "hold a match), e.g. n_probe=2"
        )
    n_probe = None if n_probe is None else int(n_probe)
    clusters = positive_int("clusters", clusters, "clusters=1000")
    if method == "exact":
        given = [n for n, v in (("n_probe", n_probe), ("clusters", clusters)) if v is not None]
        if given:
            raise ValueError(
                f"{given[0]} is an option of method='clustered': add method='clustered' "
                f"or drop {given[0]}"
            )
        return method, None, None
    if k is not None:
        raise ValueError(
            f"k={k!r} with method='clustered': the clustered method finds the pairs above "
            "a threshold; for each row's k best use method='exact'"
        )
    value = search_threshold(threshold, required=True)
    if value is None or value <= 0:
        raise ValueError(
            f"threshold={threshold!r}: method='clustered' needs a threshold in (0, 1], e.g. "
            "threshold=0.9 (at or below 0 a zero vector matches every row and no cluster "
            "can be ruled out); use method='exact'"
        )
    return method, n_probe, clusters


def k_or_threshold(k: Any, threshold: Any) -> tuple[int | None, float | None]:
    """``k`` and ``threshold`` of a join or neighbours search: either or both."""
    k, threshold = search_k(k), search_threshold(threshold)
    if k is None and threshold is None:
        raise ValueError(
            "give k (the best matches of each row), threshold (every pair scoring at "
            "least it), or both; e.g. k=10 or threshold=0.9"
        )
    return k, threshold


def positive_int(name: str, value: Any, example: str) -> int | None:
    """A count such as ``n_workers``: a positive integer, or None (the default)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer, e.g. {example}")
    return int(value)


def memory_size(name: str, value: Any, example: str) -> None:
    """A memory size as dask takes it (``memory_limit``, ``rmm_pool_size``): bytes,
    "4GiB", a fraction of the memory in (0, 1], "auto" or None."""
    if value is None or value == "auto":
        return
    ok = False
    if isinstance(value, str):
        try:
            ok = parse_bytes(value) > 0
        except ValueError:
            ok = False
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        # dask takes a float up to 1 for a fraction, and any other number for bytes: 1.5
        # gave each worker 1 byte.
        ok = value > 0 and (value <= 1 or float(value).is_integer())
    if not ok:
        raise ValueError(
            f"{name}={value!r} is not a size: give bytes, a string like {example}, a "
            "fraction of the memory like 0.5, 'auto' or None"
        )
