"""What a new user meets first: messages that name the fix, the command line's words."""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
import sys
from pathlib import Path

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import dask_cosim
from tests.helpers import cli_here, random_pairs, reference

BINARY_FIX = (
    "not vectors: Parquet written by dask_cosim.to_parquet stores each vector as raw bytes "
    "(layout='binary'), which other readers such as pd.read_parquet and dd.read_parquet return "
    "as they are. Read the files with dask_cosim.read_parquet(path), or write them with "
    "dask_cosim.to_parquet(df, path, layout='list') for other tools."
)


def run(*args: str) -> tuple[int, str]:
    proc = cli_here(*args)
    return proc.returncode, proc.stdout


@pytest.fixture
def binary_folder(tmp_path: Path) -> Path:
    a, b = random_pairs(40, 8)
    pdf = pd.DataFrame({"embeds_a": list(a), "embeds_b": list(b)})
    dask_cosim.to_parquet(dask_cosim.from_pandas(pdf), tmp_path / "bin")
    return tmp_path / "bin"


def test_binary_layout_read_by_pandas_names_the_reader(binary_folder: Path) -> None:
    objects = pd.read_parquet(binary_folder)  # one bytes object per row
    with pytest.raises(
        TypeError, match=re.escape(f"column 'embeds_a': row 0 holds bytes (object), {BINARY_FIX}")
    ):
        objects.cosim.pairwise("embeds_a", "embeds_b")
    arrow = pd.read_parquet(binary_folder, dtype_backend="pyarrow")
    with pytest.raises(
        TypeError,
        match=re.escape(
            f"column 'embeds_a' holds bytes (fixed_size_binary[32][pyarrow]), {BINARY_FIX}"
        ),
    ):
        arrow.cosim.pairwise("embeds_a", "embeds_b")


def test_binary_layout_read_by_dask_names_the_reader(binary_folder: Path) -> None:
    # The Arrow type tells while the graph is built...
    arrow = dd.read_parquet(binary_folder, dtype_backend="pyarrow")
    with pytest.raises(
        TypeError, match=re.escape(f"holds bytes (fixed_size_binary[32][pyarrow]), {BINARY_FIX}")
    ):
        arrow.cosim.pairwise("embeds_a", "embeds_b")
    # ...an object column only when its rows are read.
    cos = dd.read_parquet(binary_folder).cosim.pairwise("embeds_a", "embeds_b")
    with pytest.raises(
        TypeError, match=re.escape(f"column 'embeds_a': row 0 holds bytes (object), {BINARY_FIX}")
    ):
        cos.compute(scheduler="sync")
    # The reader it names gives the right numbers.
    ours = dask_cosim.read_parquet(binary_folder).cosim.pairwise("embeds_a", "embeds_b")
    a, b = random_pairs(40, 8)
    np.testing.assert_allclose(ours.compute().to_numpy(), reference(a, b), atol=1e-6)


def test_strings_error_offers_the_fast_fix_first() -> None:
    a, b = random_pairs(10, 300)
    pdf = pd.DataFrame(
        {"embeds_a": [torch.from_numpy(r.copy()).reshape(300, 1) for r in a],
         "embeds_b": [torch.from_numpy(r.copy()).reshape(300, 1) for r in b]}
    )  # fmt: skip
    stringified = dd.from_pandas(pdf, npartitions=1)
    with pytest.raises(TypeError) as raised:
        stringified.cosim.pairwise("embeds_a", "embeds_b")
    text = str(raised.value)
    assert text.startswith("column 'embeds_a' holds strings (string), not vectors.")
    fast, slow = text.index("dask_cosim.from_pandas(pdf)"), text.index("convert-string': False")
    assert fast < slow and "about 200x slower" in text[slow:]
    # The fix it offers works.
    fixed = dask_cosim.from_pandas(pdf).cosim.pairwise("embeds_a", "embeds_b").compute()
    assert fixed.notna().all()


