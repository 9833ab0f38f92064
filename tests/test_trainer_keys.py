"""What ran is what is keyed: the trainer's resume key, compare's run key and compare's start.json name data by its
content (trainer/keys.py), never by a path, a file name or a size.

The mined tables here are written uncompressed, without dictionaries or statistics, so a text's bytes sit verbatim
in the Parquet file: swapping them for others of the same length rewrites a shard with other content under the same
name and size (the case a name-and-size key cannot see), and the file stays valid Parquet.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contramine.pipeline.config import load_config
from contramine.pipeline.storage.store import Store, file_hash
from contramine.pipeline.storage.tables import TableUnreadable
from contramine.pipeline.schema import SCHEMAS
from contramine.trainer import compare as cmp
from contramine.trainer.keys import fingerprint
from contramine.trainer.train import main, train
from train_helpers import read_metrics, sentences_rows, write_profile


# ------------------------------------------------------------------------------------------------ fixtures
def write_sidecar(part: Path, rows: int) -> None:
    """The sidecar Store.write_shard records beside a shard: what its writer wrote."""
    part.with_suffix(".json").write_text(json.dumps({"key": "test", "hash": file_hash(part), "rows": rows,
                                                     "seconds": 0.0}))


def write_plain_table(run: Path, name: str, rows: list[dict], parts: int = 2, sidecars: bool = False) -> list[Path]:
    d = run / name
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, idx in enumerate(np.array_split(np.arange(len(rows)), parts)):
        path = d / f"part-{i:05d}-of-{parts:05d}.parquet"
        pq.write_table(pa.Table.from_pylist([rows[j] for j in idx], schema=SCHEMAS[name]), path,
                       compression="none", use_dictionary=False, write_statistics=False)
        if sidecars:
            write_sidecar(path, len(idx))
        paths.append(path)
    (d / "_manifest.json").write_text(json.dumps({"shards": parts}))  # a commit naming its layout's part files
    return paths


def rewrite_in_place(part: Path, text: str) -> None:
    """Same name, same size, other content: `text` reversed where it sits in the file."""
    data, old, new = part.read_bytes(), text.encode(), text[::-1].encode()
    assert old != new and data.count(old) == 1
    part.write_bytes(data.replace(old, new))
    assert part.stat().st_size == len(data)
    assert text[::-1] in pq.read_table(part).column("text").to_pylist()  # still Parquet, with the new text


@pytest.fixture
def mined(tmp_path):
    """A run `r` with a `sentences` table, without sidecars (as a table written outside the pipeline)."""
    rows = sentences_rows(24)
    parts = write_plain_table(tmp_path / "r", "sentences", rows)
    return rows, parts


# ------------------------------------------------------------------------------------------------ mined tables
def test_data_key_is_the_tables_content_hash_and_a_damaged_shard_is_refused(tmp_path):
    from contramine.trainer.keys import TableDamaged

    rows = sentences_rows(20)
    parts = write_plain_table(tmp_path, "sentences", rows, sidecars=True)
    before = fingerprint(tmp_path, ("sentences",))
    assert before == [["sentences", Store(tmp_path).table_hash("sentences", 2)]]  # the pipeline's table hash
    rewrite_in_place(parts[0], rows[0]["text"])
    # bytes no stage recorded: refused, never keyed (the read's own check, pipeline/storage/verify.py, names the
    # shard before the trainer's TableDamaged would)
    with pytest.raises((TableDamaged, TableUnreadable), match=rf"{parts[0]} is damaged: its [\d,]+ bytes do not hash"):
        fingerprint(tmp_path, ("sentences",))
    write_sidecar(parts[0], 10)  # its stage wrote it again: the new bytes are on record
    after = fingerprint(tmp_path, ("sentences",))
    assert after != before and after == [["sentences", Store(tmp_path).table_hash("sentences", 2)]]


def test_resume_key_follows_the_shards_content_not_their_name_and_size(tmp_path, mined, bert, senteval, capsys):
    rows, parts = mined
    p = write_profile(tmp_path / "p.toml", tmp_path, "r", bert, senteval, max_steps=4, eval_every=2)
    train(load_config(str(p)))
    train(load_config(str(p)))
    assert "resumed at step 4" in capsys.readouterr().out  # the same bytes: resumed
    rewrite_in_place(parts[0], rows[0]["text"])
    res = train(load_config(str(p)))
    out = capsys.readouterr()
    assert "another configuration" in out.err and "resumed" not in out.out
    assert len([m for m in read_metrics(Path(res["metrics"])) if "loss" in m]) == 4  # trained again, from step 0


def test_trainer_refuses_a_shard_that_no_longer_matches_its_sidecar(tmp_path, bert, senteval, capsys):
    rows = sentences_rows(24)
    parts = write_plain_table(tmp_path / "r", "sentences", rows, sidecars=True)
    p = write_profile(tmp_path / "p.toml", tmp_path, "r", bert, senteval, max_steps=4, eval_every=2)
    train(load_config(str(p)))
    state = tmp_path / "r" / "train" / "simcse" / "last" / "state.pt"
    written = state.stat().st_mtime_ns
    rewrite_in_place(parts[1], rows[-1]["text"])
    assert main(["--profile", str(p)]) == 2
    err = capsys.readouterr().err
    assert f"{parts[1]} is damaged" in err and "contramine stage sentences" in err
    assert state.stat().st_mtime_ns == written  # nothing trained, nothing overwritten


def test_compare_run_key_follows_the_tables_content(tmp_path, mined, bert, senteval):
    rows, parts = mined
    p = str(write_profile(tmp_path / "p.toml", tmp_path, "r", bert, senteval))
    key = cmp.run_key(load_config(p))
    assert cmp.run_key(load_config(p)) == key
    rewrite_in_place(parts[0], rows[0]["text"])
    assert cmp.run_key(load_config(p)) != key


# ------------------------------------------------------------------------------------------------ evaluation data
def test_eval_data_hash_is_content_not_path(tmp_path, senteval):
    from contramine.trainer.keys import eval_data_hash

    copy = shutil.copytree(senteval, tmp_path / "copy")
    assert eval_data_hash(copy) == eval_data_hash(senteval)  # a copied folder: the same data
    dev = eval_data_hash(copy, dev_only=True)
    gold = copy / "STS" / "STS12-en-test" / "STS.gs.news.txt"
    gold.write_text("4.999\n" + "".join(gold.read_text().splitlines(keepends=True)[1:]))
    assert eval_data_hash(copy) != eval_data_hash(senteval)
    assert eval_data_hash(copy, dev_only=True) == dev  # a test file does not pick best/
    (copy / "STS" / "STSBenchmark" / "sts-dev.csv").write_text("")
    assert eval_data_hash(copy, dev_only=True) != dev
    probe = tmp_path / "probe.tsv"
    probe.write_text("kind\tsentence\nanchor\ta cat\n")
    assert eval_data_hash(copy, probe) != eval_data_hash(copy)


def test_start_json_is_reused_only_for_the_same_weights_settings_data_and_code(tmp_path, mined, bert, senteval,
                                                                              monkeypatch):
    data = shutil.copytree(senteval, tmp_path / "senteval")  # edited below: not the module's folder
    profile = str(write_profile(tmp_path / "cmp.toml", tmp_path, "r", bert, data, eval_every=1))
    starts = []
    real = cmp.evaluate_checkpoint

    def counting(model, cfg):
        if not model.endswith("best"):  # the start model, not a run's best/
            starts.append(model)
        return real(model, cfg)

    monkeypatch.setattr(cmp, "evaluate_checkpoint", counting)
    start_json = tmp_path / "r" / "compare" / "start.json"

    def run(*sets: str) -> int:
        cmp.compare(profile, None, ["compare.steps=1", "compare.bootstrap=50", *sets], ["simcse"], 1)
        return len(starts)

    assert run() == 1
    assert run() == 1  # nothing changed: reused
    assert run("train.pooler=mean") == 2  # the same weights under another pooler: another start
    assert json.loads(start_json.read_text())["results"]["pooler"] == "mean"
    assert run("train.pooler=mean") == 2
    gold = data / "STS" / "STS12-en-test" / "STS.gs.news.txt"
    gold.write_text("4.999\n" + "".join(gold.read_text().splitlines(keepends=True)[1:]))  # same path, other data
    assert run("train.pooler=mean") == 3
    assert run("train.pooler=mean") == 3
    import contramine.trainer.keys

    monkeypatch.setattr(contramine.trainer.keys, "eval_code_version", lambda: "other evaluation code")
    assert run("train.pooler=mean") == 4
