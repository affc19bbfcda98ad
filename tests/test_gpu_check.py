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


def test_install_takes_one_wheel_per_distribution(tmp_path: Path) -> None:
    """The install step puts every carried wheel into one pip call, one file per
    distribution: the cudf set (reassembled from its slices) before the first call's own
    pyarrow, dask's small set and the extras; a missing set is no error."""
    import subprocess
    import tarfile

    wheels = tmp_path / "wheels"
    for sub, name in [("first", "pyarrow-26.0.1-cp312-cp312-manylinux_2_28_x86_64.whl"),
                      ("small", "dask-2026.7.1-py3-none-any.whl"),
                      ("extra", "nbclient-0.11.0-py3-none-any.whl")]:  # fmt: skip
        (wheels / sub).mkdir(parents=True)
        (wheels / sub / name).write_bytes(b"")
    cudf = tmp_path / "cudf"
    cudf.mkdir()
    for name in ["pyarrow-26.0.1-cp312-cp312-manylinux_2_28_x86_64.whl",
                 "cudf_cu13-26.10.2-cp312-cp312-manylinux_2_28_x86_64.whl"]:  # fmt: skip
        (cudf / name).write_bytes(b"")
    with tarfile.open(tmp_path / "cudf.tar", "w") as tar:
        tar.add(cudf, arcname="cudf")
    blob = (tmp_path / "cudf.tar").read_bytes()
    for i, piece in enumerate((blob[: len(blob) // 2], blob[len(blob) // 2 :])):
        (wheels / "parts" / f"p0{i + 1}").mkdir(parents=True)
        (wheels / "parts" / f"p0{i + 1}" / f"cudf.tar.0{i}").write_bytes(piece)
    calls = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    fake.chmod(0o755)
    out = tmp_path / "out"
    proc = subprocess.run(
        [str(ROOT / ".ci" / "gpu-check"), str(out), "install"],
        env={"PATH": "/usr/bin:/bin", "PYTHON": str(fake), "WHEELS": str(wheels)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    install = next(line for line in calls.read_text().splitlines() if " install " in line)
    names = [Path(w).name for w in install.split() if w.endswith(".whl")]
    assert sorted(names) == sorted([
        "pyarrow-26.0.1-cp312-cp312-manylinux_2_28_x86_64.whl",
        "cudf_cu13-26.10.2-cp312-cp312-manylinux_2_28_x86_64.whl",
        "dask-2026.7.1-py3-none-any.whl", "nbclient-0.11.0-py3-none-any.whl",
    ])  # fmt: skip
    pyarrow = next(w for w in install.split() if Path(w).name.startswith("pyarrow"))
    assert "/first/" not in pyarrow  # the cudf set's own
    assert "install: rc=0" in (out / "summary.txt").read_text()


def test_a_step_with_seconds_is_interrupted_after_them(tmp_path: Path) -> None:
    """``STEP:SECONDS`` interrupts that step after so long (so that a slow step leaves the
    next one its share of a lease), and the steps after it still run."""
    import subprocess
    import time

    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")
    fake.chmod(0o755)
    out = tmp_path / "out"
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(ROOT / ".ci" / "gpu-check"), str(out), "install:2", "install:x", "install:1"],
        env={"PATH": "/usr/bin:/bin", "PYTHON": str(fake), "WHEELS": str(tmp_path / "none")},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert time.monotonic() - t0 < 30
    summary = (out / "summary.txt").read_text().splitlines()
    assert summary[0].startswith("install: rc=124, ") and summary[2].startswith("install: rc=124")
    assert "install:x: unknown step" in summary[1]
    assert proc.returncode == 1
    # Under a budget too short for the step's expected time, the cap is what it asks.
    proc = subprocess.run(
        [str(ROOT / ".ci" / "gpu-check"), str(out), "gpu-tests:2"],
        env={"PATH": "/usr/bin:/bin", "PYTHON": str(fake), "GPU_CHECK_BUDGET": "100"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (out / "summary.txt").read_text().startswith("gpu-tests: rc=124, ")
