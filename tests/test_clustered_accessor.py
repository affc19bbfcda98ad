"""method="clustered" through the accessor and dask_cosim.search: the same pairs, kept
and removed rows as method="exact" (frames in memory and dask frames, TF32 settings, an
Arrow list column with empty partitions, user columns named like the routing keys),
rows of two lengths named, result.partitions and deterministic keys, the plan's graph
(the centroids as one key) and the columns it reads, and the errors for what does not go
together.  tests/test_clustered_columns_cli.py has the carried columns, the distributed
cluster and the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dask
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from dask.utils import key_split

import dask_cosim
from dask_cosim import clustered, search
from dask_cosim import clustered_kernels as ck
from tests.clustered_data import generated
from tests.helpers import (
    as_column,
    counting_computes,
    fp32_precision,
    needs_fp32_precision,
    spy_on_reads,
    to_dask,
)


@pytest.fixture(scope="module")
def pdf() -> pd.DataFrame:
    return generated()


@pytest.mark.parametrize("centroid_scores", ["float32", "bfloat16"])
def test_accessor_clustered_equals_exact(
    pdf: pd.DataFrame, centroid_scores: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same pairs as exact search, with the centroid scores of the plan and the
    routing in float32 or from bfloat16 products first (as on CPUs with bfloat16 units)."""
    if centroid_scores == "bfloat16":
        monkeypatch.setattr(ck, "use_bfloat16", lambda wanted, d: d.device.type == "cpu")
    ddf = to_dask(pdf, 3)
    with dask.config.set(scheduler="sync"):
        for frame in (pdf, ddf):
            want = frame.cosim.neighbors("emb", threshold=0.9)
            got = frame.cosim.neighbors("emb", threshold=0.9, method="clustered", clusters=12)
            if frame is ddf:
                assert got.npartitions == ddf.npartitions
                assert got._meta.dtypes.to_dict() == want._meta.dtypes.to_dict()
                want, got = want.compute(), got.compute()
            assert len(want) > 50
            assert got.dtypes.to_dict() == want.dtypes.to_dict()
            pd.testing.assert_frame_equal(
                got.reset_index(drop=True)[["left", "right"]],
                want.reset_index(drop=True)[["left", "right"]],
            )
            np.testing.assert_allclose(got["score"], want["score"], atol=2e-6)
            kept = frame.cosim.dedup("emb", 0.9, method="clustered", n_probe=3)
            exact = search.dedup(frame, "emb", 0.9)
            if frame is ddf:
                assert kept.divisions == ddf.divisions
                kept, exact = kept.compute(), exact.compute()
            # n_probe may miss pairs (rows kept), never invent them (rows dropped).
            assert set(exact.index) <= set(kept.index)
            assert list(kept.columns) == list(pdf.columns)


def test_clustered_removed_rows_equal_exact(pdf: pd.DataFrame) -> None:
    ddf = to_dask(pdf, 3)
    with dask.config.set(scheduler="sync"):
        for frame in (pdf, ddf):
            want = frame.cosim.dedup("emb", 0.9, return_removed=True)
            got = frame.cosim.dedup("emb", 0.9, return_removed=True, method="clustered",
                                    clusters=12)  # fmt: skip
            if frame is ddf:
                assert got[0].divisions == ddf.divisions
                assert got[1].npartitions == ddf.npartitions
                assert got[1]._meta.dtypes.to_dict() == want[1]._meta.dtypes.to_dict()
                want, got = dask.compute(*want), dask.compute(*got)
            pd.testing.assert_frame_equal(got[0], want[0])
            removed, expected = (r.reset_index(drop=True) for r in (got[1], want[1]))
            assert len(expected) > 50
            assert removed.dtypes.to_dict() == expected.dtypes.to_dict()
            # Which earlier row each removed row names: the same float64 rule, ties alike.
            pd.testing.assert_frame_equal(removed[["left", "right"]], expected[["left", "right"]])
            np.testing.assert_allclose(removed["score"], expected["score"], rtol=1e-12, atol=0)


@needs_fp32_precision
def test_clustered_under_torch_per_backend_float32_settings(pdf: pd.DataFrame) -> None:
    """TF32 products on CUDA set torch 2.9's new way, which makes
    torch.get_float32_matmul_precision raise: the bounds widen for TF32 inputs, and the
    answer stays the exact one."""
    want = pdf.cosim.neighbors("emb", threshold=0.9)
    ieee = ck.product_error(16)
    with fp32_precision(cuda_matmul="tf32"):
        assert ck.product_error(16) > 100 * ieee
        got = pdf.cosim.neighbors("emb", threshold=0.9, method="clustered", clusters=12)
    pd.testing.assert_frame_equal(
        got.reset_index(drop=True)[["left", "right"]],
        want.reset_index(drop=True)[["left", "right"]],
    )
    # Planned with IEEE products, computed with TF32 ones: the radii do not cover that.
    lazy = to_dask(pdf, 2).cosim.neighbors("emb", threshold=0.9, method="clustered", clusters=12)
    with (
        fp32_precision(cuda_matmul="tf32"),
        pytest.raises(RuntimeError, match="may round their inputs to tf32, more than where"),
    ):
        lazy.compute(scheduler="sync")


