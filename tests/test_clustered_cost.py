"""What the clustered plan decides from its estimates: exact all-pairs where it expects
that to cost no more (``cosim.search.clustered.exact-when-cheaper``, which the tests
turn off elsewhere: see tests/conftest.py), and a refusal, before anything is routed,
where the routing shuffle has no room for the copies of the rows."""

from __future__ import annotations

import shutil
import types
import warnings
from typing import Any

import dask
import pandas as pd
import psutil
import pytest

from dask_cosim import clustered, clustered_plan
from dask_cosim._cli import cli_spelling
from dask_cosim.datasets import make_embeddings
from dask_cosim.errors import ExactInsteadWarning
from tests.clustered_data import adversarial, frame
from tests.helpers import to_dask
from tests.test_clustered_results import assert_same

CHEAPER = {"cosim.search.clustered.exact-when-cheaper": True}


def clustered_tasks(result: Any) -> bool:
    """Whether the lazy ``result`` routes rows through the clustered search's shuffle."""
    return any("cosim-clustered" in str(key) for key in dict(result.__dask_graph__()))


def test_exact_all_pairs_runs_where_the_plan_expects_it_to_cost_no_more() -> None:
    """600 rows around six centres: every row would be copied to most clusters, for more
    than the all-pairs search costs; exact all-pairs runs instead, with a warning at the
    caller's line, and gives the exact method's result."""
    pdf = frame(adversarial(600))
    ddf = to_dask(pdf, 3)
    want = pdf.cosim.neighbors("emb", threshold=0.9)
    with dask.config.set(CHEAPER):
        with pytest.warns(ExactInsteadWarning, match="runs instead"):
            p = clustered.plan(ddf, "emb", 0.9, clusters=4)
        assert p.cost_vs_exact >= 1 and p.exact_instead
        with pytest.warns(ExactInsteadWarning, match="so method='exact' runs instead") as seen:
            got = ddf.cosim.neighbors("emb", threshold=0.9, method="clustered", clusters=4)
        assert [w.filename for w in seen] == [__file__]
        assert "times exact all-pairs here" in str(seen[0].message)
        assert cli_spelling(str(seen[0].message)).startswith(
            "--method clustered at --threshold 0.9: the plan expects"
        )
        assert "so --method exact runs instead" in cli_spelling(str(seen[0].message))
        assert not clustered_tasks(got)
        assert_same(got.compute(), want, exact_scores=True)
        # dedup, eager, with its removed rows and a carried column: the exact method's.
        with pytest.warns(ExactInsteadWarning, match="so method='exact' runs instead"):
            kept, removed = pdf.cosim.dedup(
                "emb", 0.9, method="clustered", clusters=4, return_removed=True, columns="id"
            )
    want_kept, want_removed = pdf.cosim.dedup("emb", 0.9, return_removed=True, columns="id")
    pd.testing.assert_frame_equal(kept, want_kept)
    pd.testing.assert_frame_equal(removed, want_removed)
    # Turned off (as in the other tests), the same call routes the rows.
    routed = ddf.cosim.neighbors("emb", threshold=0.9, method="clustered", clusters=4)
    assert clustered_tasks(routed)


def test_the_clustered_search_runs_where_it_pays() -> None:
    """20,000 rows around 200 directions: at 0.99 each row goes to about 2 blocks, and
    the plan expects a quarter of the all-pairs cost: the clustered search runs, with no
    warning; at 0.95 (about 8 copies per row) it would cost as much as all pairs."""
    pdf, _ = make_embeddings(20_000, 16, directions=200, duplicates=0.05, seed=1)
    ddf = to_dask(pdf, 2)
    with dask.config.set(CHEAPER), warnings.catch_warnings():
        warnings.simplefilter("error")
        p = clustered.plan(ddf, "emb", 0.99)
        assert p.cost_vs_exact < 0.5 and not p.exact_instead
        kept = ddf.cosim.dedup("emb", 0.99, method="clustered")
    assert clustered_tasks(kept)
    with dask.config.set(CHEAPER), pytest.warns(ExactInsteadWarning, match="runs instead"):
        assert clustered.plan(ddf, "emb", 0.95).exact_instead
    pd.testing.assert_frame_equal(kept.compute(), pdf.cosim.dedup("emb", 0.99))


