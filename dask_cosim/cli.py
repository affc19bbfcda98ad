"""The ``dask-cosim`` command line (also ``python -m dask_cosim`` and ``dask cosim``).

Options and delegation only: ``pairwise`` (Parquet in, Parquet out, a summary),
``convert`` (pickles, .npy/.npz and Parquet into our layout), ``info``, ``demo``, and the
searches ``topk``, ``join``, ``neighbors`` and ``dedup``.  The work is the library's
(:mod:`dask_cosim.runs`, :mod:`dask_cosim.io`, the ``.cosim`` accessor,
:class:`~dask_cosim.summary.Summary`); the options every command shares, and errors in one
line, are in :mod:`dask_cosim._cli`.

Exit status: 0 on success; 2 with one line on stderr for bad input (usage, missing files,
unknown columns, wrong dtypes, ragged rows, an existing output); 1 when the computation
fails otherwise (a worker died, the scheduler went away).  Outputs are written atomically
(``dask_cosim.to_parquet``): a failed or interrupted run leaves no output, or the old one.

Only click is imported with this module: each command imports what it needs (torch,
pandas, dask, distributed) when it runs, so ``--help`` and ``--version`` answer at once.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

import dask_cosim  # light: the library's modules are imported by the commands using them
from dask_cosim._cli import (
    MEMORY_LIMIT,
    REMOVED_COLUMNS,
    VECTOR_DTYPES,
    WORKERS,
    Cluster,
    InputError,
    Output,
    check_local_inputs,
    cluster_options,
    clustered,
    count,
    log_steps,
    method_options,
    one_line_errors,
    output_options,
    pairs_options,
)

__all__ = ["main"]

F = TypeVar("F", bound=Callable[..., Any])


# --------------------------------------------------------------------------- commands


class _Commands(click.Group):
    """The commands' group: a Ctrl-C ends a command with "Aborted!" and exit status 130
    (128 + SIGINT, as the shell reports a process ended by it), where click exits 1, the
    status of a failure."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("Aborted!", err=True)
            ctx.exit(130)


@click.group(name="cosim", cls=_Commands)  # the name `dask cosim` registers it under
@click.version_option(dask_cosim.__version__, "-V", "--version", prog_name="dask-cosim")
def main() -> None:
    """Row-wise cosine similarity of embedding columns, on dask clusters of CPUs or GPUs."""


@main.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("-a", "--a", "col_a", required=True, help="First embedding column.")
@click.option("-b", "--b", "col_b", required=True, help="Second embedding column.")
@click.option("--keep", multiple=True, help="A column to copy to the output (repeatable).")
@click.option("--name", default="cos", show_default=True, help="Result column name.")
@cluster_options
@click.option(
    "--dtype",
    default=None,
    type=click.Choice(["float32", "float64"]),
    help="Result dtype (default: config cosim.dtype; unset: float64 when both columns "
    "are float64, else float32).",
)
@click.option(
    "--device",
    default=None,
    help="auto, cpu, cuda or cuda:N (default: config cosim.device, auto).",
)
@click.option(
    "--eps",
    default=None,
    type=float,
    help="Lower bound on norms (default: config cosim.eps, 1e-8).",
)
@output_options
@one_line_errors
def pairwise(
    inputs: tuple[str, ...],
    col_a: str,
    col_b: str,
    keep: tuple[str, ...],
    name: str,
    cluster: Cluster,
    dtype: str | None,
    device: str | None,
    eps: float | None,
    out: Output,
) -> None:
    """cos(A[i], B[i]) for every row of the INPUTS (Parquet files), written to OUTPUT.

    OUTPUT gets the result column (plus --keep columns and the index) and a summary is
    printed: rows, nulls, mean, min, max, a histogram, time and throughput.
    """
    check_local_inputs(*inputs)
    from dask_cosim import runs

    # Everything that can be checked without a cluster is checked before one starts.
    run = runs.pairwise(inputs, col_a, col_b, out.output, keep=keep, name=name,
                        overwrite=out.overwrite, layout=out.layout, eps=eps, dtype=dtype,
                        device=device)  # fmt: skip
    with cluster.client():
        written = run(out.progress)
        assert written.summary is not None
        # Said before the cluster shuts down: OUTPUT is in place already.
        click.echo(f"wrote       {out.output}")
        click.echo(written.summary.format(written.seconds, written.embedding_bytes))


