"""Parquet shards on disk: atomic writes, verified cache keys, and a table that is the file list its last commit names.

A shard is named by the key of the computation that wrote it: `part-<i>-of-<n>.<key16>.parquet`, with a sidecar
`part-<i>-of-<n>.<key16>.json` = {key, hash, rows, seconds}. A shard is reused only when a file of the key the
stage computes now (inputs' content hashes + stage config + code version + ...) is there AND its bytes still hash to
the recorded hash, so a truncated, edited or deleted shard is recomputed, never silently reused.

A table is the file list of its `_manifest.json` (Delta Lake's and Iceberg's snapshot, in one file): `files` =
[{file, hash, rows, seconds}] in shard order. Writers add files and never replace one a manifest lists with other
bytes (another computation has another key, so another name); the stage's commit is the atomic swap of the manifest
(`finish`), after which files no manifest lists are collected. So a rerun killed after any number of shards leaves
the previous computation readable whole, and its own finished shards on disk for the next run to reuse. Readers
(tables.py) read exactly the listed files. A manifest written before file lists existed (no `files`) names the
files `part-<i>-of-<n>.parquet` of its layout: those are read as they are.

Writes go through atomic.py (temp file in the same folder, fsync, rename). One writer per run folder (lock.py).
This is the writer's side; readers of a finished run use tables.py (RunTables).
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from contramine.pipeline.storage.atomic import atomic_file, atomic_write_json
from contramine.pipeline.errors import json_loads
from contramine.pipeline.storage.grace import collect
from contramine.pipeline.storage.manifest import MANIFEST, SIDECAR_MAX, TableCorrupt, committed_files, read_manifest
from contramine.pipeline.storage.safe_paths import UnsafePath, open_regular, read_regular
from contramine.pipeline.storage.served import read_checked
from contramine.pipeline.storage.shard_names import PART, shard_file
from contramine.pipeline.storage.verify import Verified, damaged_line, first_damaged, hash_open
from contramine.pipeline.schema import SCHEMAS



def file_hash(path: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def combine(*parts: str) -> str:
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=16).hexdigest()


@dataclass(frozen=True)
class ShardInfo:
    table: str
    index: int
    count: int
    key: str
    hash: str
    rows: int
    cached: bool
    file: str = ""
    seconds: float = 0.0
    bytes: int | None = None  # the file's size: a reader compares it (fstat) before it hashes the file

    def entry(self) -> dict:
        """The shard as a manifest lists it."""
        return {"file": self.file, "hash": self.hash, "rows": self.rows, "seconds": round(self.seconds, 3),
                **({"bytes": self.bytes} if self.bytes is not None else {})}


class Store:
    """The tables of one run: artifacts/<run>/<table>/. `staged` holds the file lists of tables a stage has computed
    but not committed yet (finish_stage: its manifest functions see the new shards); everything else reads the
    committed snapshot."""

    def __init__(self, run_dir: Path, keep_replaced_s: float = 0.0):
        self.root = Path(run_dir)
        self.staged: dict[str, list[dict]] = {}
        self.keep_replaced_s = keep_replaced_s  # finish(): how long the shards a commit replaces stay (grace.py)
        self._verified: Verified | None = None  # verify.Verified, made at this Store's first check (`verified`)

    def dir(self, table: str) -> Path:
        return self.root / table

    @property
    def verified(self) -> Verified:
        """The run's remembered checks (verify.py), loaded at this Store's first check of a file."""
        if self._verified is None:
            self._verified = Verified(self.root)
        return self._verified

    def _whole(self, table: str, path: Path, digest, size: int | None) -> bool:
        """`path` (a shard of `table`) is a plain file of `size` bytes (when known) that hashes to `digest`: checked,
        or vouched for by a remembered check of the unchanged file. A shard with no recorded hash is not whole."""
        return isinstance(digest, str) and bool(digest) and self.verified.check(table, path, digest, size) is None

    # ---- the snapshot a reader of this run sees
    def files(self, table: str) -> list[dict] | None:
        return self.staged[table] if table in self.staged else committed_files(self.dir(table))

    def _entry(self, table: str, i: int, n: int) -> dict:
        files = self.files(table)
        if files is None:
            raise FileNotFoundError(f"{self.dir(table)}: no finished table `{table}`; run the stage that writes it")
        if len(files) != n:
            raise FileNotFoundError(f"{self.dir(table)}: table `{table}` has {len(files)} shards where this run has "
                                    f"{n}: rerun the stage that writes it")
        return files[i]

    def shard_path(self, table: str, i: int, n: int, key: str | None = None) -> Path:
        """With `key`: the file that computation writes. Without: the committed shard i's file."""
        if key is not None:
            return self.dir(table) / shard_file(i, n, key)
        return self.dir(table) / self._entry(table, i, n)["file"]

    def shard_hash(self, table: str, i: int, n: int) -> str:
        """Content hash of a finished input shard, as its commit records it (and its writer checked)."""
        h = self._entry(table, i, n).get("hash")
        if not h:
            raise FileNotFoundError(f"{self.shard_path(table, i, n)}: shard missing; run the stage that writes "
                                    f"`{table}`")
        return h

    def intact(self, table: str, i: int, n: int) -> bool:
        """The committed shard exists and its bytes still hash to the recorded hash (a check the run's
        `.verified.json` or this process remembers, for a file unchanged since, counts: verify.py)."""
        try:
            e = self._entry(table, i, n)
            return self._whole(table, self.dir(table) / e["file"], e.get("hash"), e.get("bytes"))
        except (FileNotFoundError, OSError, TableCorrupt, UnsafePath):
            return False

    def cached_rows(self, table: str, i: int, n: int) -> int:
        return int(self._entry(table, i, n).get("rows", 0))

    def shard_seconds(self, table: str, i: int, n: int) -> float:
        return float(self._entry(table, i, n).get("seconds", 0.0))

    def table_hash(self, table: str, n: int) -> str:
        return combine(*(self.shard_hash(table, i, n) for i in range(n)))

    def read_shard(self, table: str, i: int, n: int, columns: tuple[str, ...] | None = None,
                   dictionary: tuple[str, ...] = ()) -> pa.Table:
        """Shard i of a committed table, its bytes checked against the hash its commit records (verify.py) and
        read from the descriptor that was checked (served.py: a file renamed over it since is not read), its
        Parquet pages against their checksums: a damaged one is TableCorrupt, one line naming it and the fix.
        `columns`: only those of them the file has (a stage that reads 5 of candidates' 13 columns decodes a third
        of its bytes; the whole file's hash is still checked); `dictionary`: those read as dictionary columns."""

        path = self.shard_path(table, i, n)
        entry = self._entry(table, i, n)
        fd, why = self.verified.open_checked(table, path, entry.get("hash"), entry.get("bytes"))
        if fd is not None:
            try:
                self.verified.save()
                return read_checked(fd, columns, dictionary)
            except (pa.ArrowInvalid, OSError) as e:
                why = f"is not readable Parquet ({' '.join(str(e).split())[:120]})"
            finally:
                os.close(fd)
        raise TableCorrupt(damaged_line(self.dir(table), path.name, why or "changed"))

    def read(self, table: str, n: int | None = None) -> pa.Table:
        """Whole table: every shard in order (sorted by sid for per-sentence tables)."""
        if n is None:
            n = self.shard_count(table)
        parts = [self.read_shard(table, i, n) for i in range(n)]
        return pa.concat_tables(parts) if parts else schema_of(table).empty_table()  # type: ignore[union-attr]  # stages discovered

    def shard_count(self, table: str) -> int:
        files = self.files(table)
        if files is None:
            raise FileNotFoundError(f"{self.dir(table)}: no finished table `{table}` (run its stage first)")
        return len(files)

    def exists(self, table: str) -> bool:
        return (self.dir(table) / MANIFEST).is_file()

    def manifest(self, table: str) -> dict | None:
        return read_manifest(self.dir(table))

    # ---- the writer's side
    def write_shard(self, table: str, i: int, n: int, data: pa.Table, key: str, seconds: float = 0.0) -> ShardInfo:
        """Shard i under `key`: a file of its own name, never one a manifest lists with other bytes."""
        check_schema(table, data)
        path = self.shard_path(table, i, n, key)
        # no folder below the run is a link (safe_paths.py); committed bytes are read-only (0444): an edit in place
        # takes a chmod first, which moves the file's ctime, which the verified-read cache keys on (verify.py)
        with atomic_file(path, root=self.root, mode=0o444) as tmp:
            # Fixed writer options: the same table always gives the same bytes.
            pq.write_table(data, tmp, compression="zstd", row_group_size=64_000, write_statistics=True,
                           write_page_checksum=True)
        digest, size = _hash_written(path)
        info = ShardInfo(table, i, n, key, digest, data.num_rows, cached=False, file=path.name,
                         seconds=seconds, bytes=size)
        atomic_write_json(path.with_suffix(".json"),
                          {"key": key, "hash": info.hash, "rows": info.rows, "seconds": round(seconds, 3),
                           "bytes": info.bytes}, root=self.root, mode=0o444)
        return info

    def cached_shard(self, table: str, i: int, n: int, key: str) -> ShardInfo | None:
        """The shard written under `key`, if it is there whole: its sidecar names the key and its bytes are intact.
        Finished shards of a rerun that was killed before its commit are found here too."""
        path = self.shard_path(table, i, n, key)
        try:  # bounded (fstat) before it is parsed; no link followed, no FIFO waited on
            meta = json_loads(read_regular(path.with_suffix(".json"), max_size=SIDECAR_MAX))
            if not isinstance(meta, dict) or meta.get("key") != key or not isinstance(meta.get("rows"), int):
                return None
            size = meta.get("bytes") if isinstance(meta.get("bytes"), int) else None
            # the run's remembered checks (verify.py) vouch for a shard a rerun finds unchanged: not hashed again
            if not self._whole(table, path, meta.get("hash"), size):
                return None
        except (OSError, ValueError, UnsafePath):
            return None
        return ShardInfo(table, i, n, key, meta["hash"], int(meta["rows"]), cached=True, file=path.name,
                         seconds=float(meta.get("seconds", 0.0)) if isinstance(meta.get("seconds"), (int, float))
                         else 0.0, bytes=os.stat(path, follow_symlinks=False).st_size)

    def write_table(self, table: str, parts: list[pa.Table], key: str, manifest: dict | None = None) -> None:
        """A whole table written and committed outside a stage (a table you bring, a test's input): shard i of
        len(parts) under `key`, then the commit."""
        n = len(parts)
        self.finish(table, n, manifest or {}, [self.write_shard(table, i, n, t, key).entry() for i, t in
                                               enumerate(parts)])

    def finish(self, table: str, n: int, manifest: dict, files: list[dict]) -> None:
        """Commit: the manifest naming exactly `files` replaces the last one in one rename; then every shard file
        no longer listed (an older computation, another layout, a killed writer's temp file) is removed: only names
        a writer of this module makes (OWN), never another file, a folder or a link's target. Only the run's one
        writer (lock.py) calls this, so no other writer's file is in flight. Each listed file is checked against its
        hash first (TableCorrupt: nothing is committed), which the first reader after the commit then need not do."""
        if len(files) != n or any(not PART.fullmatch(e["file"]) for e in files):
            raise ValueError(f"table {table}: a commit needs {n} shard files, got {[e.get('file') for e in files]}")
        if (line := first_damaged(self.verified, self.dir(table), files)) is not None:  # remembered for readers
            raise TableCorrupt(line)
        try:  # what the manifest being replaced lists and this one does not: kept for a grace period (grace.py)
            listed = {e["file"] for e in files}
            replaced = [e["file"] for e in committed_files(self.dir(table)) or [] if e["file"] not in listed]
        except TableCorrupt:
            replaced = []
        atomic_write_json(self.dir(table) / MANIFEST, {**manifest, "table": table, "shards": n, "files": files},
                          root=self.root, mode=0o444)
        self.staged.pop(table, None)
        collect(self.root, self.dir(table), files, replaced, self.keep_replaced_s)
        self.verified.save()


