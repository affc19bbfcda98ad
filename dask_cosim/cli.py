"""The ``dask-cosim`` command line (also ``python -m dask_cosim`` and ``dask cosim``).

A thin shell over the library: ``pairwise`` (Parquet in, Parquet out, a summary),
``convert`` (pickles, .npy/.npz and Parquet into our layout), ``info`` and ``demo``.

Exit status: 0 on success; 2 with one line on stderr for bad input (usage, missing files,
unknown columns, wrong dtypes, ragged rows, an existing output); 1 when the computation
fails otherwise (a worker died, the scheduler went away).  Outputs are written atomically
(``dask_cosim.to_parquet``): a failed or interrupted run leaves no output, or the old one.

Only click is imported with this module: each command imports what it needs (torch,
pandas, dask, distributed) when it runs, so ``--help`` and ``--version`` answer at once.
"""

from __future__ import annotations

import functools
import itertools
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

import dask_cosim  # light: the library's modules are imported by the commands using them

if TYPE_CHECKING:
    import dask.dataframe as dd
    import pandas as pd

    from dask_cosim.summary import Summary

__all__ = ["main"]


def format_summary(summary: Summary, seconds: float, embedding_bytes: int | None = None) -> str:
    """:meth:`Summary.format` with the time and throughput before the histogram."""
    rate = f"{summary.rows / seconds:,.0f} pairs/s"
    if embedding_bytes is not None:
        rate += f", {embedding_bytes / seconds / 1e9:.2f} GB/s of embeddings"
    lines = summary.format().splitlines()
    lines.insert(lines.index("histogram"), f"time        {seconds:.2f} s  ({rate})")
    return "\n".join(lines)


class InputError(click.ClickException):
    """Bad input: exit status 2 and one line, like click's usage errors."""

    exit_code = 2


# Raised for input the user can fix (including ragged rows found while computing, which
# dask re-raises with their own type).  pyarrow's ArrowInvalid is a ValueError.
_INPUT_ERRORS = (
    KeyError,
    TypeError,
    ValueError,
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
)

F = TypeVar("F", bound=Callable[..., Any])


