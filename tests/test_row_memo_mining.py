"""The row memo end to end (pipeline/memo/rows.py): mining with the real models (MiniLM, the Bergamot en-pt chain,
spaCy), only rows with new keys reach a model, counted independently of the memo's own counts (a wrapper around
each model's call), and the tables equal a fresh run's, forged packs included. The memo alone:
tests/test_row_memo.py."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contramine.pipeline.memo.packs import pack_record
from contramine.pipeline.engine.runner import load_stages

ROOT = Path(__file__).resolve().parent.parent
WIKI = ROOT.parent / "shared" / "data" / "wiki1m_head.txt"
SETS = ["encoder.max_length=32", "neighbours.pool_size=8", "noise.n_variants=2", "run.shards=2"]


class ModelCalls:
    """Texts that reached each model, counted outside the memo."""

    def __init__(self, monkeypatch):
        from contramine.pipeline.models.translate.engines import bergamot
        from contramine.pipeline.models.encode import encoder
        from contramine.pipeline.stages import negate

        self.n = {"encode": 0, "translate": 0, "negate": 0}
        enc, tr, neg = encoder.Encoder.encode, bergamot.BergamotTranslator.translate, negate.negate_texts

        def count(name, fn, method=True):
            def wrapped(*a, **k):
                texts = a[1] if method else a[0]
                self.n[name] += len(texts)
                return fn(*a, **k)
            return wrapped
        monkeypatch.setattr(encoder.Encoder, "encode", count("encode", enc))
        monkeypatch.setattr(bergamot.BergamotTranslator, "translate", count("translate", tr))
        monkeypatch.setattr(negate, "negate_texts", count("negate", neg, method=False))

    def take(self) -> dict:
        out, self.n = self.n, {k: 0 for k in self.n}
        return out


def _memo_counts(run_dir: Path) -> dict:
    from contramine.pipeline.storage.store import Store

    store, out = Store(run_dir), {}
    for stage in ("embeddings", "backtranslate", "negate", "scores"):
        for name, e in ((store.manifest(load_stages()[stage].writes[0]) or {}).get("memo") or {}).items():
            out[stage] = (e["rows_computed"], e["rows_reused"], e["rows_audited"])
    return out


def test_a_grown_corpus_another_layout_and_another_run_send_only_new_rows_to_the_models(tmp_path, monkeypatch,
                                                                                         caplog):
    """Every stage in order through the runner's own driver (`run_stage`, what the flows map; the Prefect path
    and a real Dask cluster: tests/test_cluster.py)."""
    from mining_helpers import table_hashes
    from contramine.pipeline.config import configure
    from contramine.pipeline.engine.runner import run_stage
    from contramine.pipeline.models.translate.engines import bergamot

    if not hasattr(bergamot, "BergamotTranslator"):
        pytest.fail("pipeline/models/translate/engines/bergamot.py no longer has BergamotTranslator: count its calls another way")
    lines = WIKI.read_text(encoding="utf-8").splitlines()
    small, grown = tmp_path / "c60.txt", tmp_path / "c61.txt"
    small.write_text("\n".join(lines[:60]) + "\n", encoding="utf-8")
    grown.write_text("\n".join(lines[:61]) + "\n", encoding="utf-8")  # a line more
    root, calls = tmp_path / "runs", ModelCalls(monkeypatch)

    def mine(corpus, run, *extra, upto=None):
        cfg = configure("default", run, str(corpus), SETS + [f"run.root={root}", *extra])
        for stage in load_stages():
            run_stage(stage, cfg, log=lambda line: None)
            if stage == upto:
                break
        return calls.take(), _memo_counts(root / run)

    first, first_counts = mine(small, "a")
    assert first["encode"] and first["translate"] and first["negate"]
    assert first_counts["embeddings"] == (first_counts["embeddings"][0], 0, 0)

    again, counts = mine(grown, "a")  # the audit (runner.memo_verify, default 0.1%) is in what reaches the models
    assert again["encode"] == sum(counts[s][0] + counts[s][2] for s in ("embeddings", "scores"))
    assert again["negate"] == counts["negate"][0] + counts["negate"][2] and counts["negate"][0] == 1
    assert counts["embeddings"][0] == 1  # the one new line
    assert again["translate"] <= 0.15 * first["translate"], (again, first)
    assert counts["embeddings"][1] > 0  # the old rows of the shards whose sid range took the new line
    assert all(c[2] >= 1 for c in counts.values())  # a row of every pack read, at least

    layout, counts = mine(grown, "b", "run.shards=3", "runner.memo_verify=0")  # another layout and run name
    assert layout == {"encode": 0, "translate": 0, "negate": 0}, counts

    fresh, counts = mine(grown, "fresh", "runner.memo=off")
    assert fresh["negate"] == counts["negate"][0] > 50 and counts["negate"][1] == 0  # off: every row to the model
    want = table_hashes(root / "fresh")
    assert table_hashes(root / "a") == want
    assert table_hashes(root / "b") == want
    assert not (root / ".memo" / ".quarantine").exists()  # nothing failed the audit

    # a pack rewritten with the same keys and other values (valid Parquet, checksums and values hash, another
    # writer's record), and one with 2-d vectors: the audit and the schema check refuse them, named with their
    # file's owner (fstat, not the forged record); the run's tables equal the fresh run's
    negate_pack = _forge(root / ".memo" / "negate", lambda t: t.set_column(
        t.schema.get_field_index("text"), "text", pa.array([f"not {x}" for x in t.column("text").to_pylist()])))
    emb_pack = _forge(root / ".memo" / "embeddings", lambda t: t.set_column(
        t.schema.get_field_index("vec"), "vec", pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(8), t.num_rows, [None, pa.py_buffer(np.ones((t.num_rows, 2), np.float32))])))
    with caplog.at_level(logging.WARNING, logger="contramine.memo"):
        mine(grown, "c", upto="negate")  # the stages through negate: embeddings' and negate's memos
    got = table_hashes(root / "c")
    assert got == {t: want[t] for t in got} and {"embeddings", "negations"} <= set(got)
    named = [r.getMessage() for r in caplog.records if f"file owned by uid {os.getuid()}" in r.getMessage()]
    assert not any("mallory" in m for m in named), named
    assert any(str(negate_pack) in m and "failed the audit" in m for m in named), named
    assert any(str(emb_pack) in m and "fixed_size_binary[8]" in m for m in named), named
    quarantined = list((root / ".memo" / ".quarantine").rglob("*.parquet"))  # moved aside, not deleted
    assert sorted(pack_record(pq.read_schema(p))["writer"]["user"] for p in quarantined) == ["mallory"] * 2
    assert all(pack_record(pq.read_schema(p))["writer"]["user"] != "mallory" for p in (negate_pack, emb_pack)
               if p.exists())  # the same rows, written again by this run


def _forge(stage_dir: Path, change) -> Path:
    """Rewrite the largest pack of a stage's namespace with `change`d values and a valid record of another writer."""
    import json

    from contramine.pipeline.memo.packs import FORMAT, RECORD, namespace_of, values_hash
    from contramine.pipeline.memo.store import write_pack_file

    pack = max(stage_dir.glob("*/*.parquet"), key=lambda p: p.stat().st_size)
    table = change(pq.read_table(pack).replace_schema_metadata(None))
    values = table.drop_columns(["key"])
    record = {"format": FORMAT, "rows": table.num_rows, "values": values_hash(values), "namespace": namespace_of(pack),
              "writer": {"user": "mallory", "host": "elsewhere", "pid": 1, "time": "now", "code": "?"}}
    write_pack_file(table.replace_schema_metadata({RECORD: json.dumps(record)}), pack)
    return pack


