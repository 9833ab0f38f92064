"""Parquet shards on disk: atomic writes, verified cache keys, the table layout of pipeline/schema.py.

Every shard file `part-<i>-of-<n>.parquet` has a sidecar `part-<i>-of-<n>.json` = {key, hash, rows}. A shard is
reused only when its sidecar's key equals the key the stage computes now (inputs' content hashes + stage config +
code version) AND the file's content hash still equals the recorded one — so a truncated, edited or deleted shard
is recomputed, never silently reused. Writes go through atomic.py (temp file in the same folder, fsync, rename).
This is the writer's side; readers of a finished run use tables.py (RunTables).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.engine.atomic import atomic_file, atomic_write_json
from pipeline.schema import SCHEMAS

_PART = re.compile(r"^part-(\d{5})-of-(\d{5})\.parquet$")


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


class Store:
    """The tables of one run: artifacts/<run>/<table>/part-*.parquet."""

    def __init__(self, run_dir: Path):
        self.root = Path(run_dir)

    def dir(self, table: str) -> Path:
        return self.root / table

    def shard_path(self, table: str, i: int, n: int) -> Path:
        return self.dir(table) / f"part-{i:05d}-of-{n:05d}.parquet"

    def _sidecar(self, table: str, i: int, n: int) -> Path:
        return self.shard_path(table, i, n).with_suffix(".json")

    def write_shard(self, table: str, i: int, n: int, data: pa.Table, key: str, seconds: float = 0.0) -> ShardInfo:
        check_schema(table, data)
        path = self.shard_path(table, i, n)
        with atomic_file(path) as tmp:
            # Fixed writer options: the same table always gives the same bytes.
            pq.write_table(data, tmp, compression="zstd", row_group_size=64_000, write_statistics=True)
        info = ShardInfo(table, i, n, key, file_hash(path), data.num_rows, cached=False)
        atomic_write_json(self._sidecar(table, i, n),
                          {"key": key, "hash": info.hash, "rows": info.rows, "seconds": round(seconds, 3)})
        return info

    def cached_shard(self, table: str, i: int, n: int, key: str) -> ShardInfo | None:
        """The shard's info if it exists, was written under `key`, and its bytes are intact."""
        path, side = self.shard_path(table, i, n), self._sidecar(table, i, n)
        if not (path.is_file() and side.is_file()):
            return None
        try:
            meta = json.loads(side.read_text())
        except (json.JSONDecodeError, OSError):
            return None
        if meta.get("key") != key or file_hash(path) != meta.get("hash"):
            return None
        return ShardInfo(table, i, n, key, meta["hash"], int(meta["rows"]), cached=True)

    def shard_hash(self, table: str, i: int, n: int) -> str:
        """Content hash of a finished input shard, as recorded (and checked) by its writer."""
        side = self._sidecar(table, i, n)
        if not side.is_file():
            raise FileNotFoundError(f"{self.shard_path(table, i, n)}: shard missing; run the stage that writes `{table}`")
        meta = json.loads(side.read_text())
        return meta["hash"]

    def _meta(self, table: str, i: int, n: int) -> dict:
        side = self._sidecar(table, i, n)
        return json.loads(side.read_text()) if side.is_file() else {}

    def intact(self, table: str, i: int, n: int) -> bool:
        """The shard and its sidecar exist and the shard's bytes still hash to the recorded hash."""
        path = self.shard_path(table, i, n)
        try:
            return path.is_file() and self._meta(table, i, n).get("hash") == file_hash(path)
        except (json.JSONDecodeError, OSError):
            return False

    def cached_rows(self, table: str, i: int, n: int) -> int:
        return int(self._meta(table, i, n).get("rows", 0))

    def shard_seconds(self, table: str, i: int, n: int) -> float:
        return float(self._meta(table, i, n).get("seconds", 0.0))

    def table_hash(self, table: str, n: int) -> str:
        return combine(*(self.shard_hash(table, i, n) for i in range(n)))

    def read_shard(self, table: str, i: int, n: int) -> pa.Table:
        path = self.shard_path(table, i, n)
        try:
            return pq.read_table(path)
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: shard missing; run the stage that writes `{table}`") from None
        except (pa.ArrowInvalid, OSError) as e:
            raise RuntimeError(f"{path}: unreadable Parquet shard ({e}); rerun its stage with --force") from None

    def read(self, table: str, n: int | None = None) -> pa.Table:
        """Whole table: every shard in order (sorted by sid for per-sentence tables)."""
        if n is None:
            n = self.shard_count(table)
        parts = [self.read_shard(table, i, n) for i in range(n)]
        return pa.concat_tables(parts) if parts else schema_of(table).empty_table()

    def shard_count(self, table: str) -> int:
        man = self.manifest(table)
        if man and "shards" in man:
            return int(man["shards"])
        counts = {int(m.group(2)) for p in self.dir(table).glob("part-*.parquet") if (m := _PART.match(p.name))}
        if len(counts) != 1:
            raise FileNotFoundError(f"{self.dir(table)}: no finished table `{table}` (run its stage first)")
        return counts.pop()

    def exists(self, table: str) -> bool:
        return (self.dir(table) / "_manifest.json").is_file()

    def manifest(self, table: str) -> dict | None:
        p = self.dir(table) / "_manifest.json"
        return json.loads(p.read_text()) if p.is_file() else None

    def finish(self, table: str, n: int, manifest: dict) -> None:
        """Drop shards of other layouts (a run with another shard count) and record the manifest."""
        keep = {self.shard_path(table, i, n).name for i in range(n)}
        for p in self.dir(table).glob("part-*"):
            if p.name not in keep and p.with_suffix(".parquet").name not in keep:
                p.unlink(missing_ok=True)
        for p in self.dir(table).glob(".part-*.tmp"):  # temp files of a killed writer
            p.unlink(missing_ok=True)
        atomic_write_json(self.dir(table) / "_manifest.json", {**manifest, "table": table, "shards": n})


def schema_of(table: str) -> pa.Schema | None:
    """The table's contract, or None if no stage declares it. A stage module may declare its own tables (e.g.
    pool_embeddings): those are in SCHEMAS once the stages are discovered, whatever this process did before."""
    if table not in SCHEMAS:
        from pipeline.engine.discovery import load_stages

        load_stages()
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
