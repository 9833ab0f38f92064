"""The row memo: per-row model outputs stored under a key of what made them, reused wherever that key recurs.

A shard's cache key (runner.py) holds every row of its sid range, so a corpus grown by one line, or another shard
layout, recomputes whole shards. Underneath that, the per-row model stages (`embeddings`, `pool_embeddings`,
`backtranslate`, `negate`, the positives `scores` embeds) look every row up here first and send only the rows
with new keys to the model — Bazel's action cache and a translator's translation memory, at the row.

    memo = ctx.memo("encode", settings=("encoder", "embeddings"), resources=("encoder",))
    vectors = memo.rows([row_key(text) for text in texts], compute_missing, schema)

A row's key has two parts:
- the namespace (a folder): the stage, its code version (codeversion.py: its module and every pipeline module it
  imports), the settings that shape a row (less execution settings), the resources as resolved for the run (model
  fingerprint, device kind, precision, engine, library versions) and whatever else the stage adds (the run seed
  where a model samples). A change to a stage's code moves that stage's rows to a new namespace, and no others;
- the row key: blake2b-128 of the row's own input (its text; for a back-translation also the chain, sid and
  variant, whose seed a sampling model draws from).

Layout: <memo root>/<stage>/<memo name>-<namespace hash>/ with `_namespace.json` (what the namespace is) and packs
`<blake2b of the pack's keys>.parquet`: a `key` column (16 bytes) and the value columns, one pack per shard
computation, written atomically (temp file, fsync, rename) with Parquet page checksums. Two writers of the same rows
write the same name and replace each other with equal bytes; a writer killed mid-write leaves only a temp file that
no reader opens. A pack that fails to read (truncated, a checksum that does not match) is named once in the log,
removed, and its rows are computed again; a row is served only when its whole 16-byte key matches.

Lookups never load the memo's values: each process keeps a compact index (8-byte key prefix, pack, row: 16 bytes
a row) of the packs it has seen, adds the packs new since its last lookup, and reads values only from the packs
that hold the rows it needs. Bytes equal a fresh run's because every model stage here is batch-independent on the
CPU (encoder.py, translator.py, spaCy parses each text alone); GPU kernels are not (the GPU check measured 3e-8),
so `runner.memo = "auto"` (the default) leaves the memo off for a stage whose resources run on a GPU.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.engine.atomic import atomic_file, atomic_write_json

log = logging.getLogger("contramine.memo")
NAMESPACE = "_namespace.json"
KEY = pa.binary(16)


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


def namespace_hash(facts: dict) -> str:
    return hashlib.blake2b(json.dumps(facts, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()


@dataclass
class Counts:
    """Rows this process sent to the model and rows it took from the memo, per memo name."""
    computed: int = 0
    reused: int = 0


class _Index:
    """One namespace's index in this process: sorted 8-byte key prefixes, with the pack and row of each."""

    def __init__(self):
        self.packs: list[Path] = []
        self.seen: set[str] = set()
        self.prefix = np.zeros(0, np.uint64)
        self.where = np.zeros((0, 2), np.int64)  # (pack number, row in pack)
        self.lock = threading.Lock()


_INDEXES: dict[Path, _Index] = {}
_INDEXES_LOCK = threading.Lock()
_NAMED_BAD: set[Path] = set()


def _prefixes(keys: pa.Array | list[bytes]) -> np.ndarray:
    buf = b"".join(keys) if isinstance(keys, list) else keys.buffers()[1].to_pybytes()[keys.offset * 16:
                                                                                      (keys.offset + len(keys)) * 16]
    return np.frombuffer(buf, np.uint8).reshape(-1, 16)[:, :8].copy().view("<u8").ravel()


def _bad_pack(path: Path, why: str) -> None:
    """Named once in the log; removed, so its rows are computed again and written to a good pack."""
    if path not in _NAMED_BAD:
        _NAMED_BAD.add(path)
        log.warning(f"memo: {path} does not verify ({why}): its rows are computed again")
    try:
        path.unlink()
    except OSError:
        pass