@pytest.mark.parametrize("lazy", [False, True])
def test_misspelt_column_did_you_mean(lazy: bool) -> None:
    a, b = random_pairs(6, 4)
    pdf = pd.DataFrame({"id": range(6), "embeds_a": list(a), "embeds_b": list(b)})
    frame = dask_cosim.from_pandas(pdf) if lazy else pdf
    with pytest.raises(
        KeyError,
        match=re.escape(
            "b: column 'embed_b' not found; did you mean 'embeds_b'? available: ['id', 'embeds_a', 'embeds_b']"
        ),
    ):
        frame.cosim.pairwise("embeds_a", "embed_b")
    # No close name: the vector columns (Arrow ones; the eager frame's object columns,
    # whose first cells tell).
    hint = " the vector columns are ['embeds_a', 'embeds_b'];"
    with pytest.raises(
        KeyError,
        match=re.escape(
            f"a: column 'xyz' not found;{hint} available: ['id', 'embeds_a', 'embeds_b']"
        ),
    ):
        frame.cosim.pairwise("xyz", "embeds_b")


def test_cli_counts_are_singular_and_plural(tmp_path: Path) -> None:
    a, b = random_pairs(1, 4)
    pdf = pd.DataFrame({"embeds_a": list(a), "embeds_b": list(b)})
    pdf.to_pickle(tmp_path / "one.pkl")
    code, out = run(
        "convert", str(tmp_path / "one.pkl"), "-o", str(tmp_path / "one"), "--allow-pickle"
    )
    assert code == 0, out
    assert f"wrote       {tmp_path / 'one'}: 1 row in 1 file, layout binary" in out
    code, out = run("info", str(tmp_path / "one"))
    assert code == 0, out
    assert "files       1 file (1 partition)" in out

    table = pa.table({"x": list(range(10))})
    for i in range(2):
        pq.write_table(table, tmp_path / f"two.{i}.parquet", row_group_size=5)
    code, out = run("info", str(tmp_path / "two.0.parquet"), str(tmp_path / "two.1.parquet"))
    assert code == 0, out
    assert re.search(r"files       2 files \(\d+ partitions\)", out), out


def test_cli_misspelt_columns_did_you_mean(tmp_path: Path) -> None:
    a, b = random_pairs(20, 4)
    pdf = pd.DataFrame({"id": range(20), "embeds_a": list(a), "embeds_b": list(b)})
    dask_cosim.to_parquet(dask_cosim.from_pandas(pdf), tmp_path / "pairs")
    out = str(tmp_path / "out")
    code, text = run(
        "pairwise", str(tmp_path / "pairs"), "-a", "embeds_a", "-b", "embed_b", "-o", out
    )
    assert code == 2
    assert "Error: -b: column 'embed_b' not found; did you mean 'embeds_b'? available:" in text
    code, text = run(
        "pairwise",
        str(tmp_path / "pairs"),
        "-a",
        "embeds_a",
        "-b",
        "embeds_b",
        "-o",
        out,
        "--keep",
        "ids",
    )
    assert code == 2
    assert "Error: --keep column 'ids' not found; did you mean 'id'? available:" in text

    np.savez(tmp_path / "pairs.npz", embeds_a=a, embeds_b=b)
    code, text = run(
        "convert", str(tmp_path / "pairs.npz"), "-o", out, "--a", "embeds_a", "--b", "embed_b"
    )
    assert code == 2
    assert (
        "has no arrays ['embed_b']; did you mean 'embeds_b'? it has ['embeds_a', 'embeds_b']"
        in text
    )