@main.command()
@click.argument("input_path")
@output_options
@click.option(
    "-a",
    "--a",
    "col_a",
    default="embeds_a",
    show_default=True,
    help="Name of the first vector column (.npy of pairs, .npz inputs).",
)
@click.option(
    "-b",
    "--b",
    "col_b",
    default="embeds_b",
    show_default=True,
    help="Name of the second vector column (.npy of pairs, .npz inputs).",
)
@click.option(
    "--column",
    default="embedding",
    show_default=True,
    help="Name of the vector column of a .npy of shape (N, D).",
)
@click.option(
    "--dtype",
    type=click.Choice(VECTOR_DTYPES),
    default=None,
    help="Store the vectors' numbers as this type, each rounded to the nearest one "
    "(default: as read; text files give float64).",
)
@click.option("--allow-pickle", is_flag=True, help="Read a .pkl/.pickle file (runs its code).")
@one_line_errors
def convert(
    input_path: str,
    out: Output,
    col_a: str,
    col_b: str,
    column: str,
    dtype: str | None,
    allow_pickle: bool,
) -> None:  # fmt: skip
    """Convert INPUT to Parquet in our layout.

    INPUT: a pandas pickle (.pkl/.pickle) of a frame whose columns hold one array or
    tensor per row; a .npy array of shape (N, D) (one vector per row, column --column) or
    (N, 2, D) (pair i is [i, 0] and [i, 1], columns --a and --b); a .npz with arrays named
    by --a/--b, each (N, D); a CSV (.csv/.tsv) or JSON Lines (.jsonl/.ndjson/.json) file
    whose vector cells are JSON lists of numbers (float64 vectors, rows numbered from 0);
    or Parquet with object or list columns.
    """
    check_local_inputs(input_path)
    import dask

    from dask_cosim import io, runs

    runs.check_output(out.output, out.overwrite, [input_path])

    df = io.source_frame(input_path, a=col_a, b=col_b, column=column, allow_pickle=allow_pickle)
    if dtype is not None:
        df = io.cast_vectors(df, dtype)
    # A text file's blocks each number their rows from 0: written without the index, the
    # rows are numbered across the folder when it is read.
    write_index = False if io.is_text_file(input_path) else None
    with dask.config.set(scheduler="threads"):  # one machine's file: no cluster needed
        manifest = io.to_parquet(df, out.output, layout=out.layout, write_index=write_index,
                                 overwrite=out.overwrite, progress=out.progress)  # fmt: skip
    dims = ", ".join(
        f"{c} {_vectors(v['dim'], v['dtype'])}" for c, v in manifest["vectors"].items()
    )
    click.echo(
        f"wrote       {out.output}: {count(manifest['rows'], 'row')} in "
        f"{count(len(manifest['files']), 'file')}, "
        f"layout {out.layout}; vectors: {dims or 'none found'}"
    )


def _vectors(dim: int | None, dtype: str, lead: str = "", none: str = "no row holds one") -> str:
    """ "6 x float32" after ``lead``, or where no row holds a vector (every row null or
    empty; ``none`` says which rows) no D to show."""
    return f"{lead}{dim} x {dtype}" if dim else f"{dtype} vectors of unknown length ({none})"


# What info says of a list column without a vector in the first file (the one it reads).
_NONE_IN_FIRST = "no row of the first file holds one"


