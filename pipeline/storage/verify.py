"""Every read checks what it reads: a shard's bytes hash to what its table's manifest records before anything serves
them (`make sql`, the report, exports, the trainer, a stage reading its inputs, `contramine verify`).

The manifest records each shard's blake2b-128 of its whole file (store.file_hash, taken by the writer right after
the rename). Hashing every shard at every `sql` would cost seconds on a large run, so a check that passed is
remembered in the run's `.verified.json`: {"<table>/<file>": [device, inode, size, mtime_ns, ctime_ns, hash]}. A
remembered check counts only while the file's device, inode, size, mtime_ns and ctime_ns are what they were and the
manifest records the same hash: a rewrite (a new inode: every write is a rename), a truncation (size), a byte
flipped in place (mtime; and ctime, which no user can set back: an in-place rewrite with its mtime restored) or a
new commit (hash) hashes the file again. The manifest also records each shard's size, compared (fstat) before the
file is hashed: a shard grown to 8 GiB is one line at once. The cache is written atomically, 0600 (only its user
writes it), and read only when it is its user's own and no one else may write it; a run folder that cannot be
written (read-only) is checked all the same, only not remembered.

The check is of an open file, and what is served is read from that same descriptor (open_checked; served.py), never
by the path again: a shard renamed over the original after its check is not served, by pyarrow or by a `sql`
connection that is already open. So every byte any reader serves, DuckDB's `sql` and the report included, is a byte
of a file whose whole hash matched. DuckDB does not check Parquet page checksums and does not need to: the file hash
covers them. (pyarrow's readers verify them all the same; store.write_shard writes them.)

    verified = Verified(run_dir)
    why = verified.check("triplets", path, expected_hash, size)   # None: intact; else why ("missing", "damaged ...")
    verified.save()
"""
from __future__ import annotations

import errno
import hashlib
import os
import stat
import threading
from pathlib import Path

from contramine.pipeline.errors import json_loads
from contramine.pipeline.hints import command
from contramine.pipeline.storage.atomic import atomic_write_json
from contramine.pipeline.storage.shard_names import MANIFEST

CACHE = ".verified.json"
_CACHE_MAX = 16 << 20  # a cache file larger than this is not ours: ignored (and replaced at the next save)


# table -> the stage that writes it, for the lines below: the engine's discovery fills it when it loads the stages
# (storage sits below the stages and never imports them; the information comes down)
WRITERS: dict[str, str] = {}


def table_line(table_dir: Path, what: str, man=None) -> str:
    """One line: which table of which run, `what` is wrong, and the stage run that writes the table again (the
    writer of the stages loaded in this process, WRITERS; else the manifest's own `stage`)."""
    table_dir = Path(table_dir)
    table, run = table_dir.name, table_dir.parent.name
    named = man.get("stage") if isinstance(man, dict) else None
    stage = WRITERS.get(table) if WRITERS else (named if isinstance(named, str) and named.isidentifier() else None)
    fix = (f"rewrite it with `{command('stage', stage=stage, run=run, force=True)}`" if stage else
           f"no stage writes `{table}`: remove {table_dir} or write it again" if WRITERS else
           f"remove {table_dir} or write it again with the stage that writes `{table}`")
    return f"table `{table}` of run {run!r}: {what}: {fix}"


def damaged_line(table_dir: Path, file: str, why: str) -> str:
    """The one line for a listed shard that is not what its manifest recorded (the manifest's own `stage` names the
    fix where this process loaded no stages: `sql`, `verify`)."""
    return table_line(table_dir, f"shard {Path(table_dir) / file} {why} (nothing of it is served)",
                      small_json(Path(table_dir) / MANIFEST))


def content_hash(f) -> str:
    """The hash a manifest records for a shard (store.file_hash: blake2b-128 of the whole file), of an open file."""
    return hashlib.file_digest(f, lambda: hashlib.blake2b(digest_size=16)).hexdigest()


