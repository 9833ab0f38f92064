"""The row memo: per-row model outputs stored under a key of what made them, reused wherever that key recurs, and
checked before they are served.

A shard's cache key (runner.py) holds every row of its sid range, so a corpus grown by one line, or another shard
layout, recomputes whole shards. Underneath that, the per-row model stages (`embeddings`, `pool_embeddings`,
`backtranslate`, `negate`, the positives `scores` embeds) look every row up here first and send only the rows
with new keys to the model — Bazel's action cache and a translator's translation memory, at the row.

    memo = ctx.memo("encode", settings=("encoder", "embeddings"), resources=("encoder",))
    vectors = memo.rows([row_key(text) for text in texts], compute_missing, schema)

A row's key has two parts:
- the namespace (a folder): the memo's format, the stage, its code version (codeversion.py: its module and every
  pipeline module it imports), the settings that shape a row (less execution settings), the resources as resolved
  for the run (model fingerprint, device kind, precision, engine, library versions) and whatever else the stage
  adds (the run seed where a model samples). A change to a stage's code moves that stage's rows to a new
  namespace, and no others; a new FORMAT moves them all (packs of an older format are never read);
- the row key: blake2b-128 of the row's own input (its text; for a back-translation also the chain, sid and
  variant, whose seed a sampling model draws from).

Layout: <memo root>/<stage>/<memo name>-<namespace hash>/ with `_namespace.json` (what the namespace is, and the
schema of its values) and packs `<blake2b of the pack's keys>.parquet`: a `key` column (16 bytes) and the value
columns, one pack per shard computation, written atomically (temp file, fsync, rename) with Parquet page checksums.
Each pack's key-value metadata (`contramine.memo`, written with it in the same file) records its writer (user,
host, pid, time, the stage's code version) and the blake2b of its values. Two writers of the same rows write the same
name and replace each other with equal values; a writer killed mid-write leaves only a temp file no reader opens.

What is served, and what is not. A row is served only when its whole 16-byte key matches, from a pack that reads
(page checksums), whose values have the namespace's schema (the stage's, or the one `_namespace.json` records:
another vector width is another schema) and hash to what its record says. A pack that fails any of these is named
once in the log with its writer, moved aside to `<memo root>/.quarantine/<stage>/<namespace>/` (never deleted), and
its rows are computed again. On top, the audit (`runner.memo_verify`): a share of the reused rows, and at least one
row of every pack a lookup reads, is computed again and compared; a pack with a differing row is quarantined the
same way and all its rows are recomputed, so a run's tables equal a fresh run's even when a writer of a shared memo
(or a bug in a namespace key) stored wrong values. A memo the run cannot write (another user's) is used read-only,
said once; a folder under the memo root that is a symbolic link is neither read nor written, said once. Deletes
(`contramine cache --prune`) remove only names the memo writes: packs, their temp files, `_namespace.json`.

Lookups never load the memo's values: each process keeps a compact index per namespace — an 8-byte key prefix and
an 8-byte (pack, row) location, 16 bytes a row, both sorted by prefix — of the packs it has seen; a new pack's rows
are sorted alone and merged in (searchsorted + insert), and the indexes are freed when the stage ends
(`release_indexes`). Values are read only from the packs that hold the rows a lookup needs. Bytes equal a fresh
run's because every model stage here is batch-independent on the CPU (encoder.py, translator.py, spaCy parses each
text alone); GPU kernels are not (the GPU check measured 3e-8), so `runner.memo = "auto"` (the default) leaves the
memo off for a stage whose resources run on a GPU (and with "on" there, the audit compares vectors to 1e-4).
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.engine.atomic import atomic_file, atomic_write_json
from pipeline.engine.safe_paths import UnsafePath, check_below, make_dirs, open_folder
from pipeline.errors import ExpectedError

log = logging.getLogger("contramine.memo")
FORMAT = 2  # 2: packs carry their writer and values hash; in every namespace's facts, so format 1 is never read
NAMESPACE = "_namespace.json"
QUARANTINE = ".quarantine"
RECORD = b"contramine.memo"  # the pack's key-value metadata: {format, writer, values, rows}
KEY = pa.binary(16)
# The only names the memo writes in a namespace, so the only ones it reads or removes (fullmatch):
PACK = re.compile(r"[0-9a-f]{32}\.parquet")
TEMP = re.compile(r"\.(?:[0-9a-f]{32}\.parquet|_namespace\.json)\.[A-Za-z0-9_]+\.tmp")  # atomic_file's temp files
OWN = re.compile(rf"{PACK.pattern}|{TEMP.pattern}|{re.escape(NAMESPACE)}")  # all a namespace holds of the memo's


def row_key(*parts) -> bytes:
    """The 16-byte key of one row's own input (texts, ids, a precomputed prefix): each part typed and
    length-prefixed, so ("a b", "c") != ("a", "b c") and "1" != 1. ~2 µs a row (JSON was 20)."""
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        if isinstance(p, str):
            tag, data = b"s", p.encode("utf-8", "surrogatepass")
        elif isinstance(p, bytes):
            tag, data = b"b", p
        else:
            tag, data = b"j", json.dumps(p, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()
        h.update(tag + len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()


def namespace_hash(facts: dict) -> str:
    return hashlib.blake2b(json.dumps(facts, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()


# ---- what a pack records ---------------------------------------------------------------------------------------------
def values_hash(values: pa.Table) -> str:
    """blake2b-128 of a table's values, from their logical content (not their Arrow layout: a slice, a chunking or a
    validity buffer does not change it), column by column with names and types."""
    h = hashlib.blake2b(digest_size=16)
    for name, col in zip(values.column_names, values.columns):
        h.update(f"{name}:{_type_text(col.type)}:{len(col)}\0".encode())
        _hash_array(h, col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
    return h.hexdigest()


def _hash_array(h, arr: pa.Array) -> None:
    h.update(np.packbits(arr.is_null().to_numpy(zero_copy_only=False)).tobytes())
    t = arr.type
    if pa.types.is_fixed_size_binary(t):
        w = t.byte_width
        h.update(memoryview(arr.buffers()[1])[arr.offset * w:(arr.offset + len(arr)) * w])
    elif pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        lengths = pc.fill_null(pc.binary_length(arr), 0).to_numpy(zero_copy_only=False).astype("<i8")
        h.update(lengths.tobytes())
        offsets = np.frombuffer(arr.buffers()[1], "<i8" if pa.types.is_large_string(t) or
                                pa.types.is_large_binary(t) else "<i4")
        lo, hi = int(offsets[arr.offset]), int(offsets[arr.offset + len(arr)])
        if hi > lo:
            h.update(memoryview(arr.buffers()[2])[lo:hi])
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        h.update(pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype("<i8").tobytes())
        _hash_array(h, arr.flatten())
    elif pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        h.update(np.ascontiguousarray(arr.fill_null(False if pa.types.is_boolean(t) else 0)
                                      .to_numpy(zero_copy_only=False)).tobytes())
    else:  # a type no memo stores today: its values as JSON
        h.update(json.dumps(arr.to_pylist(), default=str, sort_keys=True).encode())


def writer_record(facts: dict) -> dict:
    """Who wrote a pack: the names a team's admin looks for when a shared memo serves a wrong row."""
    try:
        import getpass

        user = getpass.getuser()
    except (KeyError, OSError):  # a container's uid without a passwd entry
        user = str(os.getuid())
    return {"user": user, "host": socket.gethostname(), "pid": os.getpid(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "code": facts.get("code")}


def pack_record(schema: pa.Schema) -> dict | None:
    """The record a pack's metadata holds, or None (not written by this format)."""
    raw = (schema.metadata or {}).get(RECORD)
    try:
        record = json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) and record.get("format") == FORMAT else None


