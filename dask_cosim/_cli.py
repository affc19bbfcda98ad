"""What every command of :mod:`dask_cosim.cli` shares: errors and warnings in one line, in
the options' spellings; the cluster options (--scheduler, --workers, --gpus,
--memory-limit, with the checks that a running scheduler and a local cluster are not both
asked for and that --scheduler is a dask scheduler's address) and the output options (-o,
--overwrite, --layout, --quiet), each group handed to a command as one argument; and the
options several commands take alone (--layout, --columns).

Of the packages outside the standard library, only click is imported with this module, as
with the command line itself.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import click

import dask_cosim

__all__ = [
    "COLUMNS",
    "LAYOUT",
    "LAYOUTS",
    "MEMORY_LIMIT",
    "OVERWRITE",
    "REMOVED_COLUMNS",
    "VECTOR_DTYPES",
    "WORKERS",
    "Cluster",
    "InputError",
    "Output",
    "check_local_inputs",
    "check_scheduler",
    "cli_spelling",
    "cluster_options",
    "count",
    "failure_message",
    "method_options",
    "one_line_errors",
    "output_options",
    "pairs_options",
    "quiet_cancelled_gather",
]


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
    NotImplementedError,  # pyarrow's ArrowNotImplementedError: a type it cannot read
)

F = TypeVar("F", bound=Callable[..., Any])


def one_line_errors(command: F) -> F:
    """Input errors -> exit 2, other failures -> exit 1; one line each, no traceback.
    Warnings are printed as one line too: ``Warning: ...`` on stderr."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with warnings.catch_warnings():  # restores showwarning afterwards
                warnings.showwarning = functools.partial(_show_warning, warnings.showwarning)
                return command(*args, **kwargs)
        except click.ClickException:
            raise
        except _INPUT_ERRORS as err:
            text = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
            raise InputError(cli_spelling(str(text))) from None
        except BrokenPipeError:
            # The reader of the output went away (`| head`): nothing more to say to it.
            # Python's advice: point stdout at devnull so that its flush at exit is quiet.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        except Exception as err:
            raise click.ClickException(cli_spelling(failure_message(err))) from None

    return wrapper  # type: ignore[return-value]


# The library's messages name its arguments as Python spells them; a command's options
# are spelt as typed.  Only the arguments the commands take as options are translated,
# and not inside a call (``to_parquet(df, path, layout='list')`` stays Python).
_OPTIONS = {"k": "-k", "threshold": "--threshold", "method": "--method",
            "n_probe": "--n-probe", "clusters": "--clusters", "device": "--device",
            "eps": "--eps", "dtype": "--dtype", "layout": "--layout"}  # fmt: skip
_SPELLINGS: list[tuple[re.Pattern[str], Any]] = [
    (re.compile(r"\boverwrite=True\b"), "--overwrite"),
    (re.compile(r"\ballow_pickle=True\b"), "--allow-pickle"),
    (
        re.compile(r"(?<![\w(.,-])(?<!, )(" + "|".join(_OPTIONS) + r")=(?:'([^']*)'|([^\s,;:)]+))"),
        lambda m: f"{_OPTIONS[m[1]]} {m[2] if m[2] is not None else m[3]}",
    ),
    # Columns to carry, as a list: "columns=['id', 'id'] names a column twice".
    (
        re.compile(r"(?<![\w(.,-])(columns|right_columns)=\[([^\]]*)\]"),
        lambda m: " ".join(
            f"--{m[1].replace('_', '-')} {c}" for c in re.findall(r"'([^']*)'", m[2])
        ),
    ),
    # Which argument named a missing column: "on: column 'embs' not found; ...", join's
    # "columns (the right frame's too: right_columns= names others): column ...", and
    # pairwise's a and b (-a, -b).
    (
        re.compile(r"^(on|right_on|columns|right_columns|a|b)(?=: column | \(the right)"),
        lambda m: ("-" if len(m[1]) == 1 else "--") + m[1].replace("_", "-"),
    ),
    (re.compile(r"(?<=: )right_columns=(?= names others\))"), "--right-columns"),
    # topk's queries whose length the metadata did not tell, found on a worker.
    (re.compile(r"\bargument 'queries'"), "--queries"),
    # A config key named as the switch of a choice: the environment variable that sets it.
    (
        re.compile(r"\(cosim\.search\.clustered\.exact-when-cheaper\)"),
        "(DASK_COSIM__SEARCH__CLUSTERED__EXACT_WHEN_CHEAPER=false keeps --method clustered)",
    ),
    # "give k (the best matches of each row), threshold (every pair ...), or both".
    (re.compile(r"^give k \((.*?)\), threshold \("), r"give -k (\1), --threshold ("),
    # "give k= to keep each row's k best matches" (a search's result budget).
    (re.compile(r"\bgive k= to\b"), "give -k to"),
    # Bare names: "n_probe is an option of method='clustered': ... or drop n_probe".
    (re.compile(r"(?<![\w-])n_probe\b"), "--n-probe"),
    (re.compile(r"\bclusters(?= is an option)|(?<=\bdrop )clusters\b"), "--clusters"),
]


