"""What the tests share: the references of the numerics policy (``reference`` in float64,
``exact_reference`` in exact arithmetic, ``brute`` for every pair of two sets of rows),
the pairwise kernel with the configured options (``cosine``, ``EPS``, ``CHUNK_BYTES``),
pairs and frames in every accepted input format, schedulers that count or forbid
computations, the device-to-host bytes of a run, Triton's interpreter in a fresh process,
the answers a search must give on the search tests' frames (brute-force pairs, the rows
dedup keeps), and the Parquet readers a written folder must read back in.  The search's
adversarial rows and checks against the float64 answer are in :mod:`tests.search_checks`,
the columns, cases and runs of the bad-input tables of ``pairwise`` in
:mod:`tests.bad_input_cases`, the rows the clustered search is tested on in
:mod:`tests.clustered_data`.  Test modules take what they share from these, none from
another test module."""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

import dask_cosim
from dask_cosim import _search_tiles, kernels, options, search_prepare
from dask_cosim import search_kernels as sk


def reference(
    a: np.ndarray, b: np.ndarray, eps: float = 1e-8, null: Sequence[int] = ()
) -> np.ndarray:
    """The numerics policy in float64: (a/max(|a|,eps)).(b/max(|b|,eps)), clamped; NaN
    for rows with NaN or inf and for the ``null`` row positions."""
    a = np.asarray(a, dtype=np.float64).reshape(len(a), -1)
    b = np.asarray(b, dtype=np.float64).reshape(len(b), -1)
    with np.errstate(all="ignore"):
        na = np.maximum(np.sqrt((a * a).sum(1)), eps)
        nb = np.maximum(np.sqrt((b * b).sum(1)), eps)
        res = (a / na[:, None] * (b / nb[:, None])).sum(1)
    bad = ~(np.isfinite(a).all(1) & np.isfinite(b).all(1))
    res[bad] = np.nan
    res[list(null)] = np.nan
    return np.clip(res, -1, 1)


def exact_cosine(x: np.ndarray, y: np.ndarray, eps: float = 1e-8) -> float:
    """(x / max(|x|, eps)) . (y / max(|y|, eps)) for one pair of rows, exactly."""
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        return math.nan
    fx = [Fraction(float(v)) for v in x]
    fy = [Fraction(float(v)) for v in y]
    dot = sum((p * q for p, q in zip(fx, fy)), Fraction(0))
    xx = sum((p * p for p in fx), Fraction(0))
    yy = sum((q * q for q in fy), Fraction(0))
    if xx == 0 or yy == 0:
        return 0.0 if eps > 0 else math.nan  # 0 / eps, or 0 / 0
    # cos^2 = dot^2 / (xx yy), times (|x| / eps)^2 where |x| < eps, likewise for y.
    sq = dot * dot / (xx * yy)
    e2 = Fraction(eps) ** 2
    if xx < e2:
        sq *= xx / e2
    if yy < e2:
        sq *= yy / e2
    return math.sqrt(float(sq)) * (-1.0 if dot < 0 else 1.0)


