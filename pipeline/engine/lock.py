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
"""
from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import socket
import threading
from contextlib import contextmanager
from pathlib import Path

from pipeline.engine.safe_paths import open_folder
from pipeline.errors import ExpectedError

LOCK = ".lock"
_held: dict[tuple[Path, str], list] = {}  # (folder, lock file name) -> [open file, depth] of this process
_guard = threading.Lock()


class RunBusy(ExpectedError, RuntimeError):
    """Another process is writing this run folder."""


def holder(run_dir: Path | str) -> dict:
    """What the lock file says of its holder ({} when nothing readable)."""
    try:
        return json.loads((Path(run_dir) / LOCK).read_text() or "{}")
    except (OSError, json.JSONDecodeError):
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
    where = folder / name
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    with open_folder(folder if root is None else root, folder) as d:
        try:
            fd = os.open(name, flags, 0o644, dir_fd=d.fd)
        except OSError as e:  # a planted symlink (O_NOFOLLOW) or a folder in its place
            raise RunBusy(f"{where}: cannot open the {'run' if root is None else 'folder'}'s lock file "
                          f"({e.strerror}): remove it") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        h = _read_holder(fd)
        os.close(fd)
        raise RunBusy(f"{'run folder ' if root is None else ''}{os.path.abspath(folder)} is being written by pid "
                      f"{h.get('pid', '?')} on host {h.get('host', '?')} since {h.get('since', '?')} "
                      f"({h.get('what', '?')}): wait for it to end, or {hint}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "what": what,
                              "since": dt.datetime.now().astimezone().isoformat(timespec="seconds")}).encode(), 0)
    return fd


def _read_holder(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 1 << 16, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}
