"""How `--reuse-from` (tables.reuse_tables) brings a file of another run into the new run's temporary table folder:
never a link's target, and checked on what it brought, which is what stays. The other run is not this user's to
trust: its folder may be another account's or writable by others, and a link can be swapped in after any check of
its path. So a file is hard-linked without following (or copied from a descriptor opened with O_NOFOLLOW), and the
file in the new folder must be a plain file hashing to what the source's manifest, read once, records for it. What
FAISS will load (the neighbours stage's `_index/`) is brought only from folders of this user's that no one else can
write (`owned_here`): `faiss.read_index` is not safe on a crafted file, so elsewhere the stage builds it again.
"""
from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

from contramine.pipeline.storage.verify import content_hash

_NO_LINK = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO opens at once; fstat says what it is


class NotBrought(ValueError):
    """A file of the source run that is not brought: why, in a few words (the caller names the file)."""


def link_or_copy(a: Path, b: Path, expected: str | None = None) -> None:
    """`a` as `b`, a plain file hashing to `expected` (its manifest's hash; None: the oldest layout, which records
    none), else NotBrought and no `b`; FileNotFoundError when `a` is gone. A hard link of the entry itself (a link
    swapped in lands as a link, refused below), else (another file system) a copy from `a` opened with O_NOFOLLOW.
    Checked on `b`, in the new run's own folder: a hard link shares the inode that was linked, a copy is ours."""
    try:
        os.link(a, b, follow_symlinks=False)
    except FileNotFoundError:
        raise
    except OSError:  # another file system, or one without hard links
        _copy(a, b)
    why: str | None
    try:
        fd = os.open(b, _NO_LINK)
    except OSError:  # ELOOP: the entry linked was a symbolic link
        why = "is a symbolic link, not a shard file"
    else:
        with os.fdopen(fd, "rb") as f:
            why = None if stat.S_ISREG(os.fstat(fd).st_mode) else "is not a plain file"
            if why is None and expected is not None and content_hash(f) != expected:
                why = "does not hash to what its table's manifest records (changed after its commit)"
    if why:
        os.unlink(b)
        raise NotBrought(why)


def _copy(a: Path, b: Path) -> None:
    try:
        fd = os.open(a, _NO_LINK)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise NotBrought("is a symbolic link, not a shard file" if e.errno == errno.ELOOP else
                         f"cannot be read ({e.strerror})") from None
    with os.fdopen(fd, "rb") as src:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotBrought("is not a plain file")
        with open(b, "xb") as dst:
            shutil.copyfileobj(src, dst)
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns))  # as copy2 kept it


def owned_here(*paths: Path) -> bool:
    """Each path is this user's, no link, and no one else may write it (no group or world write bit)."""
    try:
        return all((st := os.lstat(p)).st_uid == os.getuid() and not st.st_mode & 0o022
                   and not stat.S_ISLNK(st.st_mode) for p in paths)
    except OSError:
        return False
