"""Concurrent use: many tasks of one computation in threads (dask's threaded scheduler),
several computations at once (one graph of many searches, Python threads each computing
their own), and graphs built from several threads.  Every answer must be the one a
computation alone gives (tests/test_search.py checks those against the float64 brute
force), with no warning, and nothing of the process's global state (dask's config, the
warnings filters) may be left changed.

Races show only when a thread switch falls in a short window: the tests that look for
one repeat the racy call in several threads for a fraction of a second (some asking
Python to switch threads every microsecond, :func:`switching_often`), which made the
races below show in nearly every run before their fixes."""

from __future__ import annotations

import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import dask
import numpy as np
import pandas as pd
import pyarrow as pa

import dask_cosim
from dask_cosim.backends import tensor_view
from tests.helpers import search_frame, search_vectors, to_dask


@contextmanager
def switching_often() -> Iterator[None]:
    """Python switches threads every microsecond (not every 5 ms) while inside."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def in_threads(work: Callable[[], Any], n: int, seconds: float) -> list[Any]:
    """``work()`` over and over in ``n`` threads for ``seconds``: what each call returned,
    and any exception raised here."""
    stop = threading.Event()
    results: list[Any] = []
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            while not stop.is_set():
                results.append(work())
        except BaseException as err:  # reported in the test's thread
            errors.append(err)
            stop.set()

    threads = [threading.Thread(target=loop) for _ in range(n)]
    for thread in threads:
        thread.start()
    stop.wait(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


# --------------------------------------------------------------------------- global state


def test_building_frames_in_threads_leaves_convert_string_as_it_was() -> None:
    # from_pandas and every search's graph turn dask's string conversion off while they
    # build a frame.  dask.config.set from two threads at once restored the other's
    # temporary value on the way out: the process kept convert-string off for good.
    pdf = search_frame(search_vectors(20, 4))
    pdf["misc"] = [{"row": i} for i in range(len(pdf))]  # an object column kept as is
    ddf = to_dask(search_frame(search_vectors(40, 4)), 4)
    calls = iter(range(1 << 30))  # next() is atomic: threads take turns at the kinds

    def build() -> Any:
        if next(calls) % 4:
            return dask_cosim.from_pandas(pdf, npartitions=2)
        return ddf.cosim.join(ddf, "emb", threshold=0.5)

    # Python's usual thread switching: switching every microsecond, dask's own expression
    # cache races too (a KeyError from dask._expr.SingletonExpr.__new__, a few builds in 6,000).
    with dask.config.set({"dataframe.convert-string": True}):
        frames = in_threads(build, 4, 0.3)
        assert dask.config.get("dataframe.convert-string") is True
    # Each frame was built as the setting says (not in another thread's moment off).
    converted = [f for f in frames if "misc" in f.columns]
    assert converted
    assert not any(pd.api.types.is_object_dtype(f.dtypes["text"]) for f in converted)
    assert all(pd.api.types.is_object_dtype(f.dtypes["misc"]) for f in converted)


def test_read_only_arrays_become_tensors_without_touching_the_warnings_filters() -> None:
    # numpy before 2.1 cannot export a read-only array (an Arrow column's values) through
    # DLPack; torch.from_numpy then, which warns about it.  Silencing that warning with
    # warnings.catch_warnings, in every task of every partition, swapped the process's
    # filters: one task restoring them undid what another thread had set meanwhile.
    class Numpy20(np.ndarray):
        """An array whose DLPack export refuses read-only data, as numpy's did before 2.1."""

        def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
            if not self.flags.writeable:
                raise BufferError("Cannot export readonly array since signalling readonly "
                                  "is unsupported by DLPack.")  # fmt: skip
            return super().__dlpack__(*args, **kwargs)

    values = pa.array(np.arange(64, dtype=np.float32)).to_numpy(zero_copy_only=True)
    array = values.view(Numpy20)
    assert not array.flags.writeable
    before = list(warnings.filters)
    try:
        with warnings.catch_warnings(record=True) as caught, switching_often():
            warnings.simplefilter("always")
            added = []

            def add_filters() -> None:  # a user's thread, setting filters meanwhile
                for i in range(100):
                    added.append(f"set by the user {i}")
                    warnings.filterwarnings("ignore", message=added[-1])
                    time.sleep(0.0005)

            user = threading.Thread(target=add_filters)
            user.start()
            tensors = in_threads(lambda: tensor_view(array), 4, 0.1)
            user.join()
            kept = {f[1].pattern for f in warnings.filters if f[1] is not None}
            assert [message for message in added if message not in kept] == []
        assert caught == []
    finally:
        warnings.filters[:] = before
    assert all(t.data_ptr() == values.ctypes.data for t in tensors)  # no copy
    assert tensors[0].tolist() == values.tolist()
