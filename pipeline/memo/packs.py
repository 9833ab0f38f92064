"""The row memo's packs on disk (rows.py describes the memo): the names it writes, what a pack records (its writer,
the hash of its values, the team key's MAC of everything a row is served under) and the checks a pack must pass
before a row of it is served: who may have written it (fstat), its footer (before a column is decoded), its name
against its keys, its record, its values.
"""
from __future__ import annotations

import getpass
import hashlib
import hmac
import json
import os
import re
import socket
import stat
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from contramine.pipeline.errors import json_loads
from contramine.pipeline.memo.footer import open_footer, read_values
from contramine.pipeline.storage.safe_paths import UnsafePath, kind_of, open_regular

# 2: packs carry their writer and values hash; 3: the MAC covers namespace, pack name and keys, the record names its
# namespace, keys are written plain and uncompressed. In every namespace's facts, so an older format is never read.
FORMAT = 3
NAMESPACE = "_namespace.json"
QUARANTINE = ".quarantine"
RECORD = b"contramine.memo"  # the pack's key-value metadata: {format, writer, values, rows[, mac]}
KEY = pa.binary(16)
# The only names the memo writes in a namespace, so the only ones it reads or removes (fullmatch):
PACK = re.compile(r"[0-9a-f]{32}\.parquet")
TEMP = re.compile(r"\.(?:[0-9a-f]{32}\.parquet|_namespace\.json)\.[A-Za-z0-9_]+\.tmp")  # atomic_file's temp files
OWN = re.compile(rf"{PACK.pattern}|{TEMP.pattern}|{re.escape(NAMESPACE)}")  # all a namespace holds of the memo's


# ---- what a pack records ---------------------------------------------------------------------------------------------
def values_hash(values: pa.Table, key: bytes | None = None, binding: bytes = b"") -> str:
    """blake2b-128 of a table's values, from their logical content (not their Arrow layout: a slice, a chunking or a
    validity buffer does not change it), column by column with names and types. With the team's `key`
    (runner.memo_key), HMAC-SHA256 of `binding` (`mac_binding`: namespace, pack name, keys) and the same bytes: only
    a holder of the key can make a pack's `mac` match, and only for the rows, keys and place it was written for."""
    return values_hashes(values, key, binding)[1 if key else 0]  # type: ignore[return-value]  # with a key, a keyed hash


def mac_binding(namespace: str, name: str, keys: bytes) -> bytes:
    """What a value is served under, besides itself: the namespace (`<stage>/<folder>`), the pack's file name and
    its key column (16 bytes a row, in order), each length-prefixed. In the MAC, a row whose key was swapped with
    another's, or a pack copied into another namespace or under another name, no longer matches."""
    parts = [f"contramine.memo/{FORMAT}".encode(), namespace.encode(), name.encode(), keys]
    return b"".join(len(p).to_bytes(8, "little") + p for p in parts)


def namespace_of(pack: Path) -> str:
    """`<stage>/<namespace folder>` of a pack's path: where it is served from."""
    return f"{Path(pack).parent.parent.name}/{Path(pack).parent.name}"


def pack_name(keys: bytes) -> str:
    """A pack's file name: the hash of its key column, so two writers of the same rows write the same file."""
    return hashlib.blake2b(keys, digest_size=16).hexdigest() + ".parquet"


