"""A memo pack costs what its bytes say before its hashes are checked (pipeline/memo/footer.py), and a namespace's
`_namespace.json` that is not this user's own decides nothing: each case was found by a review of the landed code
(issue 62's "checked on cases you have not seen"), with the team key set, another account's pack planted:
- a footer whose row group has no columns: an IndexError in every keyed lookup, every keyed mine and `cache
  --verify`, and the pack was never quarantined;
- a text column's dictionary page of one 8 MiB value that every row points at: decoded whole (5.9 GB at 64 MiB);
- a sparse 5 GiB pack whose footer length says 4 GB: 4 GB of memory in every lookup and every `cache` command;
- a forged `_namespace.json` (another value schema): every keyed run quarantined the honest packs;
- `_namespace.json` deleted or not parsing: `cache --verify` skipped the folder ("0 packs verified") while lookups
  read its packs."""
from __future__ import annotations

import json
import logging
import os
import pwd
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from memo_helpers import log_lines, memo_rows, vectors
from contramine.pipeline.memo import index as memo_index
from contramine.pipeline.memo.cache import namespaces, verify
from contramine.pipeline.memo.packs import FORMAT, NAMESPACE, RECORD, namespace_of, pack_name, pack_record, \
    recorded_schema, values_hashes
from contramine.pipeline.memo.rows import RowMemo, row_key
from contramine.pipeline.memo.store import write_pack_file

KEY = b"the team's memo key, 32 chars..."
TEXTS = [f"sentence {i}" for i in range(40)]
NOBODY = pwd.getpwnam("nobody").pw_uid
NEG = pa.schema([("text", pa.string()), ("rule", pa.string()), ("reason", pa.string())])


def _memo(root, key=KEY) -> RowMemo:
    memo_index.release_indexes()  # each call a fresh process' view: packs are indexed anew
    return RowMemo(root, "embeddings", "encode", {"format": FORMAT, "code": "v1"}, key=key)


def _plant(path, data: bytes) -> None:
    """`data` at `path` as another account leaves it: owned by nobody, read-only."""
    path.write_bytes(data)
    os.chmod(path, 0o444)
    os.chown(path, NOBODY, -1)


def _served_and_quarantined(tmp_path, caplog, bomb, why: str) -> None:
    """A keyed lookup serves every row right, names `bomb` once with `why`, and moves it away; so does the next."""
    calls: list = []
    with caplog.at_level(logging.WARNING, logger="contramine.memo"):
        assert memo_rows(_memo(tmp_path), TEXTS, calls).equals(vectors(TEXTS))
    assert len(log_lines(caplog, str(bomb), why, "uid", "moved to")) == 1, caplog.text[-2000:]
    assert not bomb.exists()
    assert memo_rows(_memo(tmp_path), TEXTS, []).equals(vectors(TEXTS))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n >> 7 else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(delta: int, kind: int, value) -> bytes:
    """One Thrift compact-protocol field: an i32/i64 (zigzag) or a string."""
    head = bytes([(delta << 4) | kind])
    return head + (_varint(len(value)) + value.encode() if kind == 8 else _varint((value << 1) ^ (value >> 63)))


def _column_less_footer() -> bytes:
    """A Parquet file whose footer declares key and vec columns and one row group holding no column chunk."""
    def element(name, type_=None, length=None, repetition=None, children=None):
        out, last = b"", 0
        for fid, kind, v in ((1, 5, type_), (2, 5, length), (3, 5, repetition), (4, 8, name), (5, 5, children)):
            if v is not None:
                out, last = out + _field(fid - last, kind, v), fid
        return out + b"\x00"
    schema = [element("schema", children=2), element("key", 7, 16, 0), element("vec", 7, 16, 1)]
    group = b"\x19\x0c" + _field(1, 6, 0) + _field(1, 6, 1) + b"\x00"  # columns: [], total size 0, 1 row
    meta = (_field(1, 5, 1) + b"\x19" + bytes([(len(schema) << 4) | 12]) + b"".join(schema) + _field(1, 6, 1)
            + b"\x19\x1c" + group + b"\x00")
    return b"PAR1" + bytes(64) + meta + len(meta).to_bytes(4, "little") + b"PAR1"


