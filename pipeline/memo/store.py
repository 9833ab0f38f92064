"""Writing the row memo's folder (rows.py describes the memo): packs written atomically from the memo root, packs
that failed a check moved aside to the quarantine, a memo this process cannot write used read-only, and the warnings
all of that says once per process.
"""
from __future__ import annotations

import os

import errno
import json
import logging
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from contramine.pipeline.storage.atomic import atomic_file, atomic_write_json
from contramine.pipeline.memo.packs import FORMAT, KEY, NAMESPACE, QUARANTINE, RECORD, mac_binding, namespace_mac, \
    namespace_of, \
    pack_name, schema_text, values_hashes, writer_record
from contramine.pipeline.storage.safe_paths import UnsafePath, make_dirs, open_folder

log = logging.getLogger("contramine.memo")


# ---- said once, per process ------------------------------------------------------------------------------------------
_said: set = set()
_said_lock = threading.Lock()


def say_once(key, line: str) -> None:
    with _said_lock:
        if key in _said:
            return
        _said.add(key)
    log.warning(line)


# ---- the memo's own folder: no link below its root, writes that may be refused ---------------------------------------
_READ_ONLY: dict[Path, str] = {}  # memo roots this process cannot write, and why


def denied(e: OSError) -> bool:
    return e.errno in (errno.EACCES, errno.EPERM, errno.EROFS)


def read_only(root: Path, why: str) -> None:
    """From now on this process only reads the memo at `root`; said once."""
    root = Path(root)
    if root not in _READ_ONLY:
        _READ_ONLY[root] = why
        say_once(("read-only", root), f"memo: {root} cannot be written here ({why}): used read-only — its rows are "
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
        if denied(e):
            read_only(root, f"{type(e).__name__}: {e.strerror}")
        return None
    return dest


def write_pack_file(table: pa.Table, where) -> None:
    """A pack's Parquet bytes (its `key` column first, then the values) at `where`, with page checksums. Vectors
    (fixed-size binary) do not compress: written plain, they write and read at disk speed. Keys are always plain
    and uncompressed: a reader checks from the footer alone that they hold 16 bytes a row (footer.footer_problem)."""
    values = [c for c in table.column_names if c != "key"]
    raw = all(pa.types.is_fixed_size_binary(table.schema.field(c).type) for c in values)
    codecs = {"key": "none", **{c: "none" if raw else "zstd" for c in values}}
    pq.write_table(table, where, compression=codecs, write_page_checksum=True, row_group_size=64_000,
                   use_dictionary=False if raw else values)


def _others(path: Path) -> bool:
    try:
        return os.lstat(path).st_uid != os.getuid()
    except OSError:
        return False


def write_pack(root: Path, folder: Path, stage: str, memo: str, facts: dict, keys: list[bytes],
               values: pa.Table, key: bytes | None = None) -> Path | None:
    """Write one pack of rows into the namespace `folder` of the memo at `root` (atomically, with its writer record
    and values hash, keyed with the team's `key` when given); its name is the hash of its keys, so two writers of the
    same rows write the same file. None when nothing was written (no rows, a read-only memo: said once)."""
    if not keys or root in _READ_ONLY:
        return None
    joined = b"".join(keys)
    name = pack_name(joined)
    key_col = pa.FixedSizeBinaryArray.from_buffers(KEY, len(keys), [None, pa.py_buffer(joined)])
    values = values.replace_schema_metadata(None)
    # mac: HMAC-SHA256 under the team's runner.memo_key, when set, of the namespace, name, keys and values
    plain, mac = values_hashes(values, key, mac_binding(namespace_of(folder / name), name, joined))
    record = {"format": FORMAT, "writer": writer_record(facts), "values": plain, "rows": len(keys),
              "namespace": namespace_of(folder / name), **({"mac": mac} if mac else {})}
    table = values.add_column(0, pa.field("key", KEY, nullable=False), key_col) \
        .replace_schema_metadata({RECORD: json.dumps(record, sort_keys=True)})
    try:
        make_dirs(root, folder)
        if not (folder / NAMESPACE).is_file():
            ns = {"stage": stage, "memo": memo, "facts": facts, "values": schema_text(values.schema)}
            # keyed too: a colleague with the key trusts it, and no account without the key can forge one
            atomic_write_json(folder / NAMESPACE, {**ns, **({"mac": namespace_mac(key, folder, ns)} if key else {})},
                              root=root, mode=0o444)
        if not key and _others(folder / name):  # the same keys' pack, another account's: without the key this run
            return None  # could not check it (a team's keyed pack), so it is not replaced
        # written in the namespace folder as opened from the memo root (no link on the way is followed); a link
        # in the pack's place is replaced by the rename, never followed
        with atomic_file(folder / name, root=root, mode=0o444) as tmp:  # read-only: nobody edits a pack in place
            write_pack_file(table, tmp)
    except UnsafePath as e:
        say_once(("link", folder), f"memo: {e}; nothing is written there")
        return None
    except OSError as e:  # a cache that cannot be written costs time, never the run
        if denied(e):
            read_only(root, f"{type(e).__name__}: {e.strerror} at {e.filename or folder}")
        else:
            say_once(("write", root, e.errno), f"memo: a pack could not be written under {folder} "
                                               f"({type(e).__name__}: {e}): its rows are not stored")
        return None
    return folder / name
