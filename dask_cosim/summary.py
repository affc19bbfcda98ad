"""``summarize(series)``: count, nulls, mean, min, max and a histogram in one pass, and
the :class:`Summary` it returns, which prints itself as text and draws its histogram.

On a dask Series it is one tree reduction (one ``compute``, each partition read once); on
an eager pandas or cudf Series the same two functions run directly.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import dask
import numpy as np
import pandas as pd

from dask_cosim import backends

__all__ = ["Summary", "summarize"]

# Statistics before the histogram counts in a partial result (a float64 Series: counts
# stay exact up to 2**53 rows).
_STATS = ["rows", "nulls", "sum", "min", "max"]


@dataclass(frozen=True, eq=False)
class Summary:
    """What :func:`summarize` found.

    ``rows == nulls + counts.sum() + outside``.  ``mean``, ``min`` and ``max`` are over
    the non-null values (NaN when there are none; +-inf are values, not nulls: counted
    in ``outside``, they make ``mean`` infinite, NaN with both); ``counts[i]`` counts
    the values in ``[edges[i], edges[i + 1])``, the last bin including its right edge.
    Two summaries are equal where every field is (NaN equal to NaN); unhashable, as it
    holds arrays.
    """

    rows: int
    nulls: int
    mean: float
    min: float
    max: float
    edges: np.ndarray
    counts: np.ndarray
    outside: int

    def __eq__(self, other: object) -> bool:
        # The dataclass's own compared the arrays as tuples: "truth value of an array is
        # ambiguous".
        if not isinstance(other, Summary):
            return NotImplemented
        return all(
            np.array_equal(getattr(self, f.name), getattr(other, f.name), equal_nan=True)
            for f in fields(self)
        )

    __hash__ = None  # type: ignore[assignment]

    def format(self, seconds: float | None = None, embedding_bytes: int | None = None) -> str:
        """The summary as lines of text, with a histogram of ``#`` bars (bin labels, bars
        and counts each in a column of their own; the last bin includes its right edge).
        Mean, min and max read "none" where there is no value (no rows, or all null).

        With ``seconds`` (how long the run took), a line of time and throughput (pairs/s,
        and GB/s of ``embedding_bytes`` read) comes before the histogram.
        """
        lines = [f"rows        {self.rows:,}", f"nulls       {self.nulls:,}"]
        if self.rows > self.nulls:
            lines += [
                f"mean        {self.mean:+.6f}",
                f"min / max   {self.min:+.6f} / {self.max:+.6f}",
            ]
        else:  # no value to average: "+nan" read as a result
            none = "none (no rows)" if self.rows == 0 else "none (every row is null)"
            lines += [f"mean        {none}", f"min / max   {none}"]
        if seconds is not None:
            rate = f"{self.rows / seconds:,.0f} pairs/s"
            if embedding_bytes is not None:
                rate += f", {embedding_bytes / seconds / 1e9:.2f} GB/s of embeddings"
            lines.append(f"time        {seconds:.2f} s  ({rate})")
        lines.append("histogram")
        top = max(1, int(np.max(self.counts))) if len(self.counts) else 1
        last = len(self.counts) - 1
        rows = [
            (f"[{lo:+.2g}, {hi:+.2g}{']' if i == last else ')'}", "#" * int(40 * c / top), int(c))
            for i, (lo, hi, c) in enumerate(zip(self.edges[:-1], self.edges[1:], self.counts))
        ]
        if self.outside:
            rows.append(
                (f"outside [{self.edges[0]:+.2g}, {self.edges[-1]:+.2g}]", "", self.outside)
            )
        # Labels and counts padded to their widest, so that bars and counts line up.
        width = max((len(label) for label, _, _ in rows), default=0)
        digits = max((len(f"{c:,}") for _, _, c in rows), default=0)
        lines += [f"  {label:<{width}}  {bar:<40} {c:>{digits},}" for label, bar, c in rows]
        return "\n".join(lines)

    def plot(self, path: str | os.PathLike[str]) -> str:
        """Draw the histogram into the image file ``path`` and return where it went, or,
        without matplotlib (an optional dependency: the ``bench`` extra), why not."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return "not drawn: pip install matplotlib (or dask-cosim[bench])"
        fig, ax = plt.subplots(figsize=(6, 3.5))
        edges = self.edges
        ax.bar(edges[:-1], self.counts, width=np.diff(edges), align="edge", edgecolor="white")
        ax.set_xlabel("cosine similarity")
        ax.set_ylabel("pairs")
        ax.set_title(f"{self.rows:,} pairs, mean {self.mean:+.3f}")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return str(path)


