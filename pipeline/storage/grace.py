"""Readers and a writer at the same time: the shards a commit replaces stay for a grace period.

Readers take no lock: `make sql` lists a table's files from its manifest and DuckDB opens them while it answers.
A stage's commit (store.Store.finish) swaps the manifest; if it then removed the files the old manifest listed, a
query that listed them a moment before would fail on a vanished file. So, like Delta Lake's files that stay until
VACUUM, a commit keeps the shards it replaces for `runner.keep_replaced_s` seconds, recorded in the table folder's
`.replaced.json` ({file: when replaced}); the next commit of that table, or `contramine cache --prune`, removes those
past it (upkeep.py). Shards and sidecars of no manifest at all (a killed writer's, another layout's) go at once,
as before.
"""
from __future__ import annotations

import time
from pathlib import Path

from contramine.pipeline.storage.atomic import atomic_write_json
from contramine.pipeline.storage.safe_paths import open_folder
from contramine.pipeline.storage.shard_names import OWN, PART
from contramine.pipeline.storage.verify import small_json

RECORD = ".replaced.json"


def _with_sidecars(names) -> set[str]:
    return {n for name in names for n in (name, str(Path(name).with_suffix(".json")))}


def collect(root: Path, table_dir: Path, files: list[dict], replaced: list[str], keep_s: float,
            now: float | None = None, dry_run: bool = False) -> list[str]:
    """After a commit listing `files`: record `replaced` (now), then remove every shard, sidecar or temp file the
    project writes that is neither listed nor replaced less than `keep_s` seconds ago. Returns the names removed."""
    now = time.time() if now is None else now
    listed = _with_sidecars(e["file"] for e in files)
    record = {k: v for k, v in small_json(Path(table_dir) / RECORD).items()
              if PART.fullmatch(k) and isinstance(v, (int, float)) and k not in listed}
    if keep_s > 0:
        record.update({name: now for name in replaced if name not in record})
    record = {k: v for k, v in record.items() if -keep_s < now - v < keep_s}  # a time far ahead is no record
    keep = listed | _with_sidecars(record)
    gone = []
    with open_folder(root, table_dir) as d:
        names = {e.name for e in d.entries()}
        for name in sorted(names - keep):
            if OWN.fullmatch(name) and (dry_run or d.unlink(name, OWN)):
                gone.append(name)
    record = {k: v for k, v in record.items() if k in names}
    if not dry_run and (record or RECORD in names):
        atomic_write_json(Path(table_dir) / RECORD, record, root=root)
    return gone
