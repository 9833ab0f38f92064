"""One writer per run folder: the process that mines or reruns a stage holds `<run>/.lock`; a second writer stops at
once with one line naming the holder (host, pid, since when, what), as Git's index.lock does. Readers take no lock:
they read the committed snapshot (store.py), which a writer only ever replaces whole.

The lock is the kernel's (`fcntl.flock` on an open file), so it is released when its holder dies, kill -9 and
out-of-memory included: a stale `.lock` file never blocks. On NFS the Linux client turns flock into a lock the
server holds as a lease, which expires when the client stops renewing it (a dead machine frees the run after the
server's lease time, 90 s by default on NFSv4). Workers of a Dask cluster write shards under their flow's lock:
they never take it, the flow's process holds it from its first write to its last commit.

Held per process and re-entrant: `make mine` holds it for the whole run and each stage's `run_stage` enters it again.
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

from pipeline.errors import ExpectedError

LOCK = ".lock"
_held: dict[Path, list] = {}  # run folder -> [open file, depth] of this process
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
def run_lock(run_dir: Path | str, what: str = "mine"):
    """Hold the run folder's writer lock for the block; RunBusy at once if another process holds it."""
    key = Path(os.path.abspath(run_dir))
    with _guard:
        if key in _held:
            _held[key][1] += 1
        else:
            key.mkdir(parents=True, exist_ok=True)
            flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
            try:
                fd = os.open(key / LOCK, flags, 0o644)
            except OSError as e:  # a planted symlink (O_NOFOLLOW) or a folder in its place
                raise RunBusy(f"{key / LOCK}: cannot open the run's lock file ({e.strerror}): remove it") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                h = holder(key)
                raise RunBusy(f"run folder {key} is being written by pid {h.get('pid', '?')} on host "
                              f"{h.get('host', '?')} since {h.get('since', '?')} ({h.get('what', '?')}): wait for "
                              f"it to end, or mine into another RUN") from None
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "what": what,
                                     "since": dt.datetime.now().astimezone().isoformat(timespec="seconds")}).encode())
            _held[key] = [fd, 1]
    try:
        yield key
    finally:
        with _guard:
            _held[key][1] -= 1
            if _held[key][1] == 0:
                fd = _held.pop(key)[0]
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
