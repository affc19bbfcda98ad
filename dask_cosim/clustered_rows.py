"""The routed rows' vectors in a dataframe column: one Arrow ``large_binary`` value per
row, holding the row's bytes in its own float dtype (bfloat16 included), so that the
shuffle of the clustered search (:mod:`dask_cosim.clustered_partition`) moves each row in
its input's width and the blocks read them back in one copy.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

__all__ = ["decode_rows", "encode_rows"]


def encode_rows(raw: torch.Tensor) -> pd.arrays.ArrowExtensionArray:
    """(n, D) CPU rows -> one Arrow large_binary value per row (their bytes, no copy; any
    float dtype, bfloat16 included).

    Not a fixed_size_list: dask's p2p shuffle rebuilds dtypes from their names, and
    pandas cannot parse a parametrised Arrow type's name back."""
    flat = raw.contiguous().view(torch.uint8).numpy().reshape(-1)
    width = raw.shape[1] * raw.element_size()
    offsets = pa.py_buffer(np.arange(len(raw) + 1, dtype=np.int64) * width)
    values = pa.Array.from_buffers(pa.large_binary(), len(raw), [None, offsets, pa.py_buffer(flat)])
    return pd.arrays.ArrowExtensionArray(values)


def decode_rows(
    column: pd.Series, dtype: str, dim: int, order: np.ndarray | None = None
) -> torch.Tensor:
    """:func:`encode_rows` back: (n, D) rows of ``dtype``, a torch dtype's name, taken in
    ``order`` (positions in ``column``; default as they are), in one copy into a tensor."""
    kind = getattr(torch, dtype)
    if not len(column):  # an empty tensor has no unit stride to view through
        return torch.zeros((0, dim), dtype=kind)
    width = dim * kind.itemsize
    out = np.empty((len(column), width), dtype=np.uint8)
    # Each row goes straight to its place: a shuffled column is many Arrow chunks, which
    # an Arrow take of the whole column would first copy into one.
    place = None
    if order is not None:
        place = np.empty(len(column), np.int64)
        place[order] = np.arange(len(column))
    row = 0
    values = pa.array(column.array)
    for chunk in values.chunks if isinstance(values, pa.ChunkedArray) else [values]:
        offsets = np.frombuffer(chunk.buffers()[1], np.int64)[
            chunk.offset : chunk.offset + len(chunk) + 1
        ]
        if len(chunk) and not (np.diff(offsets) == width).all():
            raise ValueError(f"routed rows of {dim} x {dtype} values expected")
        start = int(offsets[0]) if len(chunk) else 0
        data = np.frombuffer(chunk.buffers()[2], np.uint8, len(chunk) * width, start)
        there = slice(row, row + len(chunk)) if place is None else place[row : row + len(chunk)]
        out[there] = data.reshape(len(chunk), width)
        row += len(chunk)
    return torch.from_numpy(out).view(kind)
