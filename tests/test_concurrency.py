"""Concurrent use: many tasks of one computation in threads (dask's threaded scheduler),
several computations at once (one graph of many searches, Python threads each computing
their own), and graphs built from several threads.  Every answer must be the one a
computation alone gives (tests/test_search_results.py checks those against the float64
brute force), with no warning, and nothing of the process's global state (dask's config,
the warnings filters) may be left changed.

Races show only when a thread switch falls in a short window: the tests that look for
one repeat the racy call in several threads for a fraction of a second (some asking
Python to switch threads every microsecond, :func:`switching_often`), which made the
races below show in nearly every run before their fixes."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pandas as pd
import pyarrow as pa
import torch

import dask_cosim
from dask_cosim.backends import tensor_view
from tests.helpers import (
    pairs_frame,
    random_pairs,
    reference,
    search_frame,
    search_vectors,
    to_dask,
)


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
    """``work()`` over and over in ``n`` threads for ``seconds``: what the calls returned.
    The first exception raised in a thread stops them all and is raised here."""
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


def each_in_a_thread(work: Callable[[int], Any], n: int) -> None:
    """``work(0)`` ... ``work(n - 1)`` at once, each in a thread of its own; the first
    exception raised is raised here."""
    errors: list[BaseException] = []

    def call(i: int) -> None:
        try:
            work(i)
        except BaseException as err:  # reported in the test's thread
            errors.append(err)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


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


# --------------------------------------------------------------------------- answers


def frames(n: int = 120, d: int = 8, npartitions: int = 6) -> dict[str, Any]:
    """The same rows (exact and near duplicates) as float16 and float32 Arrow columns and
    an object column of bfloat16 tensors, in many small partitions."""
    x = search_vectors(n, d, seed=1)
    bf16 = torch.from_numpy(x).to(torch.bfloat16)
    cells = np.empty(n, dtype=object)
    for i in range(n):
        cells[i] = bf16[i]
    out = {}
    for name, pdf in [
        ("float16", search_frame(x.astype(np.float16))),
        ("bfloat16", search_frame(x).assign(emb=cells)),
        ("float32", search_frame(x)),
    ]:
        out[name] = to_dask(pdf, npartitions)
    return out


def searches(ddf: Any) -> dict[str, Any]:
    """Lazy results of each kind of search on ``ddf``'s "emb"."""
    return {
        "join": ddf.cosim.join(ddf, "emb", threshold=0.4, columns="id"),
        "neighbors": ddf.cosim.neighbors("emb", k=3),
        "dedup": ddf.cosim.dedup("emb", threshold=0.9),
        "groups": ddf.cosim.groups("emb", threshold=0.9),
        "clustered": ddf.cosim.neighbors(
            "emb", threshold=0.5, method="clustered", clusters=4, n_probe=2
        ),
    }


def assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Each result in ``got`` is the one in ``want``, to the bit."""
    assert got.keys() == want.keys()
    for name, frame in want.items():
        if isinstance(frame, pd.Series):
            pd.testing.assert_series_equal(got[name], frame, check_exact=True, obj=name)
        else:
            pd.testing.assert_frame_equal(got[name], frame, check_exact=True, obj=name)


def test_one_graph_of_every_search_and_dtype_on_eight_threads() -> None:
    jobs = {}
    for dtype, ddf in frames().items():
        jobs |= {f"{name} {dtype}": result for name, result in searches(ddf).items()}
    a, b = random_pairs(2400, 16)
    jobs["pairwise"] = to_dask(pairs_frame(a, b, "fixed_size_list"), 24).cosim.pairwise(
        "embeds_a", "embeds_b"
    )
    alone = dask.compute(jobs, scheduler="sync")[0]
    np.testing.assert_allclose(alone["pairwise"].to_numpy(), reference(a, b), rtol=0, atol=1e-6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        together = dask.compute(jobs, scheduler="threads", num_workers=8)[0]
    assert [str(w.message) for w in caught] == []
    assert_same(together, alone)


def test_python_threads_each_computing_their_own_searches() -> None:
    queries = search_vectors(5, 8, seed=2)
    jobs: dict[str, Any] = {}
    for dtype, ddf in frames().items():
        jobs |= {f"{name} {dtype}": result for name, result in searches(ddf).items()}
        # topk computes when called (dask's default scheduler: threads, in each thread).
        jobs[f"topk {dtype}"] = functools.partial(ddf.cosim.topk, queries, "emb", k=4)

    def run(job: Any) -> Any:
        return job() if callable(job) else dask.compute(job, num_workers=4)[0]

    with dask.config.set(scheduler="sync"):
        alone = {name: run(job) for name, job in jobs.items()}
    names = list(jobs)
    together: dict[str, Any] = {}

    def compute_share(first: int) -> None:
        for name in names[first::4]:
            together[name] = run(jobs[name])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        each_in_a_thread(compute_share, 4)
    assert [str(w.message) for w in caught] == []
    assert_same(together, alone)


_THREADS_SCRIPT = """
import threading, torch, dask_cosim
torch.set_num_threads(2)  # what TorchThreads sets in a worker: fewer than the cores
a = torch.ones(20000, 300)
seen = []
def task():  # a dask worker's task thread
    for _ in range(3):
        dask_cosim.pairwise_cosine(a, a)
        seen.append(torch.get_num_threads())
thread = threading.Thread(target=task)
thread.start()
thread.join()
print(seen)
"""


def test_the_numba_kernel_leaves_the_threads_torch_was_given() -> None:
    """The fused CPU kernel's first parallel call in a thread starts numba's thread pool,
    which (OpenMP layer) set that thread's OpenMP threads, torch's, to all of numba's:
    every later kernel and torch op in a dask task thread then ran on every core, in each
    worker at once.  In a fresh process (numba starts its pool once per process), with
    more numba threads than torch is given."""
    root = str(Path(dask_cosim.__file__).parents[1])
    env = {**os.environ, "NUMBA_NUM_THREADS": "4", "PYTHONPATH": root}
    out = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT], env=env, check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    assert out.split("\n")[-2] == "[2, 2, 2]"
