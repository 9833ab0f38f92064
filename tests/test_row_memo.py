"""The row memo (pipeline/engine/memo.py): only rows with new keys reach a model, and the tables equal a fresh run's.

The end-to-end tests mine with the real models (MiniLM, the Bergamot en-pt chain, spaCy) and count what reaches them
independently of the memo's own counts (a wrapper around each model's call)."""
from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.engine.memo import RowMemo, memo_state, namespace_facts, pack_record, prune, row_key
from pipeline.engine.runner import load_stages

ROOT = Path(__file__).resolve().parent.parent
WIKI = ROOT.parent / "shared" / "data" / "wiki1m_head.txt"
VALUES = pa.schema([("text", pa.string()), ("n", pa.int64())])


def _values(texts) -> pa.Table:
    return pa.table({"text": [t.upper() for t in texts], "n": [len(t) for t in texts]}, schema=VALUES)


def _memo(root: Path, facts=None) -> RowMemo:
    return RowMemo(root, "stage", "upper", facts or {"code": "v1"})


def _rows(memo: RowMemo, texts: list[str], calls: list) -> pa.Table:
    def compute(missing):
        calls.append([texts[i] for i in missing])
        return _values([texts[i] for i in missing])
    return memo.rows([row_key(t) for t in texts], compute, VALUES)


# ---- the memo itself --------------------------------------------------------------------------------------------
def test_only_new_keys_are_computed_and_rows_come_back_in_order(tmp_path):
    calls: list = []
    first = _rows(_memo(tmp_path), ["a", "b", "c"], calls)
    assert first.equals(_values(["a", "b", "c"]))
    memo = _memo(tmp_path)
    got = _rows(memo, ["d", "c", "a", "e", "b"], calls)
    assert got.equals(_values(["d", "c", "a", "e", "b"]))
    assert calls == [["a", "b", "c"], ["d", "e"]]
    assert (memo.counts.computed, memo.counts.reused) == (2, 3)
    assert _rows(_memo(tmp_path, {"code": "v2"}), ["a"], calls).equals(_values(["a"]))  # another namespace
    assert calls[-1] == ["a"]


