"""What `contramine cache` shows, verifies and prunes of the row memo (rows.py describes the memo): its namespaces
and their sizes, the ones no run's manifest names, and every pack checked as a lookup checks it.
"""
from __future__ import annotations

import math
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from contramine.pipeline.memo.footer import open_footer
from contramine.pipeline.memo.packs import FORMAT, NAMESPACE, OWN, PACK, QUARANTINE, TEMP, Untrusted, namespace_facts, \
    open_pack, owner_of, own_files, read_pack, recorded_schema, schema_text, values_schema
from contramine.pipeline.memo.store import log, quarantine, say_once
from contramine.pipeline.storage.safe_paths import UnsafePath, check_below, kind_of, not_regular, open_folder, \
    read_regular
from contramine.pipeline.errors import ExpectedError, json_loads
from contramine.pipeline.storage.manifest import MANIFEST_MAX


@dataclass
class NamespaceInfo:
    stage: str
    path: Path
    packs: int
    rows: int
    bytes: int
    last_used: float
    temp_files: list[Path] = field(default_factory=list)
    pack_files: list[Path] = field(default_factory=list)



def namespaces(root: Path) -> list[NamespaceInfo]:
    """Every namespace under the memo root with its size (rows from the packs' footers only): the folders that have
    a `_namespace.json`, so a memo_dir set to a folder holding anything else never lists (or prunes) that. A stage
    or namespace folder that is a symbolic link is left out, and named once."""
    out = []
    for ns in sorted(p.parent for p in Path(root).glob(f"*/*/{NAMESPACE}")):
        if ns.parent.name == QUARANTINE:
            continue
        try:
            check_below(root, ns / NAMESPACE, final=True)
            st = (ns / NAMESPACE).lstat()
            if not stat.S_ISREG(st.st_mode):  # a FIFO there would hang whoever reads it: never opened
                raise not_regular(ns / NAMESPACE, st.st_mode)
        except UnsafePath as e:
            say_once(("link", ns), f"memo: {e}; left out")
            continue
        except FileNotFoundError:
            continue
        packs = own_files(ns, PACK)
        rows, sizes, used = 0, [], []
        for p in packs:
            fd, _ = open_pack(p)  # non-blocking, fstat-checked: a FIFO swapped in since the listing is skipped
            if fd is None:
                continue
            try:
                with os.fdopen(fd, "rb") as f:
                    st = os.fstat(f.fileno())
                    pf, _ = open_footer(f, st.st_size)  # a footer bounded before it is parsed, whoever wrote it
                    rows += pf.metadata.num_rows if pf is not None else 0
            except (OSError, pa.ArrowException, ValueError):
                continue
            sizes.append(st.st_size)
            used.append(st.st_mtime)
        out.append(NamespaceInfo(ns.parent.name, ns, len(packs), rows, sum(sizes),
                                 max(used, default=ns.stat().st_mtime), own_files(ns, TEMP), packs))
    return out


def referenced_namespaces(runs_root: Path) -> set[str]:
    """`<stage>/<namespace>` of every memo a committed manifest under `runs_root` names (its stage's `memo`)."""
    refs = set()
    for man in Path(runs_root).glob("*/*/_manifest.json"):
        try:  # non-blocking, fstat-checked: a FIFO at a run's manifest is named, never waited on
            manifest = json_loads(read_regular(man, follow=True, max_size=MANIFEST_MAX))
        except UnsafePath as e:  # a FIFO, a link, a sparse 1 GiB file: named, never read
            say_once(("manifest", man), f"memo: {e}; not read for the namespaces it names")
            continue
        except (OSError, ValueError):  # invalid JSON, nested too deep, undecodable
            continue
        if not isinstance(manifest, dict) or not isinstance(manifest.get("memo"), dict):
            continue
        for entry in manifest["memo"].values():
            if isinstance(entry, dict) and isinstance(entry.get("namespace"), str):
                refs.add(f"{manifest.get('stage')}/{entry['namespace']}")
    return refs