def summarize(
    series: Any,
    bins: int | Sequence[float] | np.ndarray = 10,
    range: tuple[float, float] = (-1.0, 1.0),
) -> Summary:
    """Rows, nulls, mean, min, max and a histogram of a numeric Series, in one pass.

    Parameters
    ----------
    series : dask, pandas or cudf Series
        Numbers, e.g. the result of ``df.cosim.pairwise``.  NaN and null both count as
        nulls.  A dask Series is computed once (one tree reduction), with whichever
        scheduler or ``distributed.Client`` is active.
    bins : int or sequence of float, default 10
        Equal-width bins over ``range``, or the bin edges themselves (increasing).
    range : (float, float), default (-1.0, 1.0)
        The histogram's span when ``bins`` is an int; values outside it are counted in
        ``Summary.outside``, not in a bin.

    Returns
    -------
    Summary
        ``rows``, ``nulls``, ``mean``, ``min``, ``max``, ``edges``, ``counts``, ``outside``;
        ``Summary.format()`` gives the text the command line prints.

    Raises
    ------
    TypeError
        ``series`` is not a Series of real numbers (bool and complex are not).
    ValueError
        ``bins`` or ``range`` do not describe increasing, finite edges.

    Examples
    --------
    >>> cos = df.cosim.pairwise("embeds_a", "embeds_b")
    >>> s = dask_cosim.summarize(cos, bins=20)
    >>> s.mean, s.counts
    """
    edges = _edges(bins, range)
    meta = series._meta if dask.is_dask_collection(series) else series
    if getattr(meta, "ndim", None) != 1 or not hasattr(meta, "dtype"):
        raise TypeError(
            f"summarize() takes a Series of numbers, got {type(series).__name__}; for a "
            "column of a frame, pass df[column]"
        )
    dtype = meta.dtype
    if (
        not pd.api.types.is_numeric_dtype(dtype)
        or pd.api.types.is_bool_dtype(dtype)
        or pd.api.types.is_complex_dtype(dtype)  # its real part alone would be summarised
    ):
        name = getattr(meta, "name", None)
        which = "the Series" if name is None else f"Series {name!r}"
        raise TypeError(f"summarize() takes a Series of real numbers; {which} has dtype {dtype}")
    if dask.is_dask_collection(series):
        totals = series.reduction(
            _partial,
            aggregate=_combine,
            meta=pd.Series(dtype="float64"),
            token="cosim-summarize",
            chunk_kwargs={"edges": edges},
        ).compute()
    else:
        totals = _combine(pd.DataFrame([_partial(series, edges)]))
    rows, nulls, total, lo, hi = (float(totals[k]) for k in _STATS)
    counts = totals.iloc[len(_STATS) :].to_numpy().astype(np.int64)
    valid = int(rows - nulls)
    return Summary(
        rows=int(rows),
        nulls=int(nulls),
        mean=total / valid if valid else math.nan,
        min=lo if valid else math.nan,
        max=hi if valid else math.nan,
        edges=edges,
        counts=counts,
        outside=valid - int(counts.sum()),
    )


def _edges(bins: Any, span: Any) -> np.ndarray:
    if isinstance(bins, (int, np.integer)) and not isinstance(bins, bool):
        if bins < 1:
            raise ValueError(f"bins={bins!r} must be a positive number of bins, e.g. bins=10")
        try:
            lo, hi = (float(x) for x in span)
        except (TypeError, ValueError):
            lo = hi = math.nan
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(
                f"range={span!r} must be two finite numbers, low < high, e.g. range=(-1, 1)"
            )
        return np.linspace(lo, hi, int(bins) + 1)
    try:
        edges = np.asarray(bins, dtype=np.float64)
    except (TypeError, ValueError):
        edges = np.array([])
    if (
        edges.ndim != 1
        or len(edges) < 2
        or not np.isfinite(edges).all()
        or (np.diff(edges) <= 0).any()
    ):
        raise ValueError(
            f"bins={bins!r} must be a number of bins or at least two increasing, finite "
            "edges, e.g. bins=10 or bins=[-1, 0, 0.5, 1]"
        )
    return edges


def _partial(s: Any, edges: np.ndarray) -> pd.Series:
    """One partition's rows, nulls, sum, min, max and bin counts."""
    s = backends.to_pandas(s)  # cudf: one float per row, cheap to bring to the host
    values = s.to_numpy(dtype=np.float64, na_value=np.nan)
    valid = values[~np.isnan(values)]
    counts = np.histogram(valid, bins=edges)[0] if len(valid) else np.zeros(len(edges) - 1)
    with np.errstate(invalid="ignore"):  # +inf + -inf: NaN, as pandas makes it quietly
        total = valid.sum()
    stats = [
        len(values),
        len(values) - len(valid),
        total,
        valid.min() if len(valid) else math.inf,
        valid.max() if len(valid) else -math.inf,
    ]
    return pd.Series(np.concatenate([stats, counts]).astype(np.float64), index=_index(edges))


def _combine(parts: pd.DataFrame) -> pd.Series:
    """Partial results, one row each -> one partial result.  A NaN sum (+inf beside -inf
    in a partition) stays NaN, as pandas' mean of such values is: skipped, it would
    leave a mean of the other partitions over every partition's rows."""
    out = parts.sum(axis=0, skipna=False)
    out["min"] = parts["min"].min()
    out["max"] = parts["max"].max()
    return out


def _index(edges: np.ndarray) -> list[str]:
    return _STATS + [f"bin{i}" for i in np.arange(len(edges) - 1)]