def test_clustered_list_column_with_empty_partitions(pdf: pd.DataFrame) -> None:
    """A filter that empties partitions of an Arrow list column (whose empty partition
    has no D) leaves the clustered answer the exact one."""
    x = np.stack(pdf["emb"].to_numpy())
    listed = pd.DataFrame({"emb": as_column(x, "list")}, index=pdf.index)
    ddf = to_dask(listed, 5)
    empty = set(ddf.index.to_series().map_partitions(lambda s: s.iloc[:1]).compute().iloc[[0, 2]])
    cut = ddf.map_partitions(lambda p: p.iloc[:0] if p.index[0] in empty else p, meta=ddf._meta)
    for run in (lambda **kw: cut.cosim.neighbors("emb", threshold=0.9, **kw),
                lambda **kw: cut.cosim.dedup("emb", 0.9, **kw)):  # fmt: skip
        pd.testing.assert_frame_equal(
            run(method="clustered").compute(), run(method="exact").compute()
        )


@pytest.mark.filterwarnings("ignore:method='clustered' at threshold")  # few clusters ruled out
def test_user_columns_named_like_the_routing_keys(pdf: pd.DataFrame) -> None:
    """A column of the user's named "_key" (the routing's own key column) is data: an
    eager frame's clustered search took it for the rows' keys (other pairs, other kept
    rows, silently, or an IndexError), and vectors named "_key" failed everywhere, the
    partitions routed in pieces included."""
    small = pdf.iloc[:400]
    shuffled = small.assign(_key=np.random.default_rng(0).permutation(len(small)))
    named = small.rename(columns={"emb": "_key"})
    p = clustered.plan(to_dask(named, 2), "_key", 0.9, clusters=6)
    in_pieces = {"cosim.search.clustered.route-bytes": int(p.routed_bytes / 2 / 3) + 1}
    cases = [(shuffled, "emb", {}), (named, "_key", {}), (to_dask(named, 2), "_key", {}),
             (to_dask(named, 2), "_key", in_pieces)]  # fmt: skip
    with dask.config.set(scheduler="sync"):
        for frame, on, config in cases:
            with dask.config.set(config):
                want = dask.compute(frame.cosim.neighbors(on, threshold=0.9))[0]
                got = frame.cosim.neighbors(on, threshold=0.9, method="clustered", clusters=6)
                kept = frame.cosim.dedup(on, 0.9, method="clustered", clusters=6)
                got, kept = dask.compute(got, kept)
            assert len(want) > 20
            pd.testing.assert_frame_equal(
                got.reset_index(drop=True)[["left", "right"]],
                want.reset_index(drop=True)[["left", "right"]],
            )
            pd.testing.assert_frame_equal(kept, dask.compute(search.dedup(frame, on, 0.9))[0])


def test_rows_of_two_lengths_in_two_partitions_are_named() -> None:
    """Each partition is checked when read; two partitions of different D are named by
    the plan (clustered, with the fix) and by the pair task (exact)."""
    x = np.random.default_rng(0).standard_normal((40, 3)).astype(np.float32)
    rows = [list(r) for r in x[:20]] + [list(r[:2]) for r in x[20:]]
    ddf = to_dask(
        pd.DataFrame({"emb": pd.Series(rows, dtype=pd.ArrowDtype(pa.list_(pa.float32())))}), 4
    )
    named = r"column 'emb' holds vectors of 3 values in partition [01] and of 2 in partition [23]; .* df\[df\['emb'\]\.list\.len\(\) == 3\]"
    with pytest.raises(ValueError, match=named):
        ddf.cosim.dedup("emb", 0.5, method="clustered").compute()
    with pytest.raises(
        ValueError,
        match=r"column 'emb' \(partition [01]\) holds vectors of 3 values and column 'emb' "
        r"\(partition [23]\) of 2",
    ):
        ddf.cosim.dedup("emb", 0.5).compute()
    with pytest.raises(
        ValueError,
        match=r"argument 'queries' holds vectors of 3 values and column 'emb' \(partition [23]\) of 2",
    ):
        ddf.cosim.topk(np.ones((1, 3)), "emb", k=2).compute()