def writer_of(record: dict | None) -> str:
    w = (record or {}).get("writer")
    if not isinstance(w, dict):
        return "writer unknown"
    return f"written by {w.get('user')}@{w.get('host')} (pid {w.get('pid')}) at {w.get('time')}, code {w.get('code')}"


def schema_text(schema: pa.Schema) -> str:
    """A value schema as one comparable line: names and types, no metadata, no list item names (Parquet reads a
    list<item> back as list<element>: the same values)."""
    return ", ".join(f"{f.name}: {_type_text(f.type)}" for f in schema)


def _type_text(t: pa.DataType) -> str:
    if pa.types.is_fixed_size_list(t):
        return f"fixed_size_list<{_type_text(t.value_type)}>[{t.list_size}]"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"{'large_' if pa.types.is_large_list(t) else ''}list<{_type_text(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ", ".join(f"{f.name}: {_type_text(f.type)}" for f in t) + ">"
    return str(t)


def _values_schema(schema: pa.Schema) -> pa.Schema:
    """A pack's schema less its key column and metadata."""
    return pa.schema([f for f in schema if f.name != "key"])


def pack_problem(table_schema: pa.Schema, expected: str | None) -> str | None:
    """Why a pack (by its schema) is not one of this namespace's, or None: the key column, the value schema, the
    record."""
    if table_schema.get_field_index("key") != 0 or table_schema.field("key").type != KEY:
        return "no 16-byte key column"
    if expected is not None and schema_text(_values_schema(table_schema)) != expected:
        return f"values of schema [{schema_text(_values_schema(table_schema))}] where [{expected}] is expected"
    if pack_record(table_schema) is None:
        return "no writer record (not written by this memo's format)"
    return None


def values_problem(table: pa.Table) -> str | None:
    """Why a whole pack's values are not what its record says (rows, values hash), or None."""
    record = pack_record(table.schema)
    values = table.drop_columns(["key"])
    if record.get("rows") != table.num_rows:
        return f"{table.num_rows} rows where its record says {record.get('rows')}"
    if record.get("values") != values_hash(values):
        return "values that do not hash to its record's hash (changed after they were written)"
    return None


# ---- said once, per process ------------------------------------------------------------------------------------------
_said: set = set()
_said_lock = threading.Lock()


def _say_once(key, line: str) -> None:
    with _said_lock:
        if key in _said:
            return
        _said.add(key)
    log.warning(line)


