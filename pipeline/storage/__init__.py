"""A run folder on disk: Parquet shards and their sidecars (store.py), the one reader of a finished run (tables.py),
atomic writes (atomic.py), writes that never follow a link (safe_paths.py) and the one-writer lock (lock.py).

- atomic.py: Writes that a kill at any instant leaves whole or absent: files (temp file, fsync, rename) and folders
  (temp folder, fsync, one exchange or two renames). Shards, sidecars, manifests, checkpoints, indexes, exports and
  results all go through here.
- grace.py: Readers and a writer at the same time: the shards a commit replaces stay for a grace period.
- lock.py: One writer per run folder: the process that mines or reruns a stage holds `<run>/.lock`; a second writer
  stops at once with one line naming the holder (host, pid, since when, what), as Git's index.lock does. Readers take
  no lock: they read the committed snapshot (store.py), which a writer only ever replaces whole.
- safe_paths.py: Writing into folders someone else made: no write, rename or delete goes through a symbolic link below
  a root.
- served.py: What is served is the bytes that were checked: a shard is read from the descriptor that was hashed
  (verify.py), never by its path again.
- shard_names.py: The names a table folder holds: its manifest, its shards (part-<i>-of-<n>.<key16>.parquet,
  store.py), and the names its writers make (shards, sidecars, their temp files). Here apart so that the modules the
  store calls (grace.py) need not import the store.
- store.py: Parquet shards on disk: atomic writes, verified cache keys, and a table that is the file list its last
  commit names.
- tables.py: Reading a run's tables: the one reader for the SQL views, the mining report, the trainer and the tests.
- verify.py: Every read checks what it reads: a shard's bytes hash to what its table's manifest records before
  anything serves them (`make sql`, the report, exports, the trainer, a stage reading its inputs, `contramine
  verify`).

What the rest of the project uses, importable from the package (loaded on first use, so importing
the package imports none of its modules):
"""
from __future__ import annotations

from contramine.pipeline.lazy import lazy_attributes

_HOME = {
    "atomic_dir": "contramine.pipeline.storage.atomic",
    "atomic_file": "contramine.pipeline.storage.atomic",
    "atomic_write_bytes": "contramine.pipeline.storage.atomic",
    "atomic_write_json": "contramine.pipeline.storage.atomic",
    "recover": "contramine.pipeline.storage.atomic",
    "RECORD": "contramine.pipeline.storage.grace",
    "collect": "contramine.pipeline.storage.grace",
    "RunBusy": "contramine.pipeline.storage.lock",
    "run_lock": "contramine.pipeline.storage.lock",
    "UnsafePath": "contramine.pipeline.storage.safe_paths",
    "check_below": "contramine.pipeline.storage.safe_paths",
    "kind_of": "contramine.pipeline.storage.safe_paths",
    "make_dirs": "contramine.pipeline.storage.safe_paths",
    "not_regular": "contramine.pipeline.storage.safe_paths",
    "open_append": "contramine.pipeline.storage.safe_paths",
    "open_folder": "contramine.pipeline.storage.safe_paths",
    "open_regular": "contramine.pipeline.storage.safe_paths",
    "read_regular": "contramine.pipeline.storage.safe_paths",
    "readable": "contramine.pipeline.storage.safe_paths",
    "walk": "contramine.pipeline.storage.safe_paths",
    "MANIFEST": "contramine.pipeline.storage.store",
    "Store": "contramine.pipeline.storage.store",
    "TableCorrupt": "contramine.pipeline.storage.store",
    "check_manifest": "contramine.pipeline.storage.store",
    "combine": "contramine.pipeline.storage.store",
    "committed_files": "contramine.pipeline.storage.store",
    "file_hash": "contramine.pipeline.storage.store",
    "read_manifest": "contramine.pipeline.storage.store",
    "RunTables": "contramine.pipeline.storage.tables",
    "TableMissing": "contramine.pipeline.storage.tables",
    "TableUnreadable": "contramine.pipeline.storage.tables",
    "reuse_tables": "contramine.pipeline.storage.tables",
    "writer_of": "contramine.pipeline.storage.tables",
    "CACHE": "contramine.pipeline.storage.verify",
    "Verified": "contramine.pipeline.storage.verify",
    "damaged_line": "contramine.pipeline.storage.verify",
}
__all__ = sorted(_HOME)


__getattr__ = lazy_attributes(__name__, _HOME)