class RowMemo:
    """One namespace of the memo (see the module doc). `rows(keys, compute, schema)` is all a stage calls."""

    def __init__(self, root: Path, stage: str, name: str, facts: dict):
        self.stage, self.name, self.facts = stage, name, facts
        self.namespace = f"{name}-{namespace_hash(facts)}"
        self.dir = Path(root) / stage / self.namespace
        self.counts = Counts()
        self.read = True  # False under --force: every row goes to the model again (and is written back)

    # ---- lookup --------------------------------------------------------------------------------------------------
    def _index(self) -> _Index:
        with _INDEXES_LOCK:
            return _INDEXES.setdefault(self.dir, _Index())

    def _refresh(self, index: _Index) -> None:
        """Add the packs written since this process last looked (their key columns only)."""
        if not self.dir.is_dir():
            return
        new = sorted(p for p in self.dir.glob("*.parquet") if p.name not in index.seen)
        prefixes, where = [index.prefix], [index.where]
        for path in new:
            index.seen.add(path.name)
            try:
                keys = pq.read_table(path, columns=["key"], page_checksum_verification=True).column("key")
            except FileNotFoundError:
                continue  # pruned meanwhile
            except (OSError, pa.ArrowException) as e:
                _bad_pack(path, f"{type(e).__name__}: {e}")
                index.seen.discard(path.name)  # removed: the pack written in its place is read again
                continue
            if keys.type != KEY:
                _bad_pack(path, f"key column of type {keys.type}")
                index.seen.discard(path.name)
                continue
            number = len(index.packs)
            index.packs.append(path)
            prefixes.append(_prefixes(keys.combine_chunks()))
            where.append(np.column_stack([np.full(len(keys), number, np.int64), np.arange(len(keys))]))
        if len(prefixes) > 1:
            prefix, where_ = np.concatenate(prefixes), np.concatenate(where)
            order = np.argsort(prefix, kind="stable")
            index.prefix, index.where = prefix[order], where_[order]

    def lookup(self, keys: list[bytes], schema: pa.Schema | None = None) -> tuple[np.ndarray, pa.Table | None]:
        """(positions in `keys` found in the memo, their values in that order; None when none is). A pack that no
        longer reads, whose columns are not `schema` (when given), or a row whose whole key differs from the one
        asked for (an 8-byte prefix collision) is a miss."""
        none = (np.zeros(0, np.int64), None)
        if not keys:
            return none
        index = self._index()
        with index.lock:
            self._refresh(index)
            prefix, where, packs = index.prefix, index.where, list(index.packs)
        if not len(prefix):
            return none
        asked = _prefixes(keys)
        at = np.searchsorted(prefix, asked)
        found = at < len(prefix)
        found[found] = prefix[at[found]] == asked[found]
        positions = np.flatnonzero(found)
        if not len(positions):
            return none
        pack_of, row_of = where[at[positions], 0], where[at[positions], 1]
        got_pos, got_parts = [], []
        for number in np.unique(pack_of):
            sel = np.flatnonzero(pack_of == number)
            path = packs[number]
            try:
                values = pq.read_table(path, page_checksum_verification=True).take(pa.array(row_of[sel]))
            except FileNotFoundError:
                continue
            except (OSError, pa.ArrowException) as e:
                _bad_pack(path, f"{type(e).__name__}: {e}")
                continue
            if schema is not None and not values.schema.remove(0).equals(schema):
                _bad_pack(path, f"columns {values.schema.remove(0)} where {schema} is expected")
                continue
            stored = values.column("key").combine_chunks().buffers()[1].to_pybytes()
            same = np.array([stored[16 * j:16 * j + 16] == keys[p] for j, p in enumerate(positions[sel])], bool)
            got_pos.append(positions[sel][same])
            got_parts.append(values.filter(pa.array(same)).drop_columns(["key"]))
            try:
                os.utime(path)  # last use: what `contramine cache --prune --older-than` goes by
            except OSError:
                pass
        if not got_pos:
            return none
        pos = np.concatenate(got_pos)
        order = np.argsort(pos, kind="stable")
        return pos[order], pa.concat_tables(got_parts).take(pa.array(order))

    # ---- storing -------------------------------------------------------------------------------------------------
    def add(self, keys: list[bytes], values: pa.Table) -> Path | None:
        """Write one pack of rows (atomically); its name is the hash of its keys, so two writers of the same rows
        write the same file."""
        if not keys:
            return None
        self.dir.mkdir(parents=True, exist_ok=True)
        if not (self.dir / NAMESPACE).is_file():
            atomic_write_json(self.dir / NAMESPACE, {"stage": self.stage, "memo": self.name, "facts": self.facts})
        name = hashlib.blake2b(b"".join(keys), digest_size=16).hexdigest() + ".parquet"
        key_col = pa.FixedSizeBinaryArray.from_buffers(KEY, len(keys), [None, pa.py_buffer(b"".join(keys))])
        table = values.add_column(0, pa.field("key", KEY, nullable=False), key_col)
        # vectors (fixed-size binary) do not compress: written plain, they write and read at disk speed
        raw = all(pa.types.is_fixed_size_binary(f.type) for f in values.schema)
        with atomic_file(self.dir / name) as tmp:
            pq.write_table(table, tmp, compression="none" if raw else "zstd", write_page_checksum=True,
                           row_group_size=64_000, use_dictionary=not raw)
        return self.dir / name

    def rows(self, keys: list[bytes], compute: Callable[[np.ndarray], pa.Table],
             schema: pa.Schema | None = None) -> pa.Table | None:
        """The value rows of `keys`, in order: those in the memo read from it, the rest computed by
        `compute(positions)` (one row per position, in order; of `schema` when given) and added to the memo.
        None only when `keys` is empty and no schema is given."""
        found, reused = self.lookup(keys, schema) if self.read else (np.zeros(0, np.int64), None)
        missing = np.setdiff1d(np.arange(len(keys)), found, assume_unique=True)
        self.counts.computed += len(missing)
        self.counts.reused += len(found)
        if not len(missing):
            return reused if reused is not None else (schema.empty_table() if schema is not None else None)
        computed = compute(missing)
        if computed.num_rows != len(missing):
            raise RuntimeError(f"memo {self.stage}/{self.name}: computed {computed.num_rows} rows for "
                               f"{len(missing)} keys")
        computed = computed.cast(schema) if schema is not None else computed
        self.add([keys[i] for i in missing], computed)
        if reused is None:
            return computed
        if not reused.schema.equals(computed.schema):  # a namespace holds one model's rows: cannot happen but by hand
            raise RuntimeError(f"memo {self.dir}: stored columns {reused.schema} differ from computed "
                               f"{computed.schema}; remove the folder")
        order = np.argsort(np.concatenate([found, missing]), kind="stable")
        return pa.concat_tables([reused, computed]).take(pa.array(order))


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