@main.command()
@click.argument("inputs", nargs=-1, required=True)
@one_line_errors
def info(inputs: tuple[str, ...]) -> None:
    """Rows, partitions, columns, and each embedding column's D and dtype."""
    check_local_inputs(*inputs)
    from dask_cosim import io

    io.check_parquet_inputs(inputs, "info reads Parquet files or folders of them")
    described = io.describe_parquet(list(inputs) if len(inputs) > 1 else inputs[0])
    click.echo(f"rows        {described['rows']:,}")
    files, partitions = described["files"], described["partitions"]
    click.echo(f"files       {count(files, 'file')} ({count(partitions, 'partition')})")
    click.echo(f"layout      {described['layout'] or 'not written by dask_cosim'}")
    for level in described["index"] or ():  # one line per level, named as the read names it
        name = "(unnamed)" if level["name"] is None else level["name"]
        click.echo(f"index       {name} {level['dtype']}")
    click.echo("columns")
    for column, meta in described["columns"].items():
        vector = (
            f"  {_vectors(meta['dim'], meta['values'], 'vectors of ', _NONE_IN_FIRST)}"
            if "dim" in meta
            else ""
        )
        click.echo(f"  {column:24} {meta['dtype']}{vector}")
        for other in meta.get("elsewhere", ()):
            how = "lacked by" if other["type"] == "absent" else f"{other['type']} in"
            click.echo(f"  {'':24} {how} {count(other['files'], 'file')} ({other['first']})")
    if any("elsewhere" in meta for meta in described["columns"].values()):
        click.echo(
            "the read takes the first file's types: it casts a later file's column where no "
            "value changes, reads a column a file lacks as null, and fails naming the file "
            "otherwise"
        )