def test_to_parquet_progress_without_a_client(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = random_pairs(30, 4)
    df = dask_cosim.from_pandas(
        pd.DataFrame({"embeds_a": list(a), "embeds_b": list(b)}), npartitions=3
    )
    manifest = dask_cosim.to_parquet(df, tmp_path / "out", progress=True)
    assert manifest["rows"] == 30 and len(manifest["files"]) == 3
    out = capsys.readouterr().out
    assert "[########################################] | 100% Completed" in out
    back = dask_cosim.read_parquet(tmp_path / "out").compute()
    np.testing.assert_array_equal(np.stack(back["embeds_b"].to_numpy()), b)


def test_cli_column_flags_have_both_spellings(tmp_path: Path) -> None:
    a, b = random_pairs(20, 4)
    pdf = pd.DataFrame({"embeds_a": list(a), "embeds_b": list(b)})
    dask_cosim.to_parquet(dask_cosim.from_pandas(pdf), tmp_path / "pairs")
    for flags in (["-a", "embeds_a", "-b", "embed_b"], ["--a", "embeds_a", "--b", "embed_b"]):
        # A misspelt --b: the error comes from the column lookup, after both flags parsed.
        code, text = run("pairwise", str(tmp_path / "pairs"), *flags, "-o", str(tmp_path / "o"))
        assert code == 2 and "column 'embed_b' not found; did you mean 'embeds_b'?" in text, text
    np.savez(tmp_path / "pairs.npz", left=a, right=b)
    for flags in (["-a", "left", "-b", "right"], ["--a", "left", "--b", "right"]):
        out = tmp_path / f"npz{len(flags[0])}"
        code, text = run("convert", str(tmp_path / "pairs.npz"), "-o", str(out), *flags)
        assert code == 0, text
        assert list(dask_cosim.read_parquet(out).columns) == ["left", "right"]


def test_cli_version() -> None:
    for flag in ("--version", "-V"):
        code, text = run(flag)
        assert code == 0 and text == f"dask-cosim, version {dask_cosim.__version__}\n"


def test_cli_names_a_file_that_is_not_parquet_and_how_to_convert_it(tmp_path: Path) -> None:
    a, b = random_pairs(5, 4)
    pdf = pd.DataFrame({"embeds_a": list(a), "embeds_b": list(b)})
    pdf.to_pickle(tmp_path / "pairs.pkl")
    # Python lists of floats: pandas writes them as JSON lists.
    as_lists = {c: pdf[c].map(lambda v: v.tolist()) for c in pdf.columns}
    pdf.assign(**as_lists).to_csv(tmp_path / "pairs.csv")
    (tmp_path / "pairs.txt").write_text("0.1 0.2\n")
    np.save(tmp_path / "pairs.npy", np.stack([a, b], axis=1))
    args = ["-a", "embeds_a", "-b", "embeds_b", "-o", str(tmp_path / "out")]
    pkl = str(tmp_path / "pairs.pkl")
    code, text = run("pairwise", pkl, *args)
    assert code == 2
    assert text.startswith(f"Error: {pkl!r} is not a Parquet file (it starts with b"), (text, pkl)
    assert (
        f"pairwise reads Parquet files or folders of them; it looks like a pickle; convert it first: dask-cosim convert {pkl} -o pairs-parquet --allow-pickle"
        in text
    )
    csv = str(tmp_path / "pairs.csv")
    code, text = run("pairwise", csv, *args)
    assert (
        code == 2
        and f"Error: {csv!r} is not a Parquet file (it starts with b',emb', not b'PAR1')" in text
    )
    assert (
        "vectors stored as text must be parsed once; convert it first (vector cells are JSON "
        f"lists): dask-cosim convert {csv} -o pairs-parquet" in text
    )
    npy = str(tmp_path / "pairs.npy")
    code, text = run("info", npy)
    assert code == 2 and f"convert it first: dask-cosim convert {npy} -o pairs-parquet" in text
    txt = str(tmp_path / "pairs.txt")
    code, text = run("convert", txt, "-o", str(tmp_path / "c"))
    assert (
        code == 2
        and "convert reads pandas pickles, .npy/.npz, CSV, JSON Lines and Parquet;" in text
    )
    assert "write Parquet with dask_cosim.to_parquet(pdf, 'pairs-parquet')" in text
    gz = tmp_path / "pairs.csv.gz"
    gz.write_bytes(gzip.compress((tmp_path / "pairs.csv").read_bytes()))
    code, text = run("convert", str(gz), "-o", str(tmp_path / "c"))
    assert code == 2 and (
        f"it is compressed text; decompress it first (gunzip -k {gz}: a compressed file cannot "
        f"be cut into blocks to read in parallel), then convert it: dask-cosim convert {csv} "
        "-o pairs-parquet" in text
    ), text
    # A .parquet file that is not Parquet (empty: a write cut short) is not to convert.
    (tmp_path / "cut.parquet").write_bytes(b"")
    code, text = run("pairwise", str(tmp_path / "cut.parquet"), *args)
    assert code == 2 and "it is named .parquet but holds no Parquet (written in part, or " in text
    assert "dask-cosim convert" not in text
    # convert of a file of another suffix: told to name it by what it holds (it was told
    # to run the very command that failed).
    (tmp_path / "pairs.data").write_bytes((tmp_path / "pairs.csv").read_bytes())
    code, text = run("convert", str(tmp_path / "pairs.data"), "-o", str(tmp_path / "c"))
    assert code == 2 and "convert tells what a file holds by its suffix: name it .pkl" in text
    assert "dask-cosim convert" not in text
    assert not (tmp_path / "out").exists() and not (tmp_path / "c").exists()
    # The commands it suggests work.
    code, text = run("convert", npy, "-o", str(tmp_path / "pairs-parquet"))
    assert code == 0, text
    code, text = run("convert", csv, "-o", str(tmp_path / "csv-parquet"))
    assert code == 0 and "vectors: embeds_a 4 x float64, embeds_b 4 x float64" in text, text
    got = dask_cosim.read_parquet(tmp_path / "csv-parquet").compute()
    np.testing.assert_array_equal(np.stack(got["embeds_a"].to_numpy()), a)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_demo_and_docs_install_only_what_they_need(tmp_path: Path) -> None:
    root = Path(dask_cosim.__file__).parents[1]

    def planned(target: str) -> str:
        # -n: print the commands a fresh clone would run, without running them.
        proc = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}"], cwd=root,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    demo = planned("demo")
    assert '-e ".[bench]"' in demo and ".[dev]" not in demo
    assert "installed-demo" in demo and "-m dask_cosim demo" in demo
    assert '-e ".[dev]"' in planned("test")
    docs = planned("docs")
    assert '-e ".[docs]"' in docs and ".[dev]" not in docs
    assert "sphinx-build" in docs


