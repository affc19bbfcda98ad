"""read_parquet of files pandas wrote from columns labelled by numbers (0, 1): pandas
stores them as fields "0" and "1" with the labels' dtype in its metadata, and reads them
back as 0 and 1; columns and filters may name them either way."""

from __future__ import annotations

from pathlib import Path

import dask
import numpy as np
import pandas as pd
import pytest

import dask_cosim
from tests.helpers import random_pairs


def _numbered_folder(tmp_path: Path) -> tuple[Path, np.ndarray]:
    a, _ = random_pairs(12, 4)
    pdf = pd.DataFrame({0: list(a), 1: np.arange(12) * 3})  # 0: lists of floats
    folder = tmp_path / "numbered"
    folder.mkdir()
    pdf.iloc[:5].to_parquet(folder / "part.0.parquet")
    pdf.iloc[5:].to_parquet(folder / "part.1.parquet")
    return folder, a


def test_columns_pandas_named_by_numbers_read_back_whole(tmp_path: Path) -> None:
    """The meta had the labels 0 and 1, but each partition asked the files for those
    labels and got no column, an empty frame without an error."""
    folder, a = _numbered_folder(tmp_path)
    want = pd.read_parquet(folder)
    assert list(want.columns) == [0, 1]
    with dask.config.set(scheduler="sync"):
        df = dask_cosim.read_parquet(folder)
        got = df.compute()
        assert list(got.columns) == [0, 1]
        assert got[1].tolist() == want[1].tolist()
        assert dask_cosim.read_parquet(folder, columns=[1])[1].sum().compute() == 198
        assert df.cosim.topk(a[[3, 7]], 0, k=1, columns=[1])[1].tolist() == [9, 21]


@pytest.mark.parametrize("name", [1, "1"])
@pytest.mark.parametrize("columns", [None, "label", "field"])
def test_numbered_columns_filter_by_label_or_field_name(
    tmp_path: Path, name: int | str, columns: str | None
) -> None:
    """A filter on such a column (``[("1", ">", 10)]``, as pandas takes it, or by the
    label 1) failed: the row labels a filter keeps travel in a column of their own, whose
    name pandas' metadata then tried to make a number (ValueError: invalid literal for
    int()), and a label made pyarrow take the filter for a list of conjunctions
    (TypeError).  ``columns=["1"]`` (the field's name, as pandas takes it) raised a
    KeyError."""
    folder, _ = _numbered_folder(tmp_path)
    want = pd.read_parquet(folder, filters=[("1", ">", 10)])
    want.index = [i for i in range(12) if 3 * i > 10]  # a folder is numbered across files
    picked = {None: None, "label": [1, 0], "field": ["1", "0"]}[columns]
    with dask.config.set(scheduler="sync"):
        df = dask_cosim.read_parquet(folder, columns=picked, filters=[(name, ">", 10)])
        got = df.compute()
    if picked is not None:
        want = want[[1, 0]]
    assert list(got.columns) == list(want.columns) == list(df.columns)
    assert got.index.tolist() == want.index.tolist()
    assert got[1].tolist() == want[1].tolist()
    assert [list(v) for v in got[0]] == [list(v) for v in want[0]]
    # Both ways, in the list-of-conjunctions form too.
    either = [[(name, "<", 6)], [(str(name), ">", 30)]]
    with dask.config.set(scheduler="sync"):
        got = dask_cosim.read_parquet(folder, filters=either).compute()
    assert got[1].tolist() == [0, 3, 33]
