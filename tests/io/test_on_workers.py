"""from_pandas with a distributed client: the data goes to the workers once, not in every
graph."""

from __future__ import annotations

import gc
import warnings
from pathlib import Path

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import torch
from distributed import Client

import dask_cosim
from dask_cosim import io
from tests.helpers import random_pairs, reference


def tensor_frame(rows: int, dim: int) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    a, b = random_pairs(rows, dim)
    pdf = pd.DataFrame(
        {
            "embeds_a": [torch.from_numpy(r.copy()).reshape(dim, 1) for r in a],
            "embeds_b": [torch.from_numpy(r.copy()).reshape(dim, 1) for r in b],
            "label": [f"row {i}" for i in range(rows)],
            "score": np.arange(rows, dtype=np.float64),
        },
        index=pd.RangeIndex(rows) * 3,
    )
    return pdf, a, b


def large_graph_warnings(fn) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if "large graph" in str(w.message)]


def test_computations_send_small_graphs_and_equal_results(shared_client: Client) -> None:
    pdf, a, b = tensor_frame(12_000, 300)  # 29 MB of vectors: above the 10 MB warning
    df = dask_cosim.from_pandas(pdf, npartitions=4)
    assert df.npartitions == 4 and df.divisions == (0, 9000, 18000, 27000, 35997)
    cos = df.cosim.pairwise("embeds_a", "embeds_b")
    results: dict[str, object] = {}

    def computations() -> None:
        results["cos"] = cos.compute()
        results["mean"] = cos.mean().compute()
        results["top"] = df.assign(cos=cos).nlargest(5, "cos").compute()

    assert large_graph_warnings(computations) == []
    expected = reference(a, b)
    np.testing.assert_allclose(results["cos"].to_numpy(), expected, atol=1e-6)
    assert results["cos"].index.equals(pdf.index)
    assert (
        results["mean"] == np.float32(expected.mean())
        or abs(results["mean"] - expected.mean()) < 1e-6
    )
    top = results["top"]
    assert top["label"].tolist() == [f"row {i}" for i in np.argsort(-expected)[:5]]
    assert str(df.dtypes["label"]) == str(dask_cosim.from_pandas(pdf.head()).dtypes["label"])
    # The data lives on the workers: the scheduler knows 4 partitions held there.
    assert sum(len(keys) for keys in shared_client.has_what().values()) >= 4


def test_the_frame_in_the_graph_is_what_it_avoids(shared_client: Client) -> None:
    """The same frame through dd.from_pandas does warn: the test above can fail."""
    pdf, _a, _b = tensor_frame(12_000, 300)
    converted = dask_cosim.from_pandas(pdf)
    with dask.config.set({"dataframe.convert-string": False}):
        in_graph = dd.from_pandas(converted.compute(), npartitions=4)
    cos = in_graph.cosim.pairwise("embeds_a", "embeds_b")
    assert large_graph_warnings(lambda: cos.mean().compute()) != []


def test_without_a_client_the_data_stays_in_the_graph() -> None:
    pdf, a, b = tensor_frame(50, 8)
    df = dask_cosim.from_pandas(pdf, npartitions=3)
    np.testing.assert_allclose(
        df.cosim.pairwise("embeds_a", "embeds_b").compute(scheduler="sync").to_numpy(),
        reference(a, b),
        atol=1e-6,
    )


def test_pandas_frames_written_together_keep_their_partitions(
    shared_client: Client, tmp_path: Path
) -> None:
    """A pandas frame is scattered to the workers when staged; the staged write holds it
    until computed (its futures gone, the write would find its partitions lost)."""
    pdf, a, _ = tensor_frame(60, 8)
    out = [tmp_path / "one", tmp_path / "two"]
    manifests = io.to_parquet_together([(pdf, out[0], {}), (pdf.head(7), out[1], {})])
    assert [m["rows"] for m in manifests] == [60, 7]
    back = dask_cosim.read_parquet(out[0]).compute(scheduler="sync")
    np.testing.assert_array_equal(np.stack(back["embeds_a"].to_numpy()), a)


def test_a_pandas_frame_written_later_keeps_its_partitions(
    shared_client: Client, tmp_path: Path
) -> None:
    """``to_parquet(pandas_frame, compute=False)``: the frame is scattered to the workers
    when staged, and the Delayed holds its partitions until computed (else computing it
    failed with "lost dependencies")."""
    pdf, a, _ = tensor_frame(60, 8)
    job = dask_cosim.to_parquet(dask_cosim.from_pandas(pdf, npartitions=3), tmp_path / "out")
    later = dask_cosim.to_parquet(pdf, tmp_path / "later", compute=False)
    gc.collect()  # nothing but the Delayed refers to the scattered partitions now
    assert later.compute()["rows"] == job["rows"] == 60
    back = dask_cosim.read_parquet(tmp_path / "later").compute(scheduler="sync")
    np.testing.assert_array_equal(np.stack(back["embeds_a"].to_numpy()), a)
    assert back.index.equals(pdf.index) and back["label"].tolist() == pdf["label"].tolist()