@pytest.mark.parametrize("damage", ["truncate", "flip a byte", "empty"])
def test_a_damaged_pack_is_named_once_and_its_rows_computed_again(tmp_path, caplog, damage):
    texts = [f"sentence number {i}" for i in range(300)]
    _rows(_memo(tmp_path), texts, [])
    pack = next((tmp_path / "stage").glob("*/*.parquet"))
    data = pack.read_bytes()
    if damage == "truncate":
        pack.write_bytes(data[: len(data) // 2])
    elif damage == "flip a byte":  # inside the first data page: its checksum no longer matches
        pack.write_bytes(data[:200] + bytes([data[200] ^ 0xFF]) + data[201:])
    else:
        pack.write_bytes(b"")
    calls: list = []
    with caplog.at_level(logging.WARNING, logger="contramine.memo"):
        got = _rows(_memo(tmp_path), texts, calls)
        _rows(_memo(tmp_path), texts[:5], [])
    assert got.equals(_values(texts))  # never a wrong row
    assert calls == [texts]
    named = [r.getMessage() for r in caplog.records if str(pack) in r.getMessage()]
    assert len(named) <= 1 and (named or damage == "flip a byte")  # a flip may land where only values are read
    assert _rows(_memo(tmp_path), texts, calls).equals(_values(texts)) and len(calls) == 1  # rewritten whole


def test_a_pack_changed_after_it_was_indexed_serves_no_wrong_row(tmp_path):
    texts = [f"t{i}" for i in range(50)]
    _rows(_memo(tmp_path), texts, [])
    memo = _memo(tmp_path)
    _rows(memo, texts[:1], [])  # this process has indexed the pack
    pack = next((tmp_path / "stage").glob("*/*.parquet"))
    other = [f"u{i}" for i in range(50)]
    table = _values(other).add_column(0, "key", pa.array([row_key(t) for t in other], pa.binary(16)))
    pq.write_table(table, pack)  # same name, other keys: the full-key check refuses every row
    calls: list = []
    assert _rows(memo, texts, calls).equals(_values(texts)) and calls == [texts]


def _writer(root: str, start: int, out: str) -> None:
    texts = [f"row {i}" for i in range(start, start + 400)]
    got = _rows(_memo(Path(root)), texts, [])
    Path(out).write_text("ok" if got.equals(_values(texts)) else "WRONG")


def test_two_processes_writing_one_namespace_at_once(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), start, str(tmp_path / f"out{start}")))
             for start in (0, 200)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert [(tmp_path / f"out{s}").read_text() for s in (0, 200)] == ["ok", "ok"]
    texts = [f"row {i}" for i in range(600)]
    calls: list = []
    assert _rows(_memo(tmp_path), texts, calls).equals(_values(texts)) and calls == []
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_killed_write_leaves_a_temp_file_no_reader_opens_and_prune_removes(tmp_path):
    _rows(_memo(tmp_path), ["a"], [])
    ns = next((tmp_path / "stage").iterdir())
    tmp = ns / f".{'0123' * 8}.parquet.x1y2_z.tmp"  # atomic_file's name for a pack's temp file
    tmp.write_bytes(b"PAR1 half a file")
    theirs = [ns / ".notes.tmp", ns / "results.parquet", ns / f"{'ab' * 16}.parquet.bak"]  # not names it writes
    for p in theirs:
        p.write_bytes(b"someone's")
    calls: list = []
    _rows(_memo(tmp_path), ["a", "b"], calls)
    assert calls == [["b"]]
    packs = [p for p in ns.glob("*.parquet") if p not in theirs]
    for p in [tmp, *theirs, *packs]:
        os.utime(p, (time.time() - 7200, time.time() - 7200))
    gone = prune(tmp_path, tmp_path / "runs", older_than_days=0.01)
    assert len(packs) == 2 and sorted(p for p, _ in gone) == sorted([tmp, *packs]) and not tmp.exists()
    assert all(p.read_bytes() == b"someone's" for p in theirs)  # only names the memo writes are removed


def test_prune_by_age_and_by_what_no_run_uses(tmp_path):
    import json

    memo_root = tmp_path / "runs" / ".memo"  # where it is by default: inside the runs' root
    old, kept = _memo(memo_root, {"code": "old"}), _memo(memo_root, {"code": "kept"})
    _rows(old, ["a"], [])
    _rows(kept, ["a"], [])
    runs = tmp_path / "runs"
    (runs / "r" / "embeddings").mkdir(parents=True)
    (runs / "r" / "embeddings" / "_manifest.json").write_text(json.dumps(
        {"stage": "stage", "memo": {"upper": {"namespace": kept.namespace}}}))
    gone = prune(memo_root, runs, unreferenced=True, dry_run=True)
    assert [p for p, _ in gone] == [old.dir] and old.dir.exists()
    prune(memo_root, runs, unreferenced=True)
    assert not old.dir.exists() and kept.dir.exists() and (runs / "r" / "embeddings" / "_manifest.json").exists()
    pack = next(kept.dir.glob("*.parquet"))
    os.utime(pack, (time.time() - 40 * 86400,) * 2)
    assert [p for p, _ in prune(memo_root, runs, older_than_days=30)] == [pack]
    assert prune(runs, runs, older_than_days=0, unreferenced=True) == []  # a memo_dir with no memo in it


# ---- what a namespace holds --------------------------------------------------------------------------------------
def _cfg(*sets):
    from pipeline.config import configure

    return configure("default", "x", None, list(sets))