def exact_reference(a: np.ndarray, b: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    return np.array([exact_cosine(x, y, eps) for x, y in zip(a, b)])


def brute(x: np.ndarray, y: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """The numerics policy in float64, element by element (no BLAS: duplicate vectors get
    bit-identical scores); rows with NaN/inf score -inf (they never match)."""
    x = x.astype(np.float64)
    y = y.astype(np.float64)
    with np.errstate(all="ignore"):
        mx = np.where(np.isfinite(x).all(1), np.abs(x).max(1, initial=0), 1.0)
        my = np.where(np.isfinite(y).all(1), np.abs(y).max(1, initial=0), 1.0)
        mx[mx == 0] = 1
        my[my == 0] = 1
        xs, ys = x / mx[:, None], y / my[:, None]
        nx = np.maximum(np.sqrt((xs * xs).sum(1)) * mx, eps)
        ny = np.maximum(np.sqrt((ys * ys).sum(1)) * my, eps)
        s = (xs[:, None, :] * ys[None, :, :]).sum(-1) * (mx / nx)[:, None] * (my / ny)[None, :]
    s = np.clip(s, -1, 1)
    s[~np.isfinite(x).all(1)] = -np.inf
    s[:, ~np.isfinite(y).all(1)] = -np.inf
    return s


def random_pairs(
    n: int, d: int, seed: int = 0, dtype: type = np.float32
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, d)).astype(dtype)
    b = (0.5 * a + rng.standard_normal((n, d))).astype(dtype)
    return a, b


# The kernels take their options as arguments: the configured defaults (cosim.yaml).
EPS, CHUNK_BYTES = options.eps(), options.chunk_bytes()
# The kernel with the configured eps and chunk budget (both are required arguments).
cosine = functools.partial(kernels.pairwise_cosine, eps=EPS, chunk_bytes=CHUNK_BYTES)


FORMATS = ["fixed_size_list", "list", "object_numpy", "object_torch_300x1", "object_lists"]


def as_column(
    x: np.ndarray, fmt: str, null: np.ndarray | None = None
) -> pd.Series | pd.api.extensions.ExtensionArray:
    """An (N, D) array as a column in one of FORMATS; rows where ``null`` is True are null."""
    n, d = x.shape
    null = np.zeros(n, bool) if null is None else null
    if fmt in ("fixed_size_list", "list"):
        rows = [None if null[i] else x[i] for i in range(n)]
        value = pa.from_numpy_dtype(x.dtype)
        t = pa.list_(value, d) if fmt == "fixed_size_list" else pa.list_(value)
        return pd.array(pa.array(rows, type=t), dtype=pd.ArrowDtype(t))
    if fmt == "object_numpy":
        cells = [None if null[i] else x[i].copy() for i in range(n)]
    elif fmt == "object_torch_300x1":
        cells = [None if null[i] else torch.from_numpy(x[i].copy()).reshape(d, 1) for i in range(n)]
    elif fmt == "object_lists":
        cells = [None if null[i] else x[i].tolist() for i in range(n)]
    else:
        raise ValueError(fmt)
    out = np.empty(n, dtype=object)
    out[:] = cells
    return out


def pairs_frame(
    a: np.ndarray, b: np.ndarray, fmt: str, index: pd.Index | None = None, **nulls: np.ndarray
) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "embeds_a": as_column(a, fmt, nulls.get("null_a")),
            "embeds_b": as_column(b, fmt, nulls.get("null_b")),
            "id": np.arange(len(a)),
        },
        index=index,
    )


def spy_on_reads(monkeypatch: Any) -> list[Any]:
    """The columns each partition read of ``dask_cosim.read_parquet`` is asked for, in a
    list that grows as they are read (None: every column), while ``monkeypatch`` lasts."""
    asked: list[Any] = []
    read_piece = dask_cosim.io.read._read_piece

    @functools.wraps(read_piece)  # dask reads its signature: `columns` is projected
    def spy(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs.get("columns"))
        return read_piece(*args, **kwargs)

    monkeypatch.setattr(dask_cosim.io.read, "_read_piece", spy)
    return asked


@contextmanager
def counting_computes() -> Iterator[list[Any]]:
    """Run dask computations in this block on the synchronous scheduler, recording the
    keys of each one in the yielded list."""
    calls: list[Any] = []

    def counting_get(graph: Any, keys: Any, **kwargs: Any) -> Any:
        calls.append(keys)
        return dask.get(graph, keys, **kwargs)

    with dask.config.set(scheduler=counting_get):
        yield calls


@contextmanager
def no_computes() -> Iterator[None]:
    """Fail the test if anything in this block computes (graph building reads ``_meta``)."""

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("building the graph computed something")

    with dask.config.set(scheduler=forbidden):
        yield


def graph_bytes(*collections: Any) -> int:
    """The pickled size of the graphs of dask ``collections`` together (what the data they
    hold in memory weigh in them)."""
    graph: dict[Any, Any] = {}
    for c in collections:
        graph.update(c.__dask_graph__())
    return len(pickle.dumps(graph))