def cli_spelling(text: str) -> str:
    """``text`` (a library message) with ``overwrite=True``, ``allow_pickle=True``,
    ``method='exact'``, ``n_probe=2``, ``k=3``, ``threshold=0.9``, ``clusters=N`` spelt as
    the command line's options: ``--overwrite``, ``--allow-pickle``, ``--method exact``,
    ``--n-probe 2``, ``-k 3``, ..."""
    for pattern, spelling in _SPELLINGS:
        text = pattern.sub(spelling, text)
    # The config keys, as their environment variables ("set a larger
    # cosim.search.max-result-bytes": DASK_COSIM__SEARCH__MAX_RESULT_BYTES); only the
    # keys there are, not a path or column name that holds "cosim.", nor quoted text.
    import dask.config  # loaded already where a message names a key (the library is)

    keys = sorted(_config_keys("cosim", dask.config.get("cosim", {})), key=len, reverse=True)
    if keys:
        named = re.compile(r"(?<![\w.'/])(" + "|".join(map(re.escape, keys)) + r")(?![\w.'-])")
        text = named.sub(
            lambda m: "DASK_" + m[1].upper().replace(".", "__").replace("-", "_"), text
        )
    return text


def _config_keys(prefix: str, tree: Any) -> list[str]:
    """The dotted keys below ``prefix`` in the config ``tree``."""
    found: list[str] = []
    if isinstance(tree, dict):
        for key, value in tree.items():
            found += [f"{prefix}.{key}", *_config_keys(f"{prefix}.{key}", value)]
    return found


def check_local_inputs(*paths: str) -> None:
    """Raise ``FileNotFoundError("'x' not found")``, the reader's own words, for the first
    local path among ``paths`` that does not exist.  Commands call it before they import
    the library (torch, pandas and dask take seconds), so that a mistyped path is answered
    at once.  URLs and globs are left to the reader, which lists and checks them."""
    for text in paths:
        if "://" in text or any(c in text for c in "*?["):
            continue
        if not os.path.exists(text):
            raise FileNotFoundError(f"{text!r} not found")


def _show_warning(
    shown: Callable[..., None], message: Warning | str, category: type[Warning], *args: Any,
    **kwargs: Any,
) -> None:  # fmt: skip
    """Ours (:class:`~dask_cosim.errors.CosimWarning`) as one line, in the command line's
    spelling: Python's format adds the file, line and source line of the library's call,
    which say nothing to someone running a command.  Others' as ``shown`` shows them:
    the library's they are, not ours."""
    from dask_cosim.errors import CosimWarning

    if not issubclass(category, CosimWarning):
        shown(message, category, *args, **kwargs)
        return
    click.echo(f"Warning: {cli_spelling(' '.join(str(message).split()))}", err=True)


def failure_message(err: BaseException) -> str:
    """One line for a failed computation; a worker that died names its partition."""
    task = getattr(err, "task", None)
    if type(err).__name__ == "KilledWorker" and isinstance(task, tuple) and len(task) > 1:
        return (
            f"the computation failed: partition {task[-1]} killed the worker process "
            f"running it more than {getattr(err, 'allowed_failures', '?')} time(s) (task "
            f"{task[0]!r}); it may need more memory than a worker has, or hold data that "
            "crashes a library. Nothing was written."
        )
    if str(err):
        return f"the computation failed: {type(err).__name__}: {err}"
    # No message (a bare `assert` in a library, say): where it was raised is all there is
    # to go on, in a report or a search.
    return f"the computation failed: {type(err).__name__}, with no message, {_raised_at(err)}"


