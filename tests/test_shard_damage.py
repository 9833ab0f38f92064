"""Every read checks what it reads (pipeline/storage/verify.py): a flipped byte or a truncation in any shard of any
table is never served as data. `sql`, `report`, `train`, `export`, a stage reading it and `contramine verify` each
stop in one line naming the shard and the command that rewrites it; `sql` serves the other tables; a rewrite of
the table repairs it; a warm check is remembered by inode, size and mtime."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow as pa
import pytest

from contramine.pipeline.storage.manifest import MANIFEST, TableCorrupt
from contramine.pipeline.storage.store import Store
from contramine.pipeline.storage.tables import RunTables, TableUnreadable
from contramine.pipeline.storage.verify import CACHE
from contramine.pipeline.schema import SCHEMAS
from test_manifest_shapes import TABLE_OF, _command, _mined


def _shard(run: Path, table: str, i: int = 0) -> Path:
    return run / table / json.loads((run / table / MANIFEST).read_text())["files"][i]["file"]


def _damage(path: Path, how: str, at: int | None = None) -> bytes:
    """Flip one byte (in the middle of the file, or `at`) in place, as a bad disk would, or cut the file's tail;
    the old bytes."""
    old = path.read_bytes()
    if how == "flip":
        at = len(old) // 2 if at is None else at
        with open(path, "r+b") as f:
            f.seek(at)
            f.write(bytes([old[at] ^ 0x01]))
    else:
        with open(path, "r+b") as f:
            f.truncate(len(old) - 7)
    return old


def _restore(path: Path, old: bytes) -> None:
    with open(path, "r+b") as f:
        f.write(old)
        f.truncate(len(old))


@pytest.mark.parametrize("how", ["flip", "truncate"])
@pytest.mark.parametrize("cmd", ["sql", "report", "train", "export", "verify"])
def test_each_command_stops_in_one_line_naming_the_damaged_shard(tmp_path, capsys, cmd, how):
    from contramine.flows.cli import main

    root = tmp_path / "runs"
    run = _mined(root)
    assert main(_command("sql", root)) == 0  # a warm check remembered: the damage below must still be seen
    capsys.readouterr()
    table = TABLE_OF.get(cmd, "triplets")
    shard = _shard(run, table, 0)
    _damage(shard, how)
    args = _command(cmd, root) if cmd != "verify" else ["verify", "--run", "r", "--set", f"run.root={root}"]
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 2, (cmd, how, out, err)
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err
    if cmd == "verify":  # every damaged file on its own line, then the one error
        assert len([line for line in out.splitlines() if line.startswith("damaged: ")]) == 1, out
        assert str(shard) in out and f"contramine stage {table} --run r --force" in out
        assert last.startswith("error: verify: 1 damaged")
        return
    assert last.startswith(f"error: table `{table}` of run 'r': shard {shard} is damaged"), last
    assert last.endswith(f"rewrite it with `contramine stage {table} --run r --force`"), last
    assert not (run / "export" / "osscse-triplet").exists()  # nothing exported of it


def test_sql_serves_the_other_tables_and_never_the_damaged_one(tmp_path, capsys):
    from contramine.flows.cli import main

    root = tmp_path / "runs"
    run = _mined(root)
    shard = _shard(run, "triplets")
    _damage(shard, "flip")
    assert main(_command("sql", root)) == 0  # the query reads sentences: answered
    out, err = capsys.readouterr()
    assert "12" in out and err.startswith("warning: table `triplets` of run 'r': shard ") and err.count("\n") == 1
    assert main(["sql", "--run", "r", "--query", "SELECT count(*) FROM triplets", "--set", f"run.root={root}"]) == 2
    assert "is damaged" in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_rewrite_repairs_and_a_stage_reading_it_stops_in_one_line(tmp_path):
    run = _mined(tmp_path / "runs")
    shard = _shard(run, "sentences", 1)
    old = _damage(shard, "truncate")
    store = Store(run)
    with pytest.raises(TableCorrupt, match=rf"shard {shard} is damaged.*contramine stage sentences --run r --force"):
        store.read_shard("sentences", 1, 2)  # what a stage reading its input does
    # the shard cache never reuses it: a rerun under the same key computes the shard again
    assert store.cached_shard("sentences", 1, 2, "k1") is None
    _restore(shard, old)
    assert store.cached_shard("sentences", 1, 2, "k1") is not None
    _damage(shard, "flip")
    from train_helpers import sentences_rows

    sents = sentences_rows(12)
    store.write_table("sentences", [pa.Table.from_pylist(sents[:6], SCHEMAS["sentences"]),
                                    pa.Table.from_pylist(sents[6:], SCHEMAS["sentences"])], key="k1",
                      manifest={"stage": "sentences"})
    assert RunTables(run).read("sentences").num_rows == 12  # the rewrite (same key, same bytes) is served


def test_a_warm_check_is_remembered_and_a_changed_file_checked_again(tmp_path):
    run = _mined(tmp_path / "runs")
    seen = json.loads((run / CACHE).read_text())  # the commit checked and remembered what it lists
    assert sorted(seen) == sorted([f"sentences/{_shard(run, 'sentences', i).name}" for i in range(2)]
                                  + [f"triplets/{_shard(run, 'triplets').name}"])
    calls = []
    import contramine.pipeline.storage.verify as verify_mod

    real = verify_mod.content_hash
    verify_mod.content_hash = lambda f: calls.append(f) or real(f)
    try:
        RunTables(run).files("sentences")
        assert calls == []  # warm: nothing hashed
        shard = _shard(run, "sentences", 0)
        data = shard.read_bytes()
        os.utime(shard, ns=(time.time_ns(), time.time_ns()))  # same bytes, new mtime: hashed again, still good
        RunTables(run).files("sentences")
        assert len(calls) == 1
        # a byte of a data page flipped with the mtime put back: the size and inode match what was remembered, and
        # the Parquet page checksums (the second line) catch it
        import pyarrow.parquet as pq

        col = pq.ParquetFile(shard).metadata.row_group(0).column(1)
        st = shard.stat()
        _damage(shard, "flip", (col.dictionary_page_offset or col.data_page_offset) + col.total_compressed_size - 1)
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
        with pytest.raises(TableUnreadable, match="cannot be read|damaged"):
            RunTables(run).read("sentences")
        shard.write_bytes(data)
    finally:
        verify_mod.content_hash = real


@pytest.fixture
def read_only_root(tmp_path):
    """A runs root holding run `r`, then made read-only: by its mode for a user, by a read-only bind mount for root
    (whom modes do not stop); skipped only where root may not mount."""
    import subprocess

    src = tmp_path / "runs"
    run = _mined(src)
    (run / CACHE).unlink()  # what the commits remembered: the read-only run's readers hash and cannot remember
    if os.geteuid() != 0:
        for p in [run, *run.rglob("*")]:
            if p.is_dir():
                os.chmod(p, 0o555)
        yield src
        for p in [run, *run.rglob("*")]:
            if p.is_dir():
                os.chmod(p, 0o755)
        return
    view = tmp_path / "ro"
    view.mkdir()
    if subprocess.run(["mount", "--bind", str(src), str(view)], capture_output=True).returncode != 0:
        pytest.skip("root without the right to mount: no read-only folder to test with")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], check=True, capture_output=True)
        yield view
    finally:
        subprocess.run(["umount", str(view)], capture_output=True)


def test_a_read_only_run_is_read_by_sql_and_verify_and_refused_in_one_line_by_writers(read_only_root, capsys):
    from contramine.flows.cli import main

    run = read_only_root / "r"
    assert RunTables(run).read("triplets").num_rows == 12 and not (run / CACHE).exists()  # checked, not remembered
    assert main(_command("sql", read_only_root)) == 0
    assert main(["verify", "--run", "r", "--set", f"run.root={read_only_root}"]) == 0
    capsys.readouterr()
    for cmd in ("report", "export", "train"):
        assert main(_command(cmd, read_only_root)) == 2, cmd
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]
        assert "Traceback" not in err and last.startswith(f"error: {cmd}: "), err
        assert "read-only" in last and "`sql` and `verify`" in last


def test_sql_names_no_stage_for_a_stray_folder(tmp_path, capsys):
    """A folder of the run that no stage writes (here with an empty manifest): `sql` leaves it out in one line that
    suggests no `contramine stage foo` (there is no such stage) and serves the tables."""
    from contramine.flows.cli import main

    root = tmp_path / "runs"
    run = _mined(root)
    (run / "foo").mkdir()
    (run / "foo" / MANIFEST).write_text(json.dumps({"files": []}))
    assert main(_command("sql", root)) == 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no stage writes `foo`" in err and "stage foo" not in err, err


def test_a_stage_whose_input_is_damaged_is_refused_in_one_line_before_it_runs(tmp_path, capsys):
    """`contramine stage embeddings` on a run whose `sentences` shard lost its tail: exit 2, one line naming that
    shard and the stage run that rewrites it; nothing is computed from it."""
    from contramine.flows.cli import main

    root = tmp_path / "runs"
    run = _mined(root)
    shard = _shard(run, "sentences", 1)
    _damage(shard, "truncate")
    code = main(["stage", "embeddings", "--run", "r", "--set", f"run.root={root}", "run.shards=2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith(f"error: table `sentences` of run 'r': shard {shard} is missing or changed"), last
    assert last.endswith("rewrite it with `contramine stage sentences --run r --force`")
    assert not (run / "embeddings").exists()


def test_verify_with_memo_checks_the_memo_too(tmp_path, capsys):
    """`contramine verify --memo`: the run's shards, then every pack of the row memo (here none), exit 0."""
    from contramine.flows.cli import main

    root = tmp_path / "runs"
    _mined(root)
    assert main(["verify", "--run", "r", "--memo", "--set", f"run.root={root}"]) == 0
    out = capsys.readouterr().out
    assert "run 'r': 3 shard(s) of 2 table(s) checked, none damaged" in out and "0 packs verified" in out