def test_a_row_group_without_columns_is_quarantined_and_keyed_runs_go_on(tmp_path, caplog):
    memo_rows(_memo(tmp_path), TEXTS[:1], [])
    bomb = _memo(tmp_path).dir / f"{'44' * 16}.parquet"
    _plant(bomb, _column_less_footer())
    assert pq.ParquetFile(bomb).metadata.row_group(0).num_columns == 0  # what tripped group.column(0)
    assert verify(tmp_path, dry_run=True, key=KEY)[1][0][1].startswith("a row group of 0 columns")
    _served_and_quarantined(tmp_path, caplog, bomb, "a row group of 0 columns")


def test_a_dictionary_page_that_decodes_to_gigabytes_is_refused_before_it_is_decoded(tmp_path, caplog):
    """negate's memo stores text, dictionary-encoded. 64 rows pointing at one 8 MiB value: 512 MiB decoded from a
    pack of a few KB (the limit: 128 MiB, or 32x the pack's bytes). Refused from the dictionary's lengths."""
    def negate_memo():
        memo_index.release_indexes()
        return RowMemo(tmp_path, "negate", "negate", {"format": FORMAT, "code": "v1"}, key=KEY)

    texts = [f"sentence {i}" for i in range(64)]

    def compute(missing):
        return pa.table({"text": [f"not {texts[i]}" for i in missing], "rule": ["r"] * len(missing),
                         "reason": pa.array([None] * len(missing), pa.string())})
    memo = negate_memo()
    memo.rows([row_key(t) for t in texts[:1]], compute, NEG)
    keys = b"".join(row_key(t) for t in texts)
    text = pa.DictionaryArray.from_arrays(pa.array(np.zeros(64, np.int32)), pa.array(["x" * (8 << 20)]))
    record = {"format": FORMAT, "writer": {}, "values": "0" * 32, "rows": 64, "namespace": namespace_of(memo.dir / "x")}
    table = pa.table({"key": pa.array([row_key(t) for t in texts], pa.binary(16)), "text": text,
                      "rule": pa.array(["r"] * 64), "reason": pa.array([None] * 64, pa.string())})
    bomb = memo.dir / pack_name(keys)
    with pq.ParquetWriter(bomb, table.schema, compression={"key": "none", "text": "zstd", "rule": "zstd",
                          "reason": "zstd"}, use_dictionary=["text"], store_schema=False) as w:
        w.write_table(table)
        w.add_key_value_metadata({RECORD.decode(): json.dumps(record)})
    os.chmod(bomb, 0o444)
    os.chown(bomb, NOBODY, -1)
    assert bomb.stat().st_size < 100_000
    with caplog.at_level(logging.WARNING, logger="contramine.memo"):
        got = negate_memo().rows([row_key(t) for t in texts], compute, NEG)
    assert got.column("text").to_pylist() == [f"not {t}" for t in texts]
    assert len(log_lines(caplog, str(bomb), "decode to 536,870,912 bytes", "moved to")) == 1, caplog.text[-2000:]


def test_a_sparse_pack_whose_footer_says_4_gb_is_refused_at_once_also_by_cache(tmp_path, caplog):
    memo_rows(_memo(tmp_path), TEXTS[:1], [])
    bomb = _memo(tmp_path).dir / f"{'cd' * 16}.parquet"
    with open(bomb, "wb") as f:  # 5 GiB, 0 bytes on disk
        f.write(b"PAR1")
        f.truncate(5 << 30)
        f.seek((5 << 30) - 8)
        f.write((4_000_000_000).to_bytes(4, "little") + b"PAR1")
    os.chmod(bomb, 0o444)
    os.chown(bomb, NOBODY, -1)
    t0 = time.perf_counter()
    assert [ns.rows for ns in namespaces(tmp_path)] == [1]  # `contramine cache` (was 4 GB): the footer not parsed
    assert "a footer of 4,000,000,000 bytes" in verify(tmp_path, dry_run=True, key=KEY)[1][0][1]
    assert time.perf_counter() - t0 < 5
    _served_and_quarantined(tmp_path, caplog, bomb, "a footer of 4,000,000,000 bytes")


