"""The row memo's lookup index (rows.py describes the memo): per namespace and process, an 8-byte key prefix and an
8-byte (pack, row) location a row, both sorted by prefix, built from the packs' key columns only and freed when the
stage ends.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa

from contramine.pipeline.memo.footer import open_footer
from contramine.pipeline.memo.packs import PACK, file_signature, name_problem, open_pack, \
    pack_problem, pack_record, trust_problem
from contramine.pipeline.memo.store import say_once


class NamespaceIndex:
    """One namespace's index in this process: `prefix` (the 8-byte key prefixes, sorted) and `loc` (pack number << 32
    | row in the pack, in the same order): 16 bytes a row."""

    def __init__(self, stage: str):
        self.stage = stage
        self.packs: list[Path | None] = []  # by pack number; None once it is dropped (quarantined, refused)
        self.number: dict[str, int] = {}  # pack name -> number, for the packs indexed
        self.refused: dict[str, tuple] = {}  # pack name -> the file's signature when refused: not read again as is
        self.prefix: np.ndarray = np.zeros(0, np.uint64)
        self.loc: np.ndarray = np.zeros(0, np.uint64)
        self.lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self.prefix.nbytes + self.loc.nbytes

    def merge(self, prefix: np.ndarray, loc: np.ndarray) -> None:
        """Add rows: sorted alone, then merged in where they belong (O(n + k log k), never a sort of the whole)."""
        if not len(prefix):
            return
        order = np.argsort(prefix, kind="stable")
        prefix, loc = prefix[order], loc[order]
        if not len(self.prefix):
            self.prefix, self.loc = prefix, loc
            return
        # where each new row lands in the merged arrays: after the old rows not greater than it, and the new before it
        dest = np.searchsorted(self.prefix, prefix, side="right") + np.arange(len(prefix))
        old: np.ndarray = np.ones(len(self.prefix) + len(prefix), bool)
        old[dest] = False
        merged_prefix: np.ndarray
        merged_loc: np.ndarray
        merged_prefix, merged_loc = np.empty(len(old), np.uint64), np.empty(len(old), np.uint64)
        merged_prefix[dest], merged_loc[dest] = prefix, loc
        merged_prefix[old], merged_loc[old] = self.prefix, self.loc
        self.prefix, self.loc = merged_prefix, merged_loc

    def drop(self, name: str) -> None:
        """Forget a pack (its rows are looked up no more; a pack written under its name later is indexed anew)."""
        number = self.number.pop(name, None)
        if number is None:
            return
        self.packs[number] = None
        keep = (self.loc >> np.uint64(32)) != np.uint64(number)
        self.prefix, self.loc = self.prefix[keep], self.loc[keep]


_INDEXES: dict[Path, NamespaceIndex] = {}
_INDEXES_LOCK = threading.Lock()


def namespace_index(folder: Path, stage: str) -> NamespaceIndex:
    """This process' index of the namespace `folder` (empty until its packs are indexed)."""
    with _INDEXES_LOCK:
        return _INDEXES.setdefault(folder, NamespaceIndex(stage))


def release_indexes(keep: set[str] | frozenset[str] = frozenset()) -> None:
    """Free this process' lookup indexes, but those of the stages in `keep` (those with a job running here): called
    when a stage ends (the runner's finish_stage) and when a job of another stage starts in a worker (run_job)."""
    with _INDEXES_LOCK:
        for path in [p for p, ix in _INDEXES.items() if ix.stage not in keep]:
            del _INDEXES[path]


def index_bytes() -> int:
    """What this process' lookup indexes hold (bytes)."""
    with _INDEXES_LOCK:
        return sum(ix.nbytes for ix in _INDEXES.values())


def key_prefixes(keys: pa.Array | list[bytes]) -> np.ndarray:
    buf = b"".join(keys) if isinstance(keys, list) else keys.buffers()[1].to_pybytes()[keys.offset * 16:
                                                                                      (keys.offset + len(keys)) * 16]
    return np.frombuffer(buf, np.uint8).reshape(-1, 16)[:, :8].copy().view("<u8").ravel()


def index_new_packs(index: NamespaceIndex, folder: Path, expected: str | None, key: bytes | None = None
                    ) -> list[tuple]:
    """Index the packs of the namespace `folder` written since this process last looked (their footers and key
    columns only: who may have written it and the footer are checked before the key column is decoded, the pack's
    name against its keys after); returns (path, why, record, fstat) of each that is refused (the caller names and
    quarantines them). `key`: the team's runner.memo_key (without it, only this user's own packs are indexed)."""
    try:
        names = sorted(e.name for e in os.scandir(folder) if PACK.fullmatch(e.name) and e.name not in
                       index.number)
    except (FileNotFoundError, NotADirectoryError):
        return []
    prefixes, locs, bad = [], [], []
    for name in names:
        path = folder / name
        fd, why = open_pack(path)  # non-blocking and fstat-checked: a FIFO named like a pack never stalls a stage
        if fd is None:
            if why is not None:  # a link, FIFO, socket or device: named once, never read (a pack is a plain file)
                say_once(("not a pack", path), f"memo: {path} {why}: not read (remove it)")
            continue  # else pruned or quarantined meanwhile
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if index.refused.get(name) == file_signature(st):
                continue
            problem: str | None = trust_problem(st, key)
            record = None
            try:
                pf, problem = open_footer(f, st.st_size) if problem is None else (None, problem)  # footer.py
                if pf is not None:
                    problem, record = pack_problem(pf.schema_arrow, expected), pack_record(pf.schema_arrow)
                keys = pf.read(columns=["key"]).column("key").combine_chunks() if pf and problem is None else None
                if keys is not None:  # read: the pack's name must be the hash of its keys
                    problem = name_problem(path, keys.buffers()[1].to_pybytes()[16 * keys.offset:
                                                                                16 * (keys.offset + len(keys))])
            except (OSError, pa.ArrowException, ValueError, IndexError) as e:
                problem, record = f"does not read ({type(e).__name__}: {e})", None
        if problem is not None:
            bad.append((path, problem, record, st))
            continue
        assert keys is not None  # no problem: its keys were read
        number = len(index.packs)
        index.packs.append(path)
        index.number[name] = number
        prefixes.append(key_prefixes(keys))
        locs.append((np.uint64(number) << np.uint64(32)) | np.arange(len(keys), dtype=np.uint64))
    if prefixes:
        index.merge(np.concatenate(prefixes), np.concatenate(locs))
    return bad