def prune(root: Path, runs_root: Path, older_than_days: float | None = None, unreferenced: bool = False,
          dry_run: bool = False) -> list[tuple[Path, str]]:
    """Remove what the memo no longer needs: packs not used for `older_than_days`, namespaces no manifest under
    `runs_root` names, and temp files of writes killed more than an hour ago. Only names the memo writes are ever
    removed (packs, their temp files, `_namespace.json`, then the folder if that left it empty); the quarantine is
    never touched. Returns (path, why) of each."""
    if older_than_days is not None and not (math.isfinite(older_than_days) and older_than_days >= 0):
        raise ValueError(f"memo prune: older_than_days must be a number of days >= 0, not {older_than_days!r} "
                         f"(a negative one would remove every pack)")
    now, refs, gone = time.time(), referenced_namespaces(runs_root) if unreferenced else set(), []

    def remove(path: Path, why: str) -> None:
        gone.append((path, why))
        if not dry_run:
            try:  # a name the memo writes, in its folder as opened from the root: never a folder, never through a link
                d = open_folder(root, path.parent, create=False)
                if d is not None:
                    with d:
                        d.unlink(path.name, OWN)
            except UnsafePath as e:
                say_once(("link", path.parent), f"memo: {e}; nothing is removed there")

    for ns in namespaces(root):
        if unreferenced and f"{ns.stage}/{ns.path.name}" not in refs:
            gone.append((ns.path, "no run under " + str(runs_root) + " uses it"))
            if not dry_run:
                try:
                    d = open_folder(root, ns.path, create=False)
                    if d is not None:
                        with d:
                            own = own_files(ns.path, re.compile(re.escape(NAMESPACE)))
                            for p in ns.pack_files + ns.temp_files + own:
                                d.unlink(p.name, OWN)
                except UnsafePath as e:
                    say_once(("link", ns.path), f"memo: {e}; nothing is removed there")
                    continue
                try:
                    ns.path.rmdir()
                except OSError:
                    say_once(("kept", ns.path), f"memo: {ns.path} kept: it holds files the memo did not write")
            continue
        for tmp in ns.temp_files:
            try:
                if now - tmp.stat().st_mtime > 3600:
                    remove(tmp, "a write that did not finish")
            except FileNotFoundError:
                pass
        if older_than_days is not None:
            for pack in ns.pack_files:
                try:
                    if now - pack.stat().st_mtime > older_than_days * 86400:
                        remove(pack, f"unused for over {older_than_days:g} days")
                except FileNotFoundError:
                    pass
    return gone


class MemoUnverified(ExpectedError, RuntimeError):
    """`contramine cache --verify` found packs that fail: one line (each pack and its file's
    owner are listed above it)."""


def verify(root: Path, dry_run: bool = False, key: bytes | None = None) -> tuple[int, list[tuple[Path, str]]]:
    """`contramine cache --verify`: every pack of every namespace read whole (page checksums) and checked as a
    lookup checks it — the key column, the namespace's value schema (the one `_namespace.json` records, else the one
    most packs have), the writer record, the values hash (keyed with the team's `key` when given: a pack without
    it fails). Each pack that fails is quarantined (not with `dry_run`). Returns (packs checked, [(pack, why and
    who the filesystem says wrote it: owner uid, mtime)]). Recomputing rows needs the models and the
    rows' inputs, which a pack does not hold: a run does that (`runner.memo_verify = 1` on a new run name)."""
    checked, bad = 0, []
    # every folder that holds packs: also one whose `_namespace.json` is gone, forged or not this user's (a lookup
    # reads its packs all the same, so a verify that skipped it would say "none failed" over a forged pack)
    listed = {ns.path: ns.pack_files for ns in namespaces(root)}
    for folder in sorted({p.parent for p in Path(root).glob("*/*/*.parquet")} - set(listed)):
        if folder.parent.name != QUARANTINE and not folder.is_symlink() and not folder.parent.is_symlink():
            listed[folder] = own_files(folder, PACK)
    for folder, pack_files in listed.items():
        facts = namespace_facts(folder, key)
        if facts and facts.get("format") != FORMAT:  # an older version's namespace: never read now, pruned later
            log.info(f"memo: {folder} is of an older memo format: not read by this version, not verified "
                     f"(`contramine cache --unreferenced` removes it once no run names it)")
            continue
        expected = recorded_schema(folder, key)
        if expected is None:  # no record of ours: the schema most packs have
            seen: dict[str, int] = {}
            for p in pack_files:
                fd, _ = open_pack(p)
                if fd is None:
                    continue
                try:
                    with os.fdopen(fd, "rb") as f:
                        pf, _ = open_footer(f, os.fstat(f.fileno()).st_size)  # bounded before it is parsed
                        if pf is None:
                            continue
                        text = schema_text(values_schema(pf.schema_arrow))
                except (OSError, pa.ArrowException, ValueError):
                    continue
                seen[text] = seen.get(text, 0) + 1
            expected = max(seen, key=seen.get) if seen else None  # type: ignore[arg-type]  # each key is in seen
        try:  # a link, FIFO, socket or folder named like a pack: never read, named (a lookup skips it too)
            odd = sorted(folder / e.name for e in os.scandir(folder) if PACK.fullmatch(e.name) and
                         not e.is_file(follow_symlinks=False))
        except OSError:
            odd = []
        for p in odd:
            try:
                what = kind_of(os.lstat(p).st_mode)
            except OSError:  # gone meanwhile
                continue
            checked += 1
            bad.append((p, f"is {what}, not a pack file: never read (remove it)"))
        for p in pack_files:
            checked += 1
            table, st, problem = read_pack(p, expected, key)
            if problem is None:
                continue
            # a pack only unvouched for (another user's, without the key) is named, left where it is
            moved = None if dry_run or isinstance(problem, Untrusted) else quarantine(root, p)
            bad.append((p, f"{problem} ({owner_of(st)})" + (f": moved to {moved}" if moved else "")))
    return checked, bad