def _one_line_errors(command: F) -> F:
    """Input errors -> exit 2, other failures -> exit 1; one line each, no traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except click.ClickException:
            raise
        except _INPUT_ERRORS as err:
            text = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
            raise InputError(str(text)) from None
        except Exception as err:
            raise click.ClickException(_failure_message(err)) from None

    return wrapper  # type: ignore[return-value]


def _failure_message(err: BaseException) -> str:
    """One line for a failed computation; a worker that died names its partition."""
    task = getattr(err, "task", None)
    if type(err).__name__ == "KilledWorker" and isinstance(task, tuple) and len(task) > 1:
        return (
            f"the computation failed: partition {task[-1]} killed the worker process "
            f"running it more than {getattr(err, 'allowed_failures', '?')} time(s) (task "
            f"{task[0]!r}); it may need more memory than a worker has, or hold data that "
            "crashes a library. Nothing was written."
        )
    return f"the computation failed: {type(err).__name__}: {err}"


@contextmanager
def _cluster(
    scheduler: str | None, workers: int | None, gpus: bool, memory_limit: str = "auto"
) -> Iterator[Any]:
    """A Client: connected to ``scheduler``, or on a local cluster started and shut here."""
    from distributed import Client

    if scheduler is not None:
        try:
            client = Client(scheduler, timeout="10s")
        except (OSError, TimeoutError) as err:
            raise InputError(f"cannot connect to scheduler {scheduler!r}: {err}") from None
        with client:
            yield client
        return
    # Workers log each failed task with its traceback; the command reports the error
    # itself, in one line.
    client = dask_cosim.local_cluster(
        workers,
        gpus=True if gpus else "auto",
        memory_limit=memory_limit,
        silence_logs=logging.CRITICAL,
    )
    with client:  # closes the cluster too
        yield client


def _echo_cluster(client: Any) -> None:
    workers = client.scheduler_info()["workers"].values()
    limits = {w.get("memory_limit") for w in workers}
    memory = ""
    if len(limits) == 1 and (limit := limits.pop()):
        from dask.utils import format_bytes

        memory = f" of {format_bytes(limit)}"
    click.echo(
        f"cluster     {_count(len(workers), 'worker')}{memory}, dashboard {client.dashboard_link}",
        err=True,
    )


@click.group(name="cosim")  # the name `dask cosim` registers it under
@click.version_option(dask_cosim.__version__, "-V", "--version", prog_name="dask-cosim")
def main() -> None:
    """Row-wise cosine similarity of embedding columns, on dask clusters of CPUs or GPUs."""


def _memory_limit(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from dask_cosim import options

    try:
        options.memory_size("memory_limit", value, "4GiB")
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not a size; give e.g. 4GiB, a fraction of the memory like 0.5, or auto"
        ) from None
    return value


_memory_limit_option = click.option(
    "--memory-limit",
    default="auto",
    show_default=True,
    callback=_memory_limit,
    help="Per local worker, e.g. 4GiB (dask pauses a worker at 80 %; give at least 1.5GiB).",
)


@main.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("-a", "--a", "col_a", required=True, help="First embedding column.")
@click.option("-b", "--b", "col_b", required=True, help="Second embedding column.")
@click.option("-o", "--output", required=True, help="Output folder (Parquet, atomic).")
@click.option("--keep", multiple=True, help="A column to copy to the output (repeatable).")
@click.option("--name", default="cos", show_default=True, help="Result column name.")
@click.option("--scheduler", default=None, help="A running scheduler, e.g. tcp://host:8786.")
@click.option("--workers", default=None, type=click.IntRange(1), help="Local workers.")
@click.option("--gpus", is_flag=True, help="Local cluster of GPU workers (dask-cuda).")
@_memory_limit_option
@click.option("--dtype", default=None, type=click.Choice(["float32", "float64"]))
@click.option("--device", default=None, help="auto, cpu, cuda or cuda:N.")
@click.option("--eps", default=None, type=float, help="Lower bound on norms (1e-8).")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT once the new one is complete.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@_one_line_errors
def pairwise(
    inputs: tuple[str, ...],
    col_a: str,
    col_b: str,
    output: str,
    keep: tuple[str, ...],
    name: str,
    scheduler: str | None,
    workers: int | None,
    gpus: bool,
    memory_limit: str,
    dtype: str | None,
    device: str | None,
    eps: float | None,
    overwrite: bool,
    quiet: bool,
) -> None:
    """cos(A[i], B[i]) for every row of the INPUT Parquet files, written to OUTPUT.

    OUTPUT gets the result column (plus --keep columns and the index) and a summary is
    printed: rows, nulls, mean, min, max, a histogram, time and throughput.
    """
    if scheduler is not None and (workers is not None or gpus or memory_limit != "auto"):
        raise click.UsageError(
            "--scheduler connects to a running cluster; --workers/--gpus/--memory-limit "
            "start a local one: give one or the other"
        )
    # Everything that can be checked without a cluster is checked before one starts.
    _check_parquet_inputs(inputs, "pairwise reads Parquet files or folders of them")
    job = _prepare(inputs, col_a, col_b, output, keep, name, overwrite, eps, dtype, device)
    with _cluster(scheduler, workers, gpus, memory_limit) as client:
        _echo_cluster(client)
        summary, seconds, embedding_bytes = job(progress=not quiet and sys.stderr.isatty())
    click.echo(f"wrote       {output}")
    click.echo(format_summary(summary, seconds, embedding_bytes))


_PARQUET_MAGIC = b"PAR1"


def _check_parquet_inputs(inputs: Sequence[str], reads: str) -> None:
    """A local file that is not Parquet gets a message naming it and the way to convert
    it, instead of pyarrow's "Parquet magic bytes not found in footer"."""
    for text in inputs:
        path = Path(text)
        if not path.is_file():
            continue  # folders, globs and URLs: the reader lists and checks them
        with open(path, "rb") as f:
            head = f.read(4)
        if head == _PARQUET_MAGIC:
            continue
        suffix = path.suffix.lower()
        out = f"{path.stem}-parquet"
        if suffix in (".pkl", ".pickle"):
            how = (
                f"it looks like a pickle; convert it first: dask-cosim convert {text} -o {out} "
                "--allow-pickle (only for a pickle you trust: unpickling runs its code)"
            )
        elif suffix in (".npy", ".npz"):
            how = f"convert it first: dask-cosim convert {text} -o {out}"
        elif suffix in (".csv", ".tsv", ".txt", ".json", ".jsonl"):
            how = (
                "vectors stored as text must be parsed: read it with pandas, turn each "
                "vector cell into a list or array of numbers, and write Parquet with "
                f"dask_cosim.to_parquet(pdf, {out!r})"
            )
        else:
            how = (
                "dask-cosim convert turns pandas pickles and .npy/.npz files into Parquet: "
                f"dask-cosim convert {text} -o {out}"
            )
        raise InputError(
            f"{text!r} is not a Parquet file (it starts with {head!r}, not {_PARQUET_MAGIC!r});"
            f" {reads}; {how}"
        )


