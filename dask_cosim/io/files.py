"""Where Parquet data lives: filesystems, listing files and globs, the folder manifest, the
hidden staging folders writes go to first and their renaming into place (several
together), and naming a listed or given file that is not Parquet."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import socket
import time
import uuid
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.fs as pafs
from dask.base import tokenize
from dask.utils import natural_sort_key

from dask_cosim import errors
from dask_cosim.io import hive
from dask_cosim.io.text import TEXT_SUFFIXES

# The folder's description, next to the part files (readers skip names starting with "_").
MANIFEST = "_dask_cosim.json"

# Readers refuse a manifest of a later version (``_folder_files``, "upgrade dask_cosim"):
# bump it only for a change that readers of this version would misread, not for keys they
# ignore safely, such as ``index_type`` and ``encoded_divisions`` (:mod:`.divisions`),
# beside which ``divisions`` is null.
FORMAT_VERSION = 1


def exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound


class Found(NamedTuple):
    """What a read of a path reads: its filesystem, the files in order, their sizes (0:
    not listed), our manifest (None for other folders), the keys of a hive folder
    (``key=value/`` subfolders; None for other paths), and the files' ``version``: a
    token of their sizes and modification times as listed (:func:`stamp`; of the
    manifest for our folders, whose file names differ from write to write)."""

    fs: pafs.FileSystem
    files: list[str]
    sizes: list[int]
    manifest: dict[str, Any] | None
    keys: hive.Keys | None = None
    version: str = ""


def stamp(infos: Sequence[pafs.FileInfo]) -> str:
    """A token of the files ``infos`` lists: their paths, sizes and modification times.
    A read's graph keys include it, as dask's reader includes its files' checksum: a file
    rewritten in place under its name is read anew, not answered from results a
    distributed scheduler still holds under the old contents' keys."""
    return tokenize([(i.path, i.size, i.mtime_ns) for i in infos])


def parquet_files(path: Any) -> Found | None:
    """What a read of ``path`` reads; None when it needs dask's reader (globs in URLs).
    Several paths (a list, or what a glob matches) read their files, and the files of
    their folders, one after the other."""
    paths = list(path) if isinstance(path, (list, tuple)) else [path]
    if not paths or not all(isinstance(p, (str, os.PathLike)) for p in paths):
        return None
    texts = [_home_expanded(os.fspath(p)) for p in paths]
    # A path that exists is that path, whatever its name holds ("run[1]" is no pattern
    # for "run1"): as pandas and pyarrow read it, and as to_parquet wrote it.
    patterns = [t for t in texts if _has_wildcard(t) and not os.path.exists(t)]
    if patterns:
        if any("://" in t for t in texts):
            return None
        texts = sorted(
            (m for t in texts for m in (_matches(t) if t in patterns else [t])),
            key=natural_sort_key,
        )
        if not texts:
            raise FileNotFoundError(f"no files match {path!r}")
    fs, first = filesystem(texts[0])
    if len(texts) == 1:
        try:
            return _one_path(fs, first, texts[0])
        except FileNotFoundError:
            # An overwrite renames the old folder aside, then the new one into place: a
            # read between the two finds neither (or loses the folder while reading it),
            # and a moment later the new one.
            time.sleep(_REPLACED_WAIT)
            return _one_path(fs, first, texts[0])
    located = [filesystem(t)[1] for t in texts]
    files: list[str] = []
    sizes: list[int] = []
    versions: list[Any] = []
    missing = []
    for text, where, info in zip(texts, located, fs.get_file_info(located)):
        if info.type == pafs.FileType.File:
            files.append(where)
            sizes.append(info.size)
            versions.append(stamp([info]))
        elif info.type == pafs.FileType.Directory:
            # A folder among several paths: its files, in its own order (its manifest's
            # divisions apply to it alone: the read has none).
            found = _folder_files(fs, where)
            if found.keys is not None and found.keys.dictionaries:
                raise ValueError(
                    f"{text!r} is a hive-partitioned folder (key=value/ subfolders), which is "
                    "read on its own: read it alone, or give its files"
                )
            files += found.files
            sizes += found.sizes
            versions.append(found.version)
        else:
            missing.append(text)
    if missing:
        raise FileNotFoundError(f"not found: {missing!r}")
    return Found(fs, files, sizes, None, version=tokenize(versions))


# Seconds a read waits before it looks again for a folder it did not find (an overwrite
# between its two renames).
_REPLACED_WAIT = 0.05


