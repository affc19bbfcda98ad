"""dask_cosim.summarize: one pass, the same numbers as numpy, eager and lazy."""

from __future__ import annotations

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from distributed import Client

import dask_cosim
from dask_cosim.summary import Summary
from tests.helpers import random_pairs, reference


def numpy_summary(values: np.ndarray, edges: np.ndarray) -> dict:
    valid = values[~np.isnan(values)]
    counts = np.histogram(valid, bins=edges)[0]
    return {
        "rows": len(values),
        "nulls": int(np.isnan(values).sum()),
        "mean": valid.mean(),
        "min": valid.min(),
        "max": valid.max(),
        "counts": counts,
        "outside": len(valid) - int(counts.sum()),
    }


def check(summary: Summary, values: np.ndarray, edges: np.ndarray) -> None:
    expected = numpy_summary(values.astype(np.float64), edges)
    np.testing.assert_array_equal(summary.edges, edges)
    np.testing.assert_array_equal(summary.counts, expected.pop("counts"))
    for key, value in expected.items():
        assert getattr(summary, key) == pytest.approx(value, rel=1e-12), key
    assert summary.rows == summary.nulls + summary.counts.sum() + summary.outside


def values_with_nulls(n: int = 5000) -> np.ndarray:
    rng = np.random.default_rng(1)
    values = rng.uniform(-1.2, 1.1, n)  # some outside [-1, 1]
    values[rng.random(n) < 0.05] = np.nan
    values[:700] = np.nan  # a whole partition of nulls below
    return values


@pytest.mark.parametrize("bins", [10, 3, [-1.0, -0.5, 0.0, 0.9, 1.0]])
def test_eager_and_lazy_match_numpy(bins: int | list[float]) -> None:
    values = values_with_nulls()
    edges = np.linspace(-1, 1, bins + 1) if isinstance(bins, int) else np.array(bins)
    s = pd.Series(values, name="cos")
    check(dask_cosim.summarize(s, bins=bins), values, edges)
    lazy = dd.from_pandas(s, npartitions=7)
    check(dask_cosim.summarize(lazy, bins=bins), values, edges)
    # pandas nullable floats: <NA> is a null like NaN.
    check(dask_cosim.summarize(s.astype("Float32"), bins=bins), values.astype(np.float32), edges)


def test_range() -> None:
    values = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 10.0])
    summary = dask_cosim.summarize(pd.Series(values), bins=4, range=(0, 4))
    np.testing.assert_array_equal(summary.counts, [1, 1, 1, 2])  # 4.0 in the last bin
    assert summary.outside == 1 and summary.max == 10.0


_READS: list[int] = []


def _counted(part: pd.Series) -> pd.Series:
    _READS.append(len(part))
    return part


def test_one_pass_over_the_partitions() -> None:
    values = values_with_nulls()
    lazy = dd.from_pandas(pd.Series(values), npartitions=5)
    counted = lazy.map_partitions(_counted, meta=lazy._meta)
    _READS.clear()
    with dask.config.set(scheduler="sync"):
        dask_cosim.summarize(counted)
    assert sorted(_READS) == sorted(len(p) for p in lazy.partitions)  # each once


def test_all_null_and_empty() -> None:
    summary = dask_cosim.summarize(pd.Series([np.nan, np.nan]))
    assert (summary.rows, summary.nulls, summary.outside) == (2, 2, 0)
    assert np.isnan(summary.mean) and np.isnan(summary.min) and np.isnan(summary.max)
    assert summary.counts.tolist() == [0] * 10
    empty = dask_cosim.summarize(dd.from_pandas(pd.Series([], dtype="float32"), npartitions=1))
    assert empty.rows == 0 and np.isnan(empty.mean)
    # Summaries compare field by field (NaN equal to NaN), eager against lazy; the
    # dataclass's own comparison raised "truth value of an array is ambiguous".
    nothing = pd.Series([], dtype="float32")
    assert empty == dask_cosim.summarize(nothing) and empty != summary
    assert summary == dask_cosim.summarize(pd.Series([np.nan, np.nan]))
    with pytest.raises(TypeError, match="unhashable"):
        hash(summary)
    # No value to average: said so, where "+nan" read as a result.
    assert summary.format().splitlines()[2:4] == [
        "mean        none (every row is null)", "min / max   none (every row is null)"
    ]  # fmt: skip
    assert empty.format().splitlines()[2:4] == [
        "mean        none (no rows)", "min / max   none (no rows)"
    ]  # fmt: skip


