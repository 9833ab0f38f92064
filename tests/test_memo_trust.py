"""A memo that checks what it serves (pipeline/memo/rows.py): writer records and values hashes, the schema check,
the audit (`runner.memo_verify`), quarantine, `contramine cache --verify`, a read-only memo, no write or delete
through a link under the memo root, and the lookup index (16 bytes a row, merged, freed).

The end-to-end case with the real models (a forged pack caught in a mined run, whose tables equal a fresh run's) is
in tests/test_row_memo_mining.py."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contramine.pipeline.memo import index as memo_index
from contramine.pipeline.memo import store as memo_store
from contramine.pipeline.memo.rows import RowMemo
from contramine.pipeline.memo.cache import prune
from contramine.pipeline.memo.packs import FORMAT, RECORD, pack_record, values_hash
from contramine.pipeline.memo.store import write_pack_file
from memo_helpers import log_lines, memo_rows, vectors

VEC = pa.schema([("vec", pa.binary(16))])  # a 4-d float32 vector, as the encode memo stores one


def _memo(root: Path, verify=0.0) -> RowMemo:
    return RowMemo(root, "embeddings", "encode", {"format": FORMAT, "code": "v1"}, verify=verify)


TEXTS = [f"sentence {i}" + "x" * (i % 7) for i in range(100)]
OWNER = f"file owned by uid {os.getuid()}"  # what a refusal names: the file's owner (fstat), not the pack's claim


def _forge(pack: Path, table: pa.Table, honest_hash: bool = True, user: str = "mallory") -> None:
    """Write `table` (key + values) at `pack` with a record of another writer; its values hash valid or stale."""
    old = pack_record(pq.read_schema(pack))
    values = table.drop_columns(["key"])
    record = {"format": FORMAT, "rows": table.num_rows, "values": values_hash(values) if honest_hash else old["values"],
              "namespace": old["namespace"],
              "writer": {"user": user, "host": "elsewhere", "pid": 7, "time": "then", "code": "?"}}
    write_pack_file(table.replace_schema_metadata({RECORD: json.dumps(record)}), pack)


def test_a_pack_records_its_writer_and_the_hash_of_its_values(tmp_path):
    memo = _memo(tmp_path)
    memo_rows(memo, TEXTS[:10], [])
    pack = next(memo.dir.glob("*.parquet"))
    record = pack_record(pq.read_schema(pack))
    assert set(record["writer"]) == {"user", "host", "pid", "time", "code"} and record["writer"]["code"] == "v1"
    assert record["rows"] == 10 and record["values"] == values_hash(vectors(TEXTS[:10]))
    assert json.loads((memo.dir / "_namespace.json").read_text())["values"] == "vec: fixed_size_binary[16]"


@pytest.mark.parametrize("verify", [0.0, 0.01])
def test_a_pack_of_another_width_is_never_served(tmp_path, caplog, verify):
    """The encode memo passes no schema (the model decides the width): the one `_namespace.json` records holds, and
    a pack of 2-d vectors under the same keys (a valid record, a valid hash) is named once, moved aside, recomputed."""
    memo_rows(_memo(tmp_path), TEXTS, [])
    pack = next(_memo(tmp_path).dir.glob("*.parquet"))
    keys = pq.read_table(pack).column("key")
    _forge(pack, vectors(TEXTS, width=2).add_column(0, "key", keys))
    calls: list = []
    with caplog.at_level(logging.WARNING, logger="contramine.memo"):
        got = memo_rows(_memo(tmp_path, verify), TEXTS, calls)
        memo_rows(_memo(tmp_path, verify), TEXTS[:3], [])
    assert got.equals(vectors(TEXTS)) and calls == [TEXTS]
    named = log_lines(caplog, str(pack), "fixed_size_binary[8]", OWNER)  # who the filesystem says, not the claim
    assert len(named) == 1 and "moved to" in named[0] and "mallory" not in named[0]
    assert len(list((tmp_path / ".quarantine").rglob("*.parquet"))) == 1  # aside, not deleted
    assert memo_rows(_memo(tmp_path), TEXTS, calls).equals(vectors(TEXTS)) and len(calls) == 1  # rewritten whole


def test_other_values_under_a_stale_hash_are_caught_without_the_audit(tmp_path, caplog):
    memo_rows(_memo(tmp_path), TEXTS, [])
    pack = next(_memo(tmp_path).dir.glob("*.parquet"))
    table = pq.read_table(pack)
    vecs = vectors([t + "!" for t in TEXTS])
    _forge(pack, table.set_column(1, "vec", vecs.column("vec")), honest_hash=False)
    calls: list = []
    with caplog.at_level(logging.WARNING, logger="contramine.memo"):
        assert memo_rows(_memo(tmp_path, verify=0.0), TEXTS, calls).equals(vectors(TEXTS))
    assert calls == [TEXTS] and log_lines(caplog, str(pack), "do not hash to its record", OWNER)


@pytest.mark.parametrize("changed", ["every row", "one row"])
def test_the_audit_catches_a_pack_rewritten_with_a_valid_hash(tmp_path, caplog, changed):
    """Same keys, other values, valid Parquet, checksums and values hash: only a recomputation can tell. The audit
    recomputes a row of every pack it reads (and a share of the rest): a pack whose every row is wrong is always
    caught; one wrong row among 100, with verify = 1."""
    memo_rows(_memo(tmp_path), TEXTS, [])
    pack = next(_memo(tmp_path).dir.glob("*.parquet"))
    table = pq.read_table(pack).replace_schema_metadata(None)
    wrong = [t + "!" if changed == "every row" or i == 37 else t for i, t in enumerate(TEXTS)]
    _forge(pack, table.set_column(1, "vec", vectors(wrong).column("vec")))
    # the forged file's time, which the warning names: the run below writes the pack again (a later second, maybe)
    mtime = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(pack.stat().st_mtime))
    unaudited: list = []
    if changed == "every row":  # without the audit it is served: this is what the audit is for
        assert memo_rows(_memo(tmp_path, verify=0.0), TEXTS, unaudited).equals(vectors(wrong)) and unaudited == []
    calls: list = []
    memo = _memo(tmp_path, verify=0.01 if changed == "every row" else 1.0)
    with caplog.at_level(logging.WARNING, logger="contramine.memo"):
        got = memo_rows(memo, TEXTS, calls)
    assert got.equals(vectors(TEXTS))  # the run's rows equal a fresh computation's
    named = log_lines(caplog, str(pack), "failed the audit", f"{OWNER}", f"modified {mtime}")
    assert len(named) == 1 and "moved to" in named[0] and "mallory" not in named[0]
    assert len(list((tmp_path / ".quarantine").rglob("*.parquet"))) == 1  # aside, for whoever looks into it
    assert pack_record(pq.read_schema(pack))["writer"]["user"] != "mallory"  # its rows, written again by this run
    assert sorted(t for c in calls for t in c) == sorted(TEXTS)  # its rows, all computed again
    assert (memo.counts.computed, memo.counts.reused) == (len(TEXTS), 0)


def test_the_audit_share_and_one_row_of_every_pack(tmp_path):
    texts = [f"t{i}" for i in range(1000)]
    for part in range(4):  # 4 packs of 250 rows
        memo_rows(_memo(tmp_path), texts[part::4], [])
    calls: list = []
    memo = _memo(tmp_path, verify=0.01)
    assert memo_rows(memo, texts + ["new"], calls).equals(vectors(texts + ["new"]))
    audited = [t for t in calls[0] if t != "new"]
    assert memo.counts.audited == len(audited) and 10 <= len(audited) <= 14  # ceil(1% of 1000), + up to one a pack
    assert {int(t[1:]) % 4 for t in audited} == {0, 1, 2, 3}  # every pack
    assert (memo.counts.computed, memo.counts.reused) == (1, 1000)
    none: list = []
    memo_rows(_memo(tmp_path, verify=0.0), texts, none)
    assert none == []  # 0 = off


def test_a_pack_of_the_old_format_is_not_served(tmp_path, caplog):
    """A memo written before packs had records: its namespaces have other hashes (FORMAT is in the facts), and a
    record-less pack found in a namespace of this format is refused, named once."""
    from contramine.pipeline.memo.run import namespace_facts
    from contramine.pipeline.engine.runner import load_stages
    from contramine.pipeline.config import configure

    stage = load_stages()["embeddings"]
    facts = namespace_facts(stage, stage.memos[0], configure("default", "x", None, []), {"encoder": {}})
    assert facts["format"] == FORMAT == 3
    memo_rows(_memo(tmp_path), TEXTS, [])
    pack = next(_memo(tmp_path).dir.glob("*.parquet"))
    write_pack_file(pq.read_table(pack).replace_schema_metadata(None), pack)  # what format 1 wrote
    calls: list = []
    with caplog.at_level(logging.WARNING, logger="contramine.memo"):
        assert memo_rows(_memo(tmp_path), TEXTS, calls).equals(vectors(TEXTS)) and calls == [TEXTS]
    assert log_lines(caplog, str(pack), "no writer record")


# ---- a memo the run cannot write ---------------------------------------------------------------------------------
@contextlib.contextmanager
def _unwritable(folder: Path, monkeypatch):
    """`folder` as another user's: chmod where that stops this process (not root); as root, where chmod does not
    stop writes, every create under `folder` fails as it would (PermissionError from the memo's write primitives)."""
    folder.chmod(0o555)
    probe = folder / ".probe"
    try:
        probe.write_bytes(b"")
        probe.unlink()
        denied = False
    except PermissionError:
        denied = True
    if not denied:
        real_file, real_dirs = memo_store.atomic_file, memo_store.make_dirs

        def refuse(path):
            if Path(path).resolve().is_relative_to(folder.resolve()):
                raise PermissionError(13, "Permission denied", str(path))

        @contextlib.contextmanager
        def atomic_file(path, root=None, mode=None):
            refuse(path)
            with real_file(path, root, mode) as tmp:
                yield tmp

        def make_dirs(root, path):
            if not Path(path).exists():
                refuse(path)
            return real_dirs(root, path)
        monkeypatch.setattr(memo_store, "atomic_file", atomic_file)
        monkeypatch.setattr(memo_store, "make_dirs", make_dirs)
    try:
        yield
    finally:
        folder.chmod(0o755)


def test_a_memo_the_run_cannot_write_is_used_read_only(tmp_path, caplog, monkeypatch):
    root = tmp_path / "shared-memo"
    memo_rows(_memo(root), TEXTS[:50], [])  # the team's writer filled it
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    memo_store._READ_ONLY.clear()
    with _unwritable(root, monkeypatch), caplog.at_level(logging.WARNING, logger="contramine.memo"):
        calls: list = []
        for _ in range(2):
            assert memo_rows(_memo(root), TEXTS, calls).equals(vectors(TEXTS))  # the stage does not fail
    assert calls == [TEXTS[50:], TEXTS[50:]]  # served what it holds, computed the rest, stored nothing
    assert len(log_lines(caplog, str(root), "used read-only")) == 1
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    memo_store._READ_ONLY.clear()


# ---- links under the memo root ----------------------------------------------------------------------------------
def _victim(tmp_path: Path) -> tuple[Path, dict]:
    victim = tmp_path / "victim"
    victim.mkdir()
    for name in ("precious.parquet", f"{'ab' * 16}.parquet", "_namespace.json", "notes.txt"):
        (victim / name).write_bytes(b"not the memo's " + name.encode())
    return victim, {p.name: p.read_bytes() for p in victim.iterdir()}


@pytest.mark.parametrize("where", ["namespace", "stage", "quarantine"])
def test_a_link_under_the_memo_root_is_neither_read_nor_written_through(tmp_path, caplog, where):
    victim, files = _victim(tmp_path)
    root = tmp_path / "memo"
    memo = _memo(root)
    if where == "namespace":
        memo.dir.parent.mkdir(parents=True)
        memo.dir.symlink_to(victim)
    elif where == "stage":
        root.mkdir()
        (root / "embeddings").symlink_to(victim)
    else:  # the quarantine folder: a refused pack stays where it is, nothing is moved into the link
        memo_rows(_memo(root), TEXTS, [])
        pack = next(memo.dir.glob("*.parquet"))
        write_pack_file(pq.read_table(pack).replace_schema_metadata(None), pack)  # no record: refused
        (root / ".quarantine").symlink_to(victim)
    calls: list = []
    with caplog.at_level(logging.WARNING, logger="contramine.memo"):
        for _ in range(2):
            assert memo_rows(_memo(root), TEXTS, calls).equals(vectors(TEXTS))
    assert {p.name: p.read_bytes() for p in victim.iterdir()} == files  # nothing outside the memo root changed
    assert calls == ([TEXTS, TEXTS] if where != "quarantine" else [TEXTS])  # there: rewritten in place, then served
    if where != "quarantine":
        assert len(log_lines(caplog, "symbolic link")) == 1
        assert prune(root, tmp_path, older_than_days=0, unreferenced=True) == []  # and the pruner never goes there
        assert {p.name: p.read_bytes() for p in victim.iterdir()} == files
    else:
        assert len(log_lines(caplog, "no writer record", "left in place")) == 1


def test_a_pack_that_is_a_link_is_not_read_nor_removed(tmp_path, caplog):
    victim, files = _victim(tmp_path)
    memo = _memo(tmp_path / "memo")
    memo_rows(memo, TEXTS[:5], [])
    link = memo.dir / f"{'cd' * 16}.parquet"
    link.symlink_to(victim / "precious.parquet")
    calls: list = []
    with caplog.at_level(logging.WARNING, logger="contramine.memo"):
        memo_rows(_memo(tmp_path / "memo"), TEXTS[:10], calls)
    assert calls == [TEXTS[5:10]] and link.is_symlink() and log_lines(caplog, str(link), "symbolic link")
    prune(tmp_path / "memo", tmp_path, older_than_days=0, unreferenced=True)
    assert {p.name: p.read_bytes() for p in victim.iterdir()} == files


# ---- contramine cache --verify ---------------------------------------------------------------------------------
def test_cache_verify_checks_every_pack_and_quarantines_what_fails(tmp_path, capsys):
    from contramine.flows.cli import main as cli_main

    runs = tmp_path / "runs"
    root = runs / ".memo"
    for part in range(3):
        memo_rows(_memo(root), TEXTS[part::3], [])
    older = RowMemo(root, "embeddings", "encode", {"code": "v0"})  # a namespace of the format before
    memo_rows(older, TEXTS[:3], [])
    old_pack = next(older.dir.glob("*.parquet"))
    write_pack_file(pq.read_table(old_pack).replace_schema_metadata(None), old_pack)
    assert cli_main(["cache", "--verify", "--set", f"run.root={runs}"]) == 0
    assert "3 packs verified, none failed" in capsys.readouterr().out
    packs = sorted(_memo(root).dir.glob("*.parquet"))
    table = pq.read_table(packs[0])
    _forge(packs[0], table.set_column(1, "vec", vectors(["x"] * table.num_rows).column("vec")), honest_hash=False)
    write_pack_file(pq.read_table(packs[1]).replace_schema_metadata(None), packs[1])
    assert cli_main(["cache", "--verify", "--dry-run", "--set", f"run.root={runs}"]) == 2
    out, err = capsys.readouterr()
    assert all(p.exists() for p in packs) and f"bad {packs[0]}:" in out and OWNER in out and "mallory" not in out
    assert err.strip().splitlines()[-1].startswith("error: memo: 2 of 3 packs failed verification")
    assert cli_main(["cache", "--verify", "--set", f"run.root={runs}"]) == 2
    capsys.readouterr()
    assert not packs[0].exists() and not packs[1].exists() and packs[2].exists()
    assert len(list((root / ".quarantine").rglob("*.parquet"))) == 2
    assert old_pack.exists()  # never read by this version: not verified, not moved (pruned once unreferenced)


# ---- the lookup index -------------------------------------------------------------------------------------------
def test_the_index_is_16_bytes_a_row_merged_in_order_and_freed_when_the_stage_ends(tmp_path):
    memo_index.release_indexes()
    texts = [f"row {i}" for i in range(3000)]
    for part in range(3):
        memo_rows(_memo(tmp_path), texts[part * 1000:(part + 1) * 1000], [])
        memo_rows(_memo(tmp_path), texts[:1], [])  # a lookup indexes the packs new since the last: merged in
    index = memo_index._INDEXES[_memo(tmp_path).dir]
    assert index.nbytes == 16 * 3000 == memo_index.index_bytes()
    assert np.all(np.diff(index.prefix.astype(np.float64)) >= 0) and np.all(index.prefix[:-1] <= index.prefix[1:])
    assert memo_rows(_memo(tmp_path), texts[::-1], []).equals(vectors(texts[::-1]))  # every row found where it is
    memo_index.release_indexes(keep={"embeddings"})
    assert memo_index.index_bytes() == 16 * 3000  # a job of the same stage keeps it
    memo_index.release_indexes()
    assert memo_index.index_bytes() == 0 and not memo_index._INDEXES


def test_merge_equals_a_full_sort():
    rng = np.random.default_rng(0)
    index = memo_index.NamespaceIndex("s")
    whole_p, whole_l = [], []
    for pack in range(5):
        p = rng.integers(0, 2**63, 1000, dtype=np.uint64)
        p[:10] = whole_p[0][:10] if whole_p else p[:10]  # duplicate prefixes across packs
        loc = (np.uint64(pack) << np.uint64(32)) | np.arange(1000, dtype=np.uint64)
        index.merge(p, loc)
        whole_p.append(p)
        whole_l.append(loc)
    p, loc = np.concatenate(whole_p), np.concatenate(whole_l)
    order = np.lexsort((loc, p))
    assert np.array_equal(index.prefix, p[order])
    assert np.array_equal(np.sort(index.loc), np.sort(loc))
    assert np.array_equal(index.loc[np.argsort(index.loc)], np.sort(loc))
    assert index.prefix.dtype == np.uint64 and index.loc.dtype == np.uint64
