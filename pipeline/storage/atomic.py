"""Writes that a kill at any instant leaves whole or absent: files (temp file, fsync, rename) and folders (temp
folder, fsync, one exchange or two renames). Shards, sidecars, manifests, checkpoints, indexes, exports and results
all go through here.

Each takes the `root` its path lies below (the run folder, the export target, the memo root; default: the path's
own folder, trusted as given): the folders from `root` down are opened without following links
(pipeline/storage/safe_paths.py), the temp file or folder is created in the open folder and renamed there, so a link
planted anywhere below `root` is refused in one line and a link at the final name is replaced, never written
through.

A folder swap exchanges the temp folder with dst in one renameat2 where Linux has it; elsewhere dst -> .dst.old,
tmp -> dst, and a kill between the two renames leaves only .dst.old, which `recover` renames back before anything
reads or writes dst.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import re
import secrets
import stat
import threading
from contextlib import contextmanager
from pathlib import Path

from contramine.pipeline.storage.safe_paths import Folder, UnsafePath, linked, not_a_folder, open_folder


def _umask() -> int:
    """The process' umask, read without setting it where Linux shows it (/proc/self/status, Linux >= 4.7): setting
    it to 0 for a moment, the only other way, would let a file another thread creates meanwhile (last/ is written
    on a background thread while training writes its logs) get world-writable modes."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _UMASK_LOCK:  # elsewhere: set and restore, one thread at a time of ours
        mask = os.umask(0)
        os.umask(mask)
        return mask


_UMASK_LOCK = threading.Lock()


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _settle(folder: Folder, name: str, mode: int) -> None:
    """fchmod `name` in `folder` to a plain write's mode and fsync it (a file, not followed if a link)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder.fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK):  # the caller put a link there: not ours to sync or chmod
            return
        raise
    try:
        if os.fstat(fd).st_nlink == 1:  # a hard link (--reuse-from) shares its mode with another run's file: kept
            os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: Path | str, root: Path | str | None = None, mode: int | None = None):
    """Yield a temporary path beside `path`; on normal exit it is fsynced and renamed over `path` (with the modes a
    plain write would have, or `mode`: 0o444 for what is committed, so an edit in place takes a chmod first and
    moves the file's ctime; 0o600 for what only its user may write), on error removed. No folder from `root` down
    may be a link (see the module doc)."""
    path = Path(path)
    with open_folder(root if root is not None else path.parent, path.parent) as d:
        tmp = f".{path.name}.{secrets.token_hex(4)}.tmp"
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=d.fd))
        try:
            yield d.at(tmp)
            _settle(d, tmp, 0o666 & ~_umask() if mode is None else mode)
            d.replace(tmp, path.name)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=d.fd)
            except FileNotFoundError:
                pass
            raise


def atomic_write_bytes(path: Path | str, data: bytes, root: Path | str | None = None, mode: int | None = None
                       ) -> Path:
    with atomic_file(path, root, mode) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_json(path: Path | str, obj, indent: int = 1, root: Path | str | None = None,
                      mode: int | None = None) -> Path:
    return atomic_write_bytes(path, (json.dumps(obj, indent=indent, sort_keys=True, default=str) + "\n").encode(),
                              root, mode)


def _old(dst: Path) -> Path:
    return dst.with_name(f".{dst.name}.old")


def _temps(name: str) -> re.Pattern:
    """The temp folders atomic_dir makes for `name` (and `.name.old` of a swap that a kill interrupted)."""
    return re.compile(rf"\.{re.escape(name)}\.(tmp-[0-9a-z_]+|old)")


def _recover(parent: Folder, name: str) -> None:
    old, own = f".{name}.old", _temps(name)
    st_old = parent.lstat(old)
    if parent.lstat(name) is None and st_old is not None and stat.S_ISDIR(st_old.st_mode):
        os.rename(old, name, src_dir_fd=parent.fd, dst_dir_fd=parent.fd)
    elif st_old is not None:  # a swap killed before its cleanup (dst is the newer one), or a link planted there
        parent.rmtree(old, own)
    for e in parent.entries():
        if e.name.startswith(f".{name}.tmp-"):
            parent.rmtree(e.name, own)


def recover(dst: Path | str, root: Path | str | None = None) -> Path:
    """Undo a folder swap that a kill interrupted, and drop temporary folders of interrupted writes (only names
    atomic_dir makes; a link among them is removed as a link)."""
    dst = Path(dst)
    parent = open_folder(root if root is not None else dst.parent, dst.parent, create=False)
    if parent is not None:
        with parent:
            _recover(parent, dst.name)
    return dst


def _settle_tree(folder: Folder, mask: int) -> None:
    """Modes of a plain write and fsync for everything below `folder`, bottom up, never following a link."""
    for e in folder.entries():
        if e.is_symlink():
            continue
        if e.is_dir(follow_symlinks=False):
            with folder.child(e.name, create=False) as sub:  # type: ignore[union-attr]  # just listed: never missing
                _settle_tree(sub, mask)
                os.fchmod(sub.fd, 0o777 & ~mask)
                sub.fsync()
        else:
            _settle(folder, e.name, 0o666 & ~mask)


@contextmanager
def atomic_dir(dst: Path | str, root: Path | str | None = None):
    """Yield an empty temporary folder; on normal exit it replaces `dst` in one swap, on error it is removed. No
    folder from `root` down may be a link, `dst` included (see the module doc)."""
    dst = Path(dst)
    with open_folder(root if root is not None else dst.parent, dst.parent) as parent:
        _recover(parent, dst.name)
        st = parent.lstat(dst.name)
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise linked(dst, parent.root, os.readlink(dst.name, dir_fd=parent.fd))
        if st is not None and not stat.S_ISDIR(st.st_mode):
            raise not_a_folder(dst, parent.root)
        tmp, own = f".{dst.name}.tmp-{secrets.token_hex(4)}", _temps(dst.name)
        os.mkdir(tmp, 0o700, dir_fd=parent.fd)  # owner-only while it is written, like mkdtemp
        try:
            with parent.child(tmp, create=False) as folder:  # type: ignore[union-attr]  # made just above: present
                yield folder.at()
                mask = _umask()  # give the folder and its files a plain write's modes
                _settle_tree(folder, mask)
                os.fchmod(folder.fd, 0o777 & ~mask)
                folder.fsync()
        except BaseException:
            parent.rmtree(tmp, own)
            raise
        if st is not None and _exchange(parent, tmp, dst.name):
            parent.fsync()
            parent.rmtree(tmp, own)  # now the previous folder
            return
        old = f".{dst.name}.old"
        parent.rmtree(old, own)  # a swap killed before its cleanup: dst is the newer one
        if st is not None:
            os.rename(dst.name, old, src_dir_fd=parent.fd, dst_dir_fd=parent.fd)
        os.rename(tmp, dst.name, src_dir_fd=parent.fd, dst_dir_fd=parent.fd)
        parent.fsync()  # make the renames themselves durable
        parent.rmtree(old, own)


_RENAME_EXCHANGE = 2


@functools.cache
def _renameat2():
    try:
        return ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError, TypeError):  # glibc < 2.28, musl, macOS, Windows
        return None


def _exchange(folder: Folder, a: str, b: str) -> bool:
    """Swap two existing names of `folder` atomically (Linux renameat2 RENAME_EXCHANGE); False where the C library or
    the file system has no such call."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(folder.fd, os.fsencode(a), folder.fd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"swapping in {folder.path / b}: {os.strerror(err)}", str(folder.path / a))


__all__ = ["atomic_file", "atomic_write_bytes", "atomic_write_json", "atomic_dir", "recover", "UnsafePath"]
