"""One writer per run folder: the process that mines or reruns a stage holds `<run>/.lock`; a second writer stops at
once with one line naming the holder (host, pid, since when, what), as Git's index.lock does. Readers take no lock:
they read the committed snapshot (store.py), which a writer only ever replaces whole.

The lock is the kernel's (`fcntl.flock` on an open file), so it is released when its holder dies, kill -9 and
out-of-memory included: a stale `.lock` file never blocks. On NFS the Linux client turns flock into a lock the
server holds as a lease, which expires when the client stops renewing it (a dead machine frees the run after the
server's lease time, 90 s by default on NFSv4). Workers of a Dask cluster write shards under their flow's lock:
they never take it, the flow's process holds it from its first write to its last commit.

Held per process and re-entrant: `make mine` holds it for the whole run and each stage's `run_stage` enters it again.

The commands that write one output folder of a run lock that folder instead, so that they run beside `make mine`
(they read its committed snapshot) and beside each other, but never twice over one folder: `make train` holds
train/<objective>/.lock (two objectives of one run train side by side, one objective twice stops in one line),
`make export` export/.<format>.lock, `make compare` compare/.lock (each of its trainings its own folder's too),
`make report` report/.lock. Such a lock is opened like every write below a run: no folder on the way may be a link.

A lock file is never written in place. Taking it flocks the file that is there (opened non-blocking, checked with
fstat to be a regular file: a FIFO or socket is one line), then replaces the name with a fresh file (O_EXCL) that
holds this process' record and is flocked before the rename makes it visible. So a hard link planted at `.lock` is
left unchanged, and runs copied with `cp -al` or `rsync --link-dest` (which share the lock file's inode) part ways
on their first take. The record names the folder (device, inode) its holder locked: a file shared with another
folder whose holder is still running is not waited for.
"""
from __future__ import annotations

import datetime as dt
import errno
import fcntl
import json
import os
import secrets
import socket
import stat
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from contramine.pipeline.storage.safe_paths import UnsafePath, kind_of, open_folder, read_regular
from contramine.pipeline.errors import ExpectedError, json_loads

LOCK = ".lock"
_held: dict[tuple[Path, str], list] = {}  # (folder, lock file name) -> [open file, depth] of this process
_guard = threading.Lock()


class RunBusy(ExpectedError, RuntimeError):
    """Another process is writing this run folder."""


def holder(run_dir: Path | str) -> dict:
    """What the lock file says of its holder ({} when nothing readable; a FIFO or other non-file there is nothing)."""
    try:
        return json_loads(read_regular(Path(run_dir) / LOCK, limit=1 << 16) or b"{}")
    except (OSError, ValueError, UnsafePath):
        return {}


@contextmanager
def run_lock(folder: Path | str, what: str = "mine", root: Path | str | None = None, name: str = LOCK,
             hint: str = "mine into another RUN"):
    """Hold `folder`'s writer lock (the file `name` in it) for the block; RunBusy at once, in one line naming the
    holder, if another process holds it. Without `root` the folder is a run folder (it may be a link itself); with
    one, the folder is an output folder below `root`, reached without following a link (safe_paths.py), and the lock
    guards what is written there (train/<objective>/, export/<format>, compare/, report/)."""
    key = (Path(os.path.abspath(folder)), name)
    with _guard:
        if key in _held:
            _held[key][1] += 1
        else:
            _held[key] = [_take(Path(folder), what, root, name, hint), 1]
    try:
        yield key[0]
    finally:
        with _guard:
            _held[key][1] -= 1
            if _held[key][1] == 0:
                fd = _held.pop(key)[0]
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)


