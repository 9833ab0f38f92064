"""Writing into a run folder someone else made: no write lands outside it through a symbolic link.

Run folders travel (a colleague's artifacts/<run>/ copied over), and a symlink planted inside one, say
`report -> ~/.ssh` or `train/simcse/metrics.jsonl -> ~/.bashrc`, would turn our writes into writes to its target.
Files are written by replacing their path (pipeline/engine/atomic.py: `os.replace` swaps a symlink itself, never its
target); the folders on the way are checked here: none BELOW the run folder may be a symlink. The artifacts root and
the run folder itself may be (a run on a bigger disk is a legitimate link), so nothing at or above `root` is looked at.

    check_below(run_dir, run_dir / "report" / "index.md")      # raises UnsafePath naming the link
    log = open_append(run_dir, run_dir / "train" / "simcse" / "metrics.jsonl")

The check is made just before writing: it guards against links present in the folder as received, not against
someone swapping folders while we write (O_NOFOLLOW still keeps the append itself off a link).
"""
from __future__ import annotations

import os
from pathlib import Path

from pipeline.errors import ExpectedError


class UnsafePath(ExpectedError, RuntimeError):
    """A folder or file inside a run is a symbolic link (or not the kind of entry we write); the message names it."""


def check_below(root: Path | str, path: Path | str, final: bool = False) -> Path:
    """Refuse (UnsafePath) when a folder between `root` (excluded) and `path` is a symlink or not a folder; with
    `final`, `path` itself must not be a symlink either. Components that do not exist yet are fine (we create them
    as plain folders). A `path` outside `root` (an output folder the user named) is theirs: not checked.
    Returns `path`."""
    root, path = Path(root), Path(path)
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        return path
    cur = root
    for i, part in enumerate(parts):
        cur = cur / part
        last = i == len(parts) - 1
        if cur.is_symlink():
            if last and not final:
                return path  # a file replaced by os.replace: the link goes, its target stays untouched
            raise UnsafePath(f"{cur} is a symbolic link inside {root} (to {os.readlink(cur)}): contramine does not "
                             f"write through links in a run folder; remove it (or the run folder) and run again")
        if not cur.exists():
            return path
        if not last and not cur.is_dir():
            raise UnsafePath(f"{cur} inside {root} is a file where a folder belongs: remove it and run again")
    return path


def make_dirs(root: Path | str, path: Path | str) -> Path:
    """`path` as a folder below `root`, created where missing, after `check_below` of it and the folders above."""
    path = check_below(root, path, final=True)
    path.mkdir(parents=True, exist_ok=True)
    return path


def open_append(root: Path | str, path: Path | str, buffering: int = 1):
    """`path` opened for appending text: a symlink (or another non-regular entry that can be unlinked) in its place
    is removed first, so the log starts as a new plain file and nothing of the link's target is read or written;
    O_NOFOLLOW makes the open itself fail rather than follow a link."""
    path = Path(path)
    make_dirs(root, path.parent)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        try:
            path.unlink()
        except OSError:
            raise UnsafePath(f"{path} is not a regular file (a folder?): remove it and run again") from None
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    return os.fdopen(fd, "a", buffering=buffering)