def small_json(path: Path, private: bool = False) -> dict:
    """A small JSON object the project keeps beside its tables (a cache, a record), or {} for anything else: no
    link is followed, a FIFO does not block, a file past 16 MiB (fstat, before it is read), nested too deep or of
    another shape is not read. `private`: only a file of this user's that no one else may write (a cache that
    vouches for files)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _CACHE_MAX:
            return {}
        if private and (st.st_uid != os.getuid() or st.st_mode & 0o022):
            return {}
        data = json_loads(os.read(fd, st.st_size + 1))
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else {}


# The files this process hashed itself (a shard it has just written, or checked): (device, inode) -> [size, mtime_ns,
# ctime_ns, hash], the fstat taken before the hash. It vouches within one process as the run's cache does across
# processes, by the same identity (a rewrite is a new inode; an edit in place moves ctime), and nothing outside the
# process can write it: the commit's check of a shard written a moment ago (Store.finish), and a rerun's look at a
# shard it wrote, are a fstat instead of a second hash of the whole file.
_HASHED: dict[tuple[int, int], list] = {}
_HASHED_LOCK = threading.Lock()
_HASHED_MAX = 100_000  # entries (~200 bytes each); past it, forgotten all at once (a long-lived Dask worker)


def foreign_owner(uid: int, run_dir: Path | str) -> int | None:
    """`uid`, where a file of it in `run_dir` is neither the run folder's owner's nor root's: another account put
    it there (a table folder others may write, made under a umask of 002, lets them); None else."""
    try:
        owner = os.stat(run_dir).st_uid
    except OSError:
        return None
    return uid if uid not in (owner, 0) else None


def hash_open(fd: int) -> tuple[os.stat_result, str]:
    """(fstat, content hash) of an open file, remembered in this process under that fstat (taken first: a change
    while it is hashed moves ctime, so what is remembered never vouches for the changed file)."""
    st = os.fstat(fd)
    with open(fd, "rb", closefd=False) as f:
        digest = content_hash(f)
    with _HASHED_LOCK:
        if len(_HASHED) >= _HASHED_MAX:
            _HASHED.clear()
        _HASHED[(st.st_dev, st.st_ino)] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, digest]
    return st, digest


def hashed_here(st: os.stat_result) -> str | None:
    """The hash this process took of the file `st` (a fstat) describes, if it has not changed since; else None."""
    with _HASHED_LOCK:
        seen = _HASHED.get((st.st_dev, st.st_ino))
    return seen[3] if seen is not None and seen[:3] == [st.st_size, st.st_mtime_ns, st.st_ctime_ns] else None


class Verified:
    """The run's remembered checks (see the module doc). Thread-safe: a stage's shard threads share one."""

    def __init__(self, run_dir: Path | str, remembered: bool = True):
        """`remembered=False`: hash every file again (`contramine verify`), and remember what passed."""
        self.run_dir = Path(run_dir)
        self._lock = threading.Lock()
        self._dirty = not remembered  # a fresh check replaces what was remembered
        self._seen: dict[str, list] = self._load() if remembered else {}

    def _load(self) -> dict[str, list]:
        data = small_json(self.run_dir / CACHE, private=True)
        # an entry of the layout before ctime and device ([inode, size, mtime_ns, hash]) is not one: hashed again
        return {k: v for k, v in data.items() if isinstance(v, list) and len(v) == 6}

    def check(self, table: str, path: Path, expected: str | None, size: int | None = None) -> str | None:
        """None when `path` (a shard of `table`) is a plain file of `size` bytes (when the manifest records it)
        whose bytes hash to `expected`; else why not, as a few words for the one line. A shard whose manifest
        records no hash (the oldest layout) is not checked."""
        fd, why = self.open_checked(table, path, expected, size)
        if fd is not None:
            os.close(fd)
        return why

    def open_checked(self, table: str, path: Path, expected: str | None,
                     size: int | None = None) -> tuple[int | None, str | None]:
        """(an open descriptor of the file checked, None), or (None, why not), as `check`. The file is opened
        first, without following a link and without blocking on a FIFO; its size (fstat) is compared before a byte
        is hashed; what is hashed, and what is remembered, is that open file. The caller serves the bytes from
        this descriptor (served.py) and closes it: a file renamed over `path` since is not what it reads."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None, "is missing"
        except OSError as e:
            return None, "is not a plain file" if e.errno == errno.ELOOP else f"cannot be read ({e.strerror})"
        try:
            why = self._check_open(fd, table, path, expected, size)
        except BaseException:
            os.close(fd)
            raise
        if why is not None:
            os.close(fd)
            return None, why
        return fd, None

    def _check_open(self, fd: int, table: str, path: Path, expected: str | None, size: int | None) -> str | None:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "is not a plain file"
        if (uid := foreign_owner(st.st_uid, self.run_dir)) is not None:
            return f"is owned by uid {uid}, not by the run folder's owner: another account put it there"
        if st.st_mode & 0o022:  # every commit writes 0444: a file others may write can change after its check
            if st.st_uid == os.getuid():  # ours (a run mined before 0444 under a umask of 002): made read-only
                try:
                    os.fchmod(fd, 0o444)
                    st = os.fstat(fd)
                except OSError:
                    pass
            # still writable by others: another account's file, or a file system whose modes are not kept (WSL's
            # /mnt/c, CIFS): only another account's is refused
            if st.st_mode & 0o022 and st.st_uid != os.getuid():
                return (f"may be written by others (mode {stat.S_IMODE(st.st_mode):04o}, owned by uid {st.st_uid}), "
                        f"so what is checked is not what is read: `chmod go-w` it if you trust its writers")
        if not expected:
            return None
        if size is not None and st.st_size != size:
            return (f"is damaged: {st.st_size:,} bytes where its manifest records {size:,} (grown, truncated "
                    f"or replaced; not hashed)")
        key = f"{table}/{Path(path).name}"
        now = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, expected]
        with self._lock:
            if self._seen.get(key) == now:
                return None
        try:
            got = hashed_here(st) or hash_open(fd)[1]
        except OSError as e:
            return f"cannot be read ({e.strerror})"
        if got != expected:
            return (f"is damaged: its {st.st_size:,} bytes do not hash to the {expected[:16]}… its manifest records "
                    f"(a flipped byte or a truncation)")
        with self._lock:
            self._seen[key], self._dirty = now, True
        return None

    def save(self) -> None:
        """Write the remembered checks (only files still there), atomically; a folder that cannot be written (read
        only, a full disk) keeps none: the next reader hashes again."""
        with self._lock:
            if not self._dirty:
                return
            keep = {k: v for k, v in self._seen.items() if os.path.lexists(self.run_dir / k)}
            self._dirty = False
        try:
            atomic_write_json(self.run_dir / CACHE, keep, root=self.run_dir, mode=0o600)
        except Exception:  # noqa: BLE001 - remembering is an optimisation: never the reason a read fails
            pass


def first_damaged(verified: Verified, table_dir: Path, files: list[dict]) -> str | None:
    """Before a commit (store.Store.finish): the one line for the first listed file that is not a plain file
    hashing to its entry's hash, or None (and every file checked is remembered in `verified`)."""
    for e in files:
        why = verified.check(Path(table_dir).name, Path(table_dir) / e["file"], e.get("hash"), e.get("bytes"))
        if why is not None:
            return damaged_line(table_dir, e["file"], why)
    return None