# ---- a stage's memos for a run -----------------------------------------------------------------------------------------
def memo_root(cfg) -> Path:
    """`runner.memo_dir`, or `<run.root>/.memo`: shared by every run under the same artifacts root (a folder on a
    shared filesystem serves a team or a cluster)."""
    return Path(cfg.runner.memo_dir) if cfg.runner.memo_dir is not None else Path(cfg.run.root) / ".memo"


def memo_state(stage, cfg, plan: dict) -> str:
    """"on", or why it is off: `runner.memo = "off"`, or "auto" (the default) with a resource of the stage on a GPU,
    where kernels are not batch-independent and a reused row could differ in its last bits from a fresh one."""
    if cfg.runner.memo == "off":
        return "off (runner.memo = off)"
    on_gpu = [r for r, facts in plan.items() if isinstance(facts, dict) and str(facts.get("device", "")) == "cuda"]
    if cfg.runner.memo == "auto" and on_gpu:
        return f"off ({', '.join(on_gpu)} on a GPU: runner.memo = auto keeps it off there; \"on\" takes rows " \
               f"that may differ from a fresh run's in their last bits)"
    return "on"


def namespace_facts(stage, spec, cfg, plan: dict) -> dict:
    from pipeline.engine.codeversion import code_version

    return {"stage": stage.name, "memo": spec.name, "code": code_version(stage.module), **spec.facts(cfg, plan)}