def _raised_at(err: BaseException) -> str:
    """ "raised at distributed/client.py:123 in gather": the innermost frame of ``err``'s
    traceback (for an error a worker raised, a frame on the worker), its file named from
    the package folder on; "raised at an unknown place" without a traceback."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return "raised at an unknown place"
    last = frames[-1]
    parts = os.path.normpath(last.filename).split(os.sep)
    cut = max((i + 1 for i, part in enumerate(parts) if part == "site-packages"), default=0)
    name = "/".join(parts[cut:]) if cut else last.filename
    return f"raised at {name}:{last.lineno} in {last.name}"


def count(n: int, noun: str) -> str:
    """ "1 file", "2 files", "1,000 rows"."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


# --------------------------------------------------------------------------- shared options


@dataclass(frozen=True)
class Cluster:
    """Where a command computes: the running ``scheduler``, or a local cluster of
    ``workers`` (GPU workers with ``gpus``) of ``memory_limit`` each; not both."""

    scheduler: str | None = None
    workers: int | None = None
    gpus: bool = False
    memory_limit: str = "auto"

    def __post_init__(self) -> None:
        local = self.workers is not None or self.gpus or self.memory_limit != "auto"
        if self.scheduler is not None and local:
            raise click.UsageError(
                "--scheduler connects to a running cluster; --workers/--gpus/--memory-limit "
                "start a local one: give one or the other"
            )
        # Refused at once, before the inputs are read: no scheduler has a web address.
        if self.scheduler is not None and re.match(r"https?://", self.scheduler, re.IGNORECASE):
            raise InputError(
                f"--scheduler {self.scheduler!r} is a web address (the dashboard's, perhaps), "
                f"not a scheduler's; {_scheduler_hint(self.scheduler)}"
            )

    @contextmanager
    def client(self) -> Iterator[Any]:
        """A Client, connected (once :func:`check_scheduler` has had a scheduler's answer,
        within ``distributed.comm.timeouts.connect``) or on a local cluster started (and
        shut) here; the cluster is described on stderr.  Once the block has done its work,
        Ctrl-C does not interrupt the shutdown: the outputs are in place, and an
        interrupted shutdown waited for ever, then said "Aborted!"."""
        from distributed import Client

        from dask_cosim.cluster import describe

        logging.getLogger("asyncio").addFilter(quiet_cancelled_gather)

        if self.scheduler is not None:
            import dask.config
            from dask.utils import parse_timedelta

            timeout = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"))
            check_scheduler(self.scheduler, timeout)
            try:
                client = Client(self.scheduler, timeout=timeout)
            except (OSError, TimeoutError) as err:
                raise InputError(f"cannot connect to scheduler {self.scheduler!r}: {err}") from None
        else:
            # Workers log each failed task with its traceback; the command reports the
            # error itself, in one line.
            client = dask_cosim.local_cluster(
                self.workers,
                gpus=True if self.gpus else "auto",
                memory_limit=self.memory_limit,
                silence_logs=logging.CRITICAL,
            )
        done = False
        try:
            click.echo(f"cluster     {describe(client)}", err=True)
            yield client
            done = True
        finally:
            with _uninterrupted() if done else nullcontext():
                client.close()  # closes a local cluster too


def quiet_cancelled_gather(record: logging.LogRecord) -> bool:
    """A logging filter for asyncio's logger: a computation stopped by Ctrl-C leaves
    distributed's gather an asyncio task whose exception (AllExit) nobody retrieves, and
    asyncio printed its traceback ("Task exception was never retrieved") beside the
    command's one line, "Aborted!"."""
    error = record.exc_info[1] if record.exc_info else None
    return type(error).__name__ != "AllExit"


