"""The search graph with ``cosim.search.precision`` and ``cosim.search.max-blocks``: blocks
of consecutive partitions give the answer single partitions give; every precision gives
the float64 answer on the CPU; on a GPU (marked ``gpu``) the float16 first pass gives the
float32 path's answer, cudf frames give cudf results, and the vectors stay on the device."""

from __future__ import annotations

from pathlib import Path

import dask
import numpy as np
import pandas as pd
import pytest

from tests.helpers import device_to_host_bytes, to_dask
from tests.helpers import search_frame as frame
from tests.helpers import search_vectors as vectors

SEARCHES = {
    "join_k": lambda df, other: df.cosim.join(other, "emb", k=4),
    "join_threshold": lambda df, other: df.cosim.join(other, "emb", threshold=0.4),
    "neighbors_k": lambda df, other: df.cosim.neighbors("emb", k=3, threshold=0.1),
    "neighbors_threshold": lambda df, other: df.cosim.neighbors("emb", threshold=0.4),
}


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(["left", "right"]).reset_index(drop=True)


def _answers(df: object, other: object, queries: np.ndarray) -> dict[str, pd.DataFrame]:
    out = {name: _sorted(fn(df, other).compute()) for name, fn in SEARCHES.items()}
    out["dedup"] = df.cosim.dedup("emb", 0.5).compute()  # type: ignore[attr-defined]
    out["topk"] = df.cosim.topk(queries, "emb", k=5, columns=["id"])  # type: ignore[attr-defined]
    return out


def test_blocks_of_consecutive_partitions_give_the_same_answer() -> None:
    x = vectors(150, seed=3)
    df = to_dask(frame(x), 9)
    other = to_dask(frame(vectors(60, seed=4)), 5)
    with dask.config.set(scheduler="sync"):
        want = _answers(df, other, x[:4])
        for blocks in (1, 2, 4):
            with dask.config.set({"cosim.search.max-blocks": blocks}):
                got = _answers(df, other, x[:4])
                dedup = df.cosim.dedup("emb", 0.5)
                pairs = df.cosim.neighbors("emb", k=2)
            for name, frame_want in want.items():
                pd.testing.assert_frame_equal(got[name], frame_want, obj=f"{name}, {blocks}")
            # dedup keeps the input's partitions; the search itself sees the blocks.
            assert dedup.npartitions == 9 and dedup.divisions == df.divisions
            assert pairs.npartitions == blocks
            tasks = [k for k in pairs.__dask_graph__() if "self_pair_topk" in str(k)]
            assert len(tasks) == blocks * (blocks + 1) // 2


@pytest.mark.parametrize("precision", ["exact", "fp32", "fast"])
def test_every_precision_gives_the_float64_answer_on_cpus(precision: str) -> None:
    # On CPUs the float32 path serves every precision: the same answer.
    x = vectors(120, seed=5)
    df = to_dask(frame(x), 3)
    other = to_dask(frame(vectors(40, seed=6)), 2)
    with dask.config.set(scheduler="sync"):
        want = _answers(df, other, x[:3])
        with dask.config.set({"cosim.search.precision": precision}):
            got = _answers(df, other, x[:3])
    for name in want:
        pd.testing.assert_frame_equal(got[name], want[name], obj=name)


def test_bad_precision_fails_when_the_graph_is_built() -> None:
    df = to_dask(frame(vectors(20)), 2)
    with dask.config.set({"cosim.search.precision": "half"}):
        with pytest.raises(ValueError, match=r"cosim\.search\.precision='half'"):
            df.cosim.neighbors("emb", k=2)


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_exact_precision_on_a_gpu_gives_the_float32_paths_answer() -> None:
    """pandas frames searched on the GPU: the float16 first pass ("exact") and today's
    float32 tiles ("fp32") give identical results; "fast" gives results of the same
    shape (its decisions may differ within the bound)."""
    x = vectors(3000, d=96, seed=7)
    x[100:140] = x[7]  # exact ties
    df = to_dask(frame(x), 4)
    other = to_dask(frame(vectors(700, d=96, seed=8)), 3)
    answers = {}
    with dask.config.set(scheduler="sync", **{"cosim.device": "cuda"}):
        for precision in ("fp32", "exact", "fast"):
            with dask.config.set({"cosim.search.precision": precision}):
                answers[precision] = _answers(df, other, x[:50])
    for name, want in answers["fp32"].items():
        pd.testing.assert_frame_equal(answers["exact"][name], want, obj=name)
        assert list(answers["fast"][name].columns) == list(want.columns)


