"""Which Parquet layout of embedding vectors reads fastest, on this machine, in one run.

    python -m benchmarks.layouts --rows 1000000 --dim 300

Writes the same pairs in each candidate layout (list / fixed_size_list with each
compression and encoding, row-group sizes, one fixed-size binary value per vector) into a
temporary folder, then times ``pyarrow.parquet.read_table`` of the embedding columns with
all cores, and the same read followed by the zero-copy view as (N, D) tensors.  Prints
the median of --repeat reads after a warm-up, and the files' size.  ``--out DIR`` also
writes ``DIR/<name>.json``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import click
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks import harness
from benchmarks.harness import median_seconds
from dask_cosim import backends, io

COLUMNS = [harness.A, harness.B]


def _list_table(a: np.ndarray, b: np.ndarray, fixed: bool) -> pa.Table:
    arrays = [io.encode_vectors(x, layout="list") for x in (a, b)]
    if not fixed:  # what pandas and dask write: list<float>, one offset per row
        arrays = [x.cast(pa.list_(x.type.value_type)) for x in arrays]
    return pa.table(dict(zip(COLUMNS, arrays)))


# name -> (table builder, pq.write_table keyword arguments)
CANDIDATES: dict[str, tuple[str, dict]] = {
    "list<float>, snappy": ("list", {}),
    "list<float>, none": ("list", {"compression": "none"}),
    "list<float>, zstd": ("list", {"compression": "zstd"}),
    "fixed_size_list, snappy": ("fixed", {}),
    "fixed_size_list, none": ("fixed", {"compression": "none"}),
    "fixed_size_list, byte_stream_split": (
        "fixed",
        {"compression": "none", "use_dictionary": False, "use_byte_stream_split": True},
    ),
    "fixed_size_list, bss + zstd": (
        "fixed",
        {"compression": "zstd", "use_dictionary": False, "use_byte_stream_split": True},
    ),
    "binary (FLBA), dictionary on": ("binary", {"compression": "none"}),
    "binary (FLBA), snappy": ("binary", {"use_dictionary": False}),
    "binary (FLBA), none [to_parquet]": (
        "binary",
        {"compression": "none", "use_dictionary": False},
    ),
    "binary (FLBA), none, 16K-row groups": (
        "binary",
        {"compression": "none", "use_dictionary": False, "row_group_size": 16384},
    ),
}


def build(kind: str, a: np.ndarray, b: np.ndarray) -> pa.Table:
    if kind == "binary":  # exactly what to_parquet writes
        frame = pd.DataFrame({c: io.vectors_to_arrow(x) for c, x in zip(COLUMNS, (a, b))})
        return io.frame_to_table(frame, layout="binary", preserve_index=False)
    return _list_table(a, b, fixed=(kind == "fixed"))


def measure(
    a: np.ndarray, b: np.ndarray, files: int, repeat: int, log: harness.Log
) -> list[harness.Record]:
    """Each candidate written into a temporary folder, read, measured and removed."""
    rows, nbytes = len(a), a.nbytes + b.nbytes
    per_file = -(-rows // files)
    out = []
    tmp = Path(tempfile.mkdtemp(prefix="cosim-layouts-"))
    try:
        for name, (kind, options) in CANDIDATES.items():
            log(name)
            folder = tmp / name.replace(" ", "_").replace(",", "").replace("/", "")
            folder.mkdir()
            t0 = time.perf_counter()
            for i, start in enumerate(range(0, rows, per_file)):
                stop = min(rows, start + per_file)
                table = build(kind, a[start:stop], b[start:stop])
                pq.write_table(table, folder / f"part.{i}.parquet", **options)
            write_s = time.perf_counter() - t0
            size = sum(f.stat().st_size for f in folder.iterdir())

            def read(folder: Path = folder) -> pa.Table:
                return pq.read_table(folder, columns=COLUMNS)

            def read_and_view(folder: Path = folder) -> None:
                frame = backends.frame_from_arrow(io.restore_vectors(read(folder)))
                for column in COLUMNS:
                    backends.to_vectors(frame[column], column)

            read_s = median_seconds(read, repeat)
            out.append(
                {
                    "layout": name,
                    "bytes": size,
                    "write_s": write_s,
                    "read_s": read_s,
                    "read_gb_per_s": nbytes / read_s / 1e9,
                    "read_and_view_s": median_seconds(read_and_view, repeat),
                }
            )
            shutil.rmtree(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


TABLE = [
    harness.Column("layout", "layout", align="<"),
    harness.Column("MB", lambda r: r["bytes"] / 1e6, ".0f"),
    harness.Column("write s", "write_s", ".2f"),
    harness.Column("read s", "read_s", ".3f"),
    harness.Column("GB/s", "read_gb_per_s", ".1f"),
    harness.Column("+view s", "read_and_view_s", ".3f"),
]


@click.command()
@click.option("--rows", default=1_000_000, show_default=True)
@click.option("--dim", default=300, show_default=True)
@click.option("--files", default=8, show_default=True, help="Files the rows are split into.")
@click.option("--repeat", default=3, show_default=True)
@harness.results_options(out=None)
def main(rows: int, dim: int, files: int, repeat: int, output: harness.Output) -> None:
    """Read speed of Parquet layouts of vectors, on this machine, in one run."""

    def run(log: harness.Log) -> harness.Record:
        a, b = harness.normal_pairs(rows, dim)
        params = {"rows": rows, "dim": dim, "files": files, "repeat": repeat}
        return {"params": params, "layouts": measure(a, b, files, repeat, log)}

    def report(record: harness.Record) -> None:
        title = (
            f"N={rows:,} D={dim} float32 in {files} files, {rows * dim * 8 / 1e9:.2f} GB of vectors"
        )
        harness.print_table(TABLE, record["layouts"], title)

    name = output.name or f"layouts-{rows}x{dim}"
    harness.execute_benchmark(harness.Config(output, name, run, report))


if __name__ == "__main__":
    main()
