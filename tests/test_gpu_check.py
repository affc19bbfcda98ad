""".ci/gpu-check runs on a lent GPU machine, a few device minutes at a time, never in CI:
every benchmark command it names must at least parse here, so that an option renamed
since the script was written costs a failing test, not a GPU run."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parent.parent


def benchmark_commands() -> list[tuple[str, list[str]]]:
    """(module, arguments) of each ``$py -m benchmarks.X ...`` line of .ci/gpu-check."""
    text = (ROOT / ".ci" / "gpu-check").read_text().replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        m = re.search(r"\$py -m (benchmarks\.\w+)(.*)", line)
        if m and not line.lstrip().startswith("#"):
            found.append((m.group(1), shlex.split(m.group(2).replace("$work", "/tmp/work"))))
    return found


def test_the_script_names_its_benchmarks() -> None:
    modules = {m for m, _ in benchmark_commands()}
    assert {"benchmarks.pairwise_gpu", "benchmarks.search_gpu", "benchmarks.clustered",
            "benchmarks.dask_gpu"} <= modules  # fmt: skip


@pytest.mark.parametrize(("module", "args"), benchmark_commands(), ids=lambda v: str(v)[:40])
def test_gpu_check_benchmark_arguments_parse(module: str, args: list[str]) -> None:
    command = importlib.import_module(module).main
    assert isinstance(command, click.Command)
    with command.make_context(module, list(args)) as ctx:  # a bad option raises UsageError
        assert ctx.params