def test_a_stage_reading_some_columns_gets_them_and_the_whole_file_is_still_checked(tmp_path):
    """`Ctx.shard(table, columns)` (pairs reads 5 of candidates' 13 columns): those of them the file has, equal to
    the whole read's; a damaged byte anywhere in the file, in a column not read too, is still refused."""
    store = Store(tmp_path / "run")
    table = pa.table({"sid": pa.array([1, 2, 3], pa.int64()), "text": ["a b", "c d", "e f"],
                      "mer": [0.2, 0.3, 0.4], "chain": ["x", "y", "z"]}, schema=SCHEMAS["paraphrases"])
    store.write_table("paraphrases", [table], key="k")
    some = store.read_shard("paraphrases", 0, 1, ("chain", "sid", "not-in-this-file"))
    assert some.column_names == ["chain", "sid"]  # in the order asked; a name the file lacks is left out
    assert some.equals(store.read_shard("paraphrases", 0, 1).select(["chain", "sid"]))
    _damage(_shard(tmp_path / "run", "paraphrases"), "flip", at=8)
    with pytest.raises(TableCorrupt):
        Store(tmp_path / "run").read_shard("paraphrases", 0, 1, ("sid",))


def test_a_table_the_run_never_mined_is_its_own_line_with_no_remove(tmp_path):
    """A table the run has no folder of (a mine `--for osscse` writes no `pairs`): reading it says which stage run
    brings it, not "remove <folder> or write it again" (there is nothing to remove)."""
    from contramine.pipeline.storage.tables import TableMissing

    run = _mined(tmp_path / "runs")
    assert not (run / "pairs").exists()
    with pytest.raises(TableMissing) as e:
        RunTables(run).read("pairs")
    assert "not found" in str(e.value) and "remove" not in str(e.value), str(e.value)
