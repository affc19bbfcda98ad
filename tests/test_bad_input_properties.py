"""Hypothesis properties of the whole ``pairwise`` path, on any float32 rows: symmetry,
scale invariance (the sign flips for k < 0), range [-1, 1] (NaN exactly where the
float64 reference has it, with NaN and inf placed in rows), cos(a, a) = 1, and the same
values for every partitioning (1, 2 and 7 partitions, sorted or not) with the index
order kept."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import dask_cosim
from tests.bad_input_cases import arrays, fixed, frame
from tests.helpers import reference

pytestmark = pytest.mark.usefixtures("sync_scheduler")


def _vectors(
    n: int, d: int, *, low: float = -1e3, high: float = 1e3
) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(np.float32, (n, d), elements=st.floats(low, high, width=32))


@st.composite
def _pairs(draw: st.DrawFn, **bounds: float) -> tuple[np.ndarray, np.ndarray]:
    n, d = draw(st.integers(1, 12)), draw(st.integers(1, 16))
    return draw(_vectors(n, d, **bounds)), draw(_vectors(n, d, **bounds))


def _eager(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out: np.ndarray = (
        frame(fixed(a), fixed(b), index=pd.RangeIndex(len(a))).cosim.pairwise("a", "b").to_numpy()
    )
    return out


def _norms_above(x: np.ndarray, bound: float) -> bool:
    return bool((np.linalg.norm(x.astype(np.float64), axis=1) > bound).all())


BIG32 = float(np.float32(1e30))
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(_pairs())
def test_property_symmetric(pair: tuple[np.ndarray, np.ndarray]) -> None:
    a, b = pair
    np.testing.assert_array_equal(_eager(a, b), _eager(b, a))


@PROPERTY
@given(
    _pairs(),
    st.floats(1e-3, 1e3),
    st.sampled_from([1.0, -1.0]),
)
def test_property_scale_invariant(
    pair: tuple[np.ndarray, np.ndarray], k: float, sign: float
) -> None:
    a, b = pair
    # Norms well above eps (and k * a too), so that no vector is clamped.
    assume(_norms_above(a, 1e-2) and _norms_above(b, 1e-2))
    ka = (a * np.float32(sign * k)).astype(np.float32)
    np.testing.assert_allclose(_eager(ka, b), sign * _eager(a, b), atol=2e-6, rtol=0)
    np.testing.assert_allclose(_eager(ka, b), sign * reference(a, b), atol=2e-6, rtol=0)


@PROPERTY
@given(
    _pairs(low=-BIG32, high=BIG32), st.lists(st.sampled_from([np.nan, np.inf, -np.inf]), max_size=2)
)
def test_property_within_minus_one_one(
    pair: tuple[np.ndarray, np.ndarray], specials: list[float]
) -> None:
    a, b = pair
    for i, value in enumerate(specials):
        (a if i % 2 else b)[i % len(a), 0] = value
    res, expected = _eager(a, b), reference(a, b)
    np.testing.assert_array_equal(np.isnan(res), np.isnan(expected))
    finite = ~np.isnan(res)
    assert (np.abs(res[finite]) <= 1).all()
    np.testing.assert_allclose(res[finite], expected[finite], atol=1e-6, rtol=0)


@PROPERTY
@given(_pairs())
def test_property_self_is_one(pair: tuple[np.ndarray, np.ndarray]) -> None:
    a, _ = pair
    assume(_norms_above(a, 1e-3))
    np.testing.assert_allclose(_eager(a, a), 1.0, atol=2e-6, rtol=0)
    pdf = frame(fixed(a), fixed(a), index=pd.RangeIndex(len(a)))
    np.testing.assert_allclose(pdf.cosim.pairwise("a", "a").to_numpy(), 1.0, atol=2e-6, rtol=0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_pairs(), st.randoms(use_true_random=False), st.sampled_from(["fixed", "objects"]))
def test_property_same_for_every_partitioning(
    pair: tuple[np.ndarray, np.ndarray], rnd: Any, layout: str
) -> None:
    a, b = pair
    labels = [f"k{i:03d}" for i in range(len(a))]
    rnd.shuffle(labels)  # an index that is neither sorted nor a range
    index = pd.Index(labels, name="key")
    cols = (fixed(a), fixed(b)) if layout == "fixed" else (arrays(a), arrays(b))
    pdf = frame(cols[0], cols[1], index=index)
    eager = pdf.cosim.pairwise("a", "b")
    np.testing.assert_allclose(eager.to_numpy(), reference(a, b), atol=1e-6, rtol=0)
    for k in (1, 2, 7):
        # sort=False keeps the rows in the frame's order; sort=True sorts them by label.
        kept = dask_cosim.from_pandas(pdf, npartitions=k, sort=False).cosim.pairwise("a", "b")
        kept_res = kept.compute()
        assert list(kept_res.index) == list(index)
        np.testing.assert_array_equal(kept_res.to_numpy(), eager.to_numpy())
        in_order = dask_cosim.from_pandas(pdf, npartitions=k).cosim.pairwise("a", "b").compute()
        assert list(in_order.index) == list(index.sort_values())
        np.testing.assert_array_equal(in_order.to_numpy(), eager.loc[in_order.index].to_numpy())