def test_parquet_column_lookups_did_you_mean(tmp_path: Path) -> None:
    a, b = random_pairs(6, 4)
    df = dask_cosim.from_pandas(
        pd.DataFrame({"id": range(6), "embeds_a": list(a), "embeds_b": list(b)})
    )
    with pytest.raises(
        KeyError,
        match=re.escape(
            "vector columns ['embed_a'] not found; did you mean 'embeds_a'? available: ['id', 'embeds_a', 'embeds_b']"
        ),
    ):
        dask_cosim.to_parquet(df, tmp_path / "out", vectors=["embed_a"])
    dask_cosim.to_parquet(df, tmp_path / "out")
    with pytest.raises(
        KeyError,
        match=re.escape("columns ['embeds_c'] not found in")
        + ".*"
        + re.escape("; did you mean 'embeds_"),
    ):
        dask_cosim.read_parquet(tmp_path / "out", columns=["embeds_a", "embeds_c"])


HEAVY = ("torch", "pandas", "pyarrow", "numpy", "dask.dataframe", "distributed")


def _imported_after(code: str) -> list[str]:
    probe = f"import sys\n{code}\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return eval(proc.stdout.strip().splitlines()[-1])


def test_import_and_cli_help_load_no_heavy_module() -> None:
    """--help and --version answer without importing torch, pandas, dask.dataframe or
    distributed (the time they take is measured, not asserted: see the report)."""
    assert _imported_after("import dask_cosim") == []
    assert _imported_after("import dask_cosim.cli") == []
    for args in (["--help"], ["--version"], ["pairwise", "--help"], ["convert", "--help"]):
        code = f"from dask_cosim.cli import main\ntry:\n    main({args!r})\nexcept SystemExit as e:\n    assert e.code == 0, e.code"
        assert _imported_after(code) == [], args


