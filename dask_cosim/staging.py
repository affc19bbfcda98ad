"""Host tensors onto a GPU through pinned, double-buffered staging: tensors only, no config.

A copy from pageable host memory runs at a fraction of the bus's rate (6.4 GB/s against
51.4 GB/s from pinned memory on the H100 machine: ``docs/gpu.md``), because the driver
stages it through small pinned buffers of its own, one piece after the other.  Here rows
are copied into one of two pinned buffers by the host while the other buffer's rows are on
the bus (a side stream), and the device works on a chunk while the next one arrives: the
host copy, the transfer and the compute overlap.

:func:`device_chunks` yields the rows chunk by chunk (for work that reads each row once:
the pairwise kernel); :func:`to_device` assembles them into one device tensor (a search's
side, which the products read many times).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

__all__ = ["BUFFER_BYTES", "OUT_OF_MEMORY", "buffer_rows", "device_chunks", "to_device"]

# Bytes per staging buffer when the caller names no size: an eighth of the default
# ``cosim.chunk-bytes.cuda`` (two inputs x two slots x a pinned and a device buffer).
BUFFER_BYTES = 32 * 2**20

# What an allocation on a full device raises: torch's caching allocator, or RMM (when
# torch allocates through RMM's pool, as under dask-cuda with the shared pool).
OUT_OF_MEMORY = (torch.cuda.OutOfMemoryError, MemoryError)

Blocks = Sequence[Sequence[torch.Tensor]]


def device_chunks(
    blocks: Blocks,
    device: torch.device | str,
    rows: int,
    *,
    into: Sequence[torch.Tensor] | None = None,
) -> Iterator[tuple[int, tuple[torch.Tensor, ...]]]:
    """The rows of ``blocks`` on ``device``, ``rows`` at a time: (first row, a tensor per
    input).

    ``blocks`` lists row-aligned tuples: tuple k holds block k of each input (the same
    rows, any shape past the first dimension, any dtype), and the blocks follow one another
    in row order, so a chunk may span several blocks (Arrow chunks of one partition).
    Host blocks are staged through two pinned buffers per input (torch's pinned memory
    cache keeps them for the next call); blocks already on ``device`` are sliced, not
    copied.

    Without ``into`` the chunks land in two device buffers per input, taken in turn: work
    queued on the current stream with a chunk is waited for before its buffer is filled
    again, but a chunk's tensors must not be used once the chunk after the next is asked
    for.  With ``into`` (a device tensor per input, of all the rows) the rows land in
    place and every yielded tensor is a view of ``into``.  Either way the current stream
    waits for a chunk's transfer before the chunk is yielded.  When the device is short of
    memory for the buffers, ``rows`` is halved (down to one row) before anything is copied.
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device_chunks stages host rows onto a GPU, not onto {device}")
    total = sum(len(block[0]) for block in blocks)
    if not blocks or total == 0:
        return
    first = blocks[0]
    shapes = [tuple(t.shape[1:]) for t in first]
    dtypes = [t.dtype for t in first]
    staged = [t.device.type == "cpu" for t in first]
    rows = max(1, min(int(rows), total))
    landing, rows = _buffers(shapes, dtypes, staged, device, rows, into is None)
    pinned = [
        [torch.empty((rows, *s), dtype=d, pin_memory=True) if h else None
         for s, d, h in zip(shapes, dtypes, staged)]
        for _ in range(2)
    ]  # fmt: skip
    compute = torch.cuda.current_stream(device)
    copier = torch.cuda.Stream(device)
    # The buffers (and ``into``) were allocated on the current stream, perhaps over memory
    # that work queued there still reads: the copies start after it.
    copier.wait_stream(compute)
    sent: list[torch.cuda.Event | None] = [None, None]  # a slot's transfer was queued
    used: list[torch.cuda.Event | None] = [None, None]  # the compute after its last yield
    for k, (start, count, pieces) in enumerate(_chunks(blocks, rows)):
        slot = k % 2
        done = sent[slot]
        if done is not None:
            done.synchronize()  # the pinned buffer is free again once its transfer ended
        out = []
        for i, host in enumerate(staged):
            if not host:  # already on a device: a view, or a device copy into place
                rows_i = _gather(blocks, pieces, i).to(device)
                out.append(rows_i if into is None else into[i][start : start + count].copy_(rows_i))
                continue
            target = landing[slot][i] if into is None else into[i][start : start + count]
            assert target is not None
            buffer = pinned[slot][i]
            assert buffer is not None
            at = 0
            for b, offset, take in pieces:
                buffer[at : at + take].copy_(blocks[b][i][offset : offset + take])
                at += take
            with torch.cuda.stream(copier):
                wait = used[slot]
                if wait is not None and into is None:
                    copier.wait_event(wait)  # the landing buffer's last chunk is computed
                target[:count].copy_(buffer[:count], non_blocking=True)
            out.append(target[:count])
        event = torch.cuda.Event()
        event.record(copier)
        sent[slot] = event
        compute.wait_event(event)
        yield start, tuple(out)
        mark = torch.cuda.Event()
        mark.record(compute)
        used[slot] = mark


