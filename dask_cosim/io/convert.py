"""Frames of per-row vectors into dask without turning them into text, and local files of
other formats (.npy/.npz arrays, pandas pickles, CSV and JSON Lines) into frames
(:func:`source_frame`)."""

from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import torch
from dask.dataframe._pyarrow import to_pyarrow_string
from dask.dataframe.utils import pyarrow_strings_enabled

from dask_cosim import backends, errors
from dask_cosim.io import scattered
from dask_cosim.io.layouts import list_columns, vectors_to_arrow

# Partition size from_pandas aims at when neither npartitions nor chunksize is given.
TARGET_PARTITION_BYTES = 128 * 2**20

# dask reads 'dataframe.convert-string' from its config, one dict for the whole process.
# ``with dask.config.set(...)`` puts back on leaving the value it found on entering: two
# threads inside at once, the one leaving last put back the other's temporary False, and
# every frame built later in the process kept its strings as objects.
_CONVERT_STRING = threading.RLock()


@contextmanager
def objects_kept() -> Iterator[None]:
    """While inside, dask leaves the object columns of the frames built as they are
    (config ``dataframe.convert-string`` off); on leaving, the setting is what it was.

    Every frame this package builds with the setting off is built in here, one thread at
    a time (a lock is held while the setting is off).  The config is the process's: a
    frame that other code builds in another thread meanwhile is built with it off too.
    """
    with _CONVERT_STRING, dask.config.set({"dataframe.convert-string": False}):
        yield


def vector_columns(pdf: pd.DataFrame) -> list[str]:
    """Object columns whose first non-null cell that holds values is an array, tensor or
    list of numbers (a list of strings, a tuple of mixed values or bytes is not: such
    columns stay as they are).  An empty list tells nothing: ``[]`` first made a column
    of lists of strings vectors, and a column of nothing but empty ones (tags, say, or an
    embedding step that failed) stays as it is, for ``pairwise`` to say it holds no
    values, rather than becoming vectors of length 0."""
    found = []
    for column in pdf.columns:
        series = pdf[column]
        if series.dtype != object:
            continue
        cells = series.dropna()
        first = next((c for c in cells if not _empty(c)), None)
        if first is not None and _is_numbers(first):
            found.append(column)
    return found


def _empty(cell: Any) -> bool:
    """Whether ``cell`` is an array, tensor or sequence of no values."""
    if isinstance(cell, torch.Tensor):
        return cell.numel() == 0
    if isinstance(cell, np.ndarray):
        return cell.size == 0
    return isinstance(cell, (list, tuple)) and len(cell) == 0