def _signature(st: os.stat_result) -> tuple:
    return st.st_ino, st.st_size, st.st_mtime_ns


# ---- the lookup index ------------------------------------------------------------------------------------------------
@dataclass
class Counts:
    """Rows this process sent to the model, took from the memo, and recomputed to audit it, per memo name."""
    computed: int = 0
    reused: int = 0
    audited: int = 0


class _Index:
    """One namespace's index in this process: `prefix` (the 8-byte key prefixes, sorted) and `loc` (pack number << 32
    | row in the pack, in the same order): 16 bytes a row."""

    def __init__(self, stage: str):
        self.stage = stage
        self.packs: list[Path | None] = []  # by pack number; None once it is dropped (quarantined, refused)
        self.number: dict[str, int] = {}  # pack name -> number, for the packs indexed
        self.refused: dict[str, tuple] = {}  # pack name -> the file's signature when refused: not read again as is
        self.prefix = np.zeros(0, np.uint64)
        self.loc = np.zeros(0, np.uint64)
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
        old = np.ones(len(self.prefix) + len(prefix), bool)
        old[dest] = False
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


_INDEXES: dict[Path, _Index] = {}
_INDEXES_LOCK = threading.Lock()


def release_indexes(keep_stage: str | None = None) -> None:
    """Free this process' lookup indexes, but those of `keep_stage`: called when a stage ends (the runner's
    finish_stage) and when a job of another stage starts in a worker (run_job)."""
    with _INDEXES_LOCK:
        for path in [p for p, ix in _INDEXES.items() if ix.stage != keep_stage]:
            del _INDEXES[path]


def index_bytes() -> int:
    """What this process' lookup indexes hold (bytes)."""
    with _INDEXES_LOCK:
        return sum(ix.nbytes for ix in _INDEXES.values())


def _prefixes(keys: pa.Array | list[bytes]) -> np.ndarray:
    buf = b"".join(keys) if isinstance(keys, list) else keys.buffers()[1].to_pybytes()[keys.offset * 16:
                                                                                      (keys.offset + len(keys)) * 16]
    return np.frombuffer(buf, np.uint8).reshape(-1, 16)[:, :8].copy().view("<u8").ravel()


# ---- the memo's own folder: no link below its root, writes that may be refused ---------------------------------------
_READ_ONLY: dict[Path, str] = {}  # memo roots this process cannot write, and why


def _denied(e: OSError) -> bool:
    return e.errno in (errno.EACCES, errno.EPERM, errno.EROFS)


def read_only(root: Path, why: str) -> None:
    """From now on this process only reads the memo at `root`; said once."""
    root = Path(root)
    if root not in _READ_ONLY:
        _READ_ONLY[root] = why
        _say_once(("read-only", root), f"memo: {root} cannot be written here ({why}): used read-only — its rows are "
                                       f"served, the rows this run computes are not stored")


def quarantine_path(root: Path, pack: Path) -> Path:
    """Where a pack that failed a check is moved: <root>/.quarantine/<stage>/<namespace>/<pack>.<ns>.parquet."""
    rel = Path(pack).relative_to(root)
    return Path(root) / QUARANTINE / rel.parent / f"{Path(pack).stem}.{time.time_ns()}.parquet"


def quarantine(root: Path, pack: Path) -> Path | None:
    """Move `pack` aside (never delete it): its new path, or None where the memo cannot be written (a read-only
    memo, a link on the way: then it stays, and this process does not serve it)."""
    root = Path(root)
    if root in _READ_ONLY:
        return None
    dest = quarantine_path(root, pack)
    try:
        # both folders opened from the root without following a link; the rename is relative to them (openat)
        src = open_folder(root, Path(pack).parent, create=False)
        if src is None:
            return None
        with src, open_folder(root, dest.parent) as dst:
            src.replace(Path(pack).name, dest.name, to=dst)
    except FileNotFoundError:
        return None  # moved by another process meanwhile
    except UnsafePath:
        return None
    except OSError as e:
        if _denied(e):
            read_only(root, f"{type(e).__name__}: {e.strerror}")
        return None
    return dest