def buffer_rows(row_bytes: int, buffer_bytes: int = BUFFER_BYTES) -> int:
    """Rows of ``row_bytes`` each in one staging buffer of about ``buffer_bytes``."""
    return max(1, buffer_bytes // max(1, row_bytes))


def to_device(
    blocks: Sequence[torch.Tensor], device: torch.device | str, rows: int | None = None
) -> torch.Tensor:
    """Host row blocks (one input, in row order) as one tensor on ``device``, moved through
    :func:`device_chunks`: ``torch.cat(blocks).to(device)`` without the host copy and at
    the pinned rate.  The current stream waits for the copy.  ``rows`` per pinned buffer,
    default :func:`buffer_rows` of the rows' size."""
    first = blocks[0]
    if rows is None:
        rows = buffer_rows(first[:1].nbytes or first.element_size())
    total = sum(len(b) for b in blocks)
    out = torch.empty((total, *first.shape[1:]), dtype=first.dtype, device=device)
    for _ in device_chunks([(b,) for b in blocks], device, rows, into=[out]):
        pass
    return out


def _buffers(
    shapes: list[tuple[int, ...]],
    dtypes: list[torch.dtype],
    staged: list[bool],
    device: torch.device,
    rows: int,
    landing: bool,
) -> tuple[list[list[torch.Tensor | None]], int]:
    """Two device buffers per staged input (None for the others; none at all when
    ``landing`` is False), halving ``rows`` on out-of-memory; returns them and the rows
    they hold."""
    while True:
        try:
            buffers = [
                [torch.empty((rows, *s), dtype=d, device=device) if h else None
                 for s, d, h in zip(shapes, dtypes, staged)]
                for _ in range(2 if landing else 0)
            ]  # fmt: skip
            return buffers, rows
        except OUT_OF_MEMORY:
            if rows == 1:
                raise
            rows //= 2
            torch.cuda.empty_cache()


def _chunks(blocks: Blocks, rows: int) -> Iterator[tuple[int, int, list[tuple[int, int, int]]]]:
    """(first row, rows, pieces) per chunk; a piece is (block, offset in it, rows taken)."""
    start = 0
    pieces: list[tuple[int, int, int]] = []
    count = 0
    for b, block in enumerate(blocks):
        length, offset = len(block[0]), 0
        while offset < length:
            take = min(rows - count, length - offset)
            pieces.append((b, offset, take))
            count += take
            offset += take
            if count == rows:
                yield start, count, pieces
                start, count, pieces = start + count, 0, []
    if count:
        yield start, count, pieces


def _gather(blocks: Blocks, pieces: list[tuple[int, int, int]], i: int) -> torch.Tensor:
    """Input ``i``'s rows of one chunk from blocks already on the device: a view when the
    chunk lies in one block, else one device copy."""
    parts = [blocks[b][i][offset : offset + take] for b, offset, take in pieces]
    return parts[0] if len(parts) == 1 else torch.cat(parts)
