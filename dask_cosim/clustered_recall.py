"""Recall of a clustered run, measured against exact all-pairs on a sample of rows (the
graph, and its per-partition functions below).

A clustered run in exact mode (``n_probe=None``) finds every pair; with ``n_probe`` set it
may miss some, and how many is measured here, never assumed: a random sample of rows is
searched exactly against every row (the all-pairs kernels, float64 decisions, the
earlier row first: :func:`sample_truth`), and the pairs the run reported for those rows
are compared with it (:func:`neighbors_recall`, :func:`dedup_recall`).  The truth costs
``sample_rows x rows`` pair scores (1/50 of the all-pairs search of a million rows for
10,000 sampled rows); computed once at the lowest threshold, it serves every run and
every higher threshold::

    truth = sample_truth(df, "emb", 0.9, sample_rows=10_000)
    pairs = clustered.neighbors(df, "emb", threshold=0.9, n_probe=2)
    neighbors_recall(truth, pairs).recall

Rows are matched by their index labels, so the sampled rows' labels must name one row
each; where they repeat (a dask frame's ``reset_index`` numbers each partition from 0),
a column that names each row does instead (``id_column``), carried into the run's
result (``columns=[id_column]``: its ``left_<id>`` and ``right_<id>``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dask
import numpy as np
import pandas as pd
import torch

from dask_cosim import backends, options, search
from dask_cosim import clustered_partition as cp
from dask_cosim import search_kernels as sk

__all__ = [
    "Recall",
    "Sample",
    "Truth",
    "dedup_recall",
    "join_samples",
    "neighbors_recall",
    "sample_matches",
    "sample_truth",
    "take_rows",
]


@dataclass
class Recall:
    """What a clustered run found for a sample of rows, against the exact answer.

    ``expected``: pairs involving a sampled row (``neighbors``) or sampled rows to drop
    (``dedup``) in the exact answer; ``found``: how many of those the run reported;
    ``extra``: how many it reported that the exact answer lacks (0 unless something is
    wrong: every pair a clustered run reports is scored exactly).
    """

    rows: int
    expected: int
    found: int
    extra: int

    @property
    def recall(self) -> float:
        """found / expected (1.0 when nothing was expected)."""
        return self.found / self.expected if self.expected else 1.0


@dataclass
class Truth:
    """Sampled rows of ``column`` (``labels``: index labels, or the values of
    ``id_column``; frame-order ``keys``) and their exact matches among all rows at
    ``threshold`` or above: ``matches`` has "_s" (the sampled row's position), "_key",
    "label" and "score" (float64) of the match."""

    threshold: float
    labels: pd.Index
    keys: np.ndarray
    matches: pd.DataFrame
    column: str
    id_column: Any

    def at(self, threshold: float | None) -> pd.DataFrame:
        if threshold is None or threshold == self.threshold:
            return self.matches
        threshold = options.search_threshold(threshold, required=True)  # 2 gave recall 1.0
        assert threshold is not None  # (required)
        if threshold < self.threshold:
            raise ValueError(
                f"threshold={threshold!r} is below the truth's {self.threshold!r}: compute "
                "sample_truth at the lowest threshold you measure"
            )
        return self.matches[self.matches["score"].to_numpy() >= threshold]


def sample_truth(
    df: Any,
    on: str,
    threshold: float,
    *,
    sample_rows: int = 10_000,
    seed: int = 0,
    id_column: Any = None,
) -> Truth:
    """``sample_rows`` random rows of ``df`` and their exact matches among all rows
    (computes now, on the active scheduler).  Rows are named by their index labels, or
    by the values of ``id_column`` (carry it into the run measured: ``columns=[...]``);
    either must name each sampled row once."""
    meta = df._meta if dask.is_dask_collection(df) else df
    search.check_column(df, on)  # as the searches check it: a name two columns share too
    if id_column is not None:
        backends.check_column_name(meta, id_column, "id_column", "id_column: column")
        backends.check_named_once(meta.columns, id_column, "id_column: column")
    sample_rows = options.integer(sample_rows, 1, "sample_rows", ", e.g. 10_000")
    checked = options.search_threshold(threshold, required=True)
    assert checked is not None  # (required)
    threshold = checked
    eps = options.eps()
    device = options.device()
    tile = options.search_tile_bytes()["cuda" if device.startswith("cuda") else "cpu"]
    lazy = dask.is_dask_collection(df)
    column = df[[on] if id_column is None else [on, id_column]]
    # The lengths of an empty projection: a Parquet read reads the index alone for them.
    lens = df[[]].map_partitions(len).compute().to_numpy() if lazy else np.array([len(df)])
    n = int(lens.sum())
    rng = np.random.default_rng(seed)
    picked = np.sort(rng.choice(n, size=min(sample_rows, n), replace=False))
    starts = np.r_[0, np.cumsum(lens)]
    parts = column.to_delayed() if lazy else [df]
    call = dask.delayed(pure=True) if lazy else (lambda fn: fn)
    taken = [
        call(take_rows)(
            p, on, picked[(picked >= starts[i]) & (picked < starts[i + 1])] - starts[i],
            id_column, partition_info={"number": i},
        )
        for i, p in enumerate(parts)
    ]  # fmt: skip
    sample = call(join_samples)(*taken, eps=eps)
    matches = [
        call(sample_matches)(
            p,
            on,
            sample,
            threshold,
            eps=eps,
            tile_bytes=tile,
            device=device,
            id_column=id_column,
            partition_info={"number": i},
        )
        for i, p in enumerate(parts)
    ]
    if lazy:
        sample, matches = dask.compute(sample, matches)
    hits = sum(h for _, h in matches)
    if len(sample.labels.unique()) != len(sample.labels) or hits != len(sample.labels):
        raise _labels_repeat(len(sample.labels), hits, id_column, lazy)
    found = pd.concat([m for m, _ in matches], ignore_index=True)
    return Truth(threshold, sample.labels, sample.keys, found, on, id_column)


def _labels_repeat(sampled: int, hits: int, id_column: Any, lazy: bool) -> ValueError:
    if id_column is not None:
        return ValueError(
            f"the {sampled} sampled rows' values of id_column={id_column!r} name {hits} "
            "rows; recall matches rows by them, so they must be unique"
        )
    # A dask frame's reset_index numbers each partition from 0: its labels repeat still.
    fix = (
        "give a column that names each row, sample_truth(..., id_column='id'), and carry "
        "it in the run (columns=['id']); dask_cosim.read_parquet numbers a folder's rows "
        "across its files"
        if lazy
        else "df.reset_index() first, or give a column that names each row, "
        "sample_truth(..., id_column='id'), and carry it in the run (columns=['id'])"
    )
    return ValueError(
        f"the {sampled} sampled rows' index labels name {hits} rows; recall matches rows "
        f"by label, so labels must be unique: {fix}"
    )


def _named(result: Any, truth: Truth, names: list[Any], what: str) -> None:
    """Raises unless ``result`` (``what``: a run's result, for the error) holds the
    columns ``names`` that name its rows as ``truth`` does."""
    columns = list((result._meta if dask.is_dask_collection(result) else result).columns)
    missing = [n for n in names if n not in columns]
    if missing:
        carried = truth.id_column is not None
        carry = f"; run it with columns=[{truth.id_column!r}]" if carried else ""
        raise ValueError(
            f"{what} lacks the column {missing[0]!r} that names rows as the truth does "
            f"(columns: {columns!r}){carry}"
        )


def neighbors_recall(truth: Truth, pairs: Any, threshold: float | None = None) -> Recall:
    """Recall of ``pairs`` (a ``neighbors(threshold=...)`` result, lazy or computed) on
    the truth's sampled rows, at ``threshold`` (default: the truth's)."""
    ids = truth.id_column
    left, right = ("left", "right") if ids is None else (f"left_{ids}", f"right_{ids}")
    _named(pairs, truth, [left, right], "pairs (a neighbors result)")
    exact = truth.at(threshold)
    s = exact["_s"].to_numpy()
    first = (truth.keys[s] < exact["_key"].to_numpy()).tolist()
    mine, theirs = truth.labels[s].tolist(), exact["label"].tolist()
    expected = {(a, b) if f else (b, a) for a, b, f in zip(mine, theirs, first, strict=True)}
    wanted = list(truth.labels)
    touching = pairs[pairs[left].isin(wanted) | pairs[right].isin(wanted)]
    got = touching.compute() if dask.is_dask_collection(touching) else touching
    reported = set(zip(got[left].tolist(), got[right].tolist(), strict=True))
    found = len(expected & reported)
    return Recall(len(wanted), len(expected), found, len(reported - expected))


def dedup_recall(truth: Truth, kept: Any, threshold: float | None = None) -> Recall:
    """Recall of ``kept`` (a ``dedup`` result, lazy or computed; with
    ``return_removed=True``, the pair it returns or its kept frame) on the truth's
    sampled rows, at ``threshold`` (default: the truth's): the sampled rows exact dedup
    drops (they have an earlier match), and how many of them ``kept`` lacks."""
    if isinstance(kept, tuple) and len(kept) == 2:
        kept = kept[0]  # dedup(..., return_removed=True): (kept, removed)
    meta = kept._meta if dask.is_dask_collection(kept) else kept
    columns = list(getattr(meta, "columns", []))
    pairs = {"left", "right", "score"} <= set(columns) and truth.column not in columns
    if not hasattr(meta, "index") or pairs:
        raise ValueError(
            "kept must be the frame dedup keeps (any of its columns, or none); got "
            f"{type(kept).__name__}"
            + (f" of columns {columns!r}" if columns else "")
            + " (for a neighbors result, use neighbors_recall)"
        )
    if truth.id_column is not None:
        _named(kept, truth, [truth.id_column], "kept")
    exact = truth.at(threshold)
    s = exact["_s"].to_numpy()
    earlier = exact["_key"].to_numpy() < truth.keys[s]
    must_drop = set(truth.labels[np.unique(s[earlier])])
    wanted = list(truth.labels)
    if truth.id_column is not None:
        ids = kept[truth.id_column]
        still = ids[ids.isin(wanted)]
        still = still.compute() if dask.is_dask_collection(still) else still
    elif dask.is_dask_collection(kept):
        still = kept.map_partitions(
            lambda part: part.index[part.index.isin(wanted)].to_series(),
            meta=pd.Series([], dtype=kept._meta.index.dtype),
        ).compute()
    else:
        still = kept.index[kept.index.isin(wanted)].to_series()
    dropped = set(wanted) - set(still.tolist())
    return Recall(len(wanted), len(must_drop), len(must_drop & dropped), len(dropped - must_drop))


# --------------------------------------------------------------------------- per partition


@dataclass
class Sample:
    """Rows sampled to measure recall: their raw values and null marks (CPU), keys and
    labels; ``prep`` once :func:`join_samples` prepared them."""

    raw: torch.Tensor
    null: torch.Tensor
    keys: np.ndarray
    labels: pd.Index
    prep: sk.Prepared | None = None


def take_rows(
    df: Any,
    column: str,
    positions: np.ndarray,
    id_column: Any = None,
    partition_info: dict[str, Any] | None = None,
) -> Sample:
    """The rows of one partition at ``positions``, named by their index labels or by
    ``id_column``'s values."""
    part = cp.partition_number(partition_info)
    rows = np.asarray(positions, dtype=np.int64)
    v = backends.to_vectors(df[column], column)
    x = (v.blocks[0] if len(v.blocks) == 1 else torch.cat(v.blocks)).cpu()
    null = torch.zeros(len(x), dtype=torch.bool) if v.null is None else torch.as_tensor(v.null)
    picked = torch.from_numpy(rows)
    names = _row_names(df, id_column)
    return Sample(x[picked], null.cpu()[picked], cp.row_keys(part, len(df))[rows], names[rows])


def _row_names(df: Any, id_column: Any) -> pd.Index:
    """A partition's index labels, or its ``id_column``'s values, as a pandas Index."""
    if id_column is None:
        return cp.labels(df)
    values = df[id_column]
    return pd.Index(values.to_pandas() if hasattr(values, "to_pandas") else values)


def join_samples(*parts: Sample, eps: float) -> Sample:
    """One Sample of ``parts``, prepared with ``eps``."""
    raw = torch.cat([p.raw for p in parts])
    null = torch.cat([p.null for p in parts])
    labels = parts[0].labels.append([p.labels for p in parts[1:]])
    keys = np.concatenate([p.keys for p in parts])
    return Sample(raw, null, keys, labels, sk.prepare(raw, null, eps=eps, device="cpu"))


def sample_matches(
    df: Any,
    column: str,
    sample: Sample,
    threshold: float,
    *,
    eps: float,
    tile_bytes: int,
    device: str = "cpu",
    id_column: Any = None,
    partition_info: dict[str, Any] | None = None,
) -> tuple[pd.DataFrame, int]:
    """Exact matches of the sampled rows among one partition's rows ("_s": the sampled
    row's position in the sample, "_key", "label" and "score": the match's), decided as
    the all-pairs search decides them (float64, the earlier row first); and how many of
    the partition's rows carry a sampled row's label (index label, or ``id_column``'s
    value).  Computed on ``device`` (the ``cosim.device`` option: "auto" follows the
    partition)."""
    assert sample.prep is not None
    part = cp.partition_number(partition_info)
    prep = cp.prepared_rows(df, column, eps, device)
    mine = sample.prep.to(prep.unit.device)
    keys = cp.row_keys(part, len(df))
    i, j, _ = sk.threshold_pairs(
        mine, prep, threshold - 2.0**-50, tile_bytes=tile_bytes, exact_scores=False
    )
    ki = torch.from_numpy(sample.keys).to(i.device)[i]
    kj = torch.from_numpy(keys).to(j.device)[j]
    first = ki < kj
    score = torch.empty(len(i), dtype=torch.float64, device=i.device)
    score[first] = sk.rescore(mine, i[first], prep, j[first])
    score[~first] = sk.rescore(prep, j[~first], mine, i[~first])
    keep = ((score >= threshold) & (ki != kj)).cpu().numpy()
    i, kj, j, score = (t.cpu() for t in (i, kj, j, score))
    labels = _row_names(df, id_column)
    found = pd.DataFrame(
        {
            "_s": i.numpy()[keep],
            "_key": kj.numpy()[keep],
            "label": labels.take(j.numpy()[keep]),
            "score": score.numpy()[keep],
        }
    )
    return found, int(labels.isin(sample.labels).sum())
