"""Writing into folders someone else made: no write, rename or delete goes through a symbolic link below a root.

Run folders travel (a colleague's artifacts/<run>/ copied over) and memos are shared, and a symlink planted inside
one, say `report -> ~/.ssh`, `export -> ~/data` or `train/simcse/metrics.jsonl -> ~/.bashrc`, would turn our writes
and deletes into writes and deletes in its target. So every writer reaches its folder from a root (the run folder,
the export target, the memo root) one component at a time, each opened with O_NOFOLLOW | O_DIRECTORY relative to
the one above (`openat`), and then creates, renames and removes names relative to that open folder (`dir_fd`): a
link found on the way is refused in one line naming it (UnsafePath), and a link swapped in after the check is not
followed either, because nothing is looked up by its path again. Libraries that take a path (pyarrow, FAISS, torch,
matplotlib) are given the open folder's /proc/self/fd/<fd>/<name>, which names that folder whatever happens to
its path meanwhile. The root itself and everything above it may be a link (a run on a bigger disk is a legitimate
link): nothing at or above `root` is looked at. A path outside `root` (an output folder the user named) is its own
root.

    with open_folder(run_dir, run_dir / "report") as d:       # UnsafePath if report/ is a link or a file
        d.unlink("stage_seconds.png", PLOTS)                   # only a name the project writes, never a folder
        savefig(d.at("x.png"))                                 # /proc/self/fd/<fd>/x.png: in the folder as opened
    check_below(run_dir, run_dir / "report" / "index.md")      # the same check, creating nothing
    log = open_append(run_dir, run_dir / "train" / "simcse" / "metrics.jsonl")

Deletes remove only names the caller's pattern says the project writes (a shard, a pack, a temp file of its own, a
plot it draws): an unknown file is left where it is, and a link among the names goes, never its target.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, overload

from contramine.pipeline.errors import ExpectedError

_DIR = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_FILE = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_PROC = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else None  # Linux: a path naming an open folder


class UnsafePath(ExpectedError, RuntimeError):
    """A folder or file below a root is a symbolic link (or not the kind of entry we write); the message names it."""


def linked(path: Path, root: Path, target: str) -> UnsafePath:
    return UnsafePath(f"{path} is a symbolic link inside {root} (to {target}): contramine does not write, rename or "
                      f"delete through links; remove it (or the folder it is in) and run again")


def not_a_folder(path: Path, root: Path) -> UnsafePath:
    return UnsafePath(f"{path} inside {root} is a file where a folder belongs: remove it and run again")


def relative_parts(root: Path | str, path: Path | str) -> tuple[Path, tuple[str, ...]]:
    """(root, the names from root down to path); a path outside root is its own root: (path, ())."""
    a, b = os.path.abspath(root), os.path.abspath(path)
    rel = os.path.relpath(b, a)
    if rel == os.curdir:
        return Path(root), ()
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        return Path(path), ()
    return Path(root), tuple(rel.split(os.sep))


class Folder:
    """A folder opened without following links, reached from `root`. Names below it are created, renamed and removed
    relative to the open folder (dir_fd), never by a path looked up again. Closed by `with` or `close()`."""

    def __init__(self, fd: int, path: Path, root: Path):
        self.fd, self.path, self.root = fd, Path(path), Path(root)

    def __enter__(self) -> "Folder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:  # a folder its holder forgot (an exception on the way) is closed when it goes
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- at interpreter exit
            pass

    def at(self, name: str = "") -> Path:
        """A path for libraries that take one: through /proc/self/fd, it names this open folder (and `name` in it)
        even if a link is swapped into the folder's path meanwhile; elsewhere the folder's path."""
        base = Path(_PROC, str(self.fd)) if _PROC else self.path
        return base / name if name else base

    def lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    @overload
    def child(self, name: str, create: Literal[True] = True) -> "Folder": ...
    @overload
    def child(self, name: str, create: bool) -> "Folder | None": ...

    def child(self, name: str, create: bool = True) -> "Folder | None":
        """The folder `name` in this one, opened without following a link (created when missing and `create`, else
        None); UnsafePath when it is a link or a file."""
        for _ in range(3):  # a racing creator of the same folder: open what it made
            try:
                return Folder(os.open(name, _DIR, dir_fd=self.fd), self.path / name, self.root)
            except FileNotFoundError:
                if not create:
                    return None
                try:
                    os.mkdir(name, 0o777, dir_fd=self.fd)
                except FileExistsError:
                    pass
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise
                self._refuse(name)
        raise OSError(errno.EAGAIN, f"{self.path / name}: folder keeps changing")

    def _refuse(self, name: str):
        st = self.lstat(name)
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise linked(self.path / name, self.root, os.readlink(name, dir_fd=self.fd))
        raise not_a_folder(self.path / name, self.root)

    def entries(self) -> list[os.DirEntry]:
        """What the folder holds (its own entries: a link is reported as one, never followed)."""
        with os.scandir(self.fd) as it:
            return list(it)

    def open_file(self, name: str) -> int:
        """`name` opened for reading, refusing a link or anything but a regular file (UnsafePath)."""
        try:
            fd = os.open(name, _FILE | getattr(os, "O_NONBLOCK", 0), dir_fd=self.fd)  # a FIFO must not hang us
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EMLINK):
                raise linked(self.path / name, self.root, os.readlink(name, dir_fd=self.fd)) from None
            if e.errno == errno.ENXIO:  # a socket
                raise not_regular(self.path / name, os.lstat(name, dir_fd=self.fd).st_mode) from None
            raise
        return _regular(fd, self.path / name)

    def replace(self, src: str, dst: str, to: "Folder | None" = None) -> None:
        """Rename `src` here to `dst` (in `to`, default here), replacing `dst`: a link at `dst` is replaced itself, its
        target untouched; a folder at `dst` where a file goes is refused in one line."""
        to = to or self
        try:
            os.replace(src, dst, src_dir_fd=self.fd, dst_dir_fd=to.fd)
        except IsADirectoryError:
            raise UnsafePath(f"{to.path / dst} is a folder where contramine writes a file: remove it and run "
                             f"again") from None

    def unlink(self, name: str, own: re.Pattern) -> bool:
        """Remove `name` when it is a name the project writes (`own` matches it whole) and not a folder: a link goes,
        never its target. False when absent, not ours, or a folder."""
        if not own.fullmatch(name):
            return False
        st = self.lstat(name)
        if st is None or stat.S_ISDIR(st.st_mode):
            return False
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            return False
        return True

    def rmtree(self, name: str, own: re.Pattern) -> bool:
        """Remove the folder `name` and what it holds when `own` matches its name: links inside are removed as links
        (shutil's fd-based walk never follows one), a link in its place is removed as a link."""
        if not own.fullmatch(name):
            return False
        st = self.lstat(name)
        if st is None:
            return False
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=self.fd)
        else:
            shutil.rmtree(name, dir_fd=self.fd, ignore_errors=True)
        return True

    def fsync(self) -> None:
        os.fsync(self.fd)


