"""The binary and list layouts: self-describing, zero-copy, readable elsewhere."""

from __future__ import annotations

from pathlib import Path

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

import dask_cosim
from dask_cosim import io
from tests.helpers import pairs_frame, random_pairs


def test_binary_layout_is_zero_copy_and_self_describing(tmp_path: Path) -> None:
    a, b = random_pairs(10, 5)
    dask_cosim.to_parquet(pairs_frame(a, b, "object_numpy"), tmp_path / "p")
    first = next((tmp_path / "p").glob("part.00000.*.parquet"))
    schema = pq.read_schema(first)
    field = schema.field("embeds_a")
    assert field.type == pa.binary(20)
    assert field.metadata == {b"dask_cosim.dim": b"5", b"dask_cosim.dtype": b"float32"}
    # The pandas metadata describes only what pandas can read back.
    assert [c["name"] for c in schema.pandas_metadata["columns"]] == ["id"]
    table = pq.read_table(first)
    restored = io.restore_vectors(table)
    chunk = restored["embeds_a"].chunks[0]
    assert chunk.values.buffers()[1].address == table["embeds_a"].chunks[0].buffers()[1].address


def test_list_layout_reads_anywhere(tmp_path: Path) -> None:
    a, b = random_pairs(20, 4)
    out = tmp_path / "p"
    dask_cosim.to_parquet(pairs_frame(a, b, "fixed_size_list"), out, layout="list")
    plain = pd.read_parquet(out)  # the manifest starts with "_": readers skip it
    np.testing.assert_array_equal(np.stack(plain["embeds_a"].to_numpy()), a)
    plain_dask = dd.read_parquet(str(out)).compute()
    np.testing.assert_array_equal(np.stack(plain_dask["embeds_b"].to_numpy()), b)
