"""The tools users would use instead of dask_cosim, each written the way its users write it.

The benchmark runner (``python -m benchmarks.pairwise``) times these side by side with our
code on the same pairs.  It imports this module as ``benchmarks.peers``, builds the cases
(setup is untimed), then times ``case.run()`` and checks what it returns against a float64
reference.

    in_memory_peers(a, b)                                   packed arrays in this process
    file_peers(list_parquet, a, b, workdir, processes=2)    data on disk, several processes

Each case does the whole of what its users pay for (for the file peers: process start-up,
loading and gathering) and nothing a user would not do.  Functions that run in other
processes are module-level, so ``benchmarks.peers`` must be importable there: run from the
repository root (``python -m``, or pytest), whose place on ``sys.path`` spawned processes
copy from their parent.
"""

from __future__ import annotations

import multiprocessing
import pathlib
import socket
from concurrent.futures import ProcessPoolExecutor

import dask.dataframe as dd
import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.multiprocessing
import torch.nn.functional as F

from benchmarks.harness import Case


def _tensor_cells(x: np.ndarray, *, copy: bool) -> list[torch.Tensor]:
    """Row i of ``x`` as a (D, 1) tensor, one per row: how users hold embeddings in a frame.

    ``copy=False`` gives views of one tensor over ``x`` (cheap, shares memory);
    ``copy=True`` gives each cell its own storage, as cells that came from unpickling have.
    """
    cells = torch.from_numpy(x).unsqueeze(-1).unbind(0)
    return [c.clone() for c in cells] if copy else list(cells)


def in_memory_peers(a: np.ndarray, b: np.ndarray, *, sample_rows: int = 10_000) -> list[Case]:
    """Peers over pairs already in this process's memory; ``a``, ``b``: (N, D) float arrays."""
    rows = len(a)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)

    def cosine_similarity() -> np.ndarray:
        return F.cosine_similarity(ta, tb, dim=1).numpy()

    def numpy_einsum() -> np.ndarray:
        norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
        return np.einsum("ij,ij->i", a, b) / np.maximum(norms, 1e-8)

    def normalize_then_dot() -> np.ndarray:  # sentence_transformers.util.pairwise_cos_sim
        na, nb = F.normalize(ta, p=2, dim=1), F.normalize(tb, p=2, dim=1)
        return (na * nb).sum(dim=-1).numpy()

    # Cells as users hold them after unpickling: one (D, 1) tensor per row.  They are views
    # of ta/tb here so that setup takes seconds, not minutes, and adds only the ~0.6 KB per
    # tensor object instead of a second copy of the data; torch.stack reads views and
    # separately allocated cells at about the same speed.
    objects = pd.DataFrame(
        {"embeds_a": _tensor_cells(a, copy=False), "embeds_b": _tensor_cells(b, copy=False)}
    )

    def object_column_stack() -> np.ndarray:
        sa = torch.stack(objects["embeds_a"].tolist()).squeeze(-1)
        sb = torch.stack(objects["embeds_b"].tolist()).squeeze(-1)
        return F.cosine_similarity(sa, sb, dim=1).numpy()

    # Row by row costs ~30 us a row (~30x einsum): time a sample, the runner extrapolates.
    sample = min(sample_rows, rows)
    per_row = pd.DataFrame({"a": list(a[:sample]), "b": list(b[:sample])})

    def pandas_row_by_row() -> np.ndarray:
        cos = per_row.apply(
            lambda r: float(np.dot(r.a, r.b) / (np.linalg.norm(r.a) * np.linalg.norm(r.b))),
            axis=1,
        )
        return cos.to_numpy()

    return [
        Case("peer: F.cosine_similarity", cosine_similarity, rows),
        Case("peer: numpy einsum", numpy_einsum, rows),
        Case("peer: normalize then dot", normalize_then_dot, rows),
        Case(
            "peer: object column + torch.stack",
            object_column_stack,
            rows,
            note="(D, 1) tensor per cell",
        ),
        Case(
            "peer: pandas row by row",
            pandas_row_by_row,
            sample,
            note=f"sample of {sample:,} rows, extrapolated",
            repeat=1,
        ),
    ]


def file_peers(
    list_parquet: pathlib.Path,
    a: np.ndarray,
    b: np.ndarray,
    workdir: pathlib.Path,
    *,
    processes: int,
) -> list[Case]:
    """Peers that start from files and use ``processes`` processes.

    ``list_parquet``: a directory of Parquet files holding ``a``, ``b`` as list columns
    "embeds_a", "embeds_b", rows in file-name order.  ``workdir``: scratch space for the
    spawn peer's shards and result (removed by its ``cleanup``).  The dask peer runs on the
    default dask client at call time.
    """
    return [_spawn_gloo_case(a, b, workdir, processes), _dask_case(list_parquet, len(a), a.dtype)]