def _namespaces(cfg, root=None) -> dict[str, str]:
    from pipeline.engine import codeversion
    from pipeline.engine.memo import namespace_hash

    plan = {"encoder": {"model": "m", "device": "cpu"}, "spacy": {"model": "s"},
            "chains": {"device": "cpu", "dtype": None, "code": {}, "versions": "", "models": {}, "engines": {}}}
    out = {}
    original = codeversion.code_version
    try:
        if root is not None:
            codeversion.code_version = lambda module, r=root: original.__wrapped__(module, r)  # uncached
        for stage in load_stages().values():
            for spec in stage.memos:
                out[f"{stage.name}/{spec.name}"] = namespace_hash(namespace_facts(stage, spec, cfg, plan))
    finally:
        codeversion.code_version = original
    return out


def test_a_code_change_in_one_stage_moves_that_stages_rows_and_no_others(tmp_path):
    copy = tmp_path / "pipeline"
    shutil.copytree(ROOT / "pipeline", copy, ignore=shutil.ignore_patterns("__pycache__"))
    cfg = _cfg()
    before = _namespaces(cfg, copy)
    assert set(before) == {"embeddings/encode", "pool_embeddings/encode", "backtranslate/translate",
                           "negate/negate", "scores/encode"}
    with open(copy / "stages" / "negate.py", "a") as f:
        f.write("\n# an edit\n")
    after = _namespaces(cfg, copy)
    assert [k for k in before if before[k] != after[k]] == ["negate/negate"]
    with open(copy / "models" / "encoder.py", "a") as f:  # shared by the three stages that embed
        f.write("\n# an edit\n")
    assert {k for k in before if before[k] != _namespaces(cfg, copy)[k]} == {
        "negate/negate", "embeddings/encode", "pool_embeddings/encode", "scores/encode"}


def test_settings_that_shape_a_row_move_it_and_others_do_not():
    base = _namespaces(_cfg())
    moved = lambda *sets: {k for k, v in _namespaces(_cfg(*sets)).items() if v != base[k]}  # noqa: E731
    assert moved("encoder.pooler=cls") == {"embeddings/encode", "pool_embeddings/encode", "scores/encode"}
    assert moved("backtranslate.max_new_tokens_min=8") == {"backtranslate/translate"}
    assert moved("run.seed=7") == {"backtranslate/translate"}  # a sampling model draws from it
    # what picks the rows or handles an output, never a row's translation or vector
    assert moved("backtranslate.degenerate_min_words=3", "encoder.batch_size=7", "negate.batch_size=3",
                 'backtranslate.chains=[["bergamot:en-pt", "bergamot:pt-en"], ["bergamot:pt-en", "bergamot:en-pt"]]',
                 "scores.edit_level=word", "runner.workers=2") == set()
    assert moved("negate.model=other") == {"negate/negate"}


def test_the_memo_stays_off_on_a_gpu_unless_asked():
    stage = load_stages()["embeddings"]
    gpu, cpu = {"encoder": {"device": "cuda"}}, {"encoder": {"device": "cpu"}}
    assert memo_state(stage, _cfg(), cpu) == "on"
    assert memo_state(stage, _cfg(), gpu).startswith("off (encoder on a GPU")
    assert memo_state(stage, _cfg("runner.memo=on"), gpu) == "on"
    assert memo_state(stage, _cfg("runner.memo=off"), cpu).startswith("off")


# ---- end to end, real models -------------------------------------------------------------------------------------
SETS = ["encoder.max_length=32", "neighbours.pool_size=8", "noise.n_variants=2", "run.shards=2"]


