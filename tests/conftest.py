"""pytest hooks: tests marked ``gpu`` skip cleanly without a CUDA GPU.  Shared helpers
live in tests/helpers.py."""

from __future__ import annotations

import pytest
import torch

import dask_cosim  # noqa: F401  (registers the accessor)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