class RowMemo:
    """One namespace of the memo (see the module doc). `rows(keys, compute, schema)` is all a stage calls.
    `verify`: the audit's share of reused rows (runner.memo_verify); `exact`: False where rows may differ in their
    last bits (a GPU with runner.memo = "on"), so the audit compares vectors to 1e-4."""

    def __init__(self, root: Path, stage: str, name: str, facts: dict, verify: float = 0.0, exact: bool = True):
        self.root, self.stage, self.name, self.facts = Path(root), stage, name, facts
        self.namespace = f"{name}-{namespace_hash(facts)}"
        self.dir = self.root / stage / self.namespace
        self.counts = Counts()
        self.read = True  # False under --force: every row goes to the model again (and is written back)
        self.verify, self.exact = verify, exact
        self._schema: str | None = None  # the namespace's value schema, once known (given, computed or recorded)
        self._packs: list[Path | None] = []  # the index's packs as the last lookup saw them

    # ---- the folder ------------------------------------------------------------------------------------------------
    def _usable(self) -> bool:
        """False (said once) when a folder from the memo root down to this namespace is a symbolic link: its packs
        could be anyone's, and a write or a quarantine would land outside the memo."""
        try:
            check_below(self.root, self.dir, final=True)
            return True
        except UnsafePath as e:
            _say_once(("link", self.dir), f"memo: {e}; this namespace is neither read nor written, its rows are "
                                          f"computed")
            return False

    def _expected(self, schema: pa.Schema | None) -> str | None:
        if schema is not None:
            self._schema = schema_text(schema)
        elif self._schema is None:
            path = self.dir / NAMESPACE
            try:
                if path.is_file() and not path.is_symlink():
                    recorded = json.loads(path.read_text()).get("values")
                    self._schema = recorded if isinstance(recorded, str) else None
            except (OSError, ValueError, AttributeError):
                pass
        return self._schema

    def _refuse(self, index: _Index, path: Path, why: str, record: dict | None = None, sig: tuple | None = None):
        """A pack that is not served: named once (with its writer), quarantined, forgotten by the index."""
        moved = quarantine(self.root, path)
        where = f"moved to {moved}" if moved else "left in place (not served by this process)"
        _say_once(("bad", path, sig), f"memo: {path} {why} ({writer_of(record)}): {where}; its rows are computed "
                                      f"again")
        with index.lock:
            index.drop(path.name)
            if not moved and sig is not None:
                index.refused[path.name] = sig

    # ---- lookup --------------------------------------------------------------------------------------------------
    def _index(self) -> _Index:
        with _INDEXES_LOCK:
            return _INDEXES.setdefault(self.dir, _Index(self.stage))

    def _refresh(self, index: _Index, expected: str | None) -> list[tuple]:
        """Index the packs written since this process last looked (their footers and key columns only); returns
        (path, why, record, signature) of each that is refused (the caller names and quarantines them)."""
        try:
            names = sorted(e.name for e in os.scandir(self.dir) if PACK.fullmatch(e.name) and e.name not in
                           index.number)
        except (FileNotFoundError, NotADirectoryError):
            return []
        prefixes, locs, bad = [], [], []
        for name in names:
            path = self.dir / name
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # pruned or quarantined meanwhile
            except OSError as e:
                if e.errno == errno.ELOOP:
                    _say_once(("link", path), f"memo: {path} is a symbolic link: not read (remove it)")
                continue
            with os.fdopen(fd, "rb") as f:
                sig = _signature(os.fstat(f.fileno()))
                if index.refused.get(name) == sig:
                    continue
                try:
                    pf = pq.ParquetFile(f, page_checksum_verification=True)
                    problem, record = pack_problem(pf.schema_arrow, expected), pack_record(pf.schema_arrow)
                    keys = pf.read(columns=["key"]).column("key") if problem is None else None
                except (OSError, pa.ArrowException) as e:
                    problem, record = f"does not read ({type(e).__name__}: {e})", None
            if problem is not None:
                bad.append((path, problem, record, sig))
                continue
            number = len(index.packs)
            index.packs.append(path)
            index.number[name] = number
            prefixes.append(_prefixes(keys.combine_chunks()))
            locs.append((np.uint64(number) << np.uint64(32)) | np.arange(len(keys), dtype=np.uint64))
        if prefixes:
            index.merge(np.concatenate(prefixes), np.concatenate(locs))
        return bad

    def lookup(self, keys: list[bytes], schema: pa.Schema | None = None
               ) -> tuple[np.ndarray, pa.Table | None, np.ndarray]:
        """(positions in `keys` found in the memo, their values in that order, the pack number each came from);
        (empty, None, empty) when none is. A pack that does not read, or whose schema, record or values hash is
        wrong, is refused (named, quarantined) and its rows are misses; so is a row whose whole key differs from
        the one asked for (an 8-byte prefix collision, a pack replaced since it was indexed)."""
        none = (np.zeros(0, np.int64), None, np.zeros(0, np.int64))
        if not keys:
            return none
        index, expected = self._index(), self._expected(schema)
        if expected is None:  # every namespace this format writes records its values' schema before its first pack
            if self.dir.is_dir() and _own(self.dir, PACK):
                _say_once(("no schema", self.dir), f"memo: {self.dir} holds packs but no {NAMESPACE} recording "
                                                   f"their schema (not written by this memo): not read")
            return none
        with index.lock:
            bad = self._refresh(index, expected)
            prefix, loc, packs = index.prefix, index.loc, list(index.packs)
        self._packs = packs  # the pack numbers this lookup returns name these (rows() may refuse one of them)
        for path, problem, record, sig in bad:
            self._refuse(index, path, problem, record, sig)
        if not len(prefix):
            return none
        asked = _prefixes(keys)
        at = np.searchsorted(prefix, asked)
        found = at < len(prefix)
        found[found] = prefix[at[found]] == asked[found]
        positions = np.flatnonzero(found)
        if not len(positions):
            return none
        where = loc[at[positions]]
        pack_of, row_of = (where >> np.uint64(32)).astype(np.int64), (where & np.uint64(0xFFFFFFFF)).astype(np.int64)
        got_pos, got_parts, got_pack = [], [], []
        for number in np.unique(pack_of):
            path = packs[number]
            if path is None:
                continue
            sel = np.flatnonzero(pack_of == number)
            table, sig, problem = self._read_pack(path, expected)
            if table is None and problem is None:
                continue  # gone meanwhile: its rows are computed
            if problem is not None:
                self._refuse(index, path, problem, pack_record(table.schema) if table is not None else None, sig)
                continue
            values = table.take(pa.array(row_of[sel]))
            stored = values.column("key").combine_chunks().buffers()[1].to_pybytes()
            same = np.array([stored[16 * j:16 * j + 16] == keys[p] for j, p in enumerate(positions[sel])], bool)
            got_pos.append(positions[sel][same])
            got_parts.append(values.filter(pa.array(same)).drop_columns(["key"]).replace_schema_metadata(None))
            got_pack.append(np.full(int(same.sum()), number, np.int64))
            try:
                os.utime(path)  # last use: what `contramine cache --prune --older-than` goes by
            except OSError:
                pass
        if not got_pos:
            return none
        pos = np.concatenate(got_pos)
        order = np.argsort(pos, kind="stable")
        return pos[order], pa.concat_tables(got_parts).take(pa.array(order)), np.concatenate(got_pack)[order]

    def _read_pack(self, path: Path, expected: str | None) -> tuple[pa.Table | None, tuple | None, str | None]:
        """(the whole pack, its file's signature, why it is not served or None); (None, None, None) when gone."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None, None, None
        except OSError as e:
            return None, None, f"does not open ({type(e).__name__}: {e.strerror})"
        with os.fdopen(fd, "rb") as f:
            sig = _signature(os.fstat(f.fileno()))
            try:
                table = pq.read_table(f, page_checksum_verification=True)
            except (OSError, pa.ArrowException) as e:
                return None, sig, f"does not read ({type(e).__name__}: {e})"
        problem = pack_problem(table.schema, expected) or values_problem(table)
        return table, sig, problem

    # ---- storing -------------------------------------------------------------------------------------------------
    def add(self, keys: list[bytes], values: pa.Table) -> Path | None:
        """Write one pack of rows (atomically, with its writer record and values hash); its name is the hash of its
        keys, so two writers of the same rows write the same file. None when nothing was written (no rows, a
        read-only memo: said once)."""
        if not keys or self.root in _READ_ONLY:
            return None
        name = hashlib.blake2b(b"".join(keys), digest_size=16).hexdigest() + ".parquet"
        key_col = pa.FixedSizeBinaryArray.from_buffers(KEY, len(keys), [None, pa.py_buffer(b"".join(keys))])
        values = values.replace_schema_metadata(None)
        record = {"format": FORMAT, "writer": writer_record(self.facts), "values": values_hash(values),
                  "rows": len(keys)}
        table = values.add_column(0, pa.field("key", KEY, nullable=False), key_col) \
            .replace_schema_metadata({RECORD: json.dumps(record, sort_keys=True)})
        # vectors (fixed-size binary) do not compress: written plain, they write and read at disk speed
        raw = all(pa.types.is_fixed_size_binary(f.type) for f in values.schema)
        try:
            make_dirs(self.root, self.dir)
            if not (self.dir / NAMESPACE).is_file():
                atomic_write_json(self.dir / NAMESPACE, {"stage": self.stage, "memo": self.name, "facts": self.facts,
                                                         "values": schema_text(values.schema)}, root=self.root)
            # written in the namespace folder as opened from the memo root (no link on the way is followed); a link
            # in the pack's place is replaced by the rename, never followed
            with atomic_file(self.dir / name, root=self.root) as tmp:
                pq.write_table(table, tmp, compression="none" if raw else "zstd", write_page_checksum=True,
                               row_group_size=64_000, use_dictionary=not raw)
        except UnsafePath as e:
            _say_once(("link", self.dir), f"memo: {e}; nothing is written there")
            return None
        except OSError as e:  # a cache that cannot be written costs time, never the run
            if _denied(e):
                read_only(self.root, f"{type(e).__name__}: {e.strerror} at {e.filename or self.dir}")
            else:
                _say_once(("write", self.root, e.errno), f"memo: a pack could not be written under {self.dir} "
                                                         f"({type(e).__name__}: {e}): its rows are not stored")
            return None
        return self.dir / name

    # ---- the audit -------------------------------------------------------------------------------------------------
    def _audit_rows(self, packs: np.ndarray) -> np.ndarray:
        """Indexes (into the found rows) to compute again: a random `verify` share of them, and a random one of
        every pack they came from. Random, not seeded: a writer cannot know which rows will be checked, and the
        tables do not depend on it (an audited row is served only when it equals the fresh one)."""
        n = len(packs)
        if self.verify <= 0 or not n:
            return np.zeros(0, np.int64)
        rng = np.random.default_rng()
        share = rng.choice(n, size=min(n, int(np.ceil(self.verify * n))), replace=False)
        order = rng.permutation(n)
        _, first = np.unique(packs[order], return_index=True)
        return np.union1d(share, order[first])

    def _same(self, a: pa.Table, b: pa.Table) -> np.ndarray:
        """Per row: whether `a`'s row equals `b`'s (exactly; vectors to 1e-4 where the memo is not exact)."""
        same = np.ones(a.num_rows, bool)
        for name in a.column_names:
            x, y = a.column(name).combine_chunks(), b.column(name).combine_chunks()
            if not self.exact and pa.types.is_fixed_size_binary(x.type) and x.type.byte_width % 4 == 0:
                w = x.type.byte_width
                fx = np.frombuffer(x.buffers()[1], np.float32)[x.offset * w // 4:(x.offset + len(x)) * w // 4]
                fy = np.frombuffer(y.buffers()[1], np.float32)[y.offset * w // 4:(y.offset + len(y)) * w // 4]
                same &= np.isclose(fx.reshape(len(x), -1), fy.reshape(len(y), -1), atol=1e-4, rtol=0).all(1)
            else:
                same &= np.array([u == v for u, v in zip(x.to_pylist(), y.to_pylist())], bool)
        return same

    def rows(self, keys: list[bytes], compute: Callable[[np.ndarray], pa.Table],
             schema: pa.Schema | None = None) -> pa.Table | None:
        """The value rows of `keys`, in order: those in the memo read from it, the rest computed by
        `compute(positions)` (one row per position, in order; of `schema` when given) and added to the memo. The
        audit's rows go to `compute` with the missing ones; a pack one of them disagrees with is quarantined and
        all its rows are computed. None only when `keys` is empty and no schema is given."""
        usable = self._usable()
        if self.read and usable:
            found, reused, packs = self.lookup(keys, schema)
        else:
            found, reused, packs = np.zeros(0, np.int64), None, np.zeros(0, np.int64)
        n = len(keys)
        missing = np.setdiff1d(np.arange(n), found, assume_unique=True)
        audit = self._audit_rows(packs)
        ask = np.union1d(missing, found[audit])
        if not len(ask):
            self.counts.reused += len(found)
            return reused if reused is not None else (schema.empty_table() if schema is not None else None)
        computed = self._compute(compute, ask, schema)
        keep = np.ones(len(found), bool)  # found rows still served from the memo
        if reused is not None:
            if not reused.schema.equals(computed.schema):  # the packs are of another schema than the model's
                bad = np.unique(packs)
                why = f"holds values of schema [{schema_text(reused.schema)}] where the model computes " \
                      f"[{schema_text(computed.schema)}]"
                self._schema = schema_text(computed.schema)
            else:
                fresh = computed.take(pa.array(np.searchsorted(ask, found[audit])))
                differ = ~self._same(reused.take(pa.array(audit)), fresh)
                bad = np.unique(packs[audit][differ])
                why = "failed the audit: a row differs from a fresh computation of it"
            for number in bad:
                self._refuse_number(number, why)
            keep = ~np.isin(packs, bad)
        redo = np.setdiff1d(found[~keep], ask, assume_unique=True)  # rows of a refused pack not yet computed
        if len(redo):
            ask_all = np.union1d(ask, redo)
            more = self._compute(compute, redo, schema)
            computed = pa.concat_tables([computed, more]).take(pa.array(np.argsort(np.concatenate([ask, redo]),
                                                                                   kind="stable")))
            ask = ask_all
        served = found[keep]
        new = ~np.isin(ask, served)  # computed rows the memo did not serve: stored
        self.counts.computed += int(new.sum())
        self.counts.reused += len(served)
        self.counts.audited += len(audit)
        if new.any():
            self.add([keys[i] for i in ask[new]], computed.filter(pa.array(new)))
        parts, pos = [computed.filter(pa.array(new))], [ask[new]]
        if len(served):
            parts.append(reused.filter(pa.array(keep)))
            pos.append(served)
        order = np.argsort(np.concatenate(pos), kind="stable")
        return pa.concat_tables(parts).take(pa.array(order))

    def _compute(self, compute, positions: np.ndarray, schema: pa.Schema | None) -> pa.Table:
        out = compute(positions)
        if out.num_rows != len(positions):
            raise RuntimeError(f"memo {self.stage}/{self.name}: computed {out.num_rows} rows for "
                               f"{len(positions)} keys")
        return out.cast(schema) if schema is not None else out

    def _refuse_number(self, number: int, why: str) -> None:
        index, path = self._index(), self._packs[number]
        with index.lock:
            if index.number.get(path.name) != number:
                return  # refused meanwhile by another shard of this process
        record, sig = None, None
        try:
            sig = _signature(os.stat(path, follow_symlinks=False))
            record = pack_record(pq.read_schema(path))
        except (OSError, pa.ArrowException):
            pass
        self._refuse(index, path, why, record, sig)


class NoMemo:
    """The memo turned off (runner.memo = "off", or "auto" on a GPU): every row is computed."""

    def __init__(self, stage: str, name: str):
        self.stage, self.name, self.namespace, self.counts = stage, name, None, Counts()

    def rows(self, keys: list[bytes], compute: Callable[[np.ndarray], pa.Table],
             schema: pa.Schema | None = None) -> pa.Table | None:
        self.counts.computed += len(keys)
        if not keys:
            return schema.empty_table() if schema is not None else None
        out = compute(np.arange(len(keys)))
        return out.cast(schema) if schema is not None else out


# ---- a stage's memos for a run ---------------------------------------------------------------------------------------
def memo_root(cfg) -> Path:
    """`runner.memo_dir`, or `<run.root>/.memo`: shared by every run under the same artifacts root (a folder on a
    shared filesystem serves a team or a cluster)."""
    return Path(cfg.runner.memo_dir) if cfg.runner.memo_dir is not None else Path(cfg.run.root) / ".memo"


def _on_gpu(plan: dict) -> list[str]:
    return [r for r, facts in plan.items() if isinstance(facts, dict) and str(facts.get("device", "")) == "cuda"]


def memo_state(stage, cfg, plan: dict) -> str:
    """"on", or why it is off: `runner.memo = "off"`, or "auto" (the default) with a resource of the stage on a GPU,
    where kernels are not batch-independent and a reused row could differ in its last bits from a fresh one."""
    if cfg.runner.memo == "off":
        return "off (runner.memo = off)"
    on_gpu = _on_gpu(plan)
    if cfg.runner.memo == "auto" and on_gpu:
        return f"off ({', '.join(on_gpu)} on a GPU: runner.memo = auto keeps it off there; \"on\" takes rows " \
               f"that may differ from a fresh run's in their last bits)"
    return "on"


def namespace_facts(stage, spec, cfg, plan: dict) -> dict:
    from pipeline.engine.codeversion import code_version

    return {"format": FORMAT, "stage": stage.name, "memo": spec.name, "code": code_version(stage.module),
            **spec.facts(cfg, plan)}


def open_memo(stage, spec, cfg, plan: dict, force: bool = False) -> "RowMemo | NoMemo":
    """The stage's memo `spec` for this run; under `force` (`--force`) it reads nothing, so every row goes to the
    model again, and writes what it computes."""
    if memo_state(stage, cfg, plan) != "on":
        return NoMemo(stage.name, spec.name)
    memo = RowMemo(memo_root(cfg), stage.name, spec.name, namespace_facts(stage, spec, cfg, plan),
                   verify=cfg.runner.memo_verify, exact=not _on_gpu(plan))
    memo.read = not force
    return memo


def memo_manifest(stage, cfg, plan: dict, results: list[dict]) -> dict:
    """The manifest's `memo`: per memo, its namespace (what `contramine cache --unreferenced` keeps), whether it was
    on, and the rows this run's computed shards sent to the model, took from the memo, and recomputed to audit it."""
    out = {}
    for spec in stage.memos:
        state = memo_state(stage, cfg, plan)
        counts = [tuple(r.get("memo", {}).get(spec.name, (0, 0, 0))) + (0,) for r in results if not r["cached"]]
        out[spec.name] = {"namespace": f"{spec.name}-{namespace_hash(namespace_facts(stage, spec, cfg, plan))}"
                          if state == "on" else None, "state": state,
                          "rows_computed": sum(c[0] for c in counts), "rows_reused": sum(c[1] for c in counts),
                          "rows_audited": sum(c[2] for c in counts)}
    return out