def _one_path(fs: pafs.FileSystem, where: str, text: str) -> Found:
    """What a read of the one path ``text`` (``where`` on ``fs``) reads."""
    info = fs.get_file_info(where)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"{text!r} not found{_set_aside(fs, where)}")
    if info.type == pafs.FileType.Directory:
        return _folder_files(fs, where)
    return Found(fs, [where], [info.size], None, version=stamp([info]))


def _set_aside(fs: pafs.FileSystem, root: str) -> str:
    """For a message that ``root`` is not found: where an overwrite of it, stopped
    between its two renames, left the previous folder (``<staging>-old``), if one did."""
    if not isinstance(fs, pafs.LocalFileSystem):
        return ""
    parent, name = os.path.split(root)
    for entry, found in _stagings(parent, name):
        if found["old"]:
            return (
                f"; an overwrite of it stopped between its two renames and left the "
                f"previous folder at {os.path.join(parent, entry)!r}: the next write to "
                f"{name!r} puts it back first (or rename it back)"
            )
    return ""


def _matches(pattern: str) -> list[str]:
    """What the glob ``pattern`` reads: its matches but names readers of a folder skip
    (:func:`_skipped_name`), and but those inside a folder it matched, which is read
    whole (every file under it, as a folder given alone): ``**`` matches every folder
    on the way, the first of them the folder before it, and those folders read whole
    besides their files read every file twice.  A wildcard that matches a ``key=value``
    folder is refused (:func:`_check_no_keys_lost`)."""
    found = [m for m in glob.glob(pattern, recursive=True) if not _skipped_name(pattern, m)]
    for match in sorted(found):  # the first in name order named
        _check_no_keys_lost(pattern, match)
    normal = [os.path.normpath(m) for m in found]
    folders = [n for m, n in zip(found, normal) if os.path.isdir(m)]
    return [m for m, n in zip(found, normal) if not any(n.startswith(f + os.sep) for f in folders)]


def _has_wildcard(text: str) -> bool:
    """Whether ``text`` holds a glob's wildcard (``*``, ``?`` or ``[``)."""
    return any(c in text for c in "*?[")


def _aligned(pattern: str, match: str) -> list[tuple[str, str]]:
    """The components of a glob's ``match`` beside those of ``pattern`` that matched
    them.  A ``**`` matches any number of folders: the components before it align from
    the front, those after it from the back, and each it matched is paired with "*"."""
    parts = os.path.normpath(pattern).split(os.sep)
    got = os.path.normpath(match).split(os.sep)
    if "**" in parts:
        i = parts.index("**")
        tail = parts[i + 1 :]
        middle = got[i : len(got) - len(tail)]
        parts = [*parts[:i], *["*"] * len(middle), *tail]
    return list(zip(parts, got))


def _skipped_name(pattern: str, match: str) -> bool:
    """Whether a glob's ``match`` is a name that readers of a folder skip: a component
    starting with "_" or "." (_SUCCESS, _metadata, _common_metadata, our manifest and
    staging folders, hidden files) that ``pattern`` matched with a wildcard rather than
    spelling it out, as pyarrow's dataset discovery and :func:`_folder_files` skip
    them.  (``glob`` already leaves "." names to patterns that spell the dot.)"""
    skipped = ("_", ".")
    return any(
        g.startswith(skipped) and not p.startswith(skipped) for p, g in _aligned(pattern, match)
    )


def _check_no_keys_lost(pattern: str, match: str) -> None:
    """ValueError where a wildcard of ``pattern`` matched a ``key=value`` folder of a
    hive-partitioned folder on the way to ``match`` (or as ``match``): its files alone
    would lose the keys the folder names hold, silently (``hive/*/*.parquet``,
    ``hive/**/*.parquet``, ``hive/*``)."""
    pairs = _aligned(pattern, match)
    folders = pairs if os.path.isdir(match) else pairs[:-1]
    for i, (part, got) in enumerate(folders):
        if "=" in got and _has_wildcard(part):
            root = os.sep.join(g for _, g in pairs[:i]) or os.sep
            raise ValueError(
                f"{pattern!r} reaches {os.sep.join(g for _, g in pairs[: i + 1])!r}, a "
                f"folder of the hive-partitioned folder {root!r} (key=value/ subfolders): "
                "its files alone would lose the keys that the folder names hold; read "
                f"{root!r} itself, whose keys become columns (filters=[(key, '==', value)] "
                "reads some of its folders)"
            )


