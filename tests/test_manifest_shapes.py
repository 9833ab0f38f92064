"""A manifest is data (pipeline/storage/store.py: check_manifest): a wrong shape, a file listed twice, a name
outside the part pattern or a shard count no folder holds is one line naming the table, its run and the command
that rewrites it, for every reader: `make sql`, `make report`, `make train`, `make export`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from contramine.pipeline.storage.manifest import MANIFEST, TableCorrupt, check_manifest, committed_files
from contramine.pipeline.storage.store import Store
from contramine.pipeline.storage.tables import RunTables, TableUnreadable
from contramine.pipeline.errors import ExpectedError
from contramine.pipeline.schema import SCHEMAS
from child_env import CHILD_PYTHONPATH

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def stages_loaded():
    """As in every command that runs stages: discovery has told the store which stage writes which table."""
    from contramine.pipeline.engine.runner import load_stages

    load_stages()


def test_without_the_stages_loaded_the_manifest_names_its_own_writer(tmp_path, monkeypatch):
    """The store never imports the stages (they sit above it): a process that has not loaded them (`contramine sql`)
    takes the writer from the manifest itself, or says which stage to rerun without naming one."""
    from contramine.pipeline.storage import verify

    monkeypatch.setattr(verify, "WRITERS", {})
    table = tmp_path / "myrun" / "sentences"
    table.mkdir(parents=True)
    (table / MANIFEST).write_text(json.dumps({**GOOD, "files": 5}))
    with pytest.raises(TableCorrupt, match=r"rewrite it with `contramine stage sentences --run myrun --force`$"):
        committed_files(table)
    (table / MANIFEST).write_text("{not json")
    with pytest.raises(TableCorrupt, match=r"remove .*sentences or write it again with the stage that writes `sent"):
        committed_files(table)
PART0 = "part-00000-of-00002.0123456789abcdef.parquet"
PART1 = "part-00001-of-00002.0123456789abcdef.parquet"


def _entry(name: str, **extra) -> dict:
    return {"file": name, "hash": "ab" * 16, "rows": 3, "seconds": 0.5, **extra}


GOOD = {"stage": "sentences", "table": "sentences", "config": {}, "rows": {"sentences": 6}, "shards": 2,
        "files": [_entry(PART0), _entry(PART1)]}

# (what is wrong, the manifest, words of the one line)
BAD = [
    ("a list", [], "not a JSON object"),
    ("a number", 5, "not a JSON object"),
    ("null", None, "not a JSON object"),
    ("files a number", {"files": 5}, "files = 5, not a list"),
    ("files null", {"files": None}, "files = null, not a list"),
    ("files a string", {"files": "part-00000-of-00001.parquet"}, "not a list"),
    ("an entry a number", {"files": [5]}, "lists 5 at position 0"),
    ("a file name a number", {"files": [{"file": 5}]}, "lists file = 5 at position 0, not a string"),
    ("a name outside the folder", {"files": [_entry("../x/" + PART0)]}, "not a shard file name"),
    ("a name ending in a newline", {"files": [_entry("part-00000-of-00001.parquet\n")]}, "not a shard file name"),
    ("a name with a suffix", {"files": [_entry("part-00000-of-00001.parquet.x")]}, "not a shard file name"),
    ("a file listed twice", {"files": [_entry(PART0), _entry(PART0)]}, "twice"),
    ("out of order", {"files": [_entry(PART1), _entry(PART0)]}, "at position 0 of 2"),
    ("another layout's name", {"files": [_entry(PART0)]}, "at position 0 of 1"),
    ("shards not the list's length", {**GOOD, "shards": 3}, "shards = 3 but lists 2 files"),
    ("shards a string with files", {**GOOD, "shards": "2"}, "shards = \"2\""),
    ("rows of an entry a string", {"files": [_entry(PART0, rows="x"), _entry(PART1)]}, "rows = \"x\""),
    ("hash a number", {"files": [_entry(PART0, hash=5), _entry(PART1)]}, "hash = 5"),
    ("shards a string", {"shards": "x"}, "shards = \"x\""),
    ("shards null", {"shards": None}, "shards = null"),
    ("no shards, no files", {}, "shards = null"),
    ("shards true", {"shards": True}, "shards = true"),
    ("shards negative", {"shards": -1}, "shards = -1"),
    ("shards absurd", {"shards": 1_000_000}, "shards = 1000000"),
    ("shards more than the folder holds", {"shards": 50_000}, "names 50,000 shards (no file list) and its folder "
                                                              "holds 0"),
    ("config a list", {**GOOD, "config": []}, "config = [], not a JSON object"),
    ("rows a list", {**GOOD, "rows": [1]}, "rows = [1]"),
    ("rows of a table a string", {**GOOD, "rows": {"sentences": "6"}}, "rows['sentences'] = \"6\""),
    ("stage a number", {**GOOD, "stage": 5}, "stage = 5, not a string"),
    ("seconds a string", {**GOOD, "seconds": "1"}, "seconds = \"1\", not a number"),
    ("too many files", {"files": [_entry(f"part-{i % 99999:05d}-of-99999.parquet") for i in range(100_000)]},
     "more than a part name can number"),
]


@pytest.mark.parametrize("why,manifest,words", BAD, ids=[b[0] for b in BAD])
def test_every_wrong_shape_is_one_line_naming_the_table_its_run_and_the_rewrite(tmp_path, why, manifest, words):
    table = tmp_path / "myrun" / "sentences"
    table.mkdir(parents=True)
    (table / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(TableCorrupt) as e:  # an absurd count is refused by its bound, before any name is built
        committed_files(table)
    line = str(e.value)
    assert isinstance(e.value, ExpectedError) and "\n" not in line
    assert words in line, line
    assert line.startswith("table `sentences` of run 'myrun': ") and str(table / MANIFEST) in line
    assert line.endswith("rewrite it with `contramine stage sentences --run myrun --force`")
    with pytest.raises(TableUnreadable, match="contramine stage sentences --run myrun --force"):
        RunTables(tmp_path / "myrun").read("sentences")


def test_good_shapes_pass_and_a_table_no_stage_writes_names_its_folder(tmp_path):
    table = tmp_path / "r" / "sentences"
    table.mkdir(parents=True)
    check_manifest(table, GOOD)
    check_manifest(table, {"files": []})  # a commit of zero shards
    check_manifest(table, {"shards": 0})
    for i in range(3):
        (table / f"part-{i:05d}-of-00003.parquet").write_bytes(b"")
    check_manifest(table, {"shards": 3, "extra_field": [1, 2], "config": None})  # old layout, unknown fields
    mine = tmp_path / "r" / "my_own_table"
    mine.mkdir()
    (mine / MANIFEST).write_text("{not json")
    with pytest.raises(TableCorrupt, match=r"invalid JSON\): no stage writes `my_own_table`: remove .*my_own_table"):
        committed_files(mine)


# ---- every reader, end to end ---------------------------------------------------------------------------------
def _mined(root: Path) -> Path:
    """A run with the tables sql, report, train (simcse: sentences) and export (triplet: triplets) read."""
    from train_helpers import sentences_rows

    run = root / "r"
    store = Store(run)
    sents = sentences_rows(12)
    store.write_table("sentences", [pa.Table.from_pylist(sents[:6], SCHEMAS["sentences"]),
                                    pa.Table.from_pylist(sents[6:], SCHEMAS["sentences"])], key="k1",
                      manifest={"stage": "sentences"})
    trip = [{"sid": r["sid"], "anchor": r["text"], "paraphrase": r["text"] + " again", "negation": "not " + r["text"],
             "para_mer": 0.3, "para_chain": "de"} for r in sents]
    store.write_table("triplets", [pa.Table.from_pylist(trip, SCHEMAS["triplets"])], key="k2",
                      manifest={"stage": "triplets"})
    return run


def _break(run: Path, table: str, how: str) -> None:
    path = run / table / MANIFEST
    man = json.loads(path.read_text())
    if how == "files a number":
        man["files"] = 5
    elif how == "listed twice":
        man["files"] = [man["files"][0], man["files"][0]]
    elif how == "a newline in a name":
        man["files"][0]["file"] += "\n"
    elif how == "absurd old layout":
        man = {"stage": man["stage"], "shards": 1_000_000}
    elif how == "shards a string":
        man = {"stage": man["stage"], "shards": "x"}
    path.write_text(json.dumps(man))


def _command(cmd: str, root: Path) -> list[str]:
    sets = ["--set", f"run.root={root}"]
    return {"sql": ["sql", "--run", "r", "--query", "SELECT count(*) FROM sentences", *sets],
            "report": ["report", "--run", "r", *sets],
            "train": ["train", "--run", "r", "--objective", "simcse", *sets],
            "export": ["export", "--run", "r", "--format", "osscse-triplet", *sets]}[cmd]


SHAPES = ["files a number", "listed twice", "a newline in a name", "absurd old layout", "shards a string"]
TABLE_OF = {"sql": "sentences", "report": "sentences", "train": "sentences", "export": "triplets"}


@pytest.mark.parametrize("cmd", ["sql", "report", "train", "export"])
def test_each_command_says_one_line_for_each_malformed_manifest(tmp_path, capsys, cmd):
    """In process, every shape for each command: exit 2, the last stderr line is the one error, no traceback."""
    from contramine.flows.cli import main

    root = tmp_path / "runs"
    run = _mined(root)
    good = (run / TABLE_OF[cmd] / MANIFEST).read_text()
    for how in SHAPES:
        _break(run, TABLE_OF[cmd], how)
        code = main(_command(cmd, root))
        err = capsys.readouterr().err
        assert code == 2, (cmd, how, err)
        last = err.strip().splitlines()[-1]
        assert last.startswith("error: table `" + TABLE_OF[cmd] + "` of run 'r': "), (cmd, how, err)
        assert f"contramine stage {'sentences' if cmd != 'export' else 'triplets'} --run r --force" in last
        assert "Traceback" not in err
        (run / TABLE_OF[cmd] / MANIFEST).write_text(good)
    assert not (run / "export" / "osscse-triplet").exists()  # nothing half-written


def test_the_commands_themselves_one_process_each(tmp_path):
    """`python -m contramine.flows.cli <cmd>` (what make runs): exit 2 and exactly one stderr line, for one shape each."""
    root = tmp_path / "runs"
    run = _mined(root)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": CHILD_PYTHONPATH}
    for cmd, how in zip(["sql", "report", "train", "export"], ["listed twice", "absurd old layout",
                                                               "a newline in a name", "files a number"]):
        table = TABLE_OF[cmd]
        good = (run / table / MANIFEST).read_text()
        _break(run, table, how)
        p = subprocess.run([sys.executable, "-m", "contramine.flows.cli", *_command(cmd, root)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, (cmd, p.stderr)
        assert p.stderr.startswith(f"error: table `{table}` of run 'r': "), p.stderr
        (run / table / MANIFEST).write_text(good)


def test_sql_serves_the_other_tables_and_names_the_refused_one_once(tmp_path, capsys):
    from contramine.flows.cli import main

    root = tmp_path / "runs"
    run = _mined(root)
    _break(run, "triplets", "listed twice")
    assert main(_command("sql", root)) == 0  # the query reads sentences only
    out, err = capsys.readouterr()
    assert "12" in out
    assert err.strip().splitlines() == [err.strip()] and err.startswith("warning: table `triplets` of run 'r': ")
    assert main(["sql", "--run", "r", "--query", "SELECT * FROM nope", "--set", f"run.root={root}"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: sql: Catalog Error")