def values_hashes(values: pa.Table, key: bytes | None = None, binding: bytes = b"") -> tuple[str, str | None]:
    """(the plain hash, the keyed one or None), from one pass over the values; `binding` goes into the keyed one."""
    plain = hashlib.blake2b(digest_size=16)
    keyed = hmac.new(key, binding, digestmod=hashlib.sha256) if key else None
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
        user = getpass.getuser()
    except (KeyError, OSError):  # a container's uid without a passwd entry
        user = str(os.getuid())
    return {"user": user, "host": socket.gethostname(), "pid": os.getpid(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "code": facts.get("code")}


def pack_record(schema: pa.Schema) -> dict | None:
    """The record a pack's metadata holds, or None (not written by this format)."""
    raw = (schema.metadata or {}).get(RECORD)
    try:  # json_loads: 100,000 nested `[` is no record (ValueError), never a RecursionError that ends the run
        record = json_loads(raw) if raw else None
    except ValueError:  # JSONDecodeError, UnicodeDecodeError, nested too deep
        return None
    return record if isinstance(record, dict) and record.get("format") == FORMAT else None


def owner_of(st: os.stat_result | None) -> str:
    """Who the filesystem says wrote a file: its owner's uid (and name, where this host knows it) and its mtime, from
    fstat of the file as opened. A pack's own writer record is the writer's claim, forged as easily as its values."""
    if st is None:
        return "owner unknown"
    try:
        import pwd  # pwd: Unix only (ImportError elsewhere: the owner goes unnamed)

        name = f" ({pwd.getpwuid(st.st_uid).pw_name})"
    except (ImportError, KeyError):
        name = ""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(st.st_mtime))
    return f"file owned by uid {st.st_uid}{name}, mode {stat.S_IMODE(st.st_mode):04o}, modified {when}"


class Untrusted(str):
    """Why a pack is not served though nothing shows it wrong: it is not ours to write and no team key vouches for
    it. Named, left in place (it may be a colleague's honest pack), never quarantined."""


def trust_problem(st: os.stat_result, key: bytes | None) -> Untrusted | None:
    """Without the team's key, only a pack of this user's that no one else may write is served: another uid's, or
    a group- or world-writable one, could hold anything, with a plain hash recomputed to match (fstat of the file
    as opened). With the key, the MAC vouches for it whoever owns it."""
    if key:
        return None
    if st.st_uid != os.getuid():
        return Untrusted(f"is another user's (uid {st.st_uid}), and no runner.memo_key vouches for it")
    if st.st_mode & 0o022:
        return Untrusted(f"may be written by others (mode {stat.S_IMODE(st.st_mode):04o}), and no runner.memo_key "
                         f"vouches for it")
    return None


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


def name_problem(path: Path, keys: bytes) -> str | None:
    """Why a pack's file name is not the hash of its key column (keys swapped or reordered in place, a pack copied
    under another's name), or None."""
    if Path(path).name != pack_name(keys):
        return f"is not named after its keys (they hash to {pack_name(keys)}: keys changed, or renamed)"
    return None


def key_bytes(table: pa.Table) -> bytes:
    keys = table.column("key").combine_chunks()
    return keys.buffers()[1].to_pybytes()[keys.offset * 16:(keys.offset + len(keys)) * 16]


def values_problem(table: pa.Table, key: bytes | None = None, path: Path | None = None) -> str | None:
    """Why a whole pack (read from `path`) is not what its record says (rows, the namespace it was written for,
    values hash; with the team's `key`, also the keyed hash `mac` of the namespace, pack name, keys and values: a
    pack written without the key, rewritten with its hashes recomputed, with keys swapped or copied from elsewhere,
    fails), or None."""
    record = pack_record(table.schema)
    assert record is not None  # pack_problem, asked first, refuses a pack without one
    values = table.drop_columns(["key"])
    if record.get("rows") != table.num_rows:
        return f"{table.num_rows} rows where its record says {record.get('rows')}"
    if path is not None and record.get("namespace") != namespace_of(path):
        return f"a record written for namespace {str(record.get('namespace'))[:80]!r}, not {namespace_of(path)!r}"
    binding = mac_binding(namespace_of(path), Path(path).name, key_bytes(table)) if path is not None else b""
    plain, mac = values_hashes(values, key, binding)
    if record.get("values") != plain:
        return "values that do not hash to its record's hash (changed after they were written)"
    if key and not isinstance(record.get("mac"), str):
        return "no keyed values hash (written without the team's runner.memo_key)"
    if key and not hmac.compare_digest(record["mac"].encode("utf-8", "surrogatepass"), (mac or "").encode()):
        return ("a keyed hash that is not the team key's for these keys, values, name and namespace (forged, keys "
                "swapped, copied from elsewhere, or written with another runner.memo_key)")
    return None


def file_signature(st: os.stat_result) -> tuple:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def own_files(folder: Path, pattern: re.Pattern) -> list[Path]:
    """The entries of `folder` whose names the memo writes (`pattern`, fullmatch) and that are plain files."""
    try:
        return sorted(folder / e.name for e in os.scandir(folder) if pattern.fullmatch(e.name) and
                      e.is_file(follow_symlinks=False))
    except OSError:
        return []