def _folder_files(fs: pafs.FileSystem, root: str) -> Found:
    manifest_path = f"{root}/{MANIFEST}"
    entries = fs.get_file_info(pafs.FileSelector(root))  # once: the manifest checks it too
    if any(e.base_name == MANIFEST and e.type == pafs.FileType.File for e in entries):
        with fs.open_input_stream(manifest_path) as f:
            manifest = json.loads(f.read())
        if manifest.get("format") != "dask_cosim" or manifest.get("version", 0) > FORMAT_VERSION:
            raise ValueError(
                f"{manifest_path!r} is not a dask_cosim manifest this version can read "
                f"(format {manifest.get('format')!r}, version {manifest.get('version')!r}); "
                "upgrade dask_cosim"
            )
        files = [f"{root}/{part['path']}" for part in manifest["files"]]
        _check_listed(root, files, entries)
        # Ours: one partition each; its version their stamp too, as for any folder (a file
        # rewritten in place by another tool, same rows, was answered from old results).
        named = set(files)
        theirs = sorted((e for e in entries if e.path in named), key=lambda e: e.path)
        version = tokenize(manifest, stamp(theirs))
        return Found(fs, files, [0] * len(files), manifest, version=version)
    # Hidden and "_" names are not data (_metadata, _SUCCESS, our staging folders).
    visible = [e for e in entries if not e.base_name.startswith((".", "_"))]
    if any(e.type == pafs.FileType.Directory for e in visible):
        files, sizes, keys, listed = hive.discover(fs, root)  # key=value/ subfolders
        return Found(fs, files, sizes, None, keys, stamp(listed))
    infos: list[pafs.FileInfo] = [e for e in visible if e.type == pafs.FileType.File]
    infos.sort(key=lambda e: natural_sort_key(e.path))
    if not infos:
        raise FileNotFoundError(f"no Parquet files in {root!r}")
    paths, sizes = [e.path for e in infos], [e.size or 0 for e in infos]
    return Found(fs, paths, sizes, None, version=stamp(infos))


def _check_listed(root: str, files: list[str], entries: list[pafs.FileInfo]) -> None:
    """The files of a folder that ``to_parquet`` wrote are those its manifest lists
    (``files``), whatever else the folder holds (its listing's ``entries``).  Where
    another tool changed the folder since: FileNotFoundError for a listed file that is
    gone, and a warning for Parquet files (named .parquet, .parq, .pq) it does not list
    (not read), each with what to do."""
    there = {e.path for e in entries if e.type == pafs.FileType.File}
    gone = [f for f in files if f not in there]
    manifest = f"{root}/{MANIFEST}"
    if gone:
        raise FileNotFoundError(
            f"{gone[0]!r} is gone ({len(gone)} of the {len(files)} files that {manifest!r} "
            "lists): the folder is being replaced (an overwrite: read it again), or was "
            "changed after dask_cosim wrote it (write it again, or delete "
            f"{MANIFEST} to read the Parquet files it holds now, as any folder's)"
        )
    listed = set(files)
    added = sorted(
        (e.path for e in entries if e.path not in listed and e.type == pafs.FileType.File
         and e.extension.lower() in ("parquet", "parq", "pq")
         and not e.base_name.startswith((".", "_"))),
        key=natural_sort_key,
    )  # fmt: skip
    if added:
        warnings.warn(
            f"{root!r} holds {len(added)} file(s) that its manifest {MANIFEST} does not "
            f"list, added after dask_cosim wrote it ({added[0]!r}): they are not read; "
            f"delete {MANIFEST} to read every Parquet file of the folder",
            errors.CosimWarning,
            stacklevel=errors.caller_stacklevel(),
        )


_NOT_PARQUET = ("magic bytes", "file size is 0 bytes", "smaller than the minimum file footer")
# pyarrow's errors (OSError) for a Parquet file whose footer or pages do not decode.
_DAMAGED = ("deserialize thrift", "Unexpected end of stream", "Corrupt", "Invalid column metadata")


