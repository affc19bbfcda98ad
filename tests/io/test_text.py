"""CSV and JSON Lines files of embeddings (dask_cosim.io.read_text, ``dask-cosim
convert``): vector cells that are JSON lists become float64 vectors equal to the numbers
the text spells, block after block, null cells null, other columns kept (text with commas
and quotes too), rows numbered across the folder once written without the index; cells
that are not lists of numbers, files with no vector column and ragged rows are named;
``--dtype`` rounds each number to the nearest of the type and refuses one beyond its
range."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import dask_cosim
from dask_cosim.cli import main
from dask_cosim.io import read_text

N, D = 400, 7


def _vectors() -> np.ndarray:
    """float64 rows whose text needs every digit: random values, subnormal and huge
    magnitudes, and a row of integers (JSON writes them without a point)."""
    x = np.random.default_rng(3).standard_normal((N, D))
    x[5] = [5e-324, -1e-300, 1e300, -1.7976931348623157e308, 0.1, 1 / 3, 2.0**-1074]
    x[6] = np.arange(D)
    return x


def _write(path: Path, x: np.ndarray, null_row: int) -> None:
    """``path`` (.csv, .tsv or .jsonl) with columns id, text (commas, quotes, a newline
    inside quotes for CSV) and emb (JSON lists; row ``null_row`` empty)."""
    ids = np.arange(N) * 10
    texts = [f'row {i}, "quoted"' for i in range(N)]
    if path.suffix == ".jsonl":
        with open(path, "w") as f:
            for i in range(N):
                vec = None if i == null_row else [int(v) if i == 6 else v for v in x[i]]
                f.write(json.dumps({"id": int(ids[i]), "text": texts[i], "emb": vec}) + "\n")
        return
    cells = [None if i == null_row else json.dumps(x[i].tolist()) for i in range(N)]
    pdf = pd.DataFrame({"id": ids, "text": texts, "emb": cells})
    pdf.to_csv(path, index=False, sep="\t" if path.suffix == ".tsv" else ",")


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_text_files_read_block_by_block_into_exact_vectors(tmp_path: Path, suffix: str) -> None:
    x = _vectors()
    source = tmp_path / f"emb{suffix}"
    _write(source, x, null_row=201)
    df = read_text(source, blocksize=source.stat().st_size // 5)
    assert df.npartitions >= 4
    assert str(df.dtypes["emb"]) == "list<item: double>[pyarrow]"
    dask_cosim.to_parquet(df, tmp_path / "out", write_index=False)
    got = dask_cosim.read_parquet(tmp_path / "out").compute()
    pd.testing.assert_index_equal(got.index, pd.RangeIndex(N))
    assert got["id"].tolist() == list(np.arange(N) * 10)
    assert got["text"].tolist() == [f'row {i}, "quoted"' for i in range(N)]
    emb = got["emb"]
    assert emb.isna().tolist() == [i == 201 for i in range(N)]
    values = np.stack(emb.drop(index=201).to_numpy())
    np.testing.assert_array_equal(values, np.delete(x, 201, axis=0))  # bit for bit
    cos = got.cosim.topk(x[[7]], "emb", k=1)
    assert cos["match"].tolist() == [7]


def test_convert_writes_a_text_file_as_parquet_and_names_its_bad_cells(tmp_path: Path) -> None:
    x = _vectors()
    _write(tmp_path / "emb.csv", x, null_row=-1)
    runner = CliRunner()
    done = runner.invoke(main, ["convert", str(tmp_path / "emb.csv"), "-o", str(tmp_path / "o")])
    assert done.exit_code == 0, done.output
    assert f"{N} rows" in done.output and "vectors: emb 7 x float64" in done.output
    got = dask_cosim.read_parquet(tmp_path / "o").compute()
    np.testing.assert_array_equal(np.stack(got["emb"].to_numpy()), x)
    assert got.index.equals(pd.RangeIndex(N))

    # --dtype: each number rounded to the nearest of the type; none beyond its range.
    out = tmp_path / "f32"
    done = runner.invoke(main, ["convert", str(tmp_path / "emb.csv"), "-o", str(out),
                                "--dtype", "float32"])  # fmt: skip
    assert done.exit_code == 2 and not out.exists(), done.output
    assert "column 'emb' holds 1.79769e+308, beyond the range of float32: keep a wider dtype" in (
        done.output
    )
    x[5] = 0.25  # row 5 held numbers beyond float32's range
    _write(tmp_path / "small.jsonl", x, null_row=-1)
    done = runner.invoke(main, ["convert", str(tmp_path / "small.jsonl"), "-o", str(out),
                                "--dtype", "float32"])  # fmt: skip
    assert done.exit_code == 0 and "vectors: emb 7 x float32" in done.output, done.output
    got = dask_cosim.read_parquet(out).compute()
    np.testing.assert_array_equal(np.stack(got["emb"].to_numpy()), x.astype(np.float32))

    cases = {
        "bad.csv": ('id,emb\n0,"[1, 2, 3]"\n1,"[1, x, 2]"\n', "column 'emb' holds '[1, x, 2]', "
                    'not a list of numbers such as "[0.1, 0.2, 0.3]": fix or drop that row'),
        "bad.jsonl": ('{"id": 0, "emb": [1, 2]}\n{"id": 1, "emb": [1, "a"]}\n',
                      "column 'emb' holds '[1, \"a\"]', not a list of numbers"),
        "numpy.csv": ('id,emb\n0,"[1. 2. 3.]"\n', "numpy.csv' has no column of vectors among "
                      "['id', 'emb']: a vector cell is a JSON list of numbers"),
        "array.json": ('[{"id": 0, "emb": [1, 2]}]', "array.json' is one JSON array, not JSON "
                       "Lines (one record per line, {...})"),
        "ragged.csv": ('id,emb\n0,"[1, 2, 3]"\n1,\n2,"[1, 2]"\n',
                       "column 'emb' holds '[1.0, 2.0]', a vector of 2 values, where most of "
                       "its rows hold 3; every row of an embedding column needs the same length"),
        # One odd first row is the one named, not every row after it.
        "odd-first.csv": ('id,emb\n0,"[1, 2]"\n1,"[1, 2, 3]"\n2,"[4, 5, 6]"\n',
                          "column 'emb' holds '[1.0, 2.0]', a vector of 2 values, where most of "
                          "its rows hold 3"),
        "empty.jsonl": ('{"emb": [1, 2]}\n{"emb": []}\n', "column 'emb' holds '[]', a vector of "
                        "0 values, where most of its rows hold 2; every row of an embedding column "
                        "needs the same length: write null for a row without a vector"),
        "ragged.jsonl": ('{"emb": [1, 2]}\n{"emb": null}\n{"emb": [1]}\n',
                         "column 'emb' holds '[1.0]', a vector of 1 values, where most of its "
                         "rows hold 2"),
        "empty.csv": ("\n", "empty.csv' is empty: no header, no rows"),
        "bad-text.jsonl": ('{"emb": "[1, 2]"}\n{"emb": "[1, x]"}\n',
                           "column 'emb' holds '[1, x]', not a list of numbers"),
    }  # fmt: skip
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        out = tmp_path / f"{name}-out"
        done = runner.invoke(main, ["convert", str(tmp_path / name), "-o", str(out)])
        assert done.exit_code == 2, (name, done.output)
        assert message in done.output, (name, done.output)
        # Every message names the file (a cell's block numbers its rows from 0).
        assert f"Error: {str(tmp_path / name)!r}" in done.output, (name, done.output)
        assert not out.exists()

    # Vectors as JSON text in JSON Lines (as CSV holds them) read as in CSV.
    (tmp_path / "text.jsonl").write_text('{"id": 0, "emb": "[1, 2]"}\n{"id": 1, "emb": null}\n')
    done = runner.invoke(main, ["convert", str(tmp_path / "text.jsonl"), "-o", str(out)])
    assert done.exit_code == 0 and "vectors: emb 2 x float64" in done.output, done.output
    got = dask_cosim.read_parquet(out).compute()["emb"]
    assert got.isna().tolist() == [False, True] and list(got.iloc[0]) == [1.0, 2.0]

    # Both kinds in one column, either first (pyarrow's reader takes one kind a column:
    # "changed from string to array", or the text named as no list of numbers).
    for name, rows in {
        "lists-first.jsonl": '{"emb": [1, 2], "id": 1}\n{"emb": "[3, 4]", "id": 2}\n{"id": 3}\n',
        "text-first.jsonl": '{"emb": "[1, 2]", "id": 1}\n{"emb": [3, 4], "id": 2}\n{"id": 3}\n',
    }.items():
        (tmp_path / name).write_text(rows)
        out = tmp_path / f"{name}-out"
        done = runner.invoke(main, ["convert", str(tmp_path / name), "-o", str(out)])
        assert done.exit_code == 0, (name, done.output)
        got = dask_cosim.read_parquet(out).compute()
        assert got["id"].tolist() == [1, 2, 3] and got["emb"].isna().tolist() == [0, 0, 1]
        assert [list(v) for v in got["emb"].iloc[:2]] == [[1.0, 2.0], [3.0, 4.0]], name
    # A ragged row among them is named with its file, as in a column of one kind.
    (tmp_path / "mixed-ragged.jsonl").write_text(
        '{"emb": "[1, 2]"}\n{"emb": [3, 4]}\n{"emb": "[5]"}\n'
    )
    out = tmp_path / "mixed-ragged-out"
    done = runner.invoke(main, ["convert", str(tmp_path / "mixed-ragged.jsonl"), "-o", str(out)])
    assert done.exit_code == 2 and "mixed-ragged.jsonl': column 'emb' holds '[5.0]'" in done.output


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_topk_queries_from_a_text_file_are_named_by_position(
    tmp_path: Path, suffix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dask-cosim topk --queries q.jsonl``: the queries of a file of several blocks
    (each numbering its rows from 0) are numbered 0..N-1 across the file."""
    from dask_cosim import runs
    from dask_cosim.io import text

    x = _vectors()
    source = tmp_path / f"queries{suffix}"
    _write(source, x, null_row=3)
    monkeypatch.setattr(text, "BLOCK_BYTES", source.stat().st_size // 4)
    queries = runs.read_queries(str(source), "emb", "vec")
    pd.testing.assert_index_equal(queries.index, pd.RangeIndex(N))
    assert queries.isna().tolist() == [i == 3 for i in range(N)]
    np.testing.assert_array_equal(np.stack(queries.drop(index=3).to_numpy()), np.delete(x, 3, 0))
    with pytest.raises(KeyError, match=r"--query-on column \(in .*\) 'vec' not found"):
        runs.read_queries(str(source), "vec", "emb")
    # No --query-on: --on's name is looked for; said so, with the queries' vector column
    # (it named --query-on, which the user never gave, and suggested nothing).
    with pytest.raises(
        KeyError,
        match=r"has no column --on 'vec' and no --query-on is given: column 'vec' not found; "
        r"did you mean 'emb', the only vector column\?",
    ):
        runs.read_queries(str(source), None, "vec")