def _spawn_gloo_case(a: np.ndarray, b: np.ndarray, workdir: pathlib.Path, processes: int) -> Case:
    workdir.mkdir(parents=True, exist_ok=True)
    shards = [workdir / f"spawn-shard-{rank}.pt" for rank in range(processes)]
    result = workdir / "spawn-cos.npy"
    # Written by worker processes, one per shard: twice as fast, and a million small tensors
    # fragment the heap of whoever builds them (~2 GB the runner's process would keep).
    bounds = np.linspace(0, len(a), processes + 1).astype(int)
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        written = [
            pool.submit(_write_shard, path, a[lo:hi], b[lo:hi], int(lo))
            for path, lo, hi in zip(shards, bounds[:-1], bounds[1:])
        ]
        for future in written:
            future.result()
    # Ranks would each start torch.get_num_threads() threads; a careful user divides the
    # cores among them (1 thread per rank when processes == cores) to avoid oversubscription.
    threads = max(1, torch.get_num_threads() // processes)

    def run() -> np.ndarray:
        result.unlink(missing_ok=True)  # a stale result can never pass for this run's
        init_method = f"tcp://127.0.0.1:{_free_port()}"  # fresh per run: repeats can't collide
        torch.multiprocessing.spawn(
            _spawn_worker,
            args=(processes, init_method, threads, [str(p) for p in shards], str(result)),
            nprocs=processes,
            join=True,
        )
        return np.load(result)

    def cleanup() -> None:
        for path in [*shards, result]:
            path.unlink(missing_ok=True)

    return Case(
        "peer: torch.multiprocessing spawn + gloo",
        run,
        len(a),
        note=f"{processes} ranks, torch.save shards, includes start-up",
        repeat=1,
        cleanup=cleanup,
    )


def _write_shard(path: pathlib.Path, a: np.ndarray, b: np.ndarray, start: int) -> None:
    """One rank's rows as these users keep them: a pandas frame of (D, 1) tensors.

    They persist it with torch.save.  The cells are copies, each with its own storage, as
    cells that came from unpickling are: torch.save writes a shared storage once, so views
    would load far faster than anything users have.  Loading a storage per cell (~30 us
    each) dominates the run; that is what these users pay.  df.to_pickle, the other common
    choice, loads 2x slower and peaks at ~1.3x the memory per rank.
    """
    shard = pd.DataFrame(
        {"embeds_a": _tensor_cells(a, copy=True), "embeds_b": _tensor_cells(b, copy=True)},
        index=pd.RangeIndex(start, start + len(a)),
    )
    torch.save(shard, path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn_worker(
    rank: int, world_size: int, init_method: str, threads: int, shards: list[str], result: str
) -> None:
    """One rank: cos of its own shard, all-gathered; rank 0 writes the rows in order."""
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    try:
        # A pandas frame is not a "weight": torch >= 2.6 refuses it unless told otherwise.
        shard = torch.load(shards[rank], weights_only=False)
        ta = torch.stack(shard["embeds_a"].tolist()).squeeze(-1)
        tb = torch.stack(shard["embeds_b"].tolist()).squeeze(-1)
        cos = F.cosine_similarity(ta, tb, dim=1)
        # all_gather needs equal shapes: share the lengths, pad to the longest, trim after.
        lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
        dist.all_gather(lengths, torch.tensor([len(cos)]))
        longest = max(int(n) for n in lengths)
        gathered = [torch.empty(longest, dtype=cos.dtype) for _ in range(world_size)]
        dist.all_gather(gathered, F.pad(cos, (0, longest - len(cos))))
        if rank == 0:
            parts = [g[: int(n)] for g, n in zip(gathered, lengths)]
            np.save(result, torch.cat(parts).numpy())
    finally:
        dist.destroy_process_group()


def _dask_case(list_parquet: pathlib.Path, rows: int, dtype: np.dtype) -> Case:
    def run() -> np.ndarray:
        # Default options: list columns come back as object columns of numpy arrays.
        ddf = dd.read_parquet(str(list_parquet))
        # meta is required: without it dask calls the function on fake rows whose object
        # cells are strings, and np.stack / torch.from_numpy fail ("Metadata inference
        # failed in `_partition_cos`").
        cos = ddf.map_partitions(_partition_cos, meta=("cos", dtype))
        return cos.compute().to_numpy()

    return Case(
        "peer: dask read_parquet + F.cosine_similarity",
        run,
        rows,
        note="map_partitions on the default client",
    )


def _partition_cos(pdf: pd.DataFrame) -> pd.Series:
    """cos per row of one partition; module-level so workers import it by name."""
    # to_numpy() gives an object array of 1-D numpy arrays both for the default object
    # columns and for ArrowDtype list columns (dtype_backend="pyarrow").
    ta = torch.from_numpy(np.stack(pdf["embeds_a"].to_numpy()))
    tb = torch.from_numpy(np.stack(pdf["embeds_b"].to_numpy()))
    return pd.Series(F.cosine_similarity(ta, tb, dim=1).numpy(), index=pdf.index, name="cos")
