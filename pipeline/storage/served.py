"""What is served is the bytes that were checked: a shard is read from the descriptor that was hashed (verify.py),
never by its path again, so a file renamed over the shard after its check is not what a reader gets.

On Linux a held descriptor has a path, /proc/self/fd/<fd>, that names the open file whatever happens to its folder
entry since (a rename over it, an unlink): pyarrow opens that path once (an OSFile the dataset keeps, so the dataset
reads the checked file for as long as it lives), and DuckDB, which opens the files of a view again at every query,
is given those paths of descriptors that live as long as its connection (weakref.finalize closes them when the
connection goes: no descriptor outlives it, however many connections a process makes). Elsewhere (no /proc/self/fd)
pyarrow reads the held file object and DuckDB reads the path, as it did before: there a rename between a `sql`
connection's check and its query is served.

Each held shard is one open descriptor (two while pyarrow opens its own), and a run of many shards x tables can
pass the soft RLIMIT_NOFILE (1024 by default): `room_for` raises the soft limit towards the hard one, and where even
that is short the caller reads the table into memory shard by shard, each from its checked descriptor.
"""
from __future__ import annotations

import os
import weakref
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

try:
    import resource
except ImportError:  # not on Windows: there the limit is the C runtime's, and room_for cannot raise it
    resource = None  # type: ignore[assignment]

PROC = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else None
SPARE = 128  # descriptors left free for everything else (DuckDB's own opens, logs, sockets)
# pyarrow's readers also check each Parquet page's checksum (store.write_shard writes them)
FORMAT = pads.ParquetFileFormat(default_fragment_scan_options=pads.ParquetFragmentScanOptions(
    page_checksum_verification=True))


def fd_path(fd: int, path: Path) -> str:
    """The path that names the checked file behind `fd` (/proc/self/fd/<fd>); `path` where there is none."""
    return f"{PROC}/{fd}" if PROC else str(path)


def open_source(fd: int) -> pa.NativeFile:
    """A pyarrow file of its own reading the file behind `fd` (the caller still closes `fd`)."""
    if PROC:
        return pa.OSFile(f"{PROC}/{fd}")
    return pa.PythonFile(os.fdopen(os.dup(fd), "rb"), mode="r")


def read_checked(fd: int, columns: list[str] | tuple[str, ...] | None = None,
                 dictionary: tuple[str, ...] = ()) -> pa.Table:
    """The Parquet table in the checked file behind `fd`, its page checksums verified; `columns`: only those of them
    the file has (None: all); `dictionary`: string columns read as dictionary columns (their distinct values decoded
    once: a column of a few kinds over millions of rows)."""
    with open_source(fd) as source:  # one open: the footer read for the names, then the table (random access)
        if columns is not None:
            present = set(pq.read_schema(source).names)
            columns = [c for c in columns if c in present]
        return pq.read_table(source, columns=columns, read_dictionary=list(dictionary) or None,
                             page_checksum_verification=True)


def dataset_of(fds: list[int]) -> pads.Dataset:
    """The checked files behind `fds` (in shard order) as one dataset, each opened once here and kept open by the
    dataset (the caller closes `fds`); its schema is the first file's, as pyarrow.dataset.dataset infers it."""
    fragments = [FORMAT.make_fragment(open_source(fd)) for fd in fds]
    return pads.FileSystemDataset(fragments, fragments[0].physical_schema, FORMAT)


def close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


_HELD: "weakref.WeakKeyDictionary[object, list[list]]" = weakref.WeakKeyDictionary()


def _stamp(fd: int) -> tuple:
    st = os.fstat(fd)
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


def hold_for(owner: object, fds: list[int], paths: list[Path] | None = None,
             hashes: list[str | None] | None = None) -> None:
    """Keep `fds` open as long as `owner` (a DuckDB connection) lives, and close them when it goes; remember what
    each file was when it was checked (size, mtime, ctime, the hash it was checked against), for
    `changed_since_checked`."""
    weakref.finalize(owner, close_all, list(fds))
    held = _HELD.setdefault(owner, [])
    for i, fd in enumerate(fds):
        held.append([fd, paths[i] if paths else Path(f"{PROC}/{fd}"), _stamp(fd), hashes[i] if hashes else None])


def with_paths(owner: object, text: str) -> str:
    """`text` (a DuckDB error) with the /proc/self/fd paths of files `owner` holds written as the files' own."""
    for fd, path, _, _ in sorted(_HELD.get(owner, ()), key=lambda h: -h[0]):  # fd 12 before fd 1
        text = text.replace(f"{PROC}/{fd}", str(path))
    return text


def changed_since_checked(owner: object, rehash: bool = True) -> Path | None:
    """The first file `owner` holds whose bytes may have changed since they were checked, or None. DuckDB reads a
    view's files again at every query: `sql` asks this before and after each one, so a query never answers from
    bytes that were not checked. A size or mtime that moved is a change (a rewrite in place by whoever may write
    it); a ctime alone moves also when a hard link to the file is made or removed (`--reuse-from`, a commit's grace
    collection), so then, with `rehash` (before a query), the file is hashed again and kept where it still hashes to
    what it was checked against; after a query any change refuses its answer (a forged file restored meanwhile
    would hash right again)."""
    from contramine.pipeline.storage.verify import hash_open

    for held in _HELD.get(owner, ()):
        fd, path, stamp, expected = held
        try:
            now = _stamp(fd)
            if now == stamp:
                continue
            if now[:2] != stamp[:2] or not rehash or not expected:
                return path
            os.lseek(fd, 0, os.SEEK_SET)  # (the check's own hash left the offset at the end)
            if hash_open(fd)[1] != expected:
                return path
            held[2] = now
        except OSError:
            return path
    return None


def _in_use() -> int:
    try:
        return len(os.listdir(PROC)) if PROC else 0
    except OSError:
        return 0


def room_for(n: int) -> bool:
    """Whether `n` more descriptors can be held open, the soft RLIMIT_NOFILE raised (towards the hard one) where
    that makes room; False when even the hard limit is short (the caller reads into memory instead)."""
    if resource is None:
        return True
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = _in_use() + n + SPARE
    if soft == resource.RLIM_INFINITY or want <= soft:
        return True
    raised = want if hard == resource.RLIM_INFINITY else min(hard, want)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    except (ValueError, OSError):
        return False
    return raised >= want