def _is_numbers(cell: Any) -> bool:
    """Whether ``cell`` is an array, tensor or (nested) sequence of real numbers."""
    if isinstance(cell, torch.Tensor):
        return not (cell.dtype.is_complex or cell.dtype == torch.bool)
    if not isinstance(cell, (np.ndarray, list, tuple)):
        return False
    try:
        array = np.asarray(cell)
    except ValueError:  # a nested sequence of ragged parts
        return False
    if array.dtype.kind == "O":  # numbers beside None or pd.NA (a null: that value is NaN)
        return all(x is None or x is pd.NA or _is_real(x) for x in array.ravel())
    return array.dtype.kind in "fiu"


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def from_pandas(
    pdf: pd.DataFrame,
    npartitions: int | None = None,
    sort: bool = True,
    chunksize: int | None = None,
) -> dd.DataFrame:
    """A dask DataFrame from a pandas one, keeping per-row vectors as vectors.

    Object columns holding one numpy array, torch tensor or list of numbers per row (any
    shape with D elements, e.g. (300, 1)), as their first non-null cell shows, become
    Arrow ``fixed_size_list<D>`` columns in one vectorised stack.  Columns of strings
    become strings as in ``dd.from_pandas`` (config ``dataframe.convert-string``); any
    other object column (empty, all null, only empty vectors, scalars, bytes, lists of
    strings) stays object, so that ``df.cosim.pairwise`` can read it or name its bad row;
    other columns pass through unchanged.

    Parameters
    ----------
    pdf : pandas.DataFrame
    npartitions : int, optional
        As in ``dd.from_pandas``.  With neither ``npartitions`` nor ``chunksize``, about
        128 MiB per partition.
    sort : bool, default True
        As in ``dd.from_pandas``: sort by the index, which sets the frame order a search
        ranks ties by (and the row ``dedup`` keeps of two duplicates).  ``sort=False``
        keeps the pandas frame's order.
    chunksize : int, optional
        Rows per partition, as in ``dd.from_pandas`` (whose order of arguments this
        follows: ``from_pandas(pdf, 2, False)`` is ``sort=False``).

    Returns
    -------
    dask.dataframe.DataFrame
        With an active ``distributed.Client`` (and no local scheduler chosen in the
        config), the converted partitions are scattered to its workers here, once, and the
        frame refers to them: every computation then sends a small graph instead of the
        whole frame.  The frame is tied to that client (it holds its futures), and a worker
        that dies loses its partitions for good (computations then fail with "lost
        dependencies"; a Parquet read is read again instead).  A local scheduler
        (``compute(scheduler="sync")``) gathers the partitions from the workers when it
        starts (:mod:`dask_cosim.io.scattered`).  Without a client the data stays in the
        graph, as with ``dd.from_pandas``.

    Raises
    ------
    TypeError
        A vector column holds a non-numeric cell (names the column and row label); the
        index is a MultiIndex (dask has none: ``reset_index()`` first).
    ValueError
        Ragged rows (names the column, the row label and both lengths, and, for rows of
        integers, how to keep a column of lists that are no embeddings); a name two
        columns share.
    """
    if not isinstance(pdf, pd.DataFrame):
        raise TypeError(_not_pandas_message(pdf))
    if isinstance(pdf.index, pd.MultiIndex):  # dask's own error: "isna is not defined for"
        raise TypeError(
            f"the pandas frame's index is a MultiIndex (levels {list(pdf.index.names)}), "
            "which dask has not: keep its levels as columns, with pdf.reset_index() first"
        )
    for column in pdf.columns[pdf.columns.duplicated()][:1]:  # each is converted by its name
        backends.check_named_once(pdf.columns, column)
    converted = pdf.copy(deep=False)
    for column in vector_columns(pdf):
        converted[column] = _arrow_vectors(pdf[column], column)
    if npartitions is None and chunksize is None:
        nbytes = int(converted.memory_usage(deep=False, index=True).sum())
        npartitions = max(1, min(len(converted), math.ceil(nbytes / TARGET_PARTITION_BYTES)))
    # dask's 'dataframe.convert-string' turns every object column into text, not only
    # columns of strings.  An object column with no cell to tell (an empty frame, all
    # null) or holding scalars or other objects stays object instead: the accessor then
    # reads it as empty or null vectors, or names the row that is not a vector, rather
    # than reporting strings the user never had.
    keep = [
        column
        for column in converted.columns
        if converted[column].dtype == object
        and pd.api.types.infer_dtype(converted[column], skipna=True) != "string"
    ]
    with _CONVERT_STRING:  # the user's setting, not another thread's moment off
        objects = bool(keep) and pyarrow_strings_enabled()
        if objects:
            # What dask does to the other columns; the kept ones stand aside meanwhile
            # (as text, bytes would fail to decode).
            stand_in = converted.copy(deep=False)
            for column in keep:
                stand_in[column] = np.zeros(len(stand_in), dtype=np.int8)
            strings = to_pyarrow_string(stand_in)
            for column in keep:
                strings[column] = converted[column].array
            converted = strings
        with objects_kept() if objects else nullcontext():
            ddf = dd.from_pandas(converted, npartitions=npartitions, chunksize=chunksize, sort=sort)
    return _on_workers(ddf)


