"""`make mine FROM=<run>` (`--reuse-from`, pipeline/engine/tables.py: reuse_tables): a new run starts from another
run's finished tables, linked not copied, never over its own; a missing or same source is one line."""
from __future__ import annotations

import json

import pytest

from flows.cli import main as cli_main
from pipeline.engine.tables import TableMissing, reuse_tables


def _table(run, name, payload=b"shard"):
    (run / name).mkdir(parents=True)
    (run / name / "part-00000-of-00001.parquet").write_bytes(payload)
    (run / name / "_manifest.json").write_text(json.dumps({"shards": 1}))


def test_reuse_brings_finished_tables_as_links_and_never_replaces_the_runs_own(tmp_path):
    src, dst = tmp_path / "default", tmp_path / "other"
    for name in ("sentences", "embeddings", "pairs"):
        _table(src, name)
    (src / "train" / "simcse").mkdir(parents=True)  # not a table: no manifest
    (src / "half").mkdir()  # a table a killed stage left unfinished: no manifest either
    _table(dst, "embeddings", b"mine")
    assert reuse_tables(src, dst) == ["sentences", "pairs"]
    shard = "sentences/part-00000-of-00001.parquet"
    assert (dst / shard).stat().st_ino == (src / shard).stat().st_ino  # a hard link: no second copy on disk
    assert (dst / "embeddings" / "part-00000-of-00001.parquet").read_bytes() == b"mine"
    assert not (dst / "train").exists() and not (dst / "half").exists()
    assert [p.name for p in dst.iterdir() if p.name.startswith(".")] == [".lock"]  # no temporary folder left behind
    assert reuse_tables(src, dst) == []  # again: nothing new
    with pytest.raises(TableMissing, match="this run's own folder"):
        reuse_tables(src, src)
    with pytest.raises(TableMissing, match=r"nope/ holds no finished table"):
        reuse_tables(tmp_path / "nope", dst)


def test_mine_from_a_run_that_does_not_exist_is_one_line_and_mines_nothing(tmp_path, capsys, small_corpus):
    code = cli_main(["mine", "--run", "new", "--reuse-from", "nope", "--corpus", str(small_corpus),
                     "--set", f"run.root={tmp_path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: --reuse-from: ") and "nope/ holds no finished table" in err[-1]
    assert not (tmp_path / "new").exists() or not any((tmp_path / "new").iterdir())