def namespace_mac(key: bytes, folder: Path, record: dict) -> str:
    """The team key's HMAC of what a namespace folder's `_namespace.json` records, bound to the folder's name."""
    body = json.dumps({k: record.get(k) for k in ("stage", "memo", "facts", "values")}, sort_keys=True)
    bound = f"contramine.memo/{FORMAT}/namespace\0{Path(folder).parent.name}/{Path(folder).name}\0{body}"
    return hmac.new(key, bound.encode(), hashlib.sha256).hexdigest()


def namespace_hash(facts: dict) -> str:
    """What a namespace folder's name ends in (`<memo>-<hash>`): its facts' hash."""
    return hashlib.blake2b(json.dumps(facts, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()


def _read_record(folder: Path) -> tuple[dict, os.stat_result | None]:
    """A namespace folder's `_namespace.json` as it says ({} where it is no plain file or does not parse), and its
    fstat."""
    try:
        with os.fdopen(open_regular(folder / NAMESPACE), "rb") as f:
            st = os.fstat(f.fileno())
            record = json_loads(f.read(1 << 20))
        return (record if isinstance(record, dict) else {}), st
    except (OSError, ValueError, UnsafePath):  # ValueError: also JSON nested too deep
        return {}, None


def namespace_record(folder: Path, key: bytes | None = None) -> dict:
    """What a namespace folder's `_namespace.json` records, or {}: no such plain file, unreadable (a link, a FIFO or
    a device there is never opened for long, safe_paths.open_regular), or neither this user's own file that no one
    else may write nor vouched for by the team `key` (its `mac`). Another account's, trusted as it was, could
    record any value schema, and every keyed run then quarantined the honest packs: the packs decide then."""
    record, st = _read_record(folder)
    if st is None or not record:
        return {}
    if st.st_uid == os.getuid() and not st.st_mode & 0o022:
        return record
    mac = record.get("mac")
    return record if key and isinstance(mac, str) and hmac.compare_digest(  # bytes: a non-ASCII str is a TypeError
        mac.encode("utf-8", "surrogatepass"), namespace_mac(key, folder, record).encode()) else {}


def recorded_schema(folder: Path, key: bytes | None = None) -> str | None:
    """The value schema a namespace folder's `_namespace.json` records (namespace_record); with the team `key` and
    no record to trust, the schema of its first pack whose MAC holds (a colleague's namespace of an older memo,
    written before its record was keyed); else None."""
    recorded = namespace_record(folder, key).get("values")
    if isinstance(recorded, str) or not key:
        return recorded if isinstance(recorded, str) else None
    for pack in own_files(folder, PACK):
        table, _, problem = read_pack(pack, None, key)
        if table is not None and problem is None:
            return schema_text(values_schema(table.schema))
    return None


def namespace_facts(folder: Path, key: bytes | None = None) -> dict:
    """The facts `_namespace.json` records (namespace_record), or {}; a record not vouched for still gives its facts
    where they hash to the folder's own name (a colleague's namespace of an older memo format is known as such)."""
    facts = namespace_record(folder, key).get("facts")
    if not isinstance(facts, dict):
        facts = _read_record(folder)[0].get("facts")
        if not isinstance(facts, dict) or not Path(folder).name.endswith("-" + namespace_hash(facts)):
            return {}
    return facts


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
    """(the whole pack, its file's fstat, why it is not served or None); (None, None, None) when gone. Who may have
    written it (fstat) and its footer are checked before a column is decoded."""
    fd, why = open_pack(path)
    if fd is None:
        return None, None, why
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if (untrusted := trust_problem(st, key)) is not None:
            return None, st, untrusted
        pf, problem = open_footer(f, st.st_size)  # footer.py: bounded before it is parsed, then its promises
        if pf is None:
            return None, st, problem
        table, problem = read_values(f, pf, st.st_size)  # and what its columns decode to, before they are decoded
        if table is None:
            return None, st, problem
    problem = (pack_problem(table.schema, expected) or name_problem(path, key_bytes(table)) or
               values_problem(table, key, path))
    return table, st, problem