@contextmanager
def naming_non_parquet(file: str) -> Iterator[None]:
    """Within it, pyarrow's errors for a file that is not Parquet ("Parquet magic bytes not
    found in footer", "file size is 0 bytes", "smaller than the minimum file footer":
    none names the file) are raised as :func:`errors.not_parquet`, naming ``file`` and
    how to convert it; a file gone (deleted, or its folder replaced by an overwrite,
    since it was listed) and a damaged one (a footer or page that does not decode) say
    so; other errors pass unchanged."""
    try:
        yield
    except FileNotFoundError as err:
        raise FileNotFoundError(
            f"{file!r} is gone: it was deleted, or its folder replaced (an overwrite), after "
            "the read listed its files (when the frame was made); read the folder again, "
            "or put the file back"
        ) from err
    except pa.ArrowInvalid as err:
        if not any(why in str(err) for why in _NOT_PARQUET):
            raise
        raise errors.not_parquet(
            file,
            str(err),
            "read_parquet reads Parquet files or folders holding only Parquet files",
            "`dask-cosim convert` turns CSV, JSON Lines, .npy/.npz files and pandas pickles "
            "into Parquet (in Python: dask_cosim.io.read_text, then dask_cosim.to_parquet)",
        ) from None
    except OSError as err:
        if not any(why in str(err) for why in _DAMAGED):
            raise
        raise ValueError(
            f"{file!r} is a damaged Parquet file ({err}): cut short, or overwritten while "
            "it was read; write it again, or leave it out of the read"
        ) from None


_PARQUET_MAGIC = b"PAR1"


# Compressed files, with the command that decompresses each, keeping the file.
_COMPRESSED = {
    ".gz": "gunzip -k",
    ".bz2": "bunzip2 -k",
    ".xz": "unxz -k",
    ".zst": "unzstd",
}


def check_parquet_inputs(inputs: Sequence[str], reads: str, converting: bool = False) -> None:
    """Raise if a local file among ``inputs`` is not Parquet, naming it and the way to
    convert it (pyarrow's own message says only "Parquet magic bytes not found in
    footer"); ``reads`` says what the caller reads; ``converting``: the caller is
    ``convert``, which tells its inputs by their suffix (advice to run it again would
    fail again).  Folders, globs and URLs are left to the reader, which lists and checks
    them."""
    for text in inputs:
        path = Path(text)
        if not path.is_file():
            continue
        with open(path, "rb") as f:
            head = f.read(4)
        if head == _PARQUET_MAGIC:
            continue
        suffix = path.suffix.lower()
        out = f"{path.stem}-parquet"
        if suffix in (".pkl", ".pickle"):
            how = (
                f"it looks like a pickle; convert it first: dask-cosim convert {text} -o {out} "
                "--allow-pickle (only for a pickle you trust: unpickling runs its code)"
            )
        elif suffix in (".npy", ".npz"):
            how = f"convert it first: dask-cosim convert {text} -o {out}"
        elif suffix in TEXT_SUFFIXES:
            how = (
                "vectors stored as text must be parsed once; convert it first (vector "
                f"cells are JSON lists): dask-cosim convert {text} -o {out}"
            )
        elif suffix in _COMPRESSED and Path(path.stem).suffix.lower() in TEXT_SUFFIXES:
            plain = path.with_suffix("")
            how = (
                f"it is compressed text; decompress it first ({_COMPRESSED[suffix]} {text}: a "
                "compressed file cannot be cut into blocks to read in parallel), then convert "
                f"it: dask-cosim convert {plain} -o {plain.stem}-parquet"
            )
        elif suffix in (".parquet", ".pq", ".parq"):
            how = (
                f"it is named {suffix} but holds no Parquet (written in part, or not by a "
                "Parquet writer): write it again, or leave it out of the read"
            )
        elif suffix == ".txt":
            how = (
                "vectors stored as text must be parsed: read it with pandas, turn each "
                "vector cell into a list or array of numbers, and write Parquet with "
                f"dask_cosim.to_parquet(pdf, {out!r})"
            )
        elif converting:
            how = (
                "convert tells what a file holds by its suffix: name it .pkl (a pandas "
                "pickle), .npy or .npz, .csv or .tsv, .jsonl or .ndjson, or .parquet, as "
                "it holds"
            )
        else:
            how = (
                "dask-cosim convert turns pandas pickles, .npy/.npz, CSV and JSON Lines files "
                f"into Parquet: dask-cosim convert {text} -o {out}"
            )
        why = f"it starts with {head!r}, not {_PARQUET_MAGIC!r}"
        raise errors.not_parquet(text, why, reads, how)


