"""The code examples of README.md and docs/ run as written, so that they cannot rot
silently: each test takes a ```python block from its page (found by a line it holds),
runs it in a folder of its own, and checks what the page says it prints or returns.
Only the names a block takes from the text around it (a frame, queries) are given to it,
and row counts are shrunk where the page's would take minutes."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import dask_cosim
from dask_cosim.datasets import make_embeddings, make_pairs

ROOT = Path(dask_cosim.__file__).parents[1]


def python_block(page: str, holding: str) -> str:
    """The one ```python block of ``page`` (README.md, or a page of docs/) with a line
    holding ``holding``, dedented as in the page."""
    text = (ROOT / page).read_text()
    blocks = [
        "\n".join(line[len(indent) :] for line in body.splitlines())
        for indent, body in re.findall(r"^( *)```python\n(.*?)^ *```$", text, re.M | re.S)
    ]
    found = [b for b in blocks if holding in b]
    assert len(found) == 1, f"{page}: {len(found)} python blocks hold {holding!r}"
    return found[0]


def run_block(code: str, folder: Path, **names: Any) -> tuple[dict[str, Any], str]:
    """exec ``code`` with ``names`` defined, in ``folder``: its namespace and stdout."""
    namespace: dict[str, Any] = {"__name__": "docs_example", **names}
    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        with redirect_stdout(out):
            exec(compile(code, "<docs example>", "exec"), namespace)
    finally:
        os.chdir(cwd)
    return namespace, out.getvalue()


def test_readme_pandas_frame_of_tensors(tmp_path: Path) -> None:
    _, out = run_block(python_block("README.md", "torch.randn(300, 1)"), tmp_path)
    assert "Name: cos, dtype: float32" in out  # the eager Series' head
    assert re.search(r"^count +1000\.0+$", out, re.M)  # describe() of the dask result


def test_quickstart_eager_frame_then_from_pandas(tmp_path: Path) -> None:
    eager, out = run_block(python_block("docs/quickstart.md", "torch.randn(300, 1)"), tmp_path)
    assert eager["cos"].name == "cos" and re.search(r"^count +1000\.0+$", out, re.M)
    lazy, _ = run_block(python_block("docs/quickstart.md", "npartitions=8"), tmp_path, **eager)
    assert lazy["ddf"].npartitions == 8


def test_readme_parquet_on_a_local_cluster(tmp_path: Path) -> None:
    """The script as a user runs it (it starts worker processes), at 2,000 pairs and with
    2 workers (not one per core of a large machine)."""
    code = python_block("README.md", "make_pairs(100_000, 300, seed=0)")
    assert code.count("100_000") == code.count("dask_cosim.local_cluster()") == 1
    code = code.replace("100_000", "2_000")
    code = code.replace("dask_cosim.local_cluster()", "dask_cosim.local_cluster(2)")
    (tmp_path / "example.py").write_text(code)
    proc = subprocess.run(
        [sys.executable, "example.py"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "http://127.0.0.1:" in proc.stdout and "rows        2,000" in proc.stdout
    # "the 3 rows most like the first two vectors (each finds itself first, score 1.0)"
    hits = re.findall(r"^\d+ +(\d+) +0 +(\d+) +([\d.]+) +\d+$", proc.stdout, re.M)
    assert [(q, m, float(s)) for q, m, s in hits] == [("0", "0", 1.0), ("1", "1", 1.0)]


@pytest.fixture
def docs_folder(tmp_path: Path) -> Path:
    """docs/similarity-search.md's folder "docs/": an embedding column "emb", "id", "title"."""
    frame, _ = make_embeddings(600, 16, directions=20, duplicates=0.1, seed=1)
    frame["title"] = [f"title {i}" for i in range(len(frame))]
    dask_cosim.to_parquet(dask_cosim.from_pandas(frame, npartitions=2), tmp_path / "docs")
    return tmp_path


def test_similarity_search_api(docs_folder: Path) -> None:
    queries = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    side = dask_cosim.read_parquet(docs_folder / "docs")
    found, _ = run_block(
        python_block("docs/similarity-search.md", "query_vectors"),
        docs_folder,
        query_vectors=queries,
        left=side.partitions[0],
        right=side,
    )
    hits = found["hits"]
    assert list(hits.columns) == ["query", "rank", "match", "score", "title"]
    assert len(hits) == 30
    pairs = found["pairs"].compute()
    assert list(pairs.columns) == ["left", "right", "score", "rank", "left_id", "right_id"]
    kept, removed = (x.compute() for x in (found["clean"], found["removed"]))
    assert len(kept) + len(removed) == 600 and len(removed) > 0
    assert len(found["dups"].compute()) >= len(removed)
    assert "group" in found["grouped"].compute().columns


def test_similarity_search_prepare_and_options(docs_folder: Path) -> None:
    queries = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    found, _ = run_block(
        python_block("docs/similarity-search.md", "query_batches"),
        docs_folder,
        dask_cosim=dask_cosim,
        query_batches=[queries, queries[:1]],
    )
    assert len(found["hits"]) == 10  # the last batch: one query
    df = found["docs"]
    for page, holding in [
        ("docs/similarity-search.md", "tile-bytes.cpu"),
        ("docs/search-precision.md", '"fp32"'),
    ]:
        ran, _ = run_block(python_block(page, holding), docs_folder, df=df)
        assert isinstance(ran["pairs"], pd.DataFrame)


def test_parquet_configuration_and_summary(tmp_path: Path) -> None:
    df = dask_cosim.from_pandas(make_pairs(500, 8, seed=0), npartitions=2)
    ran, out = run_block(
        python_block("docs/parquet.md", "describe_parquet"), tmp_path, dask_cosim=dask_cosim, df=df
    )
    assert len(ran["df"]) == 500 and (tmp_path / "pairs_portable").is_dir()
    ran, _ = run_block(
        python_block("docs/configuration.md", "cosim.chunk-bytes.cpu"), tmp_path, df=df
    )
    assert len(ran["cos"].compute()) == 500
    df["cos"] = df.cosim.pairwise("embeds_a", "embeds_b")
    ran, out = run_block(
        python_block("docs/first-hour.md", "dask_cosim.summarize(df"),
        tmp_path,
        dask_cosim=dask_cosim,
        df=df,
    )
    assert ran["s"].rows == 500 and len(ran["s"].counts) == 20 and "histogram" in out


def test_kernels_page(tmp_path: Path) -> None:
    code = python_block("docs/kernels.md", "fused_kernel_for").replace("1_000_000", "1_000")
    ran, _ = run_block(code, tmp_path)
    assert ran["res"].shape == (1_000,)
