"""The ``cosim`` config's keys: the defaults of ``cosim.yaml`` registered with
dask.config (:func:`load_defaults`), and every read of an option (:func:`get`, what
:mod:`dask_cosim.options` reads through) preceded by a warning for each key set under
``cosim`` that no default has: dask.config would ignore a misspelt key, and the default
would apply, unsaid.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import dask.config
import yaml

from dask_cosim import errors

__all__ = ["get", "load_defaults", "unknown_keys"]

_DEFAULTS: dict[str, Any] = {}
_WARNED: set[str] = set()
_CHECKED_CONFIG: list[Any] = [None]  # the cosim config last walked (a copy)
# Maps whose other keys dask_cosim.options rejects itself, with an error naming them.
_CHECKED = ("cosim.chunk-bytes", "cosim.search.tile-bytes")


def load_defaults() -> None:
    """Register ``cosim.yaml`` as dask.config defaults (user settings keep priority).

    A size per device kind (:data:`_CHECKED`) may be set as one size for both, as
    ``dask.config.set`` takes it; set so in a YAML file or the environment (read by dask
    before this runs), dask's merge of the defaults' map replaced it with theirs,
    unsaid: it is set again over them."""
    with open(os.path.join(os.path.dirname(__file__), "cosim.yaml")) as f:
        _DEFAULTS.update(yaml.safe_load(f))
    one_size = {
        key: value
        for key in _CHECKED
        if (value := dask.config.get(key, None)) is not None and not isinstance(value, Mapping)
    }
    dask.config.update_defaults(_DEFAULTS)
    if one_size:
        dask.config.set(one_size)


def unknown_keys() -> list[tuple[str, list[str]]]:
    """Each key set under ``cosim`` that ``cosim.yaml`` does not have (``_`` and ``-``
    alike, as dask.config reads them), as ``cosim.a.b``, with the keys known there."""

    def walk(given: Any, known: Any, path: str) -> Iterator[tuple[str, list[str]]]:
        if isinstance(given, Mapping) and isinstance(known, Mapping):
            for key, value in given.items():
                name = str(key).replace("_", "-")
                if name in known:
                    yield from walk(value, known[name], f"{path}.{name}")
                elif path not in _CHECKED:
                    yield f"{path}.{name}", list(known)

    return list(walk(dask.config.config.get("cosim"), _DEFAULTS.get("cosim"), "cosim"))


def get(key: str) -> Any:
    """``dask.config.get(key)``, once each misspelt ``cosim`` key has been warned about
    (dask.config ignores it: the default would apply, unsaid).  The keys are walked only
    when the ``cosim`` config differs from the one last walked: options are read in
    every partition's task, where a walk would cost 40 times the read."""
    given = dask.config.config.get("cosim")
    if given != _CHECKED_CONFIG[0]:
        _CHECKED_CONFIG[0] = copy.deepcopy(given)
        _warn_unknown()
    return dask.config.get(key)


def _warn_unknown() -> None:
    for name, known in unknown_keys():
        if name not in _WARNED:
            _WARNED.add(name)
            hint = errors.did_you_mean(name.rpartition(".")[2], known)
            warnings.warn(
                f"{name} is not a dask_cosim option: it is ignored{hint} (the options: "
                "docs/configuration.md)",
                errors.CosimWarning,
                stacklevel=errors.caller_stacklevel(),
            )