def _hash_written(path: Path) -> tuple[str, int]:
    """(content hash, size) of the plain file a writer has just renamed into place, remembered in this process
    (verify.hash_open): the commit's check of it, and a rerun's look, are a fstat while it stays unchanged."""
    fd = open_regular(path)
    try:
        st, digest = hash_open(fd)
        return digest, st.st_size
    finally:
        os.close(fd)


def schema_of(table: str) -> pa.Schema | None:
    """The table's contract, or None if no loaded module declares it. A stage module may declare its own tables
    (e.g. pool_embeddings): those are in SCHEMAS once that module is imported, which a writer has done (the runner
    discovers the stages before it writes); a reader follows the committed file list and needs no contract."""
    return SCHEMAS.get(table)


def check_schema(table: str, data: pa.Table) -> None:
    """The contract's columns must be there with their types (extra columns are allowed)."""
    want = schema_of(table)
    if want is None:
        raise ValueError(f"table {table!r}: no stage declares it (known: {', '.join(sorted(SCHEMAS))})")
    missing = [n for n in want.names if n not in data.column_names]
    if missing:
        raise ValueError(f"table {table}: missing contract columns {missing} (has {data.column_names})")
    for f in want:
        got = data.schema.field(f.name).type
        ok = got == f.type or (pa.types.is_fixed_size_list(got) and pa.types.is_list(f.type)
                               and got.value_type == f.type.value_type)
        if not ok:
            raise ValueError(f"table {table}: column {f.name} is {got}, contract says {f.type}")