def vectors_as_arrow(pdf: Any, column: Any) -> Any:
    """``pdf`` with its object column ``column`` of per-row floating vectors as the
    Arrow ``fixed_size_list`` column :func:`from_pandas` makes of it: a frame a lazy
    search hashes for its key and sends to the workers, which pickle an object column
    cell by cell (a join's pandas side of 100,000 x 64 rows under a client: 16.7 s to
    build, mostly scattering it).  ``pdf`` itself where it is not a pandas frame,
    ``column`` is no such column (torch cells, say, which stay as they are), or its
    rows cannot be stacked (ragged, not numbers: the search names them)."""
    if not isinstance(pdf, pd.DataFrame) or list(pdf.columns).count(column) != 1:
        return pdf
    if column not in vector_columns(pdf[[column]]):
        return pdf
    series = pdf[column]
    try:
        values, null = backends.stack_object_column(series.to_numpy(), series.index, str(column))
    except (TypeError, ValueError):
        return pdf
    if not isinstance(values, np.ndarray) or values.dtype.kind != "f":
        return pdf
    converted = pdf.copy(deep=False)
    converted[column] = pd.Series(vectors_to_arrow(values, null), index=series.index)
    return converted


def _arrow_vectors(series: pd.Series, column: Any) -> pd.Series:
    """An object column of per-row vectors as a ``fixed_size_list`` column."""
    try:
        values, null = backends.stack_object_column(series.to_numpy(), series.index, str(column))
    except ValueError as error:  # ragged rows: of integers and none empty, token ids perhaps
        cells = [np.asarray(x) for x in series.dropna()]
        if not all(c.dtype.kind in "iu" and c.size for c in cells):
            raise
        raise ValueError(
            f"{error}. If {column!r} holds no embeddings (token ids, say), make it an Arrow "
            f"list column first, which from_pandas keeps as it is: pdf[{column!r}] = "
            f"pdf[{column!r}].astype(pd.ArrowDtype(pa.list_(pa.int64())))"
        ) from None
    return pd.Series(vectors_to_arrow(values, null), index=series.index)


def _not_pandas_message(obj: Any) -> str:
    package = type(obj).__module__.split(".")[0]
    kind = type(obj).__name__ if package == "builtins" else f"{package}.{type(obj).__name__}"
    text = f"from_pandas expects a pandas.DataFrame, got {kind}"
    if dask.is_dask_collection(obj):
        return text + "; it is a dask collection already: use it as it is (df.cosim.pairwise)"
    if isinstance(obj, pd.Series):
        return text + "; pass a frame, e.g. from_pandas(series.to_frame())"
    if backends.is_device_frame(obj):
        return text + "; for a cudf frame use dask_cudf.from_cudf(gdf, npartitions=...)"
    return text


def _on_workers(ddf: dd.DataFrame) -> dd.DataFrame:
    """``ddf`` with its partitions scattered to the active client's workers, or ``ddf``.

    A frame made by ``dd.from_pandas`` carries its data inside every graph computed from
    it: with a distributed client, each ``compute`` would ship the whole frame to the
    scheduler again ("Sending large graph").  ``client.scatter`` +
    ``dd.from_delayed(futures)`` (both documented for this) ships it once.
    """
    client = active_client()
    if client is None:
        return ddf
    # The same partitions and divisions dd.from_pandas chose; slicing them out is cheap.
    parts = dask.compute(*ddf.to_delayed(), scheduler="sync")
    futures = scattered.scatter(client, list(parts), hash=False)
    # The partitions are converted already: nothing is left for convert-string to do.
    with objects_kept():
        return dd.from_delayed(futures, meta=ddf._meta, divisions=ddf.divisions, verify_meta=False)


def futures_of(df: dd.DataFrame) -> list[Any]:
    """The distributed futures ``df``'s expression holds (a frame that :func:`from_pandas`
    scattered, or one the user made with ``dd.from_delayed(futures)``); none without
    distributed.  The frame's partitions live only as long as these: a graph built from
    its ``to_delayed()`` does not hold them, so it depends on each through
    :func:`held_where_it_is`."""
    try:
        from distributed import Future
    except ImportError:
        return []
    found = (op for expr in df.expr.walk() for op in expr.operands)
    return list({id(op): op for op in found if isinstance(op, Future)}.values())


def held_where_it_is(*held: Any) -> None:
    """Nothing, as a task on one scattered partition (run where it is held, no data
    moves), or on several such tasks (their Nones move): a graph that needs the
    partitions depends on it, and so holds their futures."""
    return None