# ---- reading a file someone else may have planted: never a FIFO's endless wait, never a device's bytes -------------
def kind_of(mode: int) -> str:
    """What a non-regular entry is, in words (for the one line that refuses it)."""
    for test, words in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"),
                        (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return words
    return "not a regular file"


def not_regular(path: Path | str, mode: int) -> UnsafePath:
    return UnsafePath(f"{path} is {kind_of(mode)}, not a regular file: contramine reads only plain files there; "
                      f"remove it and run again")


def _regular(fd: int, path: Path | str) -> int:
    """`fd` (opened O_NONBLOCK) when it is a regular file, now blocking again; else closed and UnsafePath."""
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise not_regular(path, mode)
    os.set_blocking(fd, True)
    return fd


def open_regular(path: Path | str, follow: bool = False) -> int:
    """A read-only descriptor of `path`, checked with fstat to be a regular file: opened O_NONBLOCK, so a FIFO
    planted there answers at once instead of waiting for a writer forever, then made blocking again. Not following
    a link unless `follow` (a link is UnsafePath then). FileNotFoundError when absent; UnsafePath (one line naming
    it) for a FIFO, socket, device, folder or link. Every reader of a file under a run or the memo opens it here
    (or through `Folder.open_file`, the same check relative to an open folder)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK) and not follow:
            raise UnsafePath(f"{path} is a symbolic link (to {os.readlink(path)}): contramine does not read "
                             f"through links there; remove it and run again") from None
        if e.errno in (errno.EISDIR, errno.ENXIO):  # a folder opened for writing; a socket
            raise not_regular(path, os.lstat(path).st_mode) from None
        raise
    return _regular(fd, path)


class TooLarge(UnsafePath):
    """A file the project writes small (a manifest, a sidecar, a cache) that is larger than any it writes: refused
    from its fstat size before a byte is read (a sparse 1 GiB file costs nothing on disk and everything in memory)."""

    def __init__(self, path: Path | str, size: int, max_size: int):
        super().__init__(f"{path} is {size:,} bytes, larger than the {max_size:,} any such file of contramine's is: "
                         f"not read (remove it, or write it again)")
        self.size, self.max_size = size, max_size


def read_regular(path: Path | str, follow: bool = False, limit: int | None = None,
                 max_size: int | None = None) -> bytes:
    """The bytes of `path`, opened by `open_regular` (a FIFO, socket, device or link is UnsafePath in one line);
    with `limit`, at most that many bytes; with `max_size`, TooLarge (one line) when fstat says it is larger."""
    with os.fdopen(open_regular(path, follow), "rb") as f:
        if max_size is not None and (size := os.fstat(f.fileno()).st_size) > max_size:
            raise TooLarge(path, size, max_size)
        return f.read() if limit is None else f.read(limit)


@overload
def open_folder(root: Path | str, path: Path | str, create: Literal[True] = True) -> Folder: ...
@overload
def open_folder(root: Path | str, path: Path | str, create: bool) -> Folder | None: ...


def open_folder(root: Path | str, path: Path | str, create: bool = True) -> Folder | None:
    """The folder `path`, reached from `root` one component at a time without following a link (each created when
    missing and `create`; else None when one is missing). `root` itself is opened as given (it may be a link) and
    created when missing. UnsafePath names the first link or file on the way."""
    root, parts = relative_parts(root, path)
    try:
        fd = os.open(root, _DIR & ~getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        if not create:
            return None
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root, _DIR & ~getattr(os, "O_NOFOLLOW", 0))
    except NotADirectoryError:
        raise UnsafePath(f"{root} is a file where a folder belongs: remove it and run again") from None
    cur = Folder(fd, root, root)
    for part in parts:
        try:
            nxt = cur.child(part, create)
        finally:
            cur.close()
        if nxt is None:
            return None
        cur = nxt
    return cur


def check_below(root: Path | str, path: Path | str, final: bool = False) -> Path:
    """Refuse (UnsafePath) when a folder between `root` (excluded) and `path` is a symlink or not a folder; with
    `final`, `path` itself must not be a symlink either. Components that do not exist yet are fine (a writer creates
    them as plain folders); nothing is created here. A `path` outside `root` is its own root. Returns `path`."""
    root_, parts = relative_parts(root, path)
    if not parts:
        return Path(path)
    folder = open_folder(root_, root_, create=False)
    if folder is None:
        return Path(path)
    try:
        for i, part in enumerate(parts):
            st = folder.lstat(part)
            if st is None:
                break
            last = i == len(parts) - 1
            if stat.S_ISLNK(st.st_mode):
                if last and not final:
                    break  # a file replaced by a rename: the link goes, its target stays untouched
                raise linked(folder.path / part, root_, os.readlink(part, dir_fd=folder.fd))
            if last:
                break
            if not stat.S_ISDIR(st.st_mode):
                raise not_a_folder(folder.path / part, root_)
            nxt = folder.child(part, create=False)
            folder.close()
            if nxt is None:  # removed since its lstat: nothing below exists, as when lstat finds nothing
                break
            folder = nxt
    finally:
        folder.close()
    return Path(path)


def make_dirs(root: Path | str, path: Path | str) -> Path:
    """`path` as a folder below `root`, created where missing, no component a link. Returns `path`."""
    open_folder(root, path).close()
    return Path(path)


def open_append(root: Path | str, path: Path | str, buffering: int = 1):
    """`path` opened for appending text: a symlink (or another non-regular entry that can be unlinked) in its place
    is removed first, so the log starts as a new plain file and nothing of the link's target is read or written;
    O_NOFOLLOW makes the open itself fail rather than follow a link."""
    path = Path(path)
    with open_folder(root, path.parent) as d:
        st = d.lstat(path.name)
        if st is not None and not stat.S_ISREG(st.st_mode):
            try:
                os.unlink(path.name, dir_fd=d.fd)
            except OSError:
                raise UnsafePath(f"{path} is not a regular file (a folder?): remove it and run again") from None
        fd = os.open(path.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                     dir_fd=d.fd)
    return os.fdopen(fd, "a", buffering=buffering)


@contextmanager
def readable(root: Path | str, path: Path | str):
    """A path naming `path` (below `root`, no component a link, the file itself not a link) as it was opened here:
    /proc/self/fd/<fd> on Linux, so a library that takes a path (FAISS, numpy's memmap) reads exactly this file.
    FileNotFoundError when it or its folder is absent."""
    path = Path(path)
    folder = open_folder(root, path.parent, create=False)
    if folder is None:
        raise FileNotFoundError(errno.ENOENT, "no such folder", str(path.parent))
    with folder:
        fd = folder.open_file(path.name)
    try:
        yield Path(_PROC, str(fd)) if _PROC else path
    finally:
        os.close(fd)


def walk(root: Path | str, path: Path | str | None = None):
    """(folder path, names of its plain files) for `path` (default `root`) and every folder below it, reached
    without following a link (a link to a folder, `loop -> ..` included, is neither entered nor listed, and a link
    to a file is not listed): what reads a run folder whole (`make tensorboard`) reads."""
    top = open_folder(root, path if path is not None else root, create=False)
    if top is not None:
        with top:
            yield from _walk(top)


def _walk(folder: Folder):
    subdirs, files = [], []
    for e in sorted(folder.entries(), key=lambda e: e.name):
        if e.is_symlink():
            continue
        if e.is_dir(follow_symlinks=False):
            subdirs.append(e.name)
        elif e.is_file(follow_symlinks=False):
            files.append(e.name)
    yield folder.path, files
    for name in subdirs:
        try:
            child = folder.child(name, create=False)
        except UnsafePath:  # swapped for a link since it was listed
            continue
        if child is not None:
            with child:
                yield from _walk(child)