def test_an_edited_line_of_one_part_of_a_folder_corpus_recomputes_only_that_line(tmp_path, monkeypatch):
    """A corpus kept as a folder of parts (JSON Lines gzipped, Parquet, text): its identity covers every part, so
    one edited line reruns the `sentences` stage, and `embeddings` sends that one sentence to the encoder (the row
    memo's counts in the manifest), the rest from the memo; nothing edited, nothing recomputed."""
    import gzip
    import json

    from contramine.pipeline.config import configure
    from contramine.pipeline.engine.runner import run_stage
    from contramine.pipeline.storage.store import Store
    from contramine.pipeline.storage.tables import RunTables

    lines = WIKI.read_text(encoding="utf-8").splitlines()[:30]
    parts = tmp_path / "corpus"
    parts.mkdir()

    def write(part_lines: list[str]) -> None:
        with gzip.open(parts / "a.jsonl.gz", "wt", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(part_lines[:10]))
        pq.write_table(pa.table({"text": part_lines[10:20]}), parts / "b.parquet")
        (parts / "c.txt").write_text("\n".join(part_lines[20:]) + "\n", encoding="utf-8")

    write(lines)
    root, calls = tmp_path / "runs", ModelCalls(monkeypatch)

    def mine() -> tuple[dict, dict]:
        cfg = configure("default", "a", str(parts), SETS + [f"run.root={root}", "backtranslate.chains=[]"])
        for stage in ("sentences", "embeddings", "negate"):
            run_stage(stage, cfg, log=lambda line: None)
        memo = Store(root / "a").manifest("embeddings")["memo"]["encode"]
        return calls.take(), (memo["rows_computed"], memo["rows_reused"], memo.get("rows_audited", 0))

    first, _ = mine()
    kept = RunTables(root / "a").read("sentences").num_rows
    assert first["encode"] == kept and kept + RunTables(root / "a").read("rejected").num_rows == 30
    manifest = Store(root / "a").manifest("sentences")
    assert manifest["corpus_parts"] == [{"source": "a.jsonl.gz", "first_line_no": 1, "lines": 10},
                                        {"source": "b.parquet", "first_line_no": 11, "lines": 10},
                                        {"source": "c.txt", "first_line_no": 21, "lines": 10}]
    assert mine() == ({"encode": 0, "translate": 0, "negate": 0}, (0, 0, 0))  # nothing changed: every shard reused
    edited = list(lines)
    edited[15] = "An edited line of the Parquet part, and only that line."
    write(edited)
    again, counts = mine()
    # its shard's other rows: from the memo; the encoder also sees the rows the audit recomputes (runner.memo_verify)
    assert counts[0] == 1 and counts[1] > 0 and again["encode"] == counts[0] + counts[2]
    sentences = RunTables(root / "a").read("sentences").to_pylist()
    assert [r["line_no"] for r in sentences if r["text"] == edited[15]] == [16]  # b.parquet's 6th row: across parts