def active_client() -> Any:
    """The synchronous distributed Client that ``compute`` would use now, else None."""
    try:
        from distributed import Client, get_worker
    except ImportError:
        return None
    try:
        get_worker()
        return None  # inside a task: the data is where it is needed already
    except ValueError:
        pass
    try:
        scheduler = dask.base.get_scheduler()
    except (RuntimeError, ValueError):
        return None
    client = getattr(scheduler, "__self__", None)  # dask resolves a client to client.get
    if isinstance(client, Client) and not client.asynchronous:
        return client
    return None


@contextmanager
def _naming_numpy(source: str | Path) -> Iterator[None]:
    """numpy's errors for a file it cannot load as numbers, naming the file (numpy's
    own name none): an object array, which only unpickling would load, says so."""
    try:
        yield
    except ValueError as err:
        if "Object arrays cannot be loaded" in str(err):
            raise ValueError(
                f"{str(source)!r} holds an array of Python objects (rows of different "
                "lengths, or arrays in an object array), which only unpickling loads, and "
                "that runs code stored in the file: save the vectors as one (N, D) array of "
                "numbers, e.g. np.save(path, np.stack(rows))"
            ) from None
        raise ValueError(f"{str(source)!r} is not an array numpy reads: {err}") from None


def numpy_vectors(source: str | Path) -> np.ndarray:
    """A .npy file of one array of numbers of shape (N, D): N vectors (e.g. queries).

    Object arrays are refused (``allow_pickle=False``): loading one would run code stored
    in the file.
    """
    with _naming_numpy(source):
        values = np.load(source, allow_pickle=False)
    if values.ndim != 2 or values.dtype.kind not in "fiu":
        raise ValueError(
            f"{str(source)!r} holds an array of shape {values.shape} and dtype {values.dtype}; "
            "expected (N, D) numbers: one vector per row"
        )
    return values


def numpy_frame(
    source: str | Path, a: str = "embeds_a", b: str = "embeds_b", column: str = "embedding"
) -> pd.DataFrame:
    """A .npy array as a frame: (N, D) gives one vector column ``column``; (N, 2, D) two,
    ``a`` and ``b`` (pair i is [i, 0] and [i, 1]).  A .npz holding two (N, D) arrays named
    ``a`` and ``b`` gives those two columns.

    Object arrays are refused (``allow_pickle=False``): loading one would run code stored
    in the file.
    """
    source = Path(source)
    if source.suffix.lower() == ".npy":
        with _naming_numpy(source):
            values = np.load(source, allow_pickle=False)
        if values.ndim == 2:
            return pd.DataFrame({column: vectors_to_arrow(numpy_vectors(source))})
        if values.ndim != 3 or values.shape[1] != 2:
            raise ValueError(
                f"{str(source)!r} holds an array of shape {values.shape}; expected (N, D) "
                "(one vector per row) or (N, 2, D) (pair i is [i, 0] and [i, 1])"
            )
        first, second = values[:, 0], values[:, 1]
    else:
        with _naming_numpy(source), np.load(source, allow_pickle=False) as arrays:
            missing = [c for c in (a, b) if c not in arrays]
            if missing:
                hint = errors.did_you_mean(missing[0], arrays)
                raise KeyError(
                    f"{str(source)!r} has no arrays {missing!r}{hint or ';'} it has "
                    f"{sorted(arrays)!r} (name them with --a/--b)"
                )
            first, second = arrays[a], arrays[b]
        if first.ndim != 2 or first.shape != second.shape:
            raise ValueError(
                f"--a and --b arrays must both be (N, D); got {first.shape} and {second.shape}"
            )
    return pd.DataFrame({a: vectors_to_arrow(first), b: vectors_to_arrow(second)})


def read_pickle(source: str | Path, allow_pickle: bool = False) -> pd.DataFrame:
    """A pandas pickle of a DataFrame, read only with ``allow_pickle`` (unpickling runs
    code stored in the file)."""
    if not allow_pickle:
        raise PermissionError(
            f"refusing to read {str(source)!r}: unpickling runs code stored in the file, "
            "so a pickle from an untrusted source can take over this machine; pass "
            "allow_pickle=True if you trust it"
        )
    frame = pd.read_pickle(source)
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"{str(source)!r} holds a {type(frame).__name__}, not a DataFrame")
    return frame