def _prepare(
    inputs: tuple[str, ...] | list[str],
    col_a: str,
    col_b: str,
    output: str,
    keep: tuple[str, ...],
    name: str,
    overwrite: bool,
    eps: float | None = None,
    dtype: str | None = None,
    device: str | None = None,
) -> Callable[..., tuple[Summary, float, int | None]]:
    """Check the inputs and build the graph (no cluster needed); returns the job, which
    writes OUTPUT atomically and returns (summary, seconds, bytes of embeddings read)."""
    from dask_cosim import backends
    from dask_cosim.summary import summarize

    df = dask_cosim.read_parquet(list(inputs) if len(inputs) > 1 else inputs[0])
    _check_columns(df, keep, "--keep column")
    cos = df.cosim.pairwise(col_a, col_b, eps=eps, dtype=dtype, device=device, name=name)
    out = df[list(keep)].assign(**{name: cos}) if keep else cos.to_frame()
    if Path(output).exists() and not overwrite:
        raise InputError(f"{output!r} exists; pass --overwrite to replace it")
    spec = backends.vector_spec(df._meta[col_a], col_a)

    def job(progress: bool = False) -> tuple[Summary, float, int | None]:
        t0 = time.perf_counter()
        dask_cosim.to_parquet(out, output, overwrite=overwrite, progress=progress)
        seconds = time.perf_counter() - t0
        # The written column, not a second pass over the inputs: cheap, and it is what
        # the user got.
        summary = summarize(dask_cosim.read_parquet(output, columns=[name])[name])
        embedding_bytes = None
        if spec.dim is not None and spec.dtype is not None:
            embedding_bytes = 2 * summary.rows * spec.dim * spec.dtype.itemsize
        return summary, seconds, embedding_bytes

    return job


# dask_cosim.io.LAYOUTS, spelt out so that the option list needs no import of the io package.
_LAYOUTS = ("binary", "list")


@main.command()
@click.argument("input_path")
@click.option("-o", "--output", required=True, help="Output folder (Parquet, our layout).")
@click.option(
    "-a",
    "--a",
    "col_a",
    default="embeds_a",
    show_default=True,
    help="Name of the first vector column (.npy/.npz inputs).",
)
@click.option(
    "-b",
    "--b",
    "col_b",
    default="embeds_b",
    show_default=True,
    help="Name of the second vector column (.npy/.npz inputs).",
)
@click.option("--layout", default="binary", show_default=True, type=click.Choice(_LAYOUTS))
@click.option("--allow-pickle", is_flag=True, help="Read a .pkl/.pickle file (runs its code).")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT once the new one is complete.")
@_one_line_errors
def convert(
    input_path: str,
    output: str,
    col_a: str,
    col_b: str,
    layout: str,
    allow_pickle: bool,
    overwrite: bool,
) -> None:
    """Convert INPUT to Parquet in our layout.

    INPUT: a pandas pickle (.pkl/.pickle) of a frame whose columns hold one array or
    tensor per row; a .npy array of shape (N, 2, D) (pair i is [i, 0] and [i, 1]); a .npz
    with arrays named by --a/--b, each (N, D); or Parquet with object or list columns.
    """
    import dask
    import pandas as pd

    source = Path(input_path)
    if not source.exists():
        raise InputError(f"{input_path!r} not found")
    suffix = source.suffix.lower()
    if suffix in (".pkl", ".pickle"):
        if not allow_pickle:
            raise InputError(
                f"refusing to read {input_path!r}: unpickling runs code stored in the file, "
                "so a pickle from an untrusted source can take over this machine; pass "
                "--allow-pickle if you trust it"
            )
        frame = pd.read_pickle(source)
        if not isinstance(frame, pd.DataFrame):
            raise InputError(f"{input_path!r} holds a {type(frame).__name__}, not a DataFrame")
        df = dask_cosim.from_pandas(frame)
    elif suffix in (".npy", ".npz"):
        df = dask_cosim.from_pandas(_numpy_pairs(source, col_a, col_b))
    else:
        _check_parquet_inputs([input_path], "convert reads pandas pickles, .npy/.npz and Parquet")
        df = dask_cosim.read_parquet(input_path)
    with dask.config.set(scheduler="threads"):  # one machine's file: no cluster needed
        manifest = dask_cosim.to_parquet(df, output, layout=layout, overwrite=overwrite)
    dims = ", ".join(f"{c} {v['dim']} x {v['dtype']}" for c, v in manifest["vectors"].items())
    click.echo(
        f"wrote       {output}: {_count(manifest['rows'], 'row')} in "
        f"{_count(len(manifest['files']), 'file')}, "
        f"layout {layout}; vectors: {dims or 'none found'}"
    )


