"""Two dask frames into one: the accessor takes two columns of one frame.  With the
vectors in two dask frames, users put them in one first (assign, join, concat): dask
aligns the rows by index label (repartitioning when the divisions differ), so the result
is right by label; with unknown divisions assign/join shuffle (rows come back in another
order, none lost) and concat(axis=1) refuses at compute time.  Labels missing from the
second frame give null vectors, so NaN."""

from __future__ import annotations

from collections.abc import Sequence

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

import dask_cosim
from tests.bad_input_cases import arrays
from tests.helpers import random_pairs, reference

pytestmark = pytest.mark.usefixtures("sync_scheduler")


def _two_frames(
    divisions: str, drop: Sequence[int] = ()
) -> tuple[dd.DataFrame, dd.DataFrame, pd.Series]:
    n = 20
    a, b = random_pairs(n, 8, seed=3)
    index = pd.Index(np.arange(n) * 10, name="key")
    left = pd.DataFrame({"a": arrays(a), "id": np.arange(n)}, index=index)
    right = pd.DataFrame({"b": arrays(b)}, index=index).drop(index=[i * 10 for i in drop])
    df1 = dask_cosim.from_pandas(left, npartitions=3)
    df2 = dask_cosim.from_pandas(right, npartitions=5)
    assert df1.divisions != df2.divisions
    if divisions == "unknown":
        df1, df2 = df1.clear_divisions(), df2.clear_divisions()
    expected = pd.Series(reference(a, b, null=list(drop)), index=index, name="cos")
    return df1, df2, expected


COMBINE = {
    "assign": lambda df1, df2: df1.assign(b=df2["b"]),
    "join": lambda df1, df2: df1.join(df2),
    "concat": lambda df1, df2: dd.concat([df1, df2], axis=1),
}


@pytest.mark.parametrize("divisions", ["known", "unknown"])
@pytest.mark.parametrize("how", list(COMBINE))
def test_two_frames_with_different_partitions(how: str, divisions: str) -> None:
    df1, df2, expected = _two_frames(divisions)
    cos = COMBINE[how](df1, df2).cosim.pairwise("a", "b")
    if how == "concat" and divisions == "unknown":
        # dask's own error, when it plans the computation.
        with pytest.raises(
            ValueError, match="Unable to concatenate DataFrame with unknown division"
        ):
            cos.compute()
        return
    res = cos.compute()
    if divisions == "known":
        assert list(res.index) == list(expected.index)  # aligned, in order
    assert len(res) == len(expected) and res.index.is_unique
    np.testing.assert_allclose(res.loc[expected.index].to_numpy(), expected.to_numpy(), atol=1e-6)


@pytest.mark.parametrize("how", ["assign", "join"])
def test_two_frames_missing_labels_give_nan(how: str) -> None:
    df1, df2, expected = _two_frames("known", drop=[3, 15])
    res = COMBINE[how](df1, df2).cosim.pairwise("a", "b").compute()
    assert list(res.index) == list(expected.index)
    assert res.isna().to_numpy().nonzero()[0].tolist() == [3, 15]
    np.testing.assert_allclose(res.to_numpy(), expected.to_numpy(), atol=1e-6)
