"""Readers and a writer at the same time: the shards a commit replaces stay for a grace period.

Readers take no lock: `make sql` lists a table's files from its manifest and DuckDB opens them while it answers.
A stage's commit (store.Store.finish) swaps the manifest; if it then removed the files the old manifest listed, a
query that listed them a moment before would fail on a vanished file. So, like Delta Lake's files that stay until
VACUUM, a commit keeps the shards it replaces for `runner.keep_replaced_s` seconds, recorded in the table folder's
`.replaced.json` ({file: when replaced}); the next commit of that table, or `contramine cache --prune`, removes those
past it. Shards and sidecars of no manifest at all (a killed writer's, another layout's) go at once, as before.
"""
from __future__ import annotations

import time
from pathlib import Path

from pipeline.engine.atomic import atomic_write_json
from pipeline.engine.safe_paths import open_folder
from pipeline.engine.store import OWN, PART, committed_files
from pipeline.engine.verify import small_json

RECORD = ".replaced.json"


def _with_sidecars(names) -> set[str]:
    return {n for name in names for n in (name, str(Path(name).with_suffix(".json")))}


def replaced_files(table_dir: Path, new_files: list[dict]) -> list[str]:
    """The shard files the table's committed manifest lists and `new_files` does not (read before the swap)."""
    try:
        old = committed_files(table_dir) or []
    except Exception:  # noqa: BLE001 - a manifest of the wrong shape replaced: nothing of it to keep
        return []
    new = {e["file"] for e in new_files}
    return [e["file"] for e in old if e["file"] not in new]


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
    record = {k: v for k, v in record.items() if now - v < keep_s}
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


def prune_replaced(runs_root: Path, keep_s: float, dry_run: bool = False) -> list[tuple[Path, str]]:
    """`contramine cache --prune`: in every run under `runs_root` not being written now, remove the replaced shards
    past their grace period (the table's next commit would). [(path, why)] for each file removed."""
    from pipeline.engine.lock import RunBusy, run_lock

    gone: list[tuple[Path, str]] = []
    runs_root = Path(runs_root)
    if not runs_root.is_dir():
        return gone
    for record in sorted(runs_root.glob(f"*/*/{RECORD}")):
        table_dir, run_dir = record.parent, record.parent.parent
        if table_dir.is_symlink() or run_dir.is_symlink() or run_dir.name.startswith("."):
            continue
        try:
            with run_lock(run_dir, "cache --prune"):  # the run's writer commits alone: never mid-commit
                files = committed_files(table_dir) or []
                for name in collect(runs_root, table_dir, files, [], keep_s, dry_run=dry_run):
                    gone.append((table_dir / name, f"replaced by a commit over {keep_s:g}s ago"))
        except (RunBusy, OSError, ValueError):
            continue  # a run being written (its commit collects them), or one that cannot be changed: left
    return gone
