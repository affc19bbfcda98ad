"""df.cosim.prepare(on): the numbers it stores give the unprepared frame's answers (and
the float64 brute force's), on pandas and dask, through filters, repartitions, Parquet,
another eps, and without normalising the vectors again."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pandas as pd
import pytest
import torch

import dask_cosim
from dask_cosim import errors, search_partition
from tests.helpers import brute, no_computes, search_frame, search_vectors, to_dask

COMPANIONS = ["emb.cosim.inv", "emb.cosim.norm", "emb.cosim.unit"]


def rows(normalised: bool, dtype: Any = np.float32) -> tuple[np.ndarray, np.ndarray]:
    """Search rows (exact and near duplicates) with a NaN, a zero and a null row."""
    x = search_vectors(120, 16, seed=3).astype(np.float64)
    if normalised:
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    x = x.astype(dtype)
    x[7] = np.nan
    x[8] = 0.0
    null = np.zeros(len(x), bool)
    null[9] = True
    return x, null


def searches(df: Any) -> dict[str, Any]:
    """Every search the prepared columns serve, computed."""
    queries = search_vectors(6, 16, seed=4)

    def done(result: Any) -> pd.DataFrame:
        out = result.compute() if dask.is_dask_collection(result) else result
        return out.reset_index(drop=True)

    return {
        "topk": done(df.cosim.topk(queries, "emb", k=5, columns=["id"])),
        "join k": done(df.cosim.join(df, "emb", k=3)),
        "join threshold": done(df.cosim.join(df, "emb", threshold=0.5)),
        "neighbors k": done(df.cosim.neighbors("emb", k=4)),
        "neighbors threshold": done(df.cosim.neighbors("emb", threshold=0.6)),
        # The rows kept (their other columns are the input's, whatever it holds).
        "dedup": done(df.cosim.dedup("emb", 0.95)[["id"]]),
    }


def assert_same(a: dict[str, pd.DataFrame], b: dict[str, pd.DataFrame]) -> None:
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name], obj=name)


@pytest.mark.parametrize("normalised", [True, False])
def test_prepared_frame_gives_the_same_answers(normalised: bool) -> None:
    x, null = rows(normalised)
    plain = search_frame(x, null=null)
    prepared = plain.cosim.prepare("emb")
    assert list(prepared.columns) == [*plain.columns, *COMPANIONS]
    pd.testing.assert_frame_equal(prepared[plain.columns], plain)
    assert prepared["emb.cosim.norm"].isna().tolist() == [i in (7, 9) for i in range(len(x))]
    # Rows written normalised serve as their own unit rows: nothing stored for them.
    assert prepared["emb.cosim.unit"].isna().all() == normalised
    want = searches(plain)
    assert_same(want, searches(prepared))
    assert_same(want, searches(to_dask(prepared, 3)))
    # And the float64 answer.
    s = brute(search_vectors(6, 16, seed=4), x)
    s[:, 9] = -np.inf
    top = want["topk"]
    best = np.argsort(-s, axis=1, kind="stable")[:, 0]
    assert top[top["rank"] == 0]["match"].tolist() == plain.index[best].tolist()


def test_a_prepared_side_does_not_normalise_again(monkeypatch: pytest.MonkeyPatch) -> None:
    for normalised in (True, False):
        x, null = rows(normalised)
        prepared = search_frame(x, null=null).cosim.prepare("emb")
        want = searches(prepared)

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("a prepared frame's vectors were normalised again")

        with monkeypatch.context() as m:
            m.setattr(search_partition.sk, "prepare", refuse)
            got = search_partition.prepare_side(prepared, "emb", 0, eps=1e-8)
            assert got.prep.norm is not None
            if normalised:  # the vectors themselves, no copy
                assert got.prep.unit.data_ptr() == got.prep.raw.data_ptr()
        assert_same(want, searches(prepared))


def test_prepare_is_lazy_and_survives_filters_and_repartitions() -> None:
    x, null = rows(False)
    plain = search_frame(x, null=null)
    ddf = to_dask(plain, 4)
    with no_computes():
        prepared = ddf.cosim.prepare("emb")
    assert list(prepared.columns) == [*plain.columns, *COMPANIONS]
    prepared = prepared.persist()
    keep = prepared[prepared["id"] % 3 != 1].repartition(npartitions=2)
    want = searches(to_dask(plain[plain["id"] % 3 != 1], 2))
    assert_same(want, searches(keep))


def test_parquet_keeps_a_prepared_frame(tmp_path: Path) -> None:
    x, null = rows(False)
    prepared = search_frame(x, null=null).cosim.prepare("emb")
    dask_cosim.to_parquet(to_dask(prepared, 2), tmp_path / "prepared")
    back = dask_cosim.read_parquet(tmp_path / "prepared")
    assert all(c in back.columns for c in COMPANIONS)
    assert_same(searches(prepared), searches(back))


def test_another_eps_after_prepare() -> None:
    """What prepare stores does not depend on eps: a search under another eps, larger or
    smaller, gives that eps's answer, rows shorter than eps included (those sides are
    prepared again).  The unit rows were stored over max(|x|, eps of the prepare): under a
    smaller eps a search read rows too short, and lost their matches."""
    x, null = rows(False)
    x[20:23] *= np.float32(1e-7)  # norms ~1e-7: below eps = 1e-6, above 1e-8
    x[24] = x[23] * np.float32(1e-7)  # ... a duplicate of row 23 among them
    plain = search_frame(x, null=null)
    for at_prepare in (1e-8, 1e-6):
        with dask.config.set({"cosim.eps": at_prepare}):
            prepared = plain.cosim.prepare("emb")
        for eps in (0.0, 1e-8, 1e-6):
            with dask.config.set({"cosim.eps": eps}):
                assert_same(searches(plain), searches(prepared))


def test_a_column_assigned_again_after_prepare_is_searched_as_it_is_now() -> None:
    """Vectors of another model assigned to the prepared column: the searches see that
    the stored norms are not theirs (a few rows checked per partition), warn, and give
    the new vectors' answers.  They trusted the old numbers: on a dask frame new vectors
    scored over old norms (a score of 1 for a pair at 0.71), on pandas the old vectors'
    matches."""
    x, null = rows(False)
    other, _ = rows(False)
    other = other[::-1].copy()  # the same kinds of rows, elsewhere
    plain = search_frame(x, null=null)
    prepared = plain.cosim.prepare("emb")
    for frame in (prepared, to_dask(prepared, 3)):
        new = search_frame(other, null=null)["emb"]
        swapped = frame.assign(emb=to_dask(new, 3) if dask.is_dask_collection(frame) else new)
        want = searches(search_frame(other, null=null))
        with pytest.warns(errors.StalePreparedWarning, match=r"'emb' changed after prepare"):
            got = searches(swapped)
        assert_same(want, got)


def test_a_prepared_frame_is_not_taken_for_a_changed_one() -> None:
    """Every row checked (partitions of at most 8 rows): null, NaN, inf, zero rows and
    float64 rows near the ends of its range agree with what prepare stored."""
    x, null = rows(False, np.float64)
    x[10], x[11], x[12] = np.inf, x[12] * 1e-300, x[13] * 1e300
    plain = search_frame(x[:40], null=null[:40])
    with warnings.catch_warnings():
        warnings.simplefilter("error", errors.StalePreparedWarning)
        for frame in (plain.cosim.prepare("emb"), to_dask(plain, 5).cosim.prepare("emb")):
            assert_same(searches(plain), searches(frame))


def test_mixed_and_float64_columns() -> None:
    """One partition with rows that serve as their own unit rows and rows that do not
    (two prepared frames concatenated), and a float64 column."""
    xn, null = rows(True)
    x, _ = rows(False)
    a = search_frame(xn, null=null).cosim.prepare("emb")
    b = search_frame(x[:50]).cosim.prepare("emb")
    b.index = b.index + 10_000
    both = pd.concat([a, b])
    plain = pd.concat([search_frame(xn, null=null), search_frame(x[:50]).set_axis(b.index)])
    assert_same(searches(plain), searches(both))
    x64, null = rows(False, np.float64)
    plain = search_frame(x64, null=null)
    assert_same(searches(plain), searches(plain.cosim.prepare("emb")))


def test_prepare_names_a_missing_column() -> None:
    x, _ = rows(True)
    with pytest.raises(KeyError, match="did you mean 'emb'"):
        search_frame(x).cosim.prepare("emd")


def test_from_norms_declines_what_it_cannot_stand_for() -> None:
    from dask_cosim import search_kernels as sk

    x = torch.tensor([[3e-9, 4e-9], [1.0, 0.0]], dtype=torch.float32)
    p = sk.prepare(x, eps=1e-8)
    assert p.norm is not None
    # A row shorter than eps: its unit row would depend on eps.
    assert sk.from_norms(x, None, p.inv, p.norm, None, eps=1e-8) is None
    q = sk.from_norms(x, None, p.inv, p.norm, None, eps=1e-9)
    assert q is not None and torch.equal(q.valid, p.valid)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("unit_rows", [False, True])
def test_16_bit_rows_widened_by_chunks(
    dtype: torch.dtype, unit_rows: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16-bit rows are widened to float32 a chunk at a time (not all at once beside their
    unit rows): the prepared side is the one the whole float32 copy gives, bit for bit."""
    from dask_cosim import search_prepare as spp

    torch.manual_seed(3)
    x = torch.randn(1000, 37, dtype=torch.float64)
    if unit_rows:  # rows of norm exactly 1 in 16 bits: they serve as unit rows
        x = torch.zeros(1000, 37, dtype=torch.float64)
        x[torch.arange(1000), torch.arange(1000) % 37] = 1.0
        x[::3, :4] = -0.5
        x[::3, 4:] = 0.0
    x[5] = 0.0
    x[9, 3] = float("nan")
    null = torch.zeros(1000, dtype=torch.bool)
    null[17] = True
    low = x.to(dtype)
    whole = spp.prepare(low.to(torch.float32), null, eps=1e-8)
    monkeypatch.setattr(spp, "_WIDEN_BYTES", 7 * 37 * 4)  # chunks of 7 rows
    got = spp.prepare(low, null, eps=1e-8)
    assert got.raw.dtype == dtype and got.err == whole.err
    for name in ("unit", "inv", "scale", "valid", "norm"):
        a, b = getattr(got, name), getattr(whole, name)
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)), name