def test_a_plan_the_shuffle_has_no_room_for_is_refused_before_it_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """On the local schedulers, routed rows that do not fit twice in memory go to partd's
    disk shuffle in dask's temporary directory: more of them than its disk has free is
    refused with the sizes and the ways out, before a partition is read."""
    ddf = to_dask(frame(adversarial(600)), 3)
    p = clustered.plan(ddf, "emb", 0.9, clusters=4)
    tight = types.SimpleNamespace(available=int(1.5 * p.routed_bytes))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: tight)
    room = types.SimpleNamespace(free=int(p.routed_bytes / 2))
    monkeypatch.setattr(shutil, "disk_usage", lambda path: room)
    reads: list[int] = []

    def counting(part: pd.DataFrame) -> pd.DataFrame:
        reads.append(len(part))
        return part

    counted = ddf.map_partitions(counting, meta=ddf._meta)
    # The pairs' budget ("auto") would read the same tight memory: a size of its own.
    limits = {"cosim.search.max-result-bytes": "1GiB", "temporary-directory": str(tmp_path)}
    with dask.config.set(limits, scheduler="sync"):
        with pytest.raises(ValueError, match="iB through the shuffle, more than the") as err:
            clustered.neighbors(counted, "emb", threshold=0.9, clusters=4)
        message = str(err.value)
        assert f"free in dask's temporary-directory ({tmp_path})" in message
        assert "use n_probe=2 (at most 3 copies per row" in message
        assert "or method='exact' (all pairs, no shuffle" in message
        # The commands raise it as a usage error, in their options' spelling.
        assert "use --n-probe 2 (at most 3" in cli_spelling(message)
        assert "or --method exact (all pairs" in cli_spelling(message)
        reads.clear()
        with pytest.raises(ValueError, match="use more clusters, or method='exact'"):
            clustered.dedup(counted, "emb", 0.9, clusters=4, n_probe=1)
        # The plan's three passes (rows counted, the sample, the radii) read each
        # partition; the refusal comes before the search reads any.
        assert len(reads) == 3 * 3
        # A plan that copies every row to more than 8 blocks: refused, with no warning
        # before the error (both would name n_probe=2).
        with warnings.catch_warnings(record=True) as seen, pytest.raises(ValueError):
            warnings.simplefilter("always")
            clustered.neighbors(counted, "emb", threshold=0.5, clusters=30)
        assert not [w for w in seen if "rules out few clusters" in str(w.message)]
        room.free = int(1e15)
        with pytest.warns(UserWarning, match="rules out few clusters here") as said:
            clustered.neighbors(ddf, "emb", threshold=0.5, clusters=30)
        assert [w.filename for w in said] == [__file__]
        # Room enough: it runs.
        room.free = int(2 * p.routed_bytes)
        want = ddf.compute().cosim.neighbors("emb", threshold=0.9)
        got = clustered.neighbors(ddf, "emb", threshold=0.9, clusters=4).compute()
    assert_same(got, want, exact_scores=True)


def test_blocks_hold_a_few_dozen_rows_whatever_the_block_bytes() -> None:
    """Blocks of a few rows (block-bytes of a few KiB) made the routing shuffle more
    partitions than rows (4,000 rows of 32 values at 4 KiB: 22,668): a block holds
    ``MIN_BLOCK_ROWS`` rows at least, and a 1-byte setting plans as that many rows' worth."""
    pdf, _ = make_embeddings(4000, 32, directions=300, seed=5)
    ddf = to_dask(pdf, 3)
    row_bytes = 32 * (2 * 4 + 4) + 64  # a float32 row in a block (clustered_plan)
    floor = clustered_plan.plan(
        ddf, "emb", 0.95, block_bytes=clustered_plan.MIN_BLOCK_ROWS * row_bytes
    )
    tiny = clustered_plan.plan(ddf, "emb", 0.95, block_bytes=1)
    assert tiny.partitions == floor.partitions < 4000
    assert (tiny.layout.members == floor.layout.members).all()


def test_more_clusters_than_rows_plan_one_a_row(caplog: pytest.LogCaptureFixture) -> None:
    """``clusters`` above the rows is taken as the rows (k-means seeds one a row): the
    log said "200000 clusters" of 400 rows, and the sample was sized for them."""
    pdf, _ = make_embeddings(400, 16, directions=20, seed=5)
    with caplog.at_level("INFO", logger="dask_cosim"):
        p = clustered_plan.plan(to_dask(pdf, 2), "emb", 0.9, clusters=200_000)
    assert p.n_clusters <= 400
    assert "of 400 rows, 400 clusters" in caplog.text