@contextmanager
def _uninterrupted() -> Iterator[None]:
    """SIGINT ignored while it lasts (in the main thread; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def check_scheduler(address: str, timeout: float) -> None:
    """Return once a dask scheduler at ``address`` has answered the handshake; else raise
    InputError: nothing reached within ``timeout`` seconds ("cannot connect"), or something
    that did not answer as a scheduler within as long again (not a dask scheduler: the
    dashboard's port, an HTTP server).

    distributed's Client bounds reaching the address, not the handshake after it: an HTTP
    server kept it waiting for ever, or its reply was decoded as frames (a MemoryError).
    """
    import asyncio

    from distributed.comm import connect
    from distributed.comm.addressing import parse_address
    from distributed.comm.registry import get_backend
    from distributed.security import Security

    try:
        get_backend(parse_address(address)[0])
    except ValueError as err:
        raise InputError(f"--scheduler {address!r}: {err}") from None

    async def handshake() -> None:
        comm = await connect(address, timeout=timeout, **Security().get_connection_args("client"))
        await comm.close()

    try:
        # connect() gives up reaching the address after `timeout`; the rest is handshake.
        asyncio.run(asyncio.wait_for(handshake(), 2 * timeout))
    except asyncio.TimeoutError:  # before OSError, its base class
        why = f"no reply in dask's protocol within {2 * timeout:g} s"
    except OSError as err:
        if str(err).startswith("Timed out trying to connect"):  # nothing answered
            raise InputError(f"cannot connect to scheduler {address!r}: {err}") from None
        why = f"the connection ended before a scheduler's handshake ({type(err).__name__})"
    except Exception as err:  # a reply decoded as dask's frames: a MemoryError, say
        why = f"its reply is not dask's protocol ({type(err).__name__} decoding it)"
    else:
        return
    raise InputError(
        f"--scheduler {address!r}: something answered there, but not a dask scheduler: {why}; "
        + _scheduler_hint(address)
    )


def _scheduler_hint(address: str) -> str:
    where = urlsplit(address if "://" in address else f"tcp://{address}")
    if where.port == 8786:  # the default port already: another service holds it there
        return (
            "8786 is the scheduler's default port, but another program listens on it at "
            "that host: give the address the scheduler printed when it started "
            "('Scheduler at: tcp://...')"
        )
    host = where.hostname or "HOST"
    host = f"[{host}]" if ":" in host else host
    return (
        "the dashboard is usually port 8787, the scheduler port 8786: "
        f"e.g. --scheduler tcp://{host}:8786"
    )


@dataclass(frozen=True)
class Output:
    """The output folder, whether it may be replaced, the layout of its vector columns,
    whether to show progress."""

    output: str
    overwrite: bool
    layout: str
    quiet: bool

    @property
    def progress(self) -> bool:
        return not self.quiet and sys.stderr.isatty()


def clustered(method: str, **given: Any) -> bool:
    """Whether a search command runs ``method="clustered"`` (its plan computes, so the
    search is built on the cluster), once ``method`` and the ``given`` options that go
    with it are checked together, before a cluster starts."""
    from dask_cosim import options

    options.search_method(method, **given)
    return method == "clustered"


@contextmanager
def log_steps(enabled: bool) -> Iterator[None]:
    """While it lasts, the library's INFO messages (the steps a clustered search plans
    before its progress bar can show) go to stderr, when ``enabled``: unless --quiet,
    also when stderr is not a terminal (a log file then says how far a long run got;
    only the progress bar needs a terminal)."""
    if not enabled:
        yield
        return
    logger = logging.getLogger("dask_cosim")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _memory_limit(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from dask_cosim import options

    try:
        options.memory_size("memory_limit", value, "4GiB")
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not a size; give e.g. 4GiB, a fraction of the memory like 0.5, or auto"
        ) from None
    return value


WORKERS = click.option(
    "--workers",
    default=None,
    type=click.IntRange(1),
    help="Local workers (default: one per GPU, else one per core).",
)
MEMORY_LIMIT = click.option(
    "--memory-limit",
    default="auto",
    show_default=True,
    callback=_memory_limit,
    help="Per local worker, e.g. 4GiB (dask pauses a worker at 80 %; give at least 1.5GiB).",
)
OVERWRITE = click.option(
    "--overwrite", is_flag=True, help="Replace OUTPUT once the new one is complete."
)


def _stacked(decorators: list[Callable[[Any], Any]]) -> Callable[[F], F]:
    """One decorator applying ``decorators`` as if written above a function in that
    order (the first outermost: click lists its options in the order written)."""

    def decorate(command: F) -> F:
        for decorator in reversed(decorators):
            command = decorator(command)
        return command

    return decorate


def _grouped(name: str, make: Callable[..., Any], options: list[Any]) -> Callable[[F], F]:
    """A decorator adding the click ``options`` to a command, which receives them as one
    argument ``name``: ``make(**their values)``."""

    def collect() -> None: ...

    collect = _stacked(options)(collect)
    keys = [p.name for p in collect.__click_params__]  # type: ignore[attr-defined]

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            kwargs[name] = make(**{key: kwargs.pop(key) for key in keys})
            return command(*args, **kwargs)

        return _stacked(options)(wrapper)  # type: ignore[return-value]

    return decorate


# --scheduler / --workers / --gpus / --memory-limit, on every command that computes.
cluster_options = _grouped(
    "cluster",
    Cluster,
    [
        click.option(
            "--scheduler", default=None, help="A running scheduler, e.g. tcp://host:8786."
        ),
        WORKERS,
        click.option("--gpus", is_flag=True, help="Local cluster of GPU workers (dask-cuda)."),
        MEMORY_LIMIT,
    ],
)
# dask_cosim.io.LAYOUTS and to_parquet's default, spelt out so that the options need no
# import of the io package (tests/test_cli.py checks they agree).
LAYOUTS = ("binary", "list")
LAYOUT = click.option(
    "--layout",
    default="binary",
    show_default=True,
    type=click.Choice(LAYOUTS),
    help="How vector columns are stored: binary (read fastest by dask_cosim) or list "
    "(read by every Parquet reader: pandas, DuckDB, Spark).",
)
# dask_cosim.io.convert.VECTOR_DTYPES, spelt out for the same reason (tests/test_cli.py
# checks they agree).
VECTOR_DTYPES = ("float16", "float32", "float64")
COLUMNS = click.option(
    "--columns",
    multiple=True,
    help="A column to carry from each row of a pair into the output as left_<column> and "
    "right_<column>, e.g. an id (repeatable).",
)
# dedup's: its OUTPUT is the kept rows, every column; --removed holds the pairs.
REMOVED_COLUMNS = click.option(
    "--columns",
    multiple=True,
    help="A column to carry from each row of a pair into --removed as left_<column> and "
    "right_<column>, e.g. an id (repeatable; needs --removed: OUTPUT keeps every column).",
)
# -o / --overwrite / --layout / --quiet, on every command that writes a result.
output_options = _grouped(
    "out",
    Output,
    [
        click.option("-o", "--output", required=True, help="Output folder (Parquet, atomic)."),
        OVERWRITE,
        LAYOUT,
        click.option("--quiet", is_flag=True, help="No progress bar."),
    ],
)


# -k, --threshold, --columns, the output and cluster options, one-line errors: what the
# commands that find pairs (join, neighbors) share.
pairs_options = _stacked(
    [
        click.option("-k", "k", default=None, type=click.IntRange(1),
                     help="Best matches per (left) row."),
        click.option("--threshold", default=None, type=float,
                     help="Lowest score kept, in [-1, 1]."),
        COLUMNS,
        output_options,
        cluster_options,
        one_line_errors,
    ]
)  # fmt: skip

# --method, --n-probe, --clusters: how neighbors (--threshold) and dedup search.
method_options = _stacked(
    [
        click.option("--method", default="exact", show_default=True,
                     type=click.Choice(["exact", "clustered"]),
                     help="exact: all pairs; clustered: k-means first, for millions of rows "
                     "(needs --threshold > 0)."),
        click.option("--n-probe", "n_probe", default=None, type=click.IntRange(0),
                     help="clustered: most clusters a row probes beyond its own (default: "
                     "every one that may hold a match, recall 1)."),
        click.option("--clusters", default=None, type=click.IntRange(1),
                     help="clustered: k-means clusters (default about sqrt(rows))."),
    ]
)  # fmt: skip