def test_another_accounts_namespace_record_decides_nothing(tmp_path, caplog):
    """A `_namespace.json` forged by another account (a value schema of 8-byte vectors): the honest keyed packs are
    served, not quarantined run after run. A colleague's honest one, keyed, is trusted as ours."""
    memo_rows(_memo(tmp_path), TEXTS, [])
    ns = _memo(tmp_path).dir / NAMESPACE
    record = json.loads(ns.read_text())
    assert "mac" in record
    os.chown(ns, NOBODY, -1)
    assert recorded_schema(ns.parent, KEY) == record["values"] and recorded_schema(ns.parent) is None
    record["values"] = "vec: fixed_size_binary[8]"
    ns.unlink()
    _plant(ns, json.dumps(record).encode())
    for _ in range(2):
        calls: list = []
        assert memo_rows(_memo(tmp_path), TEXTS, calls).equals(vectors(TEXTS)) and calls == []
    assert not (tmp_path / ".quarantine").exists()


def test_verify_checks_the_packs_of_a_folder_whose_namespace_record_is_gone_or_forged(tmp_path):
    """A forged pack (valid plain hash, no MAC) beside a deleted, then unparsable, `_namespace.json`: `cache --verify`
    with the key names it (it said "0 packs verified, none failed")."""
    memo_rows(_memo(tmp_path), TEXTS, [])
    pack = next(_memo(tmp_path).dir.glob("*.parquet"))
    table = pq.read_table(pack)
    values = table.drop_columns(["key"])
    record = pack_record(table.schema)
    record["values"] = values_hashes(values)[0]
    record.pop("mac")
    pack.unlink()
    write_pack_file(table.replace_schema_metadata({RECORD: json.dumps(record)}), pack)
    ns = pack.parent / NAMESPACE
    ns.unlink()
    for _ in range(2):
        checked, bad = verify(tmp_path, dry_run=True, key=KEY)
        assert checked == 1 and [p for p, _ in bad] == [pack] and "no keyed values hash" in bad[0][1]
        _plant(ns, b"[" * 100_000)


def test_verify_names_what_lies_in_a_packs_place(tmp_path):
    """A FIFO and a link named like packs: named by `cache --verify`, never opened (it said "none failed")."""
    memo_rows(_memo(tmp_path), TEXTS, [])
    folder = _memo(tmp_path).dir
    os.mkfifo(folder / f"{'ab' * 16}.parquet")
    (folder / f"{'cd' * 16}.parquet").symlink_to(next(folder.glob("*.parquet")).name)
    checked, bad = verify(tmp_path, dry_run=True, key=KEY)
    assert checked == 3 and sorted((p.name[:2], why.split(",")[0]) for p, why in bad) == [
        ("ab", "is a FIFO"), ("cd", "is a symbolic link")], bad


def test_what_pages_decompress_to_is_read_from_their_headers_and_nested_dictionaries_are_refused(tmp_path, monkeypatch):
    """The footer's totals are the writer's word (a varint rewritten to 1 still reads): each page's header says what
    Arrow allocates, and is what is bounded. A dictionary page inside a list (`texts: list<string>`; this memo writes
    none) would decode unbounded: refused."""
    import contramine.pipeline.memo.footer as footer

    def pack(table, name, **options):
        path = tmp_path / name
        pq.write_table(table, path, compression="zstd", **options)
        return path

    big = pack(pa.table({"key": pa.array([b"k" * 16] * 4, pa.binary(16)), "text": ["x" * 100_000] * 4}), "big.parquet",
               use_dictionary=False)
    with open(big, "rb") as f:
        meta = pq.ParquetFile(f).metadata
        assert footer._pages_problem(f, meta, big.stat().st_size) is None
        monkeypatch.setattr(footer, "DECODED_FLOOR", 300_000)
        monkeypatch.setattr(footer, "DECODED_RATIO", 1)
        assert "pages whose headers say they decode to over 300,000 bytes" in footer._pages_problem(
            f, meta, big.stat().st_size)
    nested = pack(pa.table({"key": pa.array([b"k" * 16] * 2, pa.binary(16)),
                            "texts": pa.array([["a", "b"], ["a"]], pa.list_(pa.string()))}), "nested.parquet",
                  use_dictionary=["texts.list.element"])
    with open(nested, "rb") as f:
        pf = pq.ParquetFile(f)
        assert footer.read_values(f, pf, nested.stat().st_size) == (
            None, "a dictionary-encoded nested column `texts.list.element` (this memo writes none)")