def _device_frame(x: np.ndarray, npartitions: int) -> object:
    """A dask_cudf frame whose "emb" list column views an (N, D) device array."""
    cudf = pytest.importorskip("cudf")
    dask_cudf = pytest.importorskip("dask_cudf")
    import cupy
    import pylibcudf as plc

    gdf = cudf.from_pandas(pd.DataFrame({"id": np.arange(len(x))}))
    gdf["emb"] = cudf.Series.from_pylibcudf(plc.Column.from_array(cupy.asarray(x)))
    return dask_cudf.from_cudf(gdf, npartitions=npartitions)


@pytest.mark.gpu
def test_cudf_in_cudf_out() -> None:
    cudf = pytest.importorskip("cudf")
    x = vectors(2000, d=64, seed=9)
    gdf = _device_frame(x, 3)
    pdf = to_dask(frame(x)[["emb", "id"]].reset_index(drop=True), 3)
    for name, fn in SEARCHES.items():
        got = fn(gdf, gdf)
        assert isinstance(got._meta, cudf.DataFrame), name
        result = got.compute()
        assert isinstance(result, cudf.DataFrame), name
        want = _sorted(fn(pdf, pdf).compute())
        pd.testing.assert_frame_equal(_sorted(result.to_pandas()), want, obj=name)
    kept = gdf.cosim.dedup("emb", 0.5)
    assert isinstance(kept._meta, cudf.DataFrame) and kept.npartitions == 3
    assert (
        kept.compute()["id"].to_pandas().tolist()
        == pdf.cosim.dedup("emb", 0.5).compute()["id"].tolist()
    )
    hits = gdf.cosim.topk(x[:3], "emb", k=4, columns=["id"])
    assert isinstance(hits, cudf.DataFrame)


@pytest.mark.gpu
@pytest.mark.parametrize("search", ["dedup", "neighbors_threshold", "join_k"])
def test_cudf_search_makes_no_host_round_trip(tmp_path: Path, search: str) -> None:
    """What comes back to the host from a search of a cudf frame is its results (and a
    few counts), never the vectors or score tiles: under 1% of the vector bytes."""
    x = vectors(60_000, d=256, seed=10)
    x[1000:1300] = x[:300] + 1e-3  # some near-duplicates, so results are not empty
    gdf = _device_frame(x, 2)

    def run() -> None:
        with dask.config.set(scheduler="sync"):
            if search == "dedup":
                gdf.cosim.dedup("emb", 0.95).compute()
            elif search == "join_k":
                gdf.cosim.join(gdf.partitions[0], "emb", k=2).compute()
            else:
                SEARCHES[search](gdf, gdf).compute()

    run()
    copies, nbytes = device_to_host_bytes(run, tmp_path)
    print(f"{search}: {copies} device-to-host copies, {nbytes} bytes")
    assert nbytes < 0.01 * x.nbytes, (copies, nbytes)


@pytest.mark.gpu
def test_float16_dedup_on_the_gpu_from_parquet_to_parquet(tmp_path: Path) -> None:
    """The scale path in small: float16 rows in Parquet, read with the pandas backend,
    deduplicated on the GPU in blocks (each side prepared once, kept on the device) and
    written back: the rows the float32 path keeps."""
    import dask_cosim
    from dask_cosim.io import vectors_to_arrow

    rng = np.random.default_rng(11)
    x = rng.standard_normal((20_000, 128)).astype(np.float16)
    x[10_000:12_000] = x[:2000] + np.float16(0.01)
    src = pd.DataFrame({"emb": vectors_to_arrow(x), "id": np.arange(len(x))})
    dask_cosim.to_parquet(dask_cosim.from_pandas(src, npartitions=8), tmp_path / "in")
    df = dask_cosim.read_parquet(str(tmp_path / "in"))
    with dask.config.set({"cosim.device": "cuda", "cosim.search.max-blocks": 3}):
        dask_cosim.to_parquet(df.cosim.dedup("emb", 0.98), tmp_path / "out")
        with dask.config.set({"cosim.search.precision": "fp32"}):
            want = src.cosim.dedup("emb", 0.98)["id"].tolist()
    kept = dask_cosim.read_parquet(str(tmp_path / "out")).compute()
    assert kept["id"].tolist() == want and 10_000 <= len(want) < 20_000
