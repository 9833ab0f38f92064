"""The memo's key binds everything a value is served under, and a pack is bounded before it is parsed
(pipeline/memo/packs.py): the team key's MAC covers namespace, pack name, keys and values; a pack's name is the hash
of its keys; another user's pack, or one others may write, is never trusted without the key; a pack's footer is
checked before a column is decoded; a record nested 100,000 deep is one line and quarantined. Each case is a
reproduction from issue 62, run against the memo as a stage calls it (tests/test_memo_trust.py shows the rest)."""
from __future__ import annotations

import json
import logging
import os
import pwd
import shutil
import stat
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from memo_helpers import log_lines, memo_rows, vectors
from child_env import CHILD_PYTHONPATH, ROOT
from contramine.pipeline.memo import index as memo_index
from contramine.pipeline.memo.cache import verify
from contramine.pipeline.memo.packs import FORMAT, RECORD, pack_name, pack_record
from contramine.pipeline.memo.rows import RowMemo, row_key
from contramine.pipeline.memo.store import write_pack_file

KEY = b"the team's memo key, 32 chars..."
TEXTS = [f"sentence {i}" for i in range(40)]
NOBODY = pwd.getpwnam("nobody")


def _memo(root, key=None, code="v1", verify=0.0) -> RowMemo:
    memo_index.release_indexes()  # each call a fresh process' view: packs are indexed anew
    return RowMemo(root, "embeddings", "encode", {"format": FORMAT, "code": code}, verify=verify, key=key)


def _owner() -> str:
    return f"file owned by uid {os.getuid()} ({pwd.getpwuid(os.getuid()).pw_name}), mode "


def _swap_first_two_keys(pack, rename: bool):
    """Rows 0 and 1 trade keys (sentence 0's key now points at sentence 1's vector), with a valid record: the plain
    values hash is of the values, which did not change; the MAC is the writer's. Renamed after the new keys when
    `rename`: what a colleague without the key does to get past the name check. Returns the pack's path now."""
    table = pq.read_table(pack)
    keys = table.column("key").to_pylist()
    keys[0], keys[1] = keys[1], keys[0]
    swapped = table.set_column(0, pa.field("key", pa.binary(16), nullable=False), pa.array(keys, pa.binary(16)))
    pack.unlink()
    dest = pack.with_name(pack_name(b"".join(keys))) if rename else pack
    write_pack_file(swapped, dest)
    return dest


def test_keys_swapped_in_place_are_refused_by_the_pack_name(tmp_path, caplog):
    memo_rows(_memo(tmp_path), TEXTS, [])
    pack = _swap_first_two_keys(next(_memo(tmp_path).dir.glob("*.parquet")), rename=False)
    calls: list = []
    with caplog.at_level(logging.WARNING, logger="contramine.memo"):
        assert memo_rows(_memo(tmp_path, verify=0.0), TEXTS, calls).equals(vectors(TEXTS))  # no audit needed
    assert calls == [TEXTS]
    named = log_lines(caplog, str(pack), "not named after its keys", _owner(), "moved to")
    assert len(named) == 1 and named[0].count("\n") == 0


def test_with_the_key_swapped_and_renamed_keys_are_refused_and_cache_verify_finds_them(tmp_path, caplog):
    memo_rows(_memo(tmp_path, KEY), TEXTS, [])
    pack = _swap_first_two_keys(next(_memo(tmp_path).dir.glob("*.parquet")), rename=True)
    checked, bad = verify(tmp_path, dry_run=True, key=KEY)  # `contramine cache --verify` with the key
    assert checked == 1 and len(bad) == 1 and bad[0][0] == pack and "keyed hash" in bad[0][1]
    assert _owner() in bad[0][1]
    calls: list = []
    with caplog.at_level(logging.WARNING, logger="contramine.memo"):
        got = memo_rows(_memo(tmp_path, KEY), TEXTS, calls)
    assert got.equals(vectors(TEXTS)) and calls == [TEXTS]  # sentence 0 never gets sentence 1's vector
    assert len(log_lines(caplog, str(pack), "keyed hash", "keys swapped", _owner(), "moved to")) == 1


def test_a_pack_copied_into_another_namespace_is_refused(tmp_path, caplog):
    """Namespace A's pack copied into B (same value schema): refused by its record's namespace; with the record
    edited to name B, by the MAC, which covers the namespace."""
    memo_rows(_memo(tmp_path, KEY, code="A"), TEXTS, [])
    memo_rows(_memo(tmp_path, KEY, code="B"), ["another row"], [])  # B exists, with its own schema record
    pack = next(_memo(tmp_path, code="A").dir.glob("*.parquet"))
    b_dir = _memo(tmp_path, code="B").dir
    copied = b_dir / pack.name
    shutil.copyfile(pack, copied)
    calls: list = []
    with caplog.at_level(logging.WARNING, logger="contramine.memo"):
        assert memo_rows(_memo(tmp_path, KEY, code="B"), TEXTS, calls).equals(vectors(TEXTS)) and calls == [TEXTS]
    assert len(log_lines(caplog, str(copied), "written for namespace", "moved to")) == 1
    table = pq.read_table(pack)
    record = {**pack_record(table.schema), "namespace": f"embeddings/{b_dir.name}"}
    write_pack_file(table.replace_schema_metadata({RECORD: json.dumps(record)}), copied)  # the claim made to fit
    calls.clear()
    with caplog.at_level(logging.WARNING, logger="contramine.memo"):
        assert memo_rows(_memo(tmp_path, KEY, code="B"), TEXTS, calls).equals(vectors(TEXTS)) and calls == [TEXTS]
    assert len(log_lines(caplog, str(copied), "keyed hash")) == 1