def test_a_colleagues_namespace_of_an_older_format_is_left_to_them(tmp_path):
    """Their `_namespace.json` carries no keyed hash (no older format wrote one), but its facts hash to the folder's
    name: it is known as an older format's and not verified (its packs were moved away as bad ones), while a record
    whose facts do not hash to its folder's name decides nothing."""
    from contramine.pipeline.memo.packs import namespace_facts, namespace_hash

    facts = {"format": 2, "code": "v1"}
    for name, moved in ((f"encode-{namespace_hash(facts)}", False), ("encode-0123456789abcdef", True)):
        folder = tmp_path / "embeddings" / name
        folder.mkdir(parents=True)
        _plant(folder / NAMESPACE, json.dumps({"stage": "embeddings", "memo": "encode", "facts": facts}).encode())
        _plant(folder / f"{'ab' * 16}.parquet", b"PAR1 an older format's pack PAR1")
        assert namespace_facts(folder, KEY) == ({} if moved else facts)
        checked, bad = verify(tmp_path, key=KEY)
        assert (folder / f"{'ab' * 16}.parquet").exists() != moved and bool(bad) == moved, (name, bad)


def test_null_values_non_ascii_macs_and_a_teammate_without_the_key(tmp_path, caplog):
    """A pack of 20M null vectors (a few KB of levels; 320 MB decoded) is refused from its pages' value counts; a
    non-ASCII `mac` (hmac.compare_digest's TypeError on str) is not vouched for, one line; and a run without the key
    does not replace a colleague's keyed pack it cannot check (the next keyed run had lost it)."""
    memo_rows(_memo(tmp_path), TEXTS, [])
    folder = _memo(tmp_path).dir
    keys = [f"null {i}".encode().ljust(16, b".") for i in range(20_000_000 // 1_000_000)]
    nulls = pa.table({"key": pa.array(keys, pa.binary(16)), "vec": pa.nulls(len(keys), pa.binary(16_000_000))})
    record = pack_record(pq.read_schema(next(folder.glob("*.parquet"))))
    bomb = folder / pack_name(b"".join(keys))
    write_pack_file(nulls.replace_schema_metadata({RECORD: json.dumps(record)}), bomb)
    assert bomb.stat().st_size < 10_000
    checked, bad = verify(tmp_path, dry_run=True, key=KEY)
    assert [why.startswith("pages whose headers say they decode to over 134,217,728 bytes") for p, why in bad
            if p == bomb] == [True], bad
    bomb.unlink()
    ns = folder / NAMESPACE
    record = json.loads(ns.read_text())
    record["mac"] = "\u00e9" * 64
    ns.unlink()
    _plant(ns, json.dumps(record).encode())
    assert recorded_schema(folder, KEY) is not None  # not vouched for: the first keyed pack's schema, no TypeError
    for pack in folder.glob("*.parquet"):
        os.chown(pack, NOBODY, -1)
    before = {p.name: p.stat().st_ino for p in folder.glob("*.parquet")}
    memo_rows(_memo(tmp_path, key=None), TEXTS, [])  # a teammate without the key: computes, replaces nothing
    assert {p.name: p.stat().st_ino for p in folder.glob("*.parquet")} == before
    calls: list = []
    assert memo_rows(_memo(tmp_path), TEXTS, calls).equals(vectors(TEXTS)) and calls == []