@pytest.mark.filterwarnings("ignore:method='clustered' at threshold")  # few clusters ruled out
def test_clustered_partitions_select_as_exact_and_keys_are_deterministic(
    pdf: pd.DataFrame,
) -> None:
    """``result.partitions[i]`` (which dask pushes into the last per-partition step,
    renumbering it) gives the exact method's partition i: rows are found by their keys,
    not by dask's partition number.  Pairs have no divisions, as the exact method's.  The
    same call gives the same graph keys (persisted results are reused); another
    threshold, others."""
    ddf = to_dask(pdf, 4)
    cl = ddf.cosim.neighbors("emb", threshold=0.9, columns=["id"], method="clustered")
    ex = ddf.cosim.neighbors("emb", threshold=0.9, columns=["id"])
    assert cl.divisions == ex.divisions == (None,) * 5
    kept = ddf.cosim.dedup("emb", 0.9, method="clustered")
    kept_ex = ddf.cosim.dedup("emb", 0.9)
    for i in range(4):
        got, want = cl.partitions[i].compute(), ex.partitions[i].compute()
        pd.testing.assert_frame_equal(got.reset_index(drop=True), want.reset_index(drop=True))
        pd.testing.assert_frame_equal(kept.partitions[i].compute(), kept_ex.partitions[i].compute())
    again = ddf.cosim.dedup("emb", 0.9, method="clustered")
    assert again.__dask_keys__() == kept.__dask_keys__()
    assert ddf.cosim.dedup("emb", 0.8, method="clustered").__dask_keys__() != kept.__dask_keys__()


def test_the_radii_pass_sends_the_centroids_as_one_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each partition's task of the radii pass names the centroids' key: the tensor
    (here 400 x 64 float32, 102 kB) is in the graph once, not in every task."""
    import cloudpickle

    from dask_cosim import clustered_plan

    x = np.random.default_rng(0).standard_normal((8000, 64)).astype(np.float32)
    ddf = to_dask(pd.DataFrame({"emb": as_column(x, "fixed_size_list")}), 8)
    graphs: list[dict] = []
    compute = dask.compute

    def keep(*args: Any, **kwargs: Any) -> Any:
        graphs.extend(dict(a.__dask_graph__()) for a in args if dask.is_dask_collection(a))
        return compute(*args, **kwargs)

    monkeypatch.setattr(clustered_plan.dask, "compute", keep)
    ddf.cosim.dedup("emb", 0.95, method="clustered", clusters=400, n_probe=1)
    tasks = {k: v for g in graphs for k, v in g.items() if key_split(k) == "stats_partition"}
    assert len(tasks) == 8
    assert max(len(cloudpickle.dumps(t)) for t in tasks.values()) < 20_000


def test_the_plan_reads_no_column_it_does_not_use(
    pdf: pd.DataFrame, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan's computations on a Parquet read: the row count reads the index alone
    (and the columns a filter tests), the k-means sample and the radii pass the vectors;
    a wide column beside them is never read; nor by the recall's exact sample.  A frame
    in memory is counted from the lengths dask knows."""
    from collections import Counter

    wide = as_column(np.zeros((len(pdf), 256), np.float32), "fixed_size_list")
    frame = pdf[["emb"]].assign(lang=np.tile(["en", "fr", "de"], 500), wide=wide)
    dask_cosim.to_parquet(to_dask(frame, 4), tmp_path / "d")
    asked = spy_on_reads(monkeypatch)
    df = dask_cosim.read_parquet(tmp_path / "d")
    for data, count in ((df, frozenset()), (df[df["lang"] == "en"], frozenset({"lang"}))):
        asked.clear()
        with dask.config.set(scheduler="sync"):
            clustered.plan(data, "emb", 0.9, clusters=10)
        assert Counter(map(frozenset, asked)) == {count: 4, count | {"emb"}: 8}
    # The recall's exact sample too: the count reads the index, the rest the vectors once.
    asked.clear()
    with dask.config.set(scheduler="sync"):
        dask_cosim.clustered_recall.sample_truth(df, "emb", 0.9, sample_rows=20)
    assert Counter(map(frozenset, asked)) == {frozenset(): 4, frozenset({"emb"}): 4}
    with counting_computes() as calls:
        clustered.plan(to_dask(frame, 4), "emb", 0.9, clusters=10)
    assert [key_split(k) for k in calls[0]] == ["literal"] and len(calls) == 3


def test_clustered_errors(pdf: pd.DataFrame) -> None:
    df = pdf.cosim
    with pytest.raises(ValueError, match=r"method='approx'; use 'exact'"):
        df.neighbors("emb", threshold=0.9, method="approx")
    with pytest.raises(ValueError, match=r"n_probe is an option of method='clustered'"):
        df.dedup("emb", 0.9, n_probe=2)
    with pytest.raises(ValueError, match=r"k=5 with method='clustered'.*method='exact'"):
        df.neighbors("emb", k=5, method="clustered")
    with pytest.raises(ValueError, match=r"threshold=-0\.5: method='clustered' needs"):
        df.neighbors("emb", threshold=-0.5, method="clustered")
    with pytest.raises(KeyError, match=r"columns: column 'idd'"):
        df.neighbors("emb", threshold=0.9, columns=["idd"], method="clustered")
    assert dask_cosim.clustered_recall.sample_truth is not None