def _count(n: int, noun: str) -> str:
    """ "1 file", "2 files", "1,000 rows"."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _numpy_pairs(source: Path, col_a: str, col_b: str) -> pd.DataFrame:
    import numpy as np
    import pandas as pd

    from dask_cosim import errors
    from dask_cosim.io import vectors_to_arrow

    # allow_pickle=False: an object array would unpickle, i.e. run code from the file.
    if source.suffix.lower() == ".npy":
        pairs = np.load(source, allow_pickle=False)
        if pairs.ndim != 3 or pairs.shape[1] != 2:
            raise InputError(
                f"{str(source)!r} holds an array of shape {pairs.shape}; expected (N, 2, D): "
                "pair i is [i, 0] and [i, 1]"
            )
        a, b = pairs[:, 0], pairs[:, 1]
    else:
        with np.load(source, allow_pickle=False) as arrays:
            missing = [c for c in (col_a, col_b) if c not in arrays]
            if missing:
                hint = errors.did_you_mean(missing[0], arrays)
                raise InputError(
                    f"{str(source)!r} has no arrays {missing!r}{hint or ';'} it has "
                    f"{sorted(arrays)!r} (name them with --a/--b)"
                )
            a, b = arrays[col_a], arrays[col_b]
        if a.ndim != 2 or a.shape != b.shape:
            raise InputError(f"--a and --b arrays must both be (N, D); got {a.shape} and {b.shape}")
    return pd.DataFrame({col_a: vectors_to_arrow(a), col_b: vectors_to_arrow(b)})


@main.command()
@click.argument("inputs", nargs=-1, required=True)
@_one_line_errors
def info(inputs: tuple[str, ...]) -> None:
    """Rows, partitions, columns, and each embedding column's D and dtype."""
    from dask_cosim import io

    _check_parquet_inputs(inputs, "info reads Parquet files or folders of them")
    described = io.describe_parquet(list(inputs) if len(inputs) > 1 else inputs[0])
    click.echo(f"rows        {described['rows']:,}")
    files, partitions = described["files"], described["partitions"]
    click.echo(f"files       {_count(files, 'file')} ({_count(partitions, 'partition')})")
    click.echo(f"layout      {described['layout'] or 'not written by dask_cosim'}")
    if described["index"]:
        click.echo(f"index       {', '.join(described['index'])}")
    click.echo("columns")
    for column, meta in described["columns"].items():
        vector = f"  vectors of {meta['dim']} x {meta['values']}" if "dim" in meta else ""
        click.echo(f"  {column:24} {meta['dtype']}{vector}")