def device_to_host_bytes(run: Any, tmp_path: Path) -> tuple[int, int]:
    """(copies, bytes) from the device to the host while ``run()`` runs, as CUPTI sees
    them (every library in the process: torch, cupy, cudf)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy" and "DtoH" in e.get("name", "")]
    return len(copies), sum(int(e.get("args", {}).get("bytes", 0)) for e in copies)


# torch's per-backend float32 matmul settings (torch >= 2.9), parents before children: a
# parent's value reaches the children left at "none" when set.
FP32_PRECISION_SETTINGS = {
    "generic": lambda: torch.backends,
    "mkldnn": lambda: torch.backends.mkldnn,
    "mkldnn.matmul": lambda: torch.backends.mkldnn.matmul,
    "cuda.matmul": lambda: torch.backends.cuda.matmul,
}
needs_fp32_precision = pytest.mark.skipif(
    not hasattr(torch.backends.cuda.matmul, "fp32_precision"),
    reason="torch before 2.9 has no per-backend fp32_precision settings",
)


@contextmanager
def fp32_precision(**settings: str) -> Iterator[None]:
    """torch's ``fp32_precision`` settings (keys of FP32_PRECISION_SETTINGS with "." as
    "_") set the new way, from torch's defaults (all "none": a child set before keeps its
    value), while the block runs; all of them as they were afterwards."""
    owners = [get() for get in FP32_PRECISION_SETTINGS.values()]
    saved = [owner.fp32_precision for owner in owners]
    try:
        for owner in owners:
            owner.fp32_precision = "none"
        for name, value in settings.items():
            FP32_PRECISION_SETTINGS[name.replace("_", ".")]().fp32_precision = value
        yield
    finally:
        for owner, value in zip(owners, saved):
            owner.fp32_precision = value


def hide_numba(monkeypatch: Any) -> None:
    """Every search module that asks for numba kernels (the clustered search's too) is
    told there are none, while ``monkeypatch`` (pytest's fixture) lasts: the torch path
    GPUs take."""
    for module in (_search_tiles, sk, search_prepare):
        monkeypatch.setattr(module, "numba_kernels", lambda *names: None)


def run_in_triton_interpreter(code: str, timeout: int = 300) -> None:
    """Run ``code`` in a fresh Python with ``TRITON_INTERPRET=1`` (it must be set before
    triton compiles anything), from the repository root; fail with its stderr."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-6000:]


# --------------------------------------------------------------------------- search


def search_vectors(n: int = 97, d: int = 12, seed: int = 0) -> np.ndarray:
    """Rows for the search tests: random, with exact duplicates and a near-duplicate."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    if n > 60:
        x[40:44] = x[5]  # exact duplicates: ties broken by position
        x[60] = x[6] + 1e-3 * rng.standard_normal(d).astype(np.float32)  # a near-duplicate
    return x


def search_frame(
    x: np.ndarray, fmt: str = "fixed_size_list", null: np.ndarray | None = None
) -> pd.DataFrame:
    """Rows as an embedding column "emb" (in ``fmt``), with "id" and "text" columns and
    a sorted, non-range index."""
    n = len(x)
    return pd.DataFrame(
        {
            "emb": as_column(x, fmt, null),
            "id": np.arange(n),
            "text": [f"row {i}" for i in range(n)],
        },
        index=pd.Index(np.arange(n) * 10 + 3, name="key"),
    )


def to_dask(pdf: pd.DataFrame, npartitions: int) -> dd.DataFrame:
    """``pdf`` in ``npartitions`` dask partitions, object columns left as they are."""
    with dask.config.set({"dataframe.convert-string": False}):
        return dd.from_pandas(pdf, npartitions=npartitions, sort=False)


def split_frame(pdf: pd.DataFrame, sizes: Sequence[int]) -> dd.DataFrame:
    """``pdf`` as consecutive dask partitions of ``sizes`` rows (0 allowed), unknown
    divisions, object columns left as they are."""
    assert sum(sizes) == len(pdf), (sizes, len(pdf))
    edges = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    parts = [pdf.iloc[a:b] for a, b in itertools.pairwise(edges)]
    with dask.config.set({"dataframe.convert-string": False}):
        return dd.from_map(lambda part: part, parts, meta=pdf.iloc[:0], enforce_metadata=False)


def expected_pairs(
    s: np.ndarray, k: int | None, thr: float | None, li: pd.Index, ri: pd.Index
) -> pd.DataFrame:
    """The brute-force result: per left row, best first (ties by position) with k, else
    by right position."""
    rows = []
    for i in range(s.shape[0]):
        # Ranked lists best first; threshold-only pairs in frame order.
        order = (
            np.lexsort((np.arange(s.shape[1]), -s[i])) if k is not None else np.arange(s.shape[1])
        )
        order = order[np.isfinite(s[i, order])]
        if thr is not None:
            order = order[s[i, order] >= thr]
        if k is not None:
            order = order[:k]
        for rank, j in enumerate(order):
            rows.append((li[i], ri[j], s[i, j], rank))
    out = pd.DataFrame(rows, columns=["left", "right", "score", "rank"])
    return out if k is not None else out.drop(columns="rank")


def assert_pairs_equal(got: pd.DataFrame, want: pd.DataFrame, s: np.ndarray | None = None) -> None:
    assert list(got.columns) == list(want.columns)
    assert len(got) == len(want), (len(got), len(want))
    np.testing.assert_allclose(
        got["score"].to_numpy(np.float64), want["score"].to_numpy(), atol=1e-6
    )
    assert (got["left"].to_numpy() == want["left"].to_numpy()).all()
    assert (got["right"].to_numpy() == want["right"].to_numpy()).all()
    if "rank" in want:
        assert (got["rank"].to_numpy() == want["rank"].to_numpy()).all()


def reference_dedup(x: np.ndarray, thr: float) -> np.ndarray:
    s = brute(x, x)
    earlier = np.tril(s >= thr, -1)  # s[i, j] with j < i
    return ~earlier.any(axis=1)


def prepare_rows(x: np.ndarray, null: np.ndarray | None = None) -> sk.Prepared:
    """Rows (and their null mask) prepared for the search kernels, as the CPU selection's
    tests take them."""
    return sk.prepare(
        torch.from_numpy(x), None if null is None else torch.from_numpy(null), eps=1e-8
    )


# --------------------------------------------------------------------------- readers


def vector_bytes(cell: Any) -> bytes | None:
    """One vector cell of any reader (numpy array, list, Arrow scalar) as float32 bytes."""
    if cell is None or cell is pd.NA or (isinstance(cell, float) and np.isnan(cell)):
        return None
    return np.asarray(cell, dtype=np.float32).tobytes()


def comparable(df: pd.DataFrame, vectors: tuple[str, ...] = ("emb",)) -> pd.DataFrame:
    """Vectors as bytes, strings as objects, missing values as None: what every reader
    must agree on, whatever dtypes it picks."""
    out = df.copy()
    if out.index.dtype.kind not in "fiu":
        out.index = out.index.astype(object)
    for c in out.columns:
        if c in vectors:
            out[c] = [vector_bytes(v) for v in out[c].to_numpy(dtype=object)]
        elif out[c].dtype.kind not in "fiu":
            out[c] = out[c].astype(object).where(out[c].notna(), None)
    return out


def assert_same(
    got: pd.DataFrame, want: pd.DataFrame, reader: str, vectors: tuple[str, ...] = ("emb",)
) -> None:
    """``got`` (read back by ``reader``) holds the columns, index and values of ``want``."""
    assert list(got.columns) == list(want.columns), reader
    assert got.index.name == want.index.name, reader
    pd.testing.assert_frame_equal(
        comparable(got, vectors),
        comparable(want, vectors),
        check_dtype=False,
        check_index_type="equiv",
        obj=reader,
    )


def stored_index(folder: Path) -> list[str]:
    first = sorted(folder.glob("*.parquet"))[0]
    meta = pq.read_schema(first).pandas_metadata or {}
    return [c for c in meta.get("index_columns", []) if isinstance(c, str)]


def read_duckdb(folder: Path) -> pd.DataFrame:
    """DuckDB has no index: the stored index column becomes the index again, by the name
    the pandas metadata gives it."""
    import duckdb

    with duckdb.connect() as con:
        df = con.sql(f"SELECT * FROM read_parquet('{folder}/*.parquet')").df()
    index = stored_index(folder)
    if index:
        first = sorted(folder.glob("*.parquet"))[0]
        stored = pq.read_schema(first).pandas_metadata["columns"]
        names = {c["field_name"]: c["name"] for c in stored}
        df = df.set_index(index)
        df.index.names = [names[n] for n in index]
    return df


READERS: dict[str, Callable[[Path], pd.DataFrame]] = {
    "pandas": lambda f: pd.read_parquet(f),
    "pyarrow dataset": lambda f: pads.dataset(f, format="parquet").to_table().to_pandas(),
    "dask": lambda f: dd.read_parquet(f).compute(),
    "duckdb": read_duckdb,
    "dask_cosim": lambda f: dask_cosim.read_parquet(f).compute(),
}


def cli_here(*args: str) -> subprocess.CompletedProcess[str]:
    """``dask-cosim ARGS`` in this process, through click's test runner: the exit code,
    and stdout and stderr together as ``stdout`` (click 8.1 mixes them by default; later
    versions always fill ``output`` with both).  For commands that start no cluster: a
    new interpreter spends 4-5 s importing torch, pandas and dask."""
    from dask_cosim.cli import main

    result = CliRunner().invoke(main, list(args))
    return subprocess.CompletedProcess(list(args), result.exit_code, result.output, "")