def source_frame(
    path: str | Path,
    *,
    a: str = "embeds_a",
    b: str = "embeds_b",
    column: str = "embedding",
    allow_pickle: bool = False,
) -> dd.DataFrame:
    """What ``dask-cosim convert`` reads, as a dask frame: a pandas pickle (read only with
    ``allow_pickle``), a .npy or .npz array (:func:`numpy_frame`), a CSV or JSON Lines
    file (:func:`~dask_cosim.io.text.read_text`: its index counts from 0 in every block,
    so write it without), or Parquet."""
    from dask_cosim.io.files import check_parquet_inputs
    from dask_cosim.io.read import read_parquet
    from dask_cosim.io.text import TEXT_SUFFIXES, read_text

    source = Path(path)
    suffix = source.suffix.lower()
    local = (".pkl", ".pickle", ".npy", ".npz", *TEXT_SUFFIXES)
    if suffix in local and not source.exists():
        raise FileNotFoundError(f"{str(path)!r} not found")  # Parquet: any URL, below
    if suffix in (".pkl", ".pickle"):
        return from_pandas(read_pickle(source, allow_pickle))
    if suffix in (".npy", ".npz"):
        return from_pandas(numpy_frame(source, a, b, column))
    if suffix in TEXT_SUFFIXES:
        return read_text(source)
    check_parquet_inputs(
        [str(path)],
        "convert reads pandas pickles, .npy/.npz, CSV, JSON Lines and Parquet",
        converting=True,
    )
    return read_parquet(path)


# What ``cast_vectors`` stores numbers as.
VECTOR_DTYPES = ("float16", "float32", "float64")


def cast_vectors(df: dd.DataFrame, dtype: str) -> dd.DataFrame:
    """``df`` with the numbers of every vector column (Arrow lists) stored as ``dtype``, one
    of :data:`VECTOR_DTYPES`, each rounded to the nearest one.  A finite number beyond the
    type's range (it would become inf, and every cosine of its row NaN) raises when its
    partition is cast, naming the column and the largest magnitude."""
    if dtype not in VECTOR_DTYPES:
        raise ValueError(f"dtype={dtype!r}: vectors are stored as one of {list(VECTOR_DTYPES)}")
    columns = list_columns(df._meta)
    value = pa.from_numpy_dtype(np.dtype(dtype))
    meta = df._meta.assign(
        **{
            str(c): pd.Series([], dtype=pd.ArrowDtype(_cast_type(df._meta[c], value)))
            for c in columns
        }
    )
    return df.map_partitions(_cast_columns, columns, dtype, meta=meta, token="cosim-cast")


def _cast_type(series: pd.Series, value: pa.DataType) -> pa.DataType:
    kind = series.dtype.pyarrow_dtype
    if pa.types.is_fixed_size_list(kind):
        return pa.list_(value, kind.list_size)
    return pa.list_(value)


def _cast_columns(pdf: pd.DataFrame, columns: list[str], dtype: str) -> pd.DataFrame:
    value = pa.from_numpy_dtype(np.dtype(dtype))
    cast = {}
    for column in columns:
        lists = pa.array(pdf[column].array)  # Arrow-backed: its own chunks, not a copy
        if lists.type.value_type == value:
            continue
        flat = pc.list_flatten(lists)  # this partition's values (.values: the whole buffer)
        narrowed = pc.cast(flat, value, safe=False)
        lost = pc.and_(pc.is_finite(flat), pc.invert(pc.is_finite(narrowed)))
        if pc.any(lost).as_py():
            largest = pc.max(pc.abs(pc.filter(flat, lost))).as_py()
            raise ValueError(
                f"column {column!r} holds {largest:g}, beyond the range of {dtype}: keep a "
                "wider dtype"
            )
        array = lists.cast(_cast_type(pdf[column], value), safe=False)
        cast[str(column)] = pd.Series(
            pd.arrays.ArrowExtensionArray(array), index=pdf.index, name=column
        )
    return pdf.assign(**cast)