@main.command()
@click.option(
    "--rows",
    default=1_000_000,
    show_default=True,
    type=click.IntRange(1),
    help="Pairs of embeddings to generate.",
)
@click.option(
    "--dim", default=300, show_default=True, type=click.IntRange(1), help="Values per embedding."
)
@click.option(
    "--partitions",
    default=None,
    type=click.IntRange(1),
    help="Parquet files to generate (default: about 64 MiB each).",
)
@WORKERS
@MEMORY_LIMIT
@click.option(
    "--output",
    default=None,
    type=click.Path(file_okay=False),
    help="Folder for the result and histogram.png (default: a new temporary folder).",
)
@one_line_errors
def demo(
    rows: int, dim: int, partitions: int | None, workers: int | None, memory_limit: str,
    output: str | None,
) -> None:  # fmt: skip
    """Generate pairs, score them with `pairwise` on a local cluster, print the summary.

    The generated pairs are deleted at the end; the result (Parquet) and a histogram PNG
    stay in --output.
    """
    from dask_cosim import datasets, runs

    out_dir = Path(output) if output else Path(tempfile.mkdtemp(prefix="dask-cosim-demo-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    pairs = Path(tempfile.mkdtemp(prefix="pairs-", dir=out_dir))
    result = str(out_dir / "result")
    try:
        with Cluster(workers=workers, memory_limit=memory_limit).client():
            t0 = time.perf_counter()
            files = datasets.write_pairs_folder(pairs, rows, dim, partitions)
            click.echo(
                f"generated   {count(rows, 'pair')} of {dim} float32 in "
                f"{count(files, 'Parquet file')} (list layout, {time.perf_counter() - t0:.1f} s)"
            )
            run = runs.pairwise([str(pairs)], "embeds_a", "embeds_b", result, keep=["id"],
                                overwrite=True)  # fmt: skip
            written = run(sys.stdout.isatty())
    finally:
        shutil.rmtree(pairs, ignore_errors=True)
    assert written.summary is not None
    click.echo(f"wrote       {result} (id, cos)")
    click.echo("from Parquet to written result:")
    click.echo(written.summary.format(written.seconds, written.embedding_bytes))
    click.echo(f"histogram   {written.summary.plot(out_dir / 'histogram.png')}")


# --------------------------------------------------------------------------- search commands


def _search(
    build: Callable[[], Any],
    out: Output,
    cluster: Cluster,
    *,
    inputs: Sequence[str],
    vectors: Collection[str],
    rows_of_input: bool = False,
    removed: str | None = None,
    on_cluster: bool = False,
) -> None:
    """Check OUTPUT and REMOVED (:func:`dask_cosim.runs.check_output`, against
    ``inputs``) and build the result (errors before a cluster starts), then build it
    again on the cluster (a search cuts partitions too few for the cluster's threads
    into ranges of rows: :func:`dask_cosim.search_graph.pieces`), compute and write it;
    prints rows, time and the output paths.  ``build`` returns the result, or (kept
    rows, removed rows) with ``removed``; ``rows_of_input``: the result's rows are the
    input's (dedup), index included; ``on_cluster``: build computes (a clustered
    search's plan), so it runs on the cluster only.  ``vectors``: the results' columns
    that hold the embedding (``--on``, its carried left_/right_ copies); other list
    columns are written as they are (tags, token ids: rows of any length)."""
    from dask_cosim import runs

    runs.check_output(out.output, out.overwrite, inputs)
    if removed is not None:
        runs.check_removed(removed, out.output, out.overwrite, inputs)

    def jobs_of(result: Any) -> list[tuple[Any, str, bool]]:
        # Search results are numbered per partition: their index says nothing, so it is
        # not written.  Dedup's kept rows keep the input's index.
        if removed is None:
            return [(result, out.output, rows_of_input)]
        return [(result[0], out.output, rows_of_input), (result[1], removed, False)]

    if not on_cluster:
        build()
    with cluster.client(), log_steps(not out.quiet):
        with warnings.catch_warnings():
            if not on_cluster:  # said by the first build
                warnings.simplefilter("ignore")
            jobs = jobs_of(build())
        written = runs.write_all(jobs, overwrite=out.overwrite, progress=out.progress,
                                 layout=out.layout, vectors=vectors)  # fmt: skip
        # Said before the cluster shuts down: the outputs are in place already.
        for (_, path, _), w in zip(jobs, written):
            counted = f"{w.rows:,} rows, " if w.rows is not None else ""
            click.echo(f"wrote       {path} ({counted}{w.seconds:.1f} s)")


_READS = "the search commands read Parquet files or folders of them"


@main.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--on", required=True, help="Embedding column of INPUTS.")
@click.option(
    "--queries",
    "queries_path",
    required=True,
    help="The query vectors: a .npy array of shape (N, D), a CSV or JSON Lines file (vector "
    "cells as JSON lists), or a Parquet file or folder.",
)
@click.option(
    "--query-on",
    default=None,
    help="Embedding column of Parquet, CSV or JSON Lines --queries (default: --on).",
)
@click.option(
    "-k", "k", default=10, show_default=True, type=click.IntRange(1), help="Matches per query."
)
@click.option(
    "--keep", multiple=True, help="A column of INPUTS to copy to the output (repeatable)."
)
@output_options
@cluster_options
@one_line_errors
def topk(
    inputs: tuple[str, ...], on: str, queries_path: str, query_on: str | None, k: int,
    keep: tuple[str, ...], out: Output, cluster: Cluster,
) -> None:  # fmt: skip
    """The K rows of INPUTS most similar to each query vector (exact), written to OUTPUT.

    OUTPUT has one row per (query, hit): query (the query's position in a .npy, or its
    index label in Parquet), rank, match (the hit's index label in INPUTS), score and the
    --keep columns (e.g. an id).
    """
    check_local_inputs(*inputs, queries_path)
    from dask_cosim import runs
    from dask_cosim.search import check_column, check_topk_columns

    df = runs.read_inputs(inputs, _READS)
    queries = runs.read_queries(queries_path, query_on, on)
    runs.check_query_dims(check_column(df, on, "on"), on, queries)
    runs.check_columns(df, keep, "--keep column")
    if len(set(keep)) != len(keep):
        raise InputError(f"--keep {' '.join(keep)} names a column twice; name each once")
    check_topk_columns(keep, f"--keep {' '.join(keep)}", "the output has its own; keep others")

    def build() -> Callable[[], Any]:
        import dask

        # Checked from the metadata now; the data is read once the cluster runs.
        return lambda: df.cosim.topk(dask.compute(queries)[0], on, k, columns=list(keep))

    _search(build, out, cluster, inputs=[*inputs, queries_path], vectors=[on])


@main.command()
@click.argument("left_path")
@click.argument("right_path")
@click.option("--on", required=True, help="Embedding column of LEFT (and of RIGHT).")
@click.option("--right-on", default=None, help="Embedding column of RIGHT (default: --on).")
@click.option(
    "--right-columns",
    multiple=True,
    help="A column of RIGHT to carry as right_<column> (repeatable; default: --columns).",
)
@pairs_options
def join(
    left_path: str, right_path: str, on: str, right_on: str | None,
    right_columns: tuple[str, ...], k: int | None, threshold: float | None,
    columns: tuple[str, ...], out: Output, cluster: Cluster,
) -> None:  # fmt: skip
    """Similarity join of LEFT and RIGHT (Parquet): for each left row its K best right rows,
    and/or every pair scoring at least --threshold; columns left, right, score (and rank),
    then left_<c> for each --columns c and right_<c> for each --right-columns c (default:
    --columns).  For pairs within one input, use `neighbors` (each pair once, no row with
    itself).
    """
    check_local_inputs(left_path, right_path)
    from dask_cosim import runs

    left, right = runs.read_inputs([left_path], _READS), runs.read_inputs([right_path], _READS)
    _search(lambda: left.cosim.join(right, on, right_on=right_on, k=k, threshold=threshold,
                                    columns=list(columns),
                                    right_columns=list(right_columns) or None), out, cluster,
            inputs=[left_path, right_path],
            vectors=[f"left_{on}", f"right_{right_on or on}"])  # fmt: skip


@main.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--on", required=True, help="Embedding column.")
@method_options
@pairs_options
def neighbors(
    inputs: tuple[str, ...], on: str, method: str, n_probe: int | None, clusters: int | None,
    k: int | None, threshold: float | None, columns: tuple[str, ...], out: Output,
    cluster: Cluster,
) -> None:  # fmt: skip
    """Similar rows within INPUTS (a self-join that never pairs a row with itself): with
    --threshold alone every pair scoring at least it, once, the earlier row as left; with
    -k each row's K best other rows.  Columns left, right, score (and rank), then
    left_<c>, right_<c> for each --columns c.
    """
    check_local_inputs(*inputs)
    from dask_cosim import runs

    df = runs.read_inputs(inputs, _READS)
    _search(lambda: df.cosim.neighbors(on, k=k, threshold=threshold, columns=list(columns),
                                       method=method, n_probe=n_probe, clusters=clusters),
            out, cluster, inputs=inputs, vectors=[f"left_{on}", f"right_{on}"],
            on_cluster=clustered(method, k=k, threshold=threshold, n_probe=n_probe,
                                 clusters=clusters))  # fmt: skip


@main.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--on", required=True, help="Embedding column.")
@click.option("--threshold", required=True, type=float, help="Score at which rows are duplicates.")
@click.option(
    "--removed",
    default=None,
    help="Also write the removed rows here: left (the earlier row each duplicates), right "
    "(the removed row), score, and left_<c>, right_<c> for each --columns c.",
)
@REMOVED_COLUMNS
@method_options
@output_options
@cluster_options
@one_line_errors
def dedup(
    inputs: tuple[str, ...], on: str, threshold: float, removed: str | None,
    columns: tuple[str, ...], method: str, n_probe: int | None, clusters: int | None,
    out: Output, cluster: Cluster,
) -> None:  # fmt: skip
    """INPUTS without every row that has an earlier row scoring at least --threshold with
    it; all columns are written to OUTPUT."""
    check_local_inputs(*inputs)
    from dask_cosim import runs

    df = runs.read_inputs(inputs, _READS)
    if removed is None and columns:
        raise InputError("--columns names what --removed carries: give --removed PATH too")
    _search(lambda: df.cosim.dedup(on, threshold, return_removed=removed is not None,
                                   columns=list(columns), method=method, n_probe=n_probe,
                                   clusters=clusters),
            out, cluster, inputs=inputs, vectors=[on, f"left_{on}", f"right_{on}"],
            rows_of_input=True, removed=removed, on_cluster=clustered(
                method, threshold=threshold, n_probe=n_probe, clusters=clusters))  # fmt: skip


if __name__ == "__main__":
    main()