@main.command()
@click.option("--rows", default=1_000_000, show_default=True, type=click.IntRange(1))
@click.option("--dim", default=300, show_default=True, type=click.IntRange(1))
@click.option(
    "--partitions",
    default=None,
    type=click.IntRange(1),
    help="Parquet files to generate (default: about 64 MiB each).",
)
@click.option(
    "--workers",
    default=None,
    type=click.IntRange(1),
    help="Local workers (default: one per GPU, else one per core).",
)
@_memory_limit_option
@click.option(
    "--output",
    default=None,
    type=click.Path(file_okay=False),
    help="Folder for the result and histogram.png (default: a new temporary folder).",
)
@_one_line_errors
def demo(
    rows: int,
    dim: int,
    partitions: int | None,
    workers: int | None,
    memory_limit: str,
    output: str | None,
) -> None:
    """Generate pairs, score them with `pairwise` on a local cluster, print the summary.

    The generated pairs are deleted at the end; the result (Parquet) and a histogram PNG
    stay in --output.
    """
    import dask
    import numpy as np

    from dask_cosim import datasets

    if partitions is None:
        partitions = max(1, min(rows, (rows * dim * 8) // (64 * 2**20)))
    bounds = np.linspace(0, rows, partitions + 1).astype(int)
    out_dir = Path(output) if output else Path(tempfile.mkdtemp(prefix="dask-cosim-demo-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    pairs = Path(tempfile.mkdtemp(prefix="pairs-", dir=out_dir))
    try:
        with _cluster(None, workers, False, memory_limit) as client:
            _echo_cluster(client)
            t0 = time.perf_counter()
            writes = [
                dask.delayed(datasets.write_pairs)(
                    pairs / f"part.{i:05d}.parquet", int(hi - lo), dim, int(lo)
                )
                for i, (lo, hi) in enumerate(itertools.pairwise(bounds))
            ]
            dask.compute(*writes)
            click.echo(
                f"generated   {_count(rows, 'pair')} of {dim} float32 in "
                f"{_count(partitions, 'Parquet file')} "
                f"(list layout, {time.perf_counter() - t0:.1f} s)"
            )
            result = str(out_dir / "result")
            job = _prepare([str(pairs)], "embeds_a", "embeds_b", result, ("id",), "cos", True)
            summary, seconds, embedding_bytes = job(progress=sys.stdout.isatty())
    finally:
        shutil.rmtree(pairs, ignore_errors=True)
    click.echo(f"wrote       {result} (id, cos)")
    click.echo("from Parquet to written result:")
    click.echo(format_summary(summary, seconds, embedding_bytes))
    click.echo(f"histogram   {_plot_histogram(summary, out_dir / 'histogram.png')}")


def _plot_histogram(summary: Summary, path: Path) -> str:
    """histogram.png of the similarities; matplotlib is optional (the `bench` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "not drawn: pip install matplotlib (or dask-cosim[bench])"
    import numpy as np

    edges, counts = summary.edges, summary.counts
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", edgecolor="white")
    ax.set_xlabel("cosine similarity")
    ax.set_ylabel("pairs")
    ax.set_title(f"{summary.rows:,} pairs, mean {summary.mean:+.3f}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


# --------------------------------------------------------------------------- search commands


def _search_cluster_options(command: F) -> F:
    """--scheduler / --workers / --gpus / --memory-limit / --overwrite / --quiet."""
    for option in reversed(
        [
            click.option(
                "--scheduler", default=None, help="A running scheduler, e.g. tcp://host:8786."
            ),
            click.option("--workers", default=None, type=click.IntRange(1), help="Local workers."),
            click.option("--gpus", is_flag=True, help="Local cluster of GPU workers (dask-cuda)."),
            _memory_limit_option,
            click.option(
                "--overwrite", is_flag=True, help="Replace OUTPUT once the new one is complete."
            ),
            click.option("--quiet", is_flag=True, help="No progress bar."),
        ]
    ):
        command = option(command)
    return command


def _check_columns(df: Any, columns: Sequence[str], what: str) -> None:
    """InputError naming the first of ``columns`` not in ``df``, with a did-you-mean."""
    from dask_cosim import errors

    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise InputError(errors.column_not_found(missing[0], df.columns, what).args[0])


def _search_run(
    build: Callable[[], Any],
    output: str,
    overwrite: bool,
    scheduler: str | None,
    workers: int | None,
    gpus: bool,
    memory_limit: str,
    quiet: bool,
) -> None:
    """Check OUTPUT, build the graph (errors before a cluster starts), then compute and
    write OUTPUT atomically on the cluster; prints rows, time and the output path."""
    if scheduler is not None and (workers is not None or gpus or memory_limit != "auto"):
        raise click.UsageError(
            "--scheduler connects to a running cluster; --workers/--gpus/--memory-limit "
            "start a local one: give one or the other"
        )
    if Path(output).exists() and not overwrite:
        raise InputError(f"{output!r} exists; pass --overwrite to replace it")
    result = build()
    with _cluster(scheduler, workers, gpus, memory_limit) as client:
        _echo_cluster(client)
        t0 = time.perf_counter()
        if callable(result):  # eager results (topk) are computed on the cluster first
            result = result()
        dask_cosim.to_parquet(
            result,
            output,
            overwrite=overwrite,
            progress=not quiet and sys.stderr.isatty(),
        )
        seconds = time.perf_counter() - t0
    from dask_cosim import io

    rows = io.describe_parquet(output).get("rows")
    counted = f"{rows:,} rows, " if rows is not None else ""
    click.echo(f"wrote       {output} ({counted}{seconds:.1f} s)")


def _read_input(inputs: tuple[str, ...]) -> dd.DataFrame:
    _check_parquet_inputs(inputs, "the search commands read Parquet files or folders of them")
    return dask_cosim.read_parquet(list(inputs) if len(inputs) > 1 else inputs[0])


@main.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--on", required=True, help="Embedding column of INPUTS.")
@click.option(
    "--queries",
    "queries_path",
    required=True,
    help="Parquet file or folder holding the query vectors.",
)
@click.option("--query-on", default=None, help="Embedding column of --queries (default: --on).")
@click.option(
    "-k", "k", default=10, show_default=True, type=click.IntRange(1), help="Matches per query."
)
@click.option(
    "--keep", multiple=True, help="A column of INPUTS to copy to the output (repeatable)."
)
@click.option("-o", "--output", required=True, help="Output folder (Parquet, atomic).")
@_search_cluster_options
@_one_line_errors
def topk(
    inputs: tuple[str, ...],
    on: str,
    queries_path: str,
    query_on: str | None,
    k: int,
    keep: tuple[str, ...],
    output: str,
    scheduler: str | None,
    workers: int | None,
    gpus: bool,
    memory_limit: str,
    overwrite: bool,
    quiet: bool,
) -> None:
    """The K rows of INPUTS most similar to each query vector (exact), written to OUTPUT.

    OUTPUT has one row per (query, hit): query (the query's index label), rank, match (the
    hit's index label in INPUTS), score and the --keep columns.
    """
    df = _read_input(inputs)
    queries = dask_cosim.read_parquet(queries_path)
    column = on if query_on is None else query_on
    _check_columns(queries, [column], f"--query-on column (in {queries_path!r})")

    def build() -> Callable[[], Any]:
        from dask_cosim import search

        # Checked from the metadata now; the data is read once the cluster runs.
        search.check_column(df, on, "on")
        search.check_column(queries, column, "query_on")
        _check_columns(df, keep, "--keep column")
        return lambda: df.cosim.topk(queries[column].compute(), on, k, columns=list(keep))

    _search_run(build, output, overwrite, scheduler, workers, gpus, memory_limit, quiet)


@main.command()
@click.argument("left_path")
@click.argument("right_path")
@click.option("--on", required=True, help="Embedding column of LEFT (and of RIGHT).")
@click.option("--right-on", default=None, help="Embedding column of RIGHT (default: --on).")
@click.option("-k", "k", default=None, type=click.IntRange(1), help="Best matches per left row.")
@click.option("--threshold", default=None, type=float, help="Lowest score kept, in [-1, 1].")
@click.option("-o", "--output", required=True, help="Output folder (Parquet, atomic).")
@_search_cluster_options
@_one_line_errors
def join(
    left_path: str,
    right_path: str,
    on: str,
    right_on: str | None,
    k: int | None,
    threshold: float | None,
    output: str,
    scheduler: str | None,
    workers: int | None,
    gpus: bool,
    memory_limit: str,
    overwrite: bool,
    quiet: bool,
) -> None:
    """Similarity join of LEFT and RIGHT (Parquet): for each left row its K best right rows,
    and/or every pair scoring at least --threshold; columns left, right, score (and rank).
    """
    left, right = dask_cosim.read_parquet(left_path), dask_cosim.read_parquet(right_path)

    def build() -> Any:
        return left.cosim.join(right, on, right_on=right_on, k=k, threshold=threshold)

    _search_run(build, output, overwrite, scheduler, workers, gpus, memory_limit, quiet)


@main.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--on", required=True, help="Embedding column.")
@click.option("--threshold", required=True, type=float, help="Score at which rows are duplicates.")
@click.option("-o", "--output", required=True, help="Output folder (Parquet, atomic).")
@_search_cluster_options
@_one_line_errors
def dedup(
    inputs: tuple[str, ...],
    on: str,
    threshold: float,
    output: str,
    scheduler: str | None,
    workers: int | None,
    gpus: bool,
    memory_limit: str,
    overwrite: bool,
    quiet: bool,
) -> None:
    """INPUTS without every row that has an earlier row scoring at least --threshold with
    it; all columns are written to OUTPUT."""
    df = _read_input(inputs)

    def build() -> Any:
        return df.cosim.dedup(on, threshold)

    _search_run(build, output, overwrite, scheduler, workers, gpus, memory_limit, quiet)


if __name__ == "__main__":
    main()