def _take(folder: Path, what: str, root: Path | str | None, name: str, hint: str) -> int:
    """The held descriptor of a fresh lock file `name` in `folder`. Never written in place: the holder record goes
    into a new file (O_EXCL, flocked before anyone can see it) that replaces the name atomically while the old file's
    lock is held, so a hard link planted at the name, or shared by a `cp -al` copy of the run, is never written."""
    where = folder / name
    with open_folder(folder if root is None else root, folder) as d:
        if root is None and (owner := os.fstat(d.fd).st_uid) != os.getuid() and os.getuid() != 0:  # made by
            raise RunBusy(f"run folder {os.path.abspath(folder)} is another account's (uid {owner}): a stage "  # another
                          f"would reuse whatever its tables hold; {hint}")  # account first: never mined into (root
            # is exempt: a container's root over a folder its host user made)
        for _ in range(50):  # a racing taker replaced the file between our open and our flock: look again
            try:
                old = os.open(name, _OPEN, dir_fd=d.fd)
            except FileNotFoundError:
                old = None
            except OSError as e:  # a planted symlink (O_NOFOLLOW), a folder, a socket (ENXIO) in its place
                st = _lstat(d, name)
                if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                    raise RunBusy(f"{where}: the lock file is {kind_of(st.st_mode)}, not a regular file: remove it "
                                  f"and run again") from None
                raise RunBusy(f"{where}: cannot open the {'run' if root is None else 'folder'}'s lock file "
                              f"({e.strerror}): remove it") from None
            if old is not None:
                st = os.fstat(old)
                if not stat.S_ISREG(st.st_mode):
                    os.close(old)
                    raise RunBusy(f"{where}: the lock file is {kind_of(st.st_mode)}, not a regular file: remove it "
                                  f"and run again")
                if not _flock(old, st, d):
                    h = _read_holder(old)
                    os.close(old)
                    raise RunBusy(f"{'run folder ' if root is None else ''}{os.path.abspath(folder)} is being "
                                  f"written by pid {h.get('pid', '?')} on host {h.get('host', '?')} since "
                                  f"{h.get('since', '?')} ({h.get('what', '?')}): wait for it to end, or {hint}")
                if not _names(d, name, st):  # replaced since we opened it: take what is there now
                    os.close(old)
                    continue
            try:
                fd = _fresh(d, name, what, replace=old is not None)
            except OSError as e:
                if old is None and e.errno == errno.EEXIST:
                    continue  # another taker made it first: take it as theirs
                raise RunBusy(f"{where}: cannot write the {'run' if root is None else 'folder'}'s lock file "
                              f"({e.strerror}){' (a read-only folder?)' if e.errno in _DENIED else ''}") from None
            finally:
                if old is not None:
                    os.close(old)  # its lock goes with it; the name is ours now
            return fd
    raise RunBusy(f"{where}: the lock file keeps being replaced by another process: run again")


# read-write though never written: on NFS an exclusive flock (a POSIX lock there) needs a descriptor open for writing
_OPEN = os.O_RDWR | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)


def _flock(fd: int, st: os.stat_result, d) -> bool:
    """Take `fd`'s lock, or False when another process holds it. A file linked elsewhere (`cp -al`, `rsync
    --link-dest`) whose holder recorded another folder is not ours to wait for: a short retry covers a taker of the
    other folder that holds it only while it replaces its own name."""
    for attempt in range(20):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if st.st_nlink < 2:
                return False
            own = os.fstat(d.fd)
            if _read_holder(fd).get("folder") not in (None, [own.st_dev, own.st_ino]):
                return True  # held for another folder that shares this file: we replace our name, never it
            time.sleep(0.02)
    return False


def _lstat(d, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=d.fd, follow_symlinks=False)
    except OSError:
        return None


def _names(d, name: str, st: os.stat_result) -> bool:
    """Whether `name` in the open folder still is the file `st` describes."""
    try:
        now = os.stat(name, dir_fd=d.fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)


def _fresh(d, name: str, what: str, replace: bool) -> int:
    """A new lock file holding this process' record, flocked, then put at `name` (replacing what is there, whose
    lock the caller holds; else linked in, EEXIST when another taker was first)."""
    tmp = f"{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=d.fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        here = os.fstat(d.fd)
        os.write(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "what": what,
                                 "since": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
                                 "folder": [here.st_dev, here.st_ino]}).encode())
        if replace:
            os.replace(tmp, name, src_dir_fd=d.fd, dst_dir_fd=d.fd)
        else:
            os.link(tmp, name, src_dir_fd=d.fd, dst_dir_fd=d.fd, follow_symlinks=False)
            os.unlink(tmp, dir_fd=d.fd)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(tmp, dir_fd=d.fd)
        except OSError:
            pass
        raise
    return fd


def _read_holder(fd: int) -> dict:
    try:
        out = json_loads(os.pread(fd, 1 << 16, 0).decode() or "{}")
        return out if isinstance(out, dict) else {}
    except (OSError, ValueError):
        return {}
