"""The row memo: per-row model outputs stored under a key of what made them, reused wherever that key recurs, and
checked before they are served.

A shard's cache key (runner.py) holds every row of its sid range, so a corpus grown by one line, or another shard
layout, recomputes whole shards. Underneath that, the per-row model stages (`embeddings`, `pool_embeddings`,
`backtranslate`, `negate`, the positives `scores` embeds) look every row up here first and send only the rows
with new keys to the model — Bazel's action cache and a translator's translation memory, at the row.

    memo = ctx.memo("encode", settings=("encoder", "embeddings"), resources=("encoder",))
    vectors = memo.rows([row_key(text) for text in texts], compute_missing, schema)

A row's key has two parts:
- the namespace (a folder): the memo's format, the stage, its code version (codeversion.py: its module and every
  pipeline module it imports), the settings that shape a row (less execution settings), the resources as resolved
  for the run (model fingerprint, device kind, precision, engine, library versions) and whatever else the stage
  adds (the run seed where a model samples). A change to a stage's code moves that stage's rows to a new
  namespace, and no others; a new FORMAT moves them all (packs of an older format are never read);
- the row key: blake2b-128 of the row's own input (its text; for a back-translation also the chain, sid and
  variant, whose seed a sampling model draws from).

Layout: <memo root>/<stage>/<memo name>-<namespace hash>/ with `_namespace.json` (what the namespace is, and the
schema of its values) and packs `<blake2b of the pack's keys>.parquet`: a `key` column (16 bytes) and the value
columns, one pack per shard computation, written atomically (temp file, fsync, rename) with Parquet page checksums.
Each pack's key-value metadata (`contramine.memo`, written with it in the same file) records its writer (user,
host, pid, time, the stage's code version: its writer's claim, never repeated as fact), the namespace it was written
for and the blake2b of its values, with a team key (`runner.memo_key`) also the HMAC-SHA256 (`mac`) of its namespace,
file name, key column and values. Packs are written read-only (0444), their key column plain and uncompressed. Two writers of the same rows write the same
name and replace each other with equal values; a writer killed mid-write leaves only a temp file no reader opens.

What is served, and what is not. Without a team key, only this user's own packs that no one else may write are read
at all (another uid's, or a group- or world-writable one, is named once and left in place). A row is served only
when its whole 16-byte key matches, from a pack whose footer fits its bytes (checked before a column is decoded),
that is named after its keys, reads (page checksums), whose values have the namespace's schema (the stage's, or the
one `_namespace.json` records: another vector width is another schema), whose record names this namespace and
whose values hash to what its record says (with a team key, also to its `mac`: a pack without one is refused). A
pack that fails any of these (or is a FIFO, socket or device named like one: opened non-blocking, checked with
fstat) is named once in the log with its file's owner (uid, name), mode and mtime, moved aside to
`<memo root>/.quarantine/<stage>/<namespace>/` (never deleted), and its rows are computed again. On top, the
audit (`runner.memo_verify`): a share of the reused rows, and at least one row of every pack a lookup reads, is
computed again and compared; a pack with a differing row is quarantined the
same way and all its rows are recomputed, so a run's tables equal a fresh run's even when a writer of a shared memo
(or a bug in a namespace key) stored wrong values. A memo the run cannot write (another user's) is used read-only,
said once; a folder under the memo root that is a symbolic link is neither read nor written, said once. Deletes
(`contramine cache --prune`) remove only names the memo writes: packs, their temp files, `_namespace.json`.

Lookups never load the memo's values: each process keeps a compact index per namespace — an 8-byte key prefix and
an 8-byte (pack, row) location, 16 bytes a row, both sorted by prefix — of the packs it has seen; a new pack's rows
are sorted alone and merged in (searchsorted + insert), and the indexes are freed when the stage ends
(`release_indexes`). Values are read only from the packs that hold the rows a lookup needs. Bytes equal a fresh
run's because every model stage here is batch-independent on the CPU (encode/encoder.py, engines/hf.py, spaCy parses each
text alone); GPU kernels are not (the GPU check measured 3e-8), so `runner.memo = "auto"` (the default) leaves the
memo off for a stage whose resources run on a GPU (and with "on" there, the audit compares vectors to 1e-4).

Here: a row's key, `RowMemo` (lookup, store, audit, as a stage calls them) and `NoMemo`. Beside it: packs.py
(a pack's names, record and checks), index.py (the lookup index), store.py (writes, the quarantine,
read-only), audit.py (which rows are computed again), run.py (a stage's memos in a run) and cache.py
(`contramine cache`).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from contramine.pipeline.memo.audit import audit_rows, same_rows
from contramine.pipeline.memo.index import NamespaceIndex, index_new_packs, key_prefixes, namespace_index
from contramine.pipeline.memo.packs import NAMESPACE, PACK, Untrusted, file_signature, owner_of, own_files, \
    namespace_hash, read_pack, recorded_schema, schema_text
from contramine.pipeline.memo.store import quarantine, say_once, write_pack
from contramine.pipeline.storage.safe_paths import UnsafePath, check_below


def row_key(*parts) -> bytes:
    """The 16-byte key of one row's own input (texts, ids, a precomputed prefix): each part typed and
    length-prefixed, so ("a b", "c") != ("a", "b c") and "1" != 1. ~2 µs a row (JSON was 20)."""
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        if isinstance(p, str):
            tag, data = b"s", p.encode("utf-8", "surrogatepass")
        elif isinstance(p, bytes):
            tag, data = b"b", p
        else:
            tag, data = b"j", json.dumps(p, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()
        h.update(tag + len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()





@dataclass
class Counts:
    """Rows this process sent to the model, took from the memo, and recomputed to audit it, per memo name."""
    computed: int = 0
    reused: int = 0
    audited: int = 0


class RowMemo:
    """One namespace of the memo (see the module doc). `rows(keys, compute, schema)` is all a stage calls.
    `verify`: the audit's share of reused rows (runner.memo_verify); `exact`: False where rows may differ in their
    last bits (a GPU with runner.memo = "on"), so the audit compares vectors to 1e-4."""

    def __init__(self, root: Path, stage: str, name: str, facts: dict, verify: float = 0.0, exact: bool = True,
                 key: bytes | None = None):
        self.root, self.stage, self.name, self.facts = Path(root), stage, name, facts
        self.key = key  # the team's runner.memo_key: packs' values hashes are keyed (HMAC-SHA256), others refused
        self.namespace = f"{name}-{namespace_hash(facts)}"
        self.dir = self.root / stage / self.namespace
        self.counts = Counts()
        self.read = True  # False under --force: every row goes to the model again (and is written back)
        self.verify, self.exact = verify, exact
        self._schema: str | None = None  # the namespace's value schema, once known (given, computed or recorded)
        self._packs: list[Path | None] = []  # the index's packs as the last lookup saw them

    # ---- the folder ------------------------------------------------------------------------------------------------
    def _usable(self) -> bool:
        """False (said once) when a folder from the memo root down to this namespace is a symbolic link: its packs
        could be anyone's, and a write or a quarantine would land outside the memo."""
        try:
            check_below(self.root, self.dir, final=True)
            return True
        except UnsafePath as e:
            say_once(("link", self.dir), f"memo: {e}; this namespace is neither read nor written, its rows are "
                                         f"computed")
            return False

    def _expected(self, schema: pa.Schema | None) -> str | None:
        if schema is not None:
            self._schema = schema_text(schema)
        elif self._schema is None:
            self._schema = recorded_schema(self.dir, self.key)
        return self._schema

    def _refuse(self, index: NamespaceIndex, path: Path, why: str, st: os.stat_result | None = None):
        """A pack that is not served: named once with who the filesystem says wrote it (owner uid and name, mode,
        mtime: the pack's own writer record is its writer's claim), quarantined (not one only untrusted: another
        user's, or writable by others, without the team key), forgotten by the index."""
        sig = file_signature(st) if st is not None else None
        moved = None if isinstance(why, Untrusted) else quarantine(self.root, path)
        where = f"moved to {moved}" if moved else "left in place (not served by this process)"
        say_once(("bad", path, sig), f"memo: {path} {why} ({owner_of(st)}): {where}; its rows are computed again")
        with index.lock:
            index.drop(path.name)
            if not moved and sig is not None:
                index.refused[path.name] = sig

    # ---- lookup --------------------------------------------------------------------------------------------------
    def _index(self) -> NamespaceIndex:
        return namespace_index(self.dir, self.stage)

    def lookup(self, keys: list[bytes], schema: pa.Schema | None = None
               ) -> tuple[np.ndarray, pa.Table | None, np.ndarray]:
        """(positions in `keys` found in the memo, their values in that order, the pack number each came from);
        (empty, None, empty) when none is. A pack that does not read, or whose schema, record or values hash is
        wrong, is refused (named, quarantined) and its rows are misses; so is a row whose whole key differs from
        the one asked for (an 8-byte prefix collision, a pack replaced since it was indexed)."""
        none: tuple[np.ndarray, pa.Table | None, np.ndarray] = (np.zeros(0, np.int64), None, np.zeros(0, np.int64))
        if not keys:
            return none
        index, expected = self._index(), self._expected(schema)
        if expected is None:  # every namespace this format writes records its values' schema before its first pack
            if self.dir.is_dir() and own_files(self.dir, PACK):
                say_once(("no schema", self.dir), f"memo: {self.dir} holds packs but no {NAMESPACE} of yours, or "
                                                  f"vouched for by the team key, recording their schema: not read")
            return none
        with index.lock:
            bad = index_new_packs(index, self.dir, expected, self.key)
            prefix, loc, packs = index.prefix, index.loc, list(index.packs)
        self._packs = packs  # the pack numbers this lookup returns name these (rows() may refuse one of them)
        for path, problem, _record, st in bad:
            self._refuse(index, path, problem, st)
        if not len(prefix):
            return none
        asked = key_prefixes(keys)
        at: np.ndarray = np.searchsorted(prefix, asked)  # type: ignore[assignment]  # array in, array out
        found: np.ndarray = at < len(prefix)
        found[found] = prefix[at[found]] == asked[found]
        positions = np.flatnonzero(found)
        if not len(positions):
            return none
        where = loc[at[positions]]
        pack_of, row_of = (where >> np.uint64(32)).astype(np.int64), (where & np.uint64(0xFFFFFFFF)).astype(np.int64)
        got_pack: list[np.ndarray]
        got_pos, got_parts, got_pack = [], [], []
        for number in np.unique(pack_of):
            path = packs[number]
            if path is None:
                continue
            sel = np.flatnonzero(pack_of == number)
            table, st, problem = read_pack(path, expected, self.key)
            if table is None and problem is None:
                continue  # gone meanwhile: its rows are computed
            if problem is not None:
                self._refuse(index, path, problem, st)
                continue
            values = table.take(pa.array(row_of[sel]))  # type: ignore[union-attr]  # read, without a problem
            stored = values.column("key").combine_chunks().buffers()[1].to_pybytes()
            same = np.array([stored[16 * j:16 * j + 16] == keys[p] for j, p in enumerate(positions[sel])], bool)
            got_pos.append(positions[sel][same])
            got_parts.append(values.filter(pa.array(same)).drop_columns(["key"]).replace_schema_metadata(None))
            got_pack.append(np.full(int(same.sum()), number, np.int64))
            try:
                os.utime(path)  # last use: what `contramine cache --prune --older-than` goes by
            except OSError:
                pass
        if not got_pos:
            return none
        pos = np.concatenate(got_pos)
        order = np.argsort(pos, kind="stable")
        return pos[order], pa.concat_tables(got_parts).take(pa.array(order)), np.concatenate(got_pack)[order]

    # ---- storing -------------------------------------------------------------------------------------------------
    def add(self, keys: list[bytes], values: pa.Table) -> Path | None:
        """Write one pack of rows (atomically, with its writer record and values hash); its name is the hash of its
        keys, so two writers of the same rows write the same file. None when nothing was written (no rows, a
        read-only memo: said once)."""
        return write_pack(self.root, self.dir, self.stage, self.name, self.facts, keys, values, self.key)

    # ---- reading, computing, auditing ------------------------------------------------------------------------------
    def rows(self, keys: list[bytes], compute: Callable[[np.ndarray], pa.Table],
             schema: pa.Schema | None = None) -> pa.Table | None:
        """The value rows of `keys`, in order: those in the memo read from it, the rest computed by
        `compute(positions)` (one row per position, in order; of `schema` when given) and added to the memo. The
        audit's rows go to `compute` with the missing ones; a pack one of them disagrees with is quarantined and
        all its rows are computed. None only when `keys` is empty and no schema is given."""
        usable = self._usable()
        if self.read and usable:
            found, reused, packs = self.lookup(keys, schema)
        else:
            found, reused, packs = np.zeros(0, np.int64), None, np.zeros(0, np.int64)
        n = len(keys)
        missing = np.setdiff1d(np.arange(n), found, assume_unique=True)
        audit = audit_rows(packs, self.verify)
        ask = np.union1d(missing, found[audit])
        if not len(ask):
            self.counts.reused += len(found)
            return reused if reused is not None else (schema.empty_table() if schema is not None else None)
        computed = self._compute(compute, ask, schema)
        keep: np.ndarray = np.ones(len(found), bool)  # found rows still served from the memo
        if reused is not None:
            if not reused.schema.equals(computed.schema):  # the packs are of another schema than the model's
                bad = np.unique(packs)
                why = f"holds values of schema [{schema_text(reused.schema)}] where the model computes " \
                      f"[{schema_text(computed.schema)}]"
                self._schema = schema_text(computed.schema)
            else:
                fresh = computed.take(pa.array(np.searchsorted(ask, found[audit])))
                differ = ~same_rows(reused.take(pa.array(audit)), fresh, self.exact)
                bad = np.unique(packs[audit][differ])
                why = "failed the audit: a row differs from a fresh computation of it"
            for number in bad:
                self._refuse_number(number, why)
            keep = ~np.isin(packs, bad)
        redo = np.setdiff1d(found[~keep], ask, assume_unique=True)  # rows of a refused pack not yet computed
        if len(redo):
            ask_all = np.union1d(ask, redo)
            more = self._compute(compute, redo, schema)
            computed = pa.concat_tables([computed, more]).take(pa.array(np.argsort(np.concatenate([ask, redo]),
                                                                                   kind="stable")))
            ask = ask_all
        served = found[keep]
        new = ~np.isin(ask, served)  # computed rows the memo did not serve: stored
        self.counts.computed += int(new.sum())
        self.counts.reused += len(served)
        self.counts.audited += len(audit)
        if new.any():
            self.add([keys[i] for i in ask[new]], computed.filter(pa.array(new)))
        parts, pos = [computed.filter(pa.array(new))], [ask[new]]
        if len(served):
            parts.append(reused.filter(pa.array(keep)))  # type: ignore[union-attr]  # it holds the served rows
            pos.append(served)
        order = np.argsort(np.concatenate(pos), kind="stable")
        return pa.concat_tables(parts).take(pa.array(order))

    def _compute(self, compute, positions: np.ndarray, schema: pa.Schema | None) -> pa.Table:
        out = compute(positions)
        if out.num_rows != len(positions):
            raise RuntimeError(f"memo {self.stage}/{self.name}: computed {out.num_rows} rows for "
                               f"{len(positions)} keys")
        return out.cast(schema) if schema is not None else out

    def _refuse_number(self, number: int, why: str) -> None:
        index, path = self._index(), self._packs[number]
        assert path is not None  # a pack this lookup read rows from
        with index.lock:
            if index.number.get(path.name) != number:
                return  # refused meanwhile by another shard of this process
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            st = None
        self._refuse(index, path, why, st)


class NoMemo:
    """The memo turned off (runner.memo = "off", or "auto" on a GPU): every row is computed."""

    def __init__(self, stage: str, name: str):
        self.stage, self.name, self.namespace, self.counts = stage, name, None, Counts()

    def rows(self, keys: list[bytes], compute: Callable[[np.ndarray], pa.Table],
             schema: pa.Schema | None = None) -> pa.Table | None:
        self.counts.computed += len(keys)
        if not keys:
            return schema.empty_table() if schema is not None else None
        out = compute(np.arange(len(keys)))
        return out.cast(schema) if schema is not None else out