@pytest.mark.parametrize("npartitions", [None, 1, 2])
def test_infinities_of_both_signs_make_the_mean_nan_as_pandas(npartitions: int | None) -> None:
    """+inf beside -inf: pandas' mean is NaN, whatever the partitions (it was 0.0 with
    both in one partition: that partition's NaN sum was skipped)."""
    values = pd.Series([np.inf, -np.inf, 0.5, 0.25])
    series = values if npartitions is None else dd.from_pandas(values, npartitions=npartitions)
    summary = dask_cosim.summarize(series)
    with np.errstate(invalid="ignore"):
        assert np.isnan(values.mean()) and np.isnan(summary.mean), summary.mean
    assert (summary.rows, summary.nulls, summary.min, summary.max) == (4, 0, -np.inf, np.inf)


def test_on_worker_processes(client: Client) -> None:
    a, b = random_pairs(3000, 16)
    pdf = pd.DataFrame({"embeds_a": list(a), "embeds_b": list(b)})
    cos = dask_cosim.from_pandas(pdf, npartitions=4).cosim.pairwise("embeds_a", "embeds_b")
    summary = dask_cosim.summarize(cos, bins=8)
    computed = cos.compute().to_numpy()
    np.testing.assert_allclose(computed, reference(a, b), atol=1e-6)
    check(summary, computed, np.linspace(-1, 1, 9))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"bins": 0}, ValueError, "bins=0 must be a positive number of bins, e.g. bins=10"),
        ({"bins": [1.0, 0.0]}, ValueError, "bins=[1.0, 0.0] must be a number of bins or at least two increasing, finite edges"),
        ({"range": (1, -1)}, ValueError, "range=(1, -1) must be two finite numbers, low < high, e.g. range=(-1, 1)"),
    ],
)  # fmt: skip
def test_bad_arguments(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(
        error,
        match=message.replace("(", r"\(")
        .replace(")", r"\)")
        .replace("[", r"\[")
        .replace("]", r"\]"),
    ):
        dask_cosim.summarize(pd.Series([0.5]), **kwargs)


def test_not_numbers() -> None:
    with pytest.raises(TypeError, match=r"Series 'name' has dtype (string|object)"):
        dask_cosim.summarize(dd.from_pandas(pd.DataFrame({"name": ["x"]}), npartitions=1)["name"])
    # Unnamed, not "None"; complex values, not their real part alone.
    with pytest.raises(TypeError, match=r"real numbers; the Series has dtype bool$"):
        dask_cosim.summarize(pd.Series([True, False]))
    with pytest.raises(TypeError, match=r"real numbers; the Series has dtype complex128$"):
        dask_cosim.summarize(pd.Series([1 + 2j, 3j]))
    with pytest.raises(
        TypeError, match="got DataFrame; for a column of a frame, pass df\\[column\\]"
    ):
        dask_cosim.summarize(pd.DataFrame({"cos": [0.5]}))


def test_format() -> None:
    text = dask_cosim.summarize(pd.Series([0.5, -0.5, np.nan, 3.0]), bins=2).format()
    assert text.splitlines() == [
        "rows        4",
        "nulls       1",
        "mean        +1.000000",
        "min / max   -0.500000 / +3.000000",
        "histogram",
        "  [-1, +0)          " + "#" * 40 + " 1",
        "  [+0, +1]          " + "#" * 40 + " 1",
        "  outside [-1, +1]  " + " " * 40 + " 1",
    ]


def test_histogram_bars_and_counts_line_up() -> None:
    values = pd.Series(np.random.default_rng(0).uniform(-1, 1, 100_000))
    lines = dask_cosim.summarize(values).format().splitlines()
    bins = lines[lines.index("histogram") + 1 :]
    assert len(bins) == 10
    # Labels of different widths ("[-1, -0.8)", "[-0.8, -0.6)"): bars start in one column,
    # counts end in one.
    assert len({line.index("#") for line in bins}) == 1
    assert len({len(line) for line in bins}) == 1


@pytest.mark.gpu
def test_cudf_series() -> None:
    cudf = pytest.importorskip("cudf")
    values = values_with_nulls()
    s = cudf.Series(values, nan_as_null=True)
    check(dask_cosim.summarize(s), values, np.linspace(-1, 1, 11))
