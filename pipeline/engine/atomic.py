"""Writes that a kill at any instant leaves whole or absent: files (temp file, fsync, rename) and folders (temp
folder, fsync, two renames). Shards, sidecars, manifests, checkpoints and results all go through here.

A folder swap is dst -> .dst.old, tmp -> dst. A kill between the two renames leaves only .dst.old, which
`recover` renames back before anything reads or writes dst.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: Path | str):
    """Yield a temporary path beside `path`; on normal exit it is fsynced and renamed over `path` (with the modes a
    plain write would have), on error removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        _fsync_path(Path(tmp))
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path | str, data: bytes) -> Path:
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_json(path: Path | str, obj, indent: int = 1) -> Path:
    return atomic_write_bytes(path, (json.dumps(obj, indent=indent, sort_keys=True, default=str) + "\n").encode())


def _old(dst: Path) -> Path:
    return dst.with_name(f".{dst.name}.old")


def recover(dst: Path | str) -> Path:
    """Undo a folder swap that a kill interrupted, and drop temporary folders of interrupted writes."""
    dst = Path(dst)
    if not dst.exists() and _old(dst).is_dir() and not _old(dst).is_symlink():
        os.rename(_old(dst), dst)
    if dst.parent.is_dir():
        for tmp in dst.parent.glob(f".{dst.name}.tmp-*"):
            shutil.rmtree(tmp, ignore_errors=True)
    return dst


@contextmanager
def atomic_dir(dst: Path | str):
    """Yield an empty temporary folder; on normal exit it replaces `dst` in one swap, on error it is removed."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    recover(dst)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    try:
        yield tmp
        mask = _umask()  # mkdtemp/mkstemp create owner-only entries: give them a plain write's modes
        for path in [tmp, *tmp.rglob("*")]:
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)
        for path in sorted(tmp.rglob("*"), reverse=True) + [tmp]:
            _fsync_path(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = _old(dst)
    if old.is_symlink():  # planted: a link is removed, never followed
        old.unlink()
    elif old.exists():
        shutil.rmtree(old)
    if dst.exists():
        os.rename(dst, old)
    os.rename(tmp, dst)
    _fsync_path(dst.parent)  # make the renames themselves durable
    shutil.rmtree(old, ignore_errors=True)