# ---- what `contramine cache` shows, verifies and prunes --------------------------------------------------------------
@dataclass
class NamespaceInfo:
    stage: str
    path: Path
    packs: int
    rows: int
    bytes: int
    last_used: float
    temp_files: list[Path] = field(default_factory=list)
    pack_files: list[Path] = field(default_factory=list)


def _own(folder: Path, pattern: re.Pattern) -> list[Path]:
    """The entries of `folder` whose names the memo writes (`pattern`, fullmatch) and that are plain files."""
    try:
        return sorted(folder / e.name for e in os.scandir(folder) if pattern.fullmatch(e.name) and
                      e.is_file(follow_symlinks=False))
    except OSError:
        return []


def namespaces(root: Path) -> list[NamespaceInfo]:
    """Every namespace under the memo root with its size (rows from the packs' footers only): the folders that have
    a `_namespace.json`, so a memo_dir set to a folder holding anything else never lists (or prunes) that. A stage
    or namespace folder that is a symbolic link is left out, and named once."""
    out = []
    for ns in sorted(p.parent for p in Path(root).glob(f"*/*/{NAMESPACE}")):
        if ns.parent.name == QUARANTINE:
            continue
        try:
            check_below(root, ns / NAMESPACE, final=True)
        except UnsafePath as e:
            _say_once(("link", ns), f"memo: {e}; left out")
            continue
        packs = _own(ns, PACK)
        rows, sizes, used = 0, [], []
        for p in packs:
            try:
                st = p.stat()
                rows += pq.ParquetFile(p).metadata.num_rows
            except (OSError, pa.ArrowException):
                continue
            sizes.append(st.st_size)
            used.append(st.st_mtime)
        out.append(NamespaceInfo(ns.parent.name, ns, len(packs), rows, sum(sizes),
                                 max(used, default=ns.stat().st_mtime), _own(ns, TEMP), packs))
    return out