class ModelCalls:
    """Texts that reached each model, counted outside the memo."""

    def __init__(self, monkeypatch):
        from pipeline.models import bergamot, encoder
        from pipeline.stages import negate

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
    from pipeline.engine.store import Store

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
    from pipeline.config import configure
    from pipeline.engine.runner import run_stage
    from pipeline.models import bergamot

    if not hasattr(bergamot, "BergamotTranslator"):
        pytest.fail("pipeline/models/bergamot.py no longer has BergamotTranslator: count its calls another way")
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
    # writer; the run's tables equal the fresh run's
    negate_pack = _forge(root / ".memo" / "negate", lambda t: t.set_column(
        t.schema.get_field_index("text"), "text", pa.array([f"not {x}" for x in t.column("text").to_pylist()])))
    emb_pack = _forge(root / ".memo" / "embeddings", lambda t: t.set_column(
        t.schema.get_field_index("vec"), "vec", pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(8), t.num_rows, [None, pa.py_buffer(np.ones((t.num_rows, 2), np.float32))])))
    with caplog.at_level(logging.WARNING, logger="contramine.memo"):
        mine(grown, "c", upto="negate")  # the stages through negate: embeddings' and negate's memos
    got = table_hashes(root / "c")
    assert got == {t: want[t] for t in got} and {"embeddings", "negations"} <= set(got)
    named = [r.getMessage() for r in caplog.records if "mallory@elsewhere" in r.getMessage()]
    assert any(str(negate_pack) in m and "failed the audit" in m for m in named), named
    assert any(str(emb_pack) in m and "fixed_size_binary[8]" in m for m in named), named
    quarantined = list((root / ".memo" / ".quarantine").rglob("*.parquet"))  # moved aside, not deleted
    assert sorted(pack_record(pq.read_schema(p))["writer"]["user"] for p in quarantined) == ["mallory"] * 2
    assert all(pack_record(pq.read_schema(p))["writer"]["user"] != "mallory" for p in (negate_pack, emb_pack)
               if p.exists())  # the same rows, written again by this run


def _forge(stage_dir: Path, change) -> Path:
    """Rewrite the largest pack of a stage's namespace with `change`d values and a valid record of another writer."""
    import json

    from pipeline.engine.memo import FORMAT, RECORD, values_hash

    pack = max(stage_dir.glob("*/*.parquet"), key=lambda p: p.stat().st_size)
    table = change(pq.read_table(pack).replace_schema_metadata(None))
    values = table.drop_columns(["key"])
    record = {"format": FORMAT, "rows": table.num_rows, "values": values_hash(values),
              "writer": {"user": "mallory", "host": "elsewhere", "pid": 1, "time": "now", "code": "?"}}
    pq.write_table(table.replace_schema_metadata({RECORD: json.dumps(record)}), pack, write_page_checksum=True)
    return pack


def test_contramine_cache_shows_the_memo_per_stage_and_prunes_what_no_run_uses(tmp_path, capsys):
    import json

    from flows.cli import main as cli_main

    runs = tmp_path / "runs"
    used, unused = _memo(runs / ".memo", {"code": "used"}), _memo(runs / ".memo", {"code": "unused"})
    _rows(used, ["a", "b"], [])
    _rows(unused, ["c"], [])
    (runs / "r" / "t").mkdir(parents=True)
    (runs / "r" / "t" / "_manifest.json").write_text(json.dumps({"stage": "stage",
                                                                 "memo": {"upper": {"namespace": used.namespace}}}))
    assert cli_main(["cache", "--set", f"run.root={runs}"]) == 0
    out = capsys.readouterr().out
    assert f"row memo: {runs / '.memo'}" in out and "stage: 3 rows" in out
    assert used.namespace in out and unused.namespace in out
    assert cli_main(["cache", "--unreferenced", "--set", f"run.root={runs}"]) == 0
    assert f"removed {unused.dir}" in capsys.readouterr().out
    assert used.dir.is_dir() and not unused.dir.exists()


def test_an_edited_line_of_one_part_of_a_folder_corpus_recomputes_only_that_line(tmp_path, monkeypatch):
    """A corpus kept as a folder of parts (JSON Lines gzipped, Parquet, text): its identity covers every part, so
    one edited line reruns the `sentences` stage, and `embeddings` sends that one sentence to the encoder (the row
    memo's counts in the manifest), the rest from the memo; nothing edited, nothing recomputed."""
    import gzip
    import json

    from pipeline.config import configure
    from pipeline.engine.runner import run_stage
    from pipeline.engine.store import Store
    from pipeline.engine.tables import RunTables

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
