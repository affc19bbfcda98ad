"""pytest hooks and fixtures: tests marked ``gpu`` skip cleanly without a CUDA GPU,
distributed's ``client`` fixture is available everywhere, and ``shared_client`` gives a
module's tests one such cluster between them.  Shared helpers live in tests/helpers.py."""

from __future__ import annotations

import os
from collections.abc import Iterator

import dask
import pytest
import torch

# isort: off
import pandas  # noqa: F401  (before dask_cosim's import hooks: see below)
import dask_cosim  # noqa: F401  (registers the accessor, loads the cosim defaults)

# The tests of method="clustered" run it on small frames, where its plan would find exact
# all-pairs cheaper and run that instead: they test the clustered search itself, here and
# in the commands they start.  The tests of that choice turn it back on.
os.environ["DASK_COSIM__SEARCH__CLUSTERED__EXACT_WHEN_CHEAPER"] = "False"
dask.config.set({"cosim.search.clustered.exact-when-cheaper": False})

# distributed's own fixtures, for every test module: `client` (a scheduler and two worker
# processes) and what it needs.  Imported after dask_cosim: distributed.utils_test keeps
# a copy of the dask config as it is now and restores it after each cluster test.
from distributed import Client  # noqa: E402  (after the config above: see there)
from distributed.utils_test import (  # noqa: E402, F401
    cleanup,
    client,
    cluster,
    cluster_fixture,
    config_for_cluster_tests,
    loop,
    loop_in_thread,
)
# isort: on


@pytest.fixture(scope="module")
def shared_cluster() -> Iterator[str]:
    """The cluster of distributed's ``client`` fixture (a scheduler and two one-thread
    worker processes), started once per module: the scheduler's address.  Starting one,
    and its workers' first import of torch and dask_cosim, takes seconds per test.

    Only for modules where no test uses ``loop`` or ``client``: their fixtures end every
    child process of this one, this cluster's included."""
    with cluster() as (scheduler, _workers):
        yield scheduler["address"]


@pytest.fixture
def shared_client(shared_cluster: str) -> Iterator[Client]:
    """A client of the module's ``shared_cluster``, for one test, in the config
    distributed's ``client`` fixture sets; the workers keep what earlier tests of the
    module left on them (imports, run() patches), never their results."""
    with config_for_cluster_tests(), Client(shared_cluster) as c:
        yield c


@pytest.fixture
def sync_scheduler() -> Iterator[None]:
    """dask's synchronous scheduler for one test; a module's tests all take it with
    ``pytestmark = pytest.mark.usefixtures("sync_scheduler")``."""
    with dask.config.set(scheduler="sync"):
        yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
