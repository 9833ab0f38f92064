"""The row memo: per-row model outputs stored under a key of what made them, reused wherever that key recurs, and
checked before they are served (rows.py describes it).

- audit.py: The row memo's audit (rows.py describes the memo; runner.memo_verify sets its share): which reused rows
  are computed again, and whether a stored row equals its fresh computation.
- cache.py: What `contramine cache` shows, verifies and prunes of the row memo (rows.py describes the memo): its
  namespaces and their sizes, the ones no run's manifest names, and every pack checked as a lookup checks it.
- index.py: The row memo's lookup index (rows.py describes the memo): per namespace and process, an 8-byte key prefix
  and an 8-byte (pack, row) location a row, both sorted by prefix, built from the packs' key columns only and freed
  when the stage ends.
- packs.py: The row memo's packs on disk (rows.py describes the memo): the names it writes, what a pack records (its
  writer, the hash of its values) and the checks a pack must pass before a row of it is served.
- rows.py: The row memo: per-row model outputs stored under a key of what made them, reused wherever that key recurs,
  and checked before they are served.
- run.py: A stage's row memos in a run (rows.py describes the memo): where the memo lives, whether it is on for the
  stage's resources, the facts that make a namespace, and the manifest's account of the rows it computed, reused and
  audited.
- store.py: Writing the row memo's folder (rows.py describes the memo): packs written atomically from the memo root,
  packs that failed a check moved aside to the quarantine, a memo this process cannot write used read-only, and the
  warnings all of that says once per process.

What the rest of the project uses, importable from the package (loaded on first use, so importing
the package imports none of its modules):
"""
from __future__ import annotations

from contramine.pipeline.lazy import lazy_attributes

_HOME = {
    "MemoUnverified": "contramine.pipeline.memo.cache",
    "namespaces": "contramine.pipeline.memo.cache",
    "prune": "contramine.pipeline.memo.cache",
    "referenced_namespaces": "contramine.pipeline.memo.cache",
    "verify": "contramine.pipeline.memo.cache",
    "NamespaceIndex": "contramine.pipeline.memo.index",
    "release_indexes": "contramine.pipeline.memo.index",
    "FORMAT": "contramine.pipeline.memo.packs",
    "RECORD": "contramine.pipeline.memo.packs",
    "pack_record": "contramine.pipeline.memo.packs",
    "values_hash": "contramine.pipeline.memo.packs",
    "NoMemo": "contramine.pipeline.memo.rows",
    "RowMemo": "contramine.pipeline.memo.rows",
    "namespace_hash": "contramine.pipeline.memo.packs",
    "row_key": "contramine.pipeline.memo.rows",
    "memo_manifest": "contramine.pipeline.memo.run",
    "memo_root": "contramine.pipeline.memo.run",
    "memo_state": "contramine.pipeline.memo.run",
    "namespace_facts": "contramine.pipeline.memo.run",
    "open_memo": "contramine.pipeline.memo.run",
}
__all__ = sorted(_HOME)


__getattr__ = lazy_attributes(__name__, _HOME)
