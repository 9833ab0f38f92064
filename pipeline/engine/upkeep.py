"""Run-level upkeep the CLI runs: `contramine verify` (every shard hashed again against its manifest) and the part
of `contramine cache --prune` that removes the shards commits replaced, past their grace period (grace.py)."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from contramine.pipeline.storage.grace import RECORD, collect
from contramine.pipeline.storage.lock import RunBusy, run_lock
from contramine.pipeline.storage.manifest import TableCorrupt, committed_files
from contramine.pipeline.storage.tables import RunTables
from contramine.pipeline.storage.verify import Verified, damaged_line


def verify_run(run_dir: Path | str) -> tuple[int, int, list[str]]:
    """`contramine verify`: every shard of every table of the run hashed again and compared with its manifest (a
    shard without a recorded hash read whole, its Parquet page checksums verified). Returns (tables, shards checked,
    one line for each damaged file or table)."""
    run_dir = Path(run_dir)
    verified, names = Verified(run_dir, remembered=False), RunTables(run_dir).names()
    checked, bad = 0, []
    for table in names:
        try:
            entries = committed_files(run_dir / table) or []
        except TableCorrupt as corrupt:
            bad.append(" ".join(str(corrupt).split("\n")))
            continue
        for e in entries:
            path, checked = run_dir / table / e["file"], checked + 1
            why = verified.check(table, path, e.get("hash"), e.get("bytes"))
            if why is None and not e.get("hash"):
                try:
                    pq.read_table(path, page_checksum_verification=True)
                except (pa.ArrowInvalid, OSError) as err:
                    why = f"is not readable Parquet ({' '.join(str(err).split())[:120]})"
            if why is not None:
                bad.append(damaged_line(run_dir / table, e["file"], why))
    verified.save()
    return len(names), checked, bad


def prune_replaced(runs_root: Path, keep_s: float, dry_run: bool = False) -> list[tuple[Path, str]]:
    """`contramine cache --prune`: in every run under `runs_root` not being written now, remove the replaced shards
    past their grace period (the table's next commit would). [(path, why)] for each file removed."""
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