def test_packs_not_ours_to_write_are_never_trusted_without_the_key(tmp_path, caplog):
    """Another uid's pack, and our own made group-writable: not served without the key, named with what fstat says
    (owner and name, mode), left in place (it may be honest); with the key, the MAC vouches for them."""
    memo_rows(_memo(tmp_path, KEY), TEXTS, [])
    pack = next(_memo(tmp_path).dir.glob("*.parquet"))
    keyless = _memo(tmp_path).dir / pack_name(b"".join(row_key(t) for t in TEXTS[:5]))  # what a keyless run writes
    for change, words in ((lambda: os.chown(pack, NOBODY.pw_uid, -1), f"uid {NOBODY.pw_uid} ({NOBODY.pw_name})"),
                          (lambda: (os.chown(pack, os.getuid(), -1), pack.chmod(0o664)), "mode 0664")):
        change()
        calls: list = []
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="contramine.memo"):
            assert memo_rows(_memo(tmp_path), TEXTS[:5], calls).equals(vectors(TEXTS[:5])) and calls == [TEXTS[:5]]
        named = log_lines(caplog, str(pack), "no runner.memo_key vouches for it", words, "left in place")
        assert len(named) == 1, [r.getMessage() for r in caplog.records]
        assert pack.exists() and not (tmp_path / ".quarantine").exists()
        keyless.unlink()
    os.chown(pack, NOBODY.pw_uid, -1)
    calls = []
    assert memo_rows(_memo(tmp_path, KEY), TEXTS, calls).equals(vectors(TEXTS)) and calls == []  # the key vouches


def test_packs_and_their_namespace_record_are_written_read_only(tmp_path):
    memo = _memo(tmp_path)
    memo_rows(memo, TEXTS, [])
    for p in [*memo.dir.glob("*.parquet"), memo.dir / "_namespace.json"]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o444, p
    key_column = pq.read_metadata(next(memo.dir.glob("*.parquet"))).row_group(0).column(0)
    assert key_column.compression == "UNCOMPRESSED" and not any("DICT" in e for e in key_column.encodings)


def test_a_record_nested_100000_deep_is_one_line_quarantined_and_never_fatal(tmp_path, caplog):
    memo_rows(_memo(tmp_path, KEY), TEXTS, [])
    pack = next(_memo(tmp_path).dir.glob("*.parquet"))
    table = pq.read_table(pack)
    write_pack_file(table.replace_schema_metadata({RECORD: "[" * 100_000}), pack)
    (tmp_path / "embeddings" / "deep-0").mkdir()
    (tmp_path / "embeddings" / "deep-0" / "_namespace.json").write_text("[" * 100_000)  # another namespace's record
    checked, bad = verify(tmp_path, dry_run=True)  # `cache --verify` without the key, then with it: no traceback
    assert checked == 1 and "no writer record" in bad[0][1]
    assert verify(tmp_path, dry_run=True, key=KEY)[0] == 1
    calls: list = []
    with caplog.at_level(logging.WARNING, logger="contramine.memo"):
        assert memo_rows(_memo(tmp_path, KEY), TEXTS, calls).equals(vectors(TEXTS)) and calls == [TEXTS]
    assert len(log_lines(caplog, str(pack), "no writer record", "moved to")) == 1
    calls.clear()
    assert memo_rows(_memo(tmp_path, KEY), TEXTS, calls).equals(vectors(TEXTS)) and calls == []  # the next run: served


BOMB_LOOKUP = """
import resource, sys
from pathlib import Path
from contramine.pipeline.memo.rows import RowMemo, row_key
from contramine.pipeline.memo.packs import FORMAT
memo = RowMemo(Path(sys.argv[1]), "embeddings", "encode", {"format": FORMAT, "code": "v1"})
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
found, values, _ = memo.lookup([row_key("sentence 0")])
print(len(found), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


def test_a_dictionary_encoded_pack_of_30m_rows_is_refused_from_its_footer(tmp_path):
    """~250 KiB on disk, 30M rows of one key: decoding its key column would take 480 MB and more. The footer says
    so (rows against bytes, a dictionary-encoded key column) before anything is decoded: one line, quarantined,
    and the lookup adds under 50 MiB to its process' peak memory."""
    memo = _memo(tmp_path)
    memo_rows(memo, TEXTS[:1], [])
    honest = next(memo.dir.glob("*.parquet"))
    one = pa.DictionaryArray.from_arrays(np.zeros(1_000_000, np.int8), pa.array([row_key("sentence 0")],
                                                                               pa.binary(16)))
    record = pack_record(pq.read_schema(honest))
    bomb_table = pa.table({"key": one, "vec": one}).replace_schema_metadata({RECORD: json.dumps(record)})
    bomb = memo.dir / f"{'ab' * 16}.parquet"
    with pq.ParquetWriter(bomb, bomb_table.schema, store_schema=False, compression="zstd") as w:
        for _ in range(30):
            w.write_table(bomb_table, row_group_size=1_000_000)
    honest.unlink()
    assert pq.read_metadata(bomb).num_rows == 30_000_000 and bomb.stat().st_size < 400_000
    p = subprocess.run([sys.executable, "-c", BOMB_LOOKUP, str(tmp_path)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": CHILD_PYTHONPATH})
    found, lookup_mib = map(int, p.stdout.split())  # what the lookup added to the child's peak (was 2.7 GB)
    assert p.returncode == 0 and found == 0 and lookup_mib < 50, (p.stdout, p.stderr[-2000:])
    lines = [line for line in p.stderr.splitlines() if str(bomb) in line]
    assert len(lines) == 1 and "30,000,000 rows" in lines[0] and "moved to" in lines[0], p.stderr[-2000:]
    assert not bomb.exists() and "Traceback" not in p.stderr