def filesystem(path: Any) -> tuple[pafs.FileSystem, str]:
    """pyarrow's own filesystem for ``path`` (local, or any URL pyarrow or fsspec knows)."""
    text = os.fspath(path)
    if "://" not in text:
        return pafs.LocalFileSystem(), os.path.abspath(_home_expanded(text))
    if text[:17].lower() == "file://localhost/":
        # RFC 8089: the local host by name.  pyarrow refuses it, and fsspec would take
        # "localhost/..." for a path relative to the working directory.
        text = "file:///" + text[17:]
    try:
        return pafs.FileSystem.from_uri(text)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        # A scheme pyarrow has no filesystem for (memory://, and any other fsspec
        # implementation): fsspec's, behind pyarrow's filesystem interface.
        import fsspec

        fs, inner = fsspec.core.url_to_fs(text)
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), inner


def _home_expanded(text: str) -> str:
    """A local path with a leading ``~`` (or ``~user``) as the home folder it names, as
    pandas and dask read and write it: a folder named "~" in the working directory
    otherwise.  URLs as they are."""
    return text if "://" in text else os.path.expanduser(text)


def location(path: str) -> str:
    """Where ``path`` is, one string for every spelling of a place, to compare outputs.

    A local path (relative, through symbolic links, or a ``file://`` or ``local://`` URL)
    is its real absolute path; another URL is itself without a trailing "/", not resolved
    further (making its filesystem could cost a request, as S3's region lookup does).
    """
    text = os.fspath(path)
    if "://" in text and text.split("://", 1)[0].lower() not in ("file", "local"):
        return text.rstrip("/")
    return os.path.realpath(filesystem(text)[1])


def check_replaceable(path: str) -> None:
    """ValueError when the local folder ``path`` is the working directory or holds it:
    replacing it would delete the directory the process runs in (dask's writer refuses
    it too), and a relative path would then name nothing."""
    where = location(path)
    if "://" in where:
        return
    cwd = os.path.realpath(os.getcwd())
    if cwd == where or cwd.startswith(where.rstrip("/") + "/"):
        raise ValueError(
            f"{path!r} holds the working directory {cwd!r}: replacing it would delete the "
            "directory this runs in; write it elsewhere, or run from another directory"
        )


def new_staging(fs: pafs.FileSystem, root: str) -> str:
    """The name of a new hidden staging folder next to ``root``, after removing those
    that earlier writes to ``root`` by dead processes of this host left behind.  Not
    created here: the write's first task does (:func:`open_staging`), so that a write
    built and not computed leaves nothing."""
    parent, name = root.rsplit("/", 1) if "/" in root else ("", root)
    _remove_abandoned_staging(fs, parent, name)
    # Host and pid in the name tell a later run whether the writer is still alive.
    return f"{parent}/.{name}.cosim-{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


_HOST = socket.gethostname().replace("/", "_")


# A staging folder, or (-old) the folder an overwrite was replacing when it stopped.
_STAGING = re.compile(r"\.cosim-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{12}(?P<old>-old)?$")


# A file in a staging folder while its write may still add files: made with the folder,
# deleted first when the write is given up (discard) and when it is committed.  dask
# reports a failed task while others still run; one that wrote its file after the folder
# was deleted (an object store has no folder whose absence stops the write) finds the
# marker gone and deletes its file (:func:`check_open`).
OPEN_MARKER = ".writing"


def open_staging(fs: pafs.FileSystem, path: str) -> None:
    """Make the staging folder ``path`` and its :data:`OPEN_MARKER`."""
    fs.create_dir(path, recursive=True)
    with fs.open_output_stream(f"{path}/{OPEN_MARKER}"):
        pass


def check_open(fs: pafs.FileSystem, path: str, name: str) -> None:
    """After a task wrote the file ``name`` into the staging folder ``path``: where the
    write was given up meanwhile (its marker gone), the file is deleted and RuntimeError
    raised.  Either the marker was there when the file was written, before discard began
    (which then deletes the file with the folder), or this deletes it."""
    if not exists(fs, f"{path}/{OPEN_MARKER}"):
        with suppress(OSError):
            fs.delete_file(f"{path}/{name}")
        raise RuntimeError(f"the write into {path!r} was given up (another task failed)")


@dataclass(frozen=True)
class Staging:
    """A write's hidden folder ``path`` (:func:`new_staging`), to become ``root``."""

    fs: pafs.FileSystem
    path: str
    root: str
    overwrite: bool


