"""A table's manifest, `_manifest.json`: its format, and reading it as data. A table is the file list its manifest
names (store.py writes it; tables.py and the runner read it). Every reader takes the manifest's shape from here, so
a hand-edited, truncated or planted one is one line, never a traceback, a doubled row or a loop over a million
shard names."""
from __future__ import annotations

import json
import os
from pathlib import Path

from contramine.pipeline.errors import ExpectedError, json_loads
from contramine.pipeline.storage.safe_paths import TooLarge, UnsafePath, kind_of, open_regular, read_regular
from contramine.pipeline.storage.shard_names import MANIFEST, OLD_PART, PART, shard_file
from contramine.pipeline.storage.verify import foreign_owner, table_line

# Sizes past which a file the project writes small is not read at all (fstat, before a byte is read): a manifest of
# MAX_SHARDS entries is ~20 MB; a sidecar is ~150 bytes.
MANIFEST_MAX = 64 << 20
SIDECAR_MAX = 1 << 16


def read_manifest(table_dir: Path) -> dict | None:
    """The table's committed manifest, checked (`check_manifest`), or None when the table has none."""
    p = Path(table_dir) / MANIFEST
    try:  # non-blocking, fstat-checked (safe_paths.open_regular): a FIFO or device there is one line, never a hang
        with os.fdopen(open_regular(p, follow=True), "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_size > MANIFEST_MAX:
                raise TooLarge(p, st.st_size, MANIFEST_MAX)
            if (uid := foreign_owner(st.st_uid, Path(table_dir).parent)) is not None:
                raise manifest_error(table_dir, f"is owned by uid {uid}, not by the run folder's owner: another "
                                                f"account put it there")
            raw = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except TooLarge as e:
        raise manifest_error(table_dir, f"is {e.size:,} bytes, more than any manifest ({MANIFEST_MAX:,}): "
                                        f"not read") from None
    except UnsafePath:
        raise manifest_error(table_dir, f"is {kind_of(p.lstat().st_mode)}, not a regular file") from None
    return parse_manifest(table_dir, raw)


def parse_manifest(table_dir: Path, raw: bytes) -> dict:
    """A manifest's bytes as read once (a copy takes its file list from the same bytes it copies), checked."""
    try:
        man = json_loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):  # nested too deep included (json_loads)
        raise manifest_error(table_dir, "not a manifest (invalid JSON)") from None
    check_manifest(table_dir, man)
    return man


# A manifest is data: every reader (tables.py: `make sql`, `make report`, `make train`, `make export`; the runner's
# inputs) takes its shape from here, so a hand-edited, truncated or planted one is one line, never a traceback, a
# doubled row or a loop over a million shard names. Fields the writers record, and the type readers rely on:
MANIFEST_FIELDS = {"stage": str, "table": str, "config": dict, "rows": dict, "memo": dict, "inputs": dict,
                   "resources": dict, "config_hash": str, "code": str, "extra": str, "seed": int,
                   "seconds": (int, float), "wall_seconds_last_run": (int, float), "shards_computed": int,
                   "shards_cached": int, "timeline": dict}
MAX_SHARDS = 99_999  # what a part name's five digits can number
_ENTRY_FIELDS = {"file": str, "hash": str, "rows": int, "seconds": (int, float), "bytes": int}  # bytes: since 62


class TableCorrupt(ExpectedError, ValueError):
    """A manifest that is not one (invalid JSON, a field of the wrong type, a file list naming something else or a
    file twice, a shard count no folder holds): one line naming the table, its run and the command that rewrites it."""


def manifest_error(table_dir: Path, why: str, man=None) -> TableCorrupt:
    """The one line: which table of which run, what is wrong, and the stage run that writes the table again."""
    return TableCorrupt(table_line(table_dir, f"{Path(table_dir) / MANIFEST} {why}", man))


def _typed(value, kind) -> bool:
    """isinstance, except that true/false are not numbers here (JSON's true is no shard count)."""
    return isinstance(value, kind) and not isinstance(value, bool)