def open_memo(stage, spec, cfg, plan: dict, force: bool = False) -> "RowMemo | NoMemo":
    """The stage's memo `spec` for this run; under `force` (`--force`) it reads nothing, so every row goes to the
    model again, and writes what it computes."""
    if memo_state(stage, cfg, plan) != "on":
        return NoMemo(stage.name, spec.name)
    memo = RowMemo(memo_root(cfg), stage.name, spec.name, namespace_facts(stage, spec, cfg, plan))
    memo.read = not force
    return memo


def memo_manifest(stage, cfg, plan: dict, results: list[dict]) -> dict:
    """The manifest's `memo`: per memo, its namespace (what `contramine cache --unreferenced` keeps), whether it was
    on, and the rows this run's computed shards sent to the model and took from the memo."""
    out = {}
    for spec in stage.memos:
        state = memo_state(stage, cfg, plan)
        counts = [r.get("memo", {}).get(spec.name, (0, 0)) for r in results if not r["cached"]]
        out[spec.name] = {"namespace": f"{spec.name}-{namespace_hash(namespace_facts(stage, spec, cfg, plan))}"
                          if state == "on" else None, "state": state,
                          "rows_computed": sum(c[0] for c in counts), "rows_reused": sum(c[1] for c in counts)}
    return out


# ---- what `contramine cache` shows and prunes ------------------------------------------------------------------------
@dataclass
class NamespaceInfo:
    stage: str
    path: Path
    packs: int
    rows: int
    bytes: int
    last_used: float
    temp_files: list[Path] = field(default_factory=list)


def namespaces(root: Path) -> list[NamespaceInfo]:
    """Every namespace under the memo root with its size (rows from the packs' footers only): the folders that have
    a `_namespace.json`, so a memo_dir set to a folder holding anything else never lists (or prunes) that."""
    out = []
    for ns in sorted(p.parent for p in Path(root).glob(f"*/*/{NAMESPACE}")
                     if p.parent.is_dir() and not p.parent.is_symlink()):
        packs = sorted(ns.glob("*.parquet"))
        rows = 0
        for p in packs:
            try:
                rows += pq.ParquetFile(p).metadata.num_rows
            except (OSError, pa.ArrowException):
                pass
        sizes = [p.stat().st_size for p in packs]
        out.append(NamespaceInfo(ns.parent.name, ns, len(packs), rows, sum(sizes),
                                 max([p.stat().st_mtime for p in packs], default=ns.stat().st_mtime),
                                 sorted(ns.glob(".*.tmp"))))
    return out


def referenced_namespaces(runs_root: Path) -> set[str]:
    """`<stage>/<namespace>` of every memo a committed manifest under `runs_root` names (its stage's `memo`)."""
    refs = set()
    for man in Path(runs_root).glob("*/*/_manifest.json"):
        try:
            manifest = json.loads(man.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        for entry in (manifest.get("memo") or {}).values():
            if isinstance(entry, dict) and entry.get("namespace"):
                refs.add(f"{manifest.get('stage')}/{entry['namespace']}")
    return refs


def prune(root: Path, runs_root: Path, older_than_days: float | None = None, unreferenced: bool = False,
          dry_run: bool = False) -> list[tuple[Path, str]]:
    """Remove what the memo no longer needs: packs not used for `older_than_days`, namespaces no manifest under
    `runs_root` names, and temp files of writes killed more than an hour ago. Returns (path, why) of each."""
    import shutil

    now, refs, gone = time.time(), referenced_namespaces(runs_root) if unreferenced else set(), []
    for ns in namespaces(root):
        if unreferenced and f"{ns.stage}/{ns.path.name}" not in refs:
            gone.append((ns.path, "no run under " + str(runs_root) + " uses it"))
            if not dry_run:
                shutil.rmtree(ns.path, ignore_errors=True)
            continue
        for tmp in ns.temp_files:
            if now - tmp.stat().st_mtime > 3600:
                gone.append((tmp, "a write that did not finish"))
                if not dry_run:
                    tmp.unlink(missing_ok=True)
        if older_than_days is not None:
            for pack in ns.path.glob("*.parquet"):
                if now - pack.stat().st_mtime > older_than_days * 86400:
                    gone.append((pack, f"unused for over {older_than_days:g} days"))
                    if not dry_run:
                        pack.unlink(missing_ok=True)
    return gone