def referenced_namespaces(runs_root: Path) -> set[str]:
    """`<stage>/<namespace>` of every memo a committed manifest under `runs_root` names (its stage's `memo`)."""
    refs = set()
    for man in Path(runs_root).glob("*/*/_manifest.json"):
        try:
            manifest = json.loads(man.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            continue
        if not isinstance(manifest, dict) or not isinstance(manifest.get("memo"), dict):
            continue
        for entry in manifest["memo"].values():
            if isinstance(entry, dict) and isinstance(entry.get("namespace"), str):
                refs.add(f"{manifest.get('stage')}/{entry['namespace']}")
    return refs


def prune(root: Path, runs_root: Path, older_than_days: float | None = None, unreferenced: bool = False,
          dry_run: bool = False) -> list[tuple[Path, str]]:
    """Remove what the memo no longer needs: packs not used for `older_than_days`, namespaces no manifest under
    `runs_root` names, and temp files of writes killed more than an hour ago. Only names the memo writes are ever
    removed (packs, their temp files, `_namespace.json`, then the folder if that left it empty); the quarantine is
    never touched. Returns (path, why) of each."""
    now, refs, gone = time.time(), referenced_namespaces(runs_root) if unreferenced else set(), []

    def remove(path: Path, why: str) -> None:
        gone.append((path, why))
        if not dry_run:
            try:  # a name the memo writes, in its folder as opened from the root: never a folder, never through a link
                d = open_folder(root, path.parent, create=False)
                if d is not None:
                    with d:
                        d.unlink(path.name, OWN)
            except UnsafePath as e:
                _say_once(("link", path.parent), f"memo: {e}; nothing is removed there")

    for ns in namespaces(root):
        if unreferenced and f"{ns.stage}/{ns.path.name}" not in refs:
            gone.append((ns.path, "no run under " + str(runs_root) + " uses it"))
            if not dry_run:
                try:
                    d = open_folder(root, ns.path, create=False)
                    if d is not None:
                        with d:
                            for p in ns.pack_files + ns.temp_files + _own(ns.path, re.compile(re.escape(NAMESPACE))):
                                d.unlink(p.name, OWN)
                except UnsafePath as e:
                    _say_once(("link", ns.path), f"memo: {e}; nothing is removed there")
                    continue
                try:
                    ns.path.rmdir()
                except OSError:
                    _say_once(("kept", ns.path), f"memo: {ns.path} kept: it holds files the memo did not write")
            continue
        for tmp in ns.temp_files:
            try:
                if now - tmp.stat().st_mtime > 3600:
                    remove(tmp, "a write that did not finish")
            except FileNotFoundError:
                pass
        if older_than_days is not None:
            for pack in ns.pack_files:
                try:
                    if now - pack.stat().st_mtime > older_than_days * 86400:
                        remove(pack, f"unused for over {older_than_days:g} days")
                except FileNotFoundError:
                    pass
    return gone


class MemoUnverified(ExpectedError, RuntimeError):
    """`contramine cache --verify` found packs that fail: one line (each pack and its writer are listed above it)."""


def verify(root: Path, dry_run: bool = False) -> tuple[int, list[tuple[Path, str]]]:
    """`contramine cache --verify`: every pack of every namespace read whole (page checksums) and checked as a
    lookup checks it — the key column, the namespace's value schema (the one `_namespace.json` records, else the one
    most packs have), the writer record, the values hash. Each pack that fails is quarantined (not with
    `dry_run`). Returns (packs checked, [(pack, why and who wrote it)]). Recomputing rows needs the models and the
    rows' inputs, which a pack does not hold: a run does that (`runner.memo_verify = 1` on a new run name)."""
    checked, bad = 0, []
    for ns in namespaces(root):
        try:
            facts = json.loads((ns.path / NAMESPACE).read_text()).get("facts") or {}
        except (OSError, ValueError, AttributeError):
            facts = {}
        if facts.get("format") != FORMAT:  # an older version's namespace: never read now, pruned once unreferenced
            log.info(f"memo: {ns.path} is of an older memo format: not read by this version, not verified "
                     f"(`contramine cache --unreferenced` removes it once no run names it)")
            continue
        memo = RowMemo(root, ns.stage, ns.path.name.rsplit("-", 1)[0], {})
        memo.dir = ns.path
        expected = memo._expected(None)
        if expected is None:  # no record: the schema most packs have
            seen: dict[str, int] = {}
            for p in ns.pack_files:
                try:
                    text = schema_text(_values_schema(pq.read_schema(p)))
                except (OSError, pa.ArrowException):
                    continue
                seen[text] = seen.get(text, 0) + 1
            expected = max(seen, key=seen.get) if seen else None
        for p in ns.pack_files:
            checked += 1
            table, _, problem = memo._read_pack(p, expected)
            if problem is None:
                continue
            record = pack_record(table.schema) if table is not None else None
            moved = None if dry_run else quarantine(root, p)
            bad.append((p, f"{problem} ({writer_of(record)})" + (f": moved to {moved}" if moved else "")))
    return checked, bad
