"""pytest hooks and fixtures: tests marked ``gpu`` skip cleanly without a CUDA GPU, and
distributed's ``client`` fixture is available everywhere.  Shared helpers live in
tests/helpers.py."""

from __future__ import annotations

import pytest
import torch

# isort: off
import pandas  # noqa: F401  (before dask_cosim's import hooks: see below)
import dask_cosim  # noqa: F401  (registers the accessor, loads the cosim defaults)

# distributed's own fixtures, for every test module: `client` (a scheduler and two worker
# processes) and what it needs.  Imported after dask_cosim: distributed.utils_test keeps
# a copy of the dask config as it is now and restores it after each cluster test.
from distributed.utils_test import (  # noqa: F401
    cleanup,
    client,
    cluster_fixture,
    loop,
    loop_in_thread,
)
# isort: on


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