@pytest.mark.parametrize(
    "imports",
    [
        "import dask_cosim; import pandas as pd; import dask.dataframe as dd",
        "import dask_cosim; import dask.dataframe as dd; import pandas as pd",
        "import dask.dataframe as dd; import dask_cosim; import pandas as pd",
        "import pandas as pd; import dask_cosim; import dask.dataframe as dd",
        # pandas first imported by a module of ours, half loaded meanwhile (as a worker
        # unpickling a task imports it): the accessor must not import it back.
        "import dask_cosim.search_partition; import pandas as pd; import dask.dataframe as dd",
        "import dask_cosim.clustered_partition; import dask.dataframe as dd; import pandas as pd",
        # Loaded again (a notebook's autoreload): pandas and dask warned of an accessor
        # "overriding a preexisting attribute".
        "import pandas as pd; import dask.dataframe as dd; import dask_cosim, importlib, "
        "warnings; warnings.filterwarnings('error', 'registration of accessor'); "
        "importlib.reload(dask_cosim)",
    ],
)
def test_accessor_registered_whatever_the_import_order(imports: str) -> None:
    code = f"""{imports}
import warnings
warnings.simplefilter("error")  # e.g. pandas' warning on registering an accessor twice
df = pd.DataFrame({{"a": [[3.0, 4.0]], "b": [[4.0, 3.0]]}})
print(round(float(df.cosim.pairwise("a", "b").iloc[0]), 4))
print(round(float(dask_cosim.from_pandas(df).cosim.pairwise("a", "b").compute().iloc[0]), 4))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0.96", "0.96"]


def test_lazy_names_are_the_public_ones() -> None:

    assert sorted(dask_cosim.__all__) == sorted(dask_cosim._LAZY)
    for name in dask_cosim.__all__:
        assert getattr(dask_cosim, name) is not None
    with pytest.raises(AttributeError, match="module 'dask_cosim' has no attribute 'nothing'"):
        dask_cosim.nothing  # noqa: B018


def test_io_functions_the_docs_name_need_only_import_dask_cosim() -> None:
    """docs/parquet.md calls dask_cosim.io.describe_parquet and .to_parquet_together after
    a plain `import dask_cosim`, as it calls dask_cosim.kernels.pairwise_cosine; and
    docs/api.md names the submodules' functions (dask_cosim.search.topk was an attribute
    only once something had imported it)."""
    code = (
        "import dask_cosim\n"
        "print(dask_cosim.io.describe_parquet.__name__, dask_cosim.io.to_parquet_together.__name__,"
        " dask_cosim.search.topk.__name__, dask_cosim.clustered.neighbors.__name__)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["describe_parquet", "to_parquet_together", "topk", "neighbors"]


def test_read_parquet_names_a_file_that_is_not_parquet(tmp_path: Path) -> None:
    folder = tmp_path / "pairs"
    folder.mkdir()
    (folder / "pairs.csv").write_text('id,embeds_a\n0,"[1, 2]"\n')
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"{str(folder / 'pairs.csv')!r} is not a Parquet file (Parquet magic bytes not found"
        ),
    ):
        dask_cosim.read_parquet(folder)
    code, text = run("info", str(folder))
    assert code == 2 and f"Error: {str(folder / 'pairs.csv')!r} is not a Parquet file" in text
    assert "`dask-cosim convert` turns CSV, JSON Lines, .npy/.npz files and pandas" in text


@pytest.mark.parametrize(
    ("stray", "text", "why"),
    [
        ("x.csv", 'id,embeds_a\n0,"[1, 2]"\n', "Parquet magic bytes not found"),
        ("x.parquet", 'id,embeds_a\n0,"[1, 2]"\n', "Parquet magic bytes not found"),
        ("README", "", "Parquet file size is 0 bytes"),
        ("x.txt", "ab\n", "smaller than the minimum file footer"),
    ],
)
@pytest.mark.parametrize("index", [False, True])
def test_plain_folder_with_a_stray_file_names_it(
    tmp_path: Path, stray: str, text: str, why: str, index: bool
) -> None:
    # A folder with no manifest: the stray file after a good one is met in the footers
    # (files that store no index are numbered from them) or, with a stored index, when
    # its partition is read; both name it, as `info` and `pairwise` do.  `pairwise`
    # reads on a local cluster of its own: run once per way the file is met, not per
    # kind of stray file (each start takes seconds of the suite's time).
    folder = tmp_path / "plain"
    folder.mkdir()
    a, b = random_pairs(6, 3)
    pdf = pd.DataFrame({"id": [5, 3, 9, 1, 7, 2], "embeds_a": list(a), "embeds_b": list(b)})
    pdf.set_index("id").to_parquet(folder / "a.parquet", index=index)
    (folder / stray).write_text(text)
    named = f"{str(folder / stray)!r} is not a Parquet file ("
    with pytest.raises(ValueError, match=re.escape(named) + ".*" + why):
        dask_cosim.read_parquet(folder).compute()
    out = str(tmp_path / "out")
    commands = [["info"], ["pairwise", "-a", "embeds_a", "-b", "embeds_b", "-o", out]]
    for args in commands if stray == "x.txt" else commands[:1]:
        code, text = run(args[0], str(folder), *args[1:])
        assert code == 2 and f"Error: {named}" in text, text


def test_a_damaged_parquet_file_is_named(tmp_path: Path) -> None:
    """A file whose footer is damaged (overwritten, or cut short and given a footer back)
    failed with pyarrow's "OSError: Couldn't deserialize thrift", naming no file (the
    command line: exit 1, as for a worker lost)."""
    folder = tmp_path / "plain"
    folder.mkdir()
    for i in range(3):
        a, b = random_pairs(6, 3, seed=i)
        pd.DataFrame({"embeds_a": list(a), "embeds_b": list(b)}).to_parquet(folder / f"{i}.parquet")
    data = (folder / "1.parquet").read_bytes()
    footer = int.from_bytes(data[-8:-4], "little")
    (folder / "1.parquet").write_bytes(data[: -8 - footer] + b"\0" * footer + data[-8:])
    named = f"{str(folder / '1.parquet')!r} is a damaged Parquet file (Couldn't deserialize thrift"
    with pytest.raises(ValueError, match=re.escape(named)):
        dask_cosim.read_parquet(folder).compute()
    out = str(tmp_path / "out")
    code, text = run("pairwise", str(folder), "-a", "embeds_a", "-b", "embeds_b", "-o", out)
    assert code == 2 and f"Error: {named}" in text and "write it again" in text, text


def test_from_pandas_given_something_else_says_what_to_do() -> None:
    pdf = pd.DataFrame({"embeds_a": list(random_pairs(4, 3)[0])})
    df = dask_cosim.from_pandas(pdf)
    cases = [
        (
            df,
            "from_pandas expects a pandas.DataFrame, got dask.DataFrame; it is a dask collection already: use it as it is (df.cosim.pairwise)",
        ),
        (
            pdf["embeds_a"],
            "from_pandas expects a pandas.DataFrame, got pandas.Series; pass a frame, e.g. from_pandas(series.to_frame())",
        ),
        ([1, 2], "from_pandas expects a pandas.DataFrame, got list"),
        (
            pdf.set_axis(pd.MultiIndex.from_product([[1, 2], ["x", "y"]], names=["k", None])),
            "the pandas frame's index is a MultiIndex (levels ['k', None]), which dask has "
            "not: keep its levels as columns, with pdf.reset_index() first",
        ),
    ]
    for obj, message in cases:
        with pytest.raises(TypeError, match=re.escape(message) + "$"):
            dask_cosim.from_pandas(obj)


def test_search_commands_name_a_file_that_is_not_parquet(tmp_path: Path) -> None:
    csv = tmp_path / "pairs.csv"
    csv.write_text('id,embeds_a\n0,"[1, 2]"\n')
    code, text = run(
        "topk", str(csv), "--on", "embeds_a", "--queries", str(csv), "-o", str(tmp_path / "out")
    )
    assert code == 2
    assert (
        f"Error: {str(csv)!r} is not a Parquet file (it starts with b'id,e', not b'PAR1'); the search commands read Parquet files"
        in text
    )
    assert not (tmp_path / "out").exists()
