"""The row memo (pipeline/memo/rows.py): only rows with new keys reach a model, a damaged or replaced pack serves no
row, two writers share a namespace, prune, what a namespace holds (a stage's code and the settings that shape a row),
and `contramine cache`. The end-to-end runs with the real models: tests/test_row_memo_mining.py."""
from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contramine.pipeline.memo.rows import RowMemo, namespace_hash, row_key
from contramine.pipeline.memo.cache import prune
from contramine.pipeline.memo.run import memo_state, namespace_facts
from contramine.pipeline.engine.runner import load_stages

ROOT = Path(__file__).resolve().parent.parent
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
    from contramine.pipeline.config import configure

    return configure("default", "x", None, list(sets))


def _namespaces(cfg, root=None) -> dict[str, str]:
    from contramine.pipeline.memo import run as memo_run

    plan = {"encoder": {"model": "m", "device": "cpu"}, "spacy": {"model": "s"},
            "chains": {"device": "cpu", "dtype": None, "code": {}, "versions": "", "models": {}, "engines": {}}}
    out = {}
    original = memo_run.code_version  # the name the memo's namespace facts call
    try:
        if root is not None:
            memo_run.code_version = lambda module, r=root: original.__wrapped__(module, r)  # uncached
        for stage in load_stages().values():
            for spec in stage.memos:
                out[f"{stage.name}/{spec.name}"] = namespace_hash(namespace_facts(stage, spec, cfg, plan))
    finally:
        memo_run.code_version = original
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
    with open(copy / "models" / "encode" / "encoder.py", "a") as f:  # shared by the three stages that embed
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


def test_contramine_cache_shows_the_memo_per_stage_and_prunes_what_no_run_uses(tmp_path, capsys):
    import json

    from contramine.flows.cli import main as cli_main

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
