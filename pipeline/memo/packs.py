"""The row memo's packs on disk (rows.py describes the memo): the names it writes, what a pack records (its writer,
the hash of its values) and the checks a pack must pass before a row of it is served.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import socket
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contramine.pipeline.storage.safe_paths import UnsafePath, kind_of, open_regular, read_regular

FORMAT = 2  # 2: packs carry their writer and values hash; in every namespace's facts, so format 1 is never read
NAMESPACE = "_namespace.json"
QUARANTINE = ".quarantine"
RECORD = b"contramine.memo"  # the pack's key-value metadata: {format, writer, values, rows[, mac]}
KEY = pa.binary(16)
# The only names the memo writes in a namespace, so the only ones it reads or removes (fullmatch):
PACK = re.compile(r"[0-9a-f]{32}\.parquet")
TEMP = re.compile(r"\.(?:[0-9a-f]{32}\.parquet|_namespace\.json)\.[A-Za-z0-9_]+\.tmp")  # atomic_file's temp files
OWN = re.compile(rf"{PACK.pattern}|{TEMP.pattern}|{re.escape(NAMESPACE)}")  # all a namespace holds of the memo's


# ---- what a pack records ---------------------------------------------------------------------------------------------
def values_hash(values: pa.Table, key: bytes | None = None) -> str:
    """blake2b-128 of a table's values, from their logical content (not their Arrow layout: a slice, a chunking or a
    validity buffer does not change it), column by column with names and types. With the team's `key`
    (runner.memo_key), HMAC-SHA256 of the same bytes: only a holder of the key can make a pack's `mac` match."""
    return values_hashes(values, key)[1 if key else 0]  # type: ignore[return-value]  # with a key, a keyed hash


def values_hashes(values: pa.Table, key: bytes | None = None) -> tuple[str, str | None]:
    """(the plain hash, the keyed one or None), from one pass over the values."""
    plain = hashlib.blake2b(digest_size=16)
    keyed = hmac.new(key, digestmod=hashlib.sha256) if key else None
    h = _Both(plain, keyed) if keyed else plain
    for name, col in zip(values.column_names, values.columns):
        h.update(f"{name}:{_type_text(col.type)}:{len(col)}\0".encode())
        _hash_array(h, col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
    return plain.hexdigest(), keyed.hexdigest() if keyed else None


class _Both:
    """Two hashes fed the same bytes."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def update(self, data) -> None:
        self.a.update(data)
        self.b.update(data)


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


def owner_of(st: os.stat_result | None) -> str:
    """Who the filesystem says wrote a file: its owner's uid (and name, where this host knows it) and its mtime, from
    fstat of the file as opened. A pack's own writer record is the writer's claim, forged as easily as its values."""
    if st is None:
        return "owner unknown"
    try:
        import pwd

        name = f" ({pwd.getpwuid(st.st_uid).pw_name})"
    except (ImportError, KeyError):
        name = ""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(st.st_mtime))
    return f"file owned by uid {st.st_uid}{name}, modified {when}"


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


def values_schema(schema: pa.Schema) -> pa.Schema:
    """A pack's schema less its key column and metadata."""
    return pa.schema([f for f in schema if f.name != "key"])


def pack_problem(table_schema: pa.Schema, expected: str | None) -> str | None:
    """Why a pack (by its schema) is not one of this namespace's, or None: the key column, the value schema, the
    record."""
    if table_schema.get_field_index("key") != 0 or table_schema.field("key").type != KEY:
        return "no 16-byte key column"
    if expected is not None and schema_text(values_schema(table_schema)) != expected:
        return f"values of schema [{schema_text(values_schema(table_schema))}] where [{expected}] is expected"
    if pack_record(table_schema) is None:
        return "no writer record (not written by this memo's format)"
    return None


def values_problem(table: pa.Table, key: bytes | None = None) -> str | None:
    """Why a whole pack's values are not what its record says (rows, values hash; with the team's `key`, also the
    keyed hash `mac`: a pack written without the key, or rewritten with its hashes recomputed, fails), or None."""
    record = pack_record(table.schema)
    assert record is not None  # pack_problem, asked first, refuses a pack without one
    values = table.drop_columns(["key"])
    if record.get("rows") != table.num_rows:
        return f"{table.num_rows} rows where its record says {record.get('rows')}"
    plain, mac = values_hashes(values, key)
    if record.get("values") != plain:
        return "values that do not hash to its record's hash (changed after they were written)"
    if key and not isinstance(record.get("mac"), str):
        return "no keyed values hash (written without the team's runner.memo_key)"
    if key and not hmac.compare_digest(record["mac"], mac):
        return "values whose keyed hash is not the team key's (forged, or written with another runner.memo_key)"
    return None


def file_signature(st: os.stat_result) -> tuple:
    return st.st_ino, st.st_size, st.st_mtime_ns


def own_files(folder: Path, pattern: re.Pattern) -> list[Path]:
    """The entries of `folder` whose names the memo writes (`pattern`, fullmatch) and that are plain files."""
    try:
        return sorted(folder / e.name for e in os.scandir(folder) if pattern.fullmatch(e.name) and
                      e.is_file(follow_symlinks=False))
    except OSError:
        return []


def recorded_schema(folder: Path) -> str | None:
    """The value schema a namespace folder's `_namespace.json` records, or None (no such plain file, or unreadable:
    a link, a FIFO or a device there is never opened for long, safe_paths.open_regular)."""
    try:
        recorded = json.loads(read_regular(folder / NAMESPACE, limit=1 << 20)).get("values")
        return recorded if isinstance(recorded, str) else None
    except (OSError, ValueError, AttributeError, UnsafePath):
        return None


def namespace_facts(folder: Path) -> dict:
    """The facts `_namespace.json` records ({} when it is no plain file or does not parse)."""
    try:
        facts = json.loads(read_regular(folder / NAMESPACE, limit=1 << 20)).get("facts")
        return facts if isinstance(facts, dict) else {}
    except (OSError, ValueError, AttributeError, UnsafePath):
        return {}


def open_pack(path: Path) -> tuple[int | None, str | None]:
    """(a read descriptor of the pack, None), or (None, why it is not opened): a link, a FIFO, a socket or a device
    named like a pack is refused at once (opened non-blocking, checked with fstat: safe_paths.open_regular), never
    waited on; (None, None) when it is gone."""
    try:
        return open_regular(path), None
    except FileNotFoundError:
        return None, None
    except UnsafePath:
        try:
            return None, f"is {kind_of(os.lstat(path).st_mode)}, not a regular file"
        except FileNotFoundError:
            return None, None
    except OSError as e:
        return None, f"does not open ({type(e).__name__}: {e.strerror})"


def read_pack(path: Path, expected: str | None, key: bytes | None = None
              ) -> tuple[pa.Table | None, os.stat_result | None, str | None]:
    """(the whole pack, its file's fstat, why it is not served or None); (None, None, None) when gone."""
    fd, why = open_pack(path)
    if fd is None:
        return None, None, why
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        try:
            # on this thread only (a pack is small): no CPU pool, and no IO pool pre-buffering reads of a Python
            # file object: an Arrow thread still reading one when a short command exits aborts the process
            # ("terminate called without an active exception", apache/arrow#34314)
            table = pq.read_table(f, page_checksum_verification=True, use_threads=False, pre_buffer=False)
        except (OSError, pa.ArrowException) as e:
            return None, st, f"does not read ({type(e).__name__}: {e})"
    problem = pack_problem(table.schema, expected) or values_problem(table, key)
    return table, st, problem