def commit(stagings: Sequence[Staging]) -> None:
    """Rename each staging folder to its root, in order, back to back.

    A root that exists (with ``overwrite``) is first moved aside (``<staging>-old``), and
    deleted once every rename is done.  If one fails (its root appeared without
    ``overwrite``, a rename failed), those renamed before it are put back, each new
    folder into its staging folder and its old root in place, and the error is raised:
    every root holds what it held before.  The filesystem renames one folder at a time,
    so a process killed between two renames leaves the first renamed; one killed within a
    folder's own two leaves its old root aside, which the next write there puts back
    (:func:`new_staging`).
    """
    done: list[tuple[Staging, str | None]] = []
    try:
        for staging in stagings:
            done.append((staging, _move_in(staging)))
    except BaseException:
        for staging, old in reversed(done):
            staging.fs.move(staging.root, staging.path)
            if old is not None:
                staging.fs.move(old, staging.root)
        raise
    for staging, old in done:
        if old is not None:
            _delete(staging.fs, old)


def discard(stagings: Sequence[Staging]) -> None:
    """Delete the staging folders that are still there (their write failed), each marker
    first (:data:`OPEN_MARKER`).  A write task still running may add a file while a
    folder is deleted ("directory not empty"): tried again, a few times.  Called while an
    error is raised, it raises none of its own, which would hide that one: a folder it
    cannot delete is named in a warning."""
    for staging in stagings:
        fs, path = staging.fs, staging.path
        for attempt in range(5):
            try:
                if not exists(fs, path):
                    break
                with suppress(FileNotFoundError):
                    fs.delete_file(f"{path}/{OPEN_MARKER}")
                fs.delete_dir(path)
            except OSError as err:
                if attempt < 4:
                    time.sleep(0.1)
                    continue
                warnings.warn(
                    f"the failed write's staging folder {path!r} could not be deleted "
                    f"({err}); delete it by hand",
                    errors.CosimWarning,
                    stacklevel=2,
                )


def _move_in(staging: Staging) -> str | None:
    """Rename ``staging.path`` to its root, the root moved aside first: where to (None
    when there was no root)."""
    fs, root = staging.fs, staging.root
    with suppress(FileNotFoundError):  # every task has written: the folder is complete
        fs.delete_file(f"{staging.path}/{OPEN_MARKER}")
    if not exists(fs, root):
        fs.move(staging.path, root)
        return None
    if not staging.overwrite:
        raise FileExistsError(f"{root!r} appeared while writing; pass overwrite=True")
    old = f"{staging.path}-old"
    fs.move(root, old)
    try:
        fs.move(staging.path, root)
    except BaseException:
        fs.move(old, root)
        raise
    return old


def _delete(fs: pafs.FileSystem, path: str) -> None:
    if fs.get_file_info(path).type == pafs.FileType.Directory:
        fs.delete_dir(path)
    else:  # the root an overwrite replaced was a file
        fs.delete_file(path)


def _remove_abandoned_staging(fs: pafs.FileSystem, parent: str, name: str) -> None:
    """Delete staging folders of earlier writes to ``name`` by processes of this host
    that no longer exist (killed before they could clean up); others are left alone.  An
    overwrite killed between its two renames left the old folder aside and no ``name``:
    it is put back first, as the folder was before that write."""
    if not isinstance(fs, pafs.LocalFileSystem):
        return  # no way to tell whether a writer elsewhere is alive
    for entry, found in _stagings(parent, name):
        if found["host"] != _HOST or _alive(int(found["pid"])):
            continue
        here, root = os.path.join(parent, entry), os.path.join(parent, name)
        if found["old"] and not os.path.lexists(root):
            os.rename(here, root)
        elif os.path.isdir(here) and not os.path.islink(here):
            shutil.rmtree(here, ignore_errors=True)
        else:  # the file an overwrite of a file was replacing
            os.remove(here)


def _stagings(parent: str, name: str) -> list[tuple[str, re.Match[str]]]:
    """The entries of the local folder ``parent`` that writes to ``name`` made (staging
    folders, and the ``-old`` folders of overwrites), each with its name parsed; none
    where ``parent`` cannot be listed."""
    try:
        entries = sorted(os.listdir(parent or "."))
    except OSError:
        return []
    found = [(e, _STAGING.search(e)) for e in entries if e.startswith(f".{name}.cosim-")]
    return [(e, match) for e, match in found if match is not None]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