def check_manifest(table_dir: Path, man) -> None:
    """Refuse (TableCorrupt, one line) a manifest of the wrong shape: not an object; a known field of another type;
    a `files` list that is not a list of {file, hash, rows, seconds} whose names fullmatch the part pattern, number
    their position and the list's length, and are each listed once; `shards` other than that length. A manifest
    of the old layout (no `files`) must name a shard count its folder holds (at most MAX_SHARDS)."""
    if not isinstance(man, dict):
        raise manifest_error(table_dir, f"is {_short(man)}, not a JSON object", man)
    for key, kind in MANIFEST_FIELDS.items():
        if man.get(key) is not None and not _typed(man[key], kind):
            raise manifest_error(table_dir, f"has {key} = {_short(man[key])}, not a {_kind_name(kind)}", man)
    if isinstance(man.get("rows"), dict):
        bad = next((k for k, v in man["rows"].items() if not _typed(v, int)), None)
        if bad is not None:
            raise manifest_error(table_dir, f"has rows[{bad!r}] = {_short(man['rows'][bad])}, not a whole number",
                                 man)
    shards = man.get("shards")
    if "files" in man:
        files = man["files"]
        if not isinstance(files, list):
            raise manifest_error(table_dir, f"has files = {_short(files)}, not a list of shard files", man)
        if len(files) > MAX_SHARDS:
            raise manifest_error(table_dir, f"lists {len(files):,} files, more than a part name can number "
                                            f"({MAX_SHARDS:,})", man)
        if shards is not None and (not _typed(shards, int) or shards != len(files)):
            raise manifest_error(table_dir, f"has shards = {_short(shards)} but lists {len(files)} files", man)
        seen: set[str] = set()
        for i, e in enumerate(files):
            if not isinstance(e, dict):
                raise manifest_error(table_dir, f"lists {_short(e)} at position {i}, not a shard file entry", man)
            for key, kind in _ENTRY_FIELDS.items():
                if e.get(key) is not None and not _typed(e[key], kind):
                    raise manifest_error(table_dir, f"lists {key} = {_short(e[key])} at position {i}, not a "
                                                    f"{_kind_name(kind)}", man)
            name = e.get("file")
            m = PART.fullmatch(name) if isinstance(name, str) else None
            if m is None:  # a file list naming anything but a shard beside it is not ours: refuse, never follow
                raise manifest_error(table_dir, f"lists {_short(name)} at position {i}, not a shard file name "
                                                f"(part-<i>-of-<n>.<key>.parquet)", man)
            if name in seen:
                raise manifest_error(table_dir, f"lists {name} twice (its rows would be read twice)", man)
            seen.add(name)  # type: ignore[arg-type]  # a str: PART matched it
            if (int(m.group(1)), int(m.group(2))) != (i, len(files)):
                raise manifest_error(table_dir, f"lists {name} at position {i} of {len(files)} (shard i of n is "
                                                f"part-<i>-of-<n>, in order)", man)
        return
    if not _typed(shards, int) or not 0 <= shards <= MAX_SHARDS:  # type: ignore[operator]  # an int by then
        raise manifest_error(table_dir, f"has no file list and shards = {_short(shards)}, not a shard count "
                                        f"(0 to {MAX_SHARDS:,})", man)
    try:  # the old layout's files are part-<i>-of-<n>.parquet: its count is bounded by what the folder holds
        held = sum(1 for name in os.listdir(table_dir) if OLD_PART.fullmatch(name) and name.endswith(
            f"-of-{shards:05d}.parquet"))
    except OSError:
        held = 0
    if shards > held:  # type: ignore[operator]  # an int (checked above)
        raise manifest_error(table_dir, f"names {shards:,} shards (no file list) and its folder holds {held} of them",
                             man)


def _short(value) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind_name(kind) -> str:
    names = {str: "string", dict: "JSON object", int: "whole number", (int, float): "number"}
    return names.get(kind, str(kind))


def committed_files(table_dir: Path, manifest: dict | None = None) -> list[dict] | None:
    """The committed snapshot of a table: [{file, hash, rows, seconds}] in shard order, or None (not finished). A
    manifest without a file list (written before there were any): its layout's `part-<i>-of-<n>.parquet` files,
    with what their sidecars say. `manifest`, when given, has been read (and checked) by the caller."""
    man = manifest if manifest is not None else read_manifest(table_dir)
    if man is None:
        return None
    if "files" in man:
        return man["files"]
    n = man["shards"]
    out = []
    for i in range(n):
        name = shard_file(i, n)
        side = (Path(table_dir) / name).with_suffix(".json")
        try:  # no link followed, no FIFO waited on, nothing past SIDECAR_MAX read
            meta = json_loads(read_regular(side, max_size=SIDECAR_MAX))
        except (OSError, ValueError, UnsafePath):
            meta = {}
        meta = meta if isinstance(meta, dict) else {}
        out.append({"file": name, "hash": meta.get("hash") if isinstance(meta.get("hash"), str) else None,
                    "rows": meta["rows"] if _typed(meta.get("rows"), int) else 0,
                    "seconds": float(meta["seconds"]) if _typed(meta.get("seconds"), (int, float)) else 0.0})
    return out


__all__ = ["MANIFEST", "MANIFEST_FIELDS", "MANIFEST_MAX", "SIDECAR_MAX", "MAX_SHARDS", "TableCorrupt", "check_manifest", "committed_files",
           "manifest_error", "parse_manifest", "read_manifest"]
