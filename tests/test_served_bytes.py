"""What is served is the bytes that were checked (issue 62, item 1; pipeline/storage/served.py): a shard renamed over
a checked one (valid Parquet, other rows, the same size) is not served, neither by a `sql` connection opened before
the swap nor by a pyarrow read whose check came before it; a connection opened after it refuses the table in one
line naming the file. The descriptors a connection holds go with it, and a process short of descriptors serves
the checked bytes from memory."""
from __future__ import annotations

import gc
import os
import pwd
import resource
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from contramine.flows.cli import main
from contramine.flows.sql import open_run
from contramine.pipeline.storage import served
from contramine.pipeline.storage.manifest import TableCorrupt
from contramine.pipeline.storage.store import Store
from contramine.pipeline.storage.tables import RunTables, TableUnreadable
from contramine.pipeline.storage.verify import Verified
from contramine.pipeline.schema import SCHEMAS
from test_bounded_reads import _entries, _forged_same_size
from test_manifest_shapes import _command, _mined

FIRST = "SELECT text FROM sentences ORDER BY sid LIMIT 1"


def _shard(run: Path, i: int = 0) -> Path:
    return run / "sentences" / _entries(run, "sentences")[i]["file"]


def _swap(shard: Path) -> None:
    """A forged shard renamed over `shard`, as anyone who may write its folder can: row 0's text is "forged"."""
    forged = _forged_same_size(shard)
    tmp = shard.with_name(".forged.tmp")
    tmp.write_bytes(forged)
    os.replace(tmp, shard)


def _swap_after_the_check(monkeypatch, shard: Path) -> None:
    """Swap right after the readers' check (Verified.save runs between the check and the read), once."""
    save, done = Verified.save, []

    def save_then_swap(self):
        save(self)
        if not done:
            done.append(shard)
            _swap(shard)
    monkeypatch.setattr(Verified, "save", save_then_swap)


def _shard_fds(run: Path) -> set[str]:
    """The shards of `run` this process holds open."""
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(run)) and ".parquet" in target:
            held.add(target)
    return held


def test_an_open_sql_connection_serves_the_checked_shard_after_a_swap_and_a_new_one_refuses_it(tmp_path, capsys):
    root = tmp_path / "runs"
    run = _mined(root)
    con, refused = open_run(run)  # what `contramine sql` opens
    original = con.sql(FIRST).fetchall()
    assert not refused and original != [("forged",)]
    shard = _shard(run)
    _swap(shard)
    assert con.sql(FIRST).fetchall() == original  # the same connection: the bytes it checked
    assert con.sql("SELECT count(*) FROM sentences").fetchall() == [(12,)]
    fresh, refused = open_run(run)
    assert f"shard {shard} is damaged" in refused["sentences"] and "\n" not in refused["sentences"]
    assert "sentences" not in {r[0] for r in fresh.sql("SELECT view_name FROM duckdb_views()").fetchall()}
    capsys.readouterr()
    assert main(_command("sql", root)) == 2
    err = capsys.readouterr().err
    assert f"{shard.name} is damaged" in err.strip().splitlines()[-1] and "Traceback" not in err


def test_a_swap_between_the_check_and_the_read_is_not_read(tmp_path, monkeypatch):
    run = _mined(tmp_path / "runs")
    want = RunTables(run).read("sentences")
    _swap_after_the_check(monkeypatch, _shard(run))
    assert RunTables(run).read("sentences").equals(want)
    with pytest.raises(TableUnreadable, match=f"{_shard(run).name} is damaged"):  # the next read checks again
        RunTables(run).read("sentences")


def test_a_shard_read_by_a_stage_is_the_one_checked(tmp_path, monkeypatch):
    run = _mined(tmp_path / "runs")
    want = Store(run).read_shard("sentences", 0, 2)
    _swap_after_the_check(monkeypatch, _shard(run))
    assert Store(run).read_shard("sentences", 0, 2).equals(want)
    with pytest.raises(TableCorrupt, match=f"{_shard(run).name} is damaged"):
        Store(run).read_shard("sentences", 0, 2)


def test_a_dataset_reads_the_files_it_checked_for_as_long_as_it_lives(tmp_path):
    """The trainer takes a dataset and reads it later: a swap in between is not what it reads."""
    run = _mined(tmp_path / "runs")
    dataset = RunTables(run).dataset("sentences")
    want = dataset.to_table()
    _swap(_shard(run))
    gc.collect()
    assert dataset.to_table().equals(want) and dataset.count_rows() == 12
    assert dataset.to_table(columns=["text"]).column("text")[0].as_py() != "forged"


def test_a_connection_holds_its_shards_until_it_goes_and_many_connections_leak_none(tmp_path):
    run = _mined(tmp_path / "runs")
    con = RunTables(run).connect(say=False)
    assert len(_shard_fds(run)) == 3  # sentences' two shards and triplets' one, open while the connection lives
    del con
    gc.collect()
    assert _shard_fds(run) == set()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(40):
        assert RunTables(run).connect(say=False).sql("SELECT count(*) FROM sentences").fetchall() == [(12,)]
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before and _shard_fds(run) == set()


def test_room_for_raises_the_soft_descriptor_limit_towards_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd"))
    if hard != resource.RLIM_INFINITY:
        assert hard >= in_use + 600, "this test needs a hard limit with room"  # (20,000 on the test machines)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 20, hard))
        assert served.room_for(400)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= in_use + 400
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_short_of_descriptors_the_checked_bytes_are_served_from_memory(tmp_path, monkeypatch):
    """Even the hard limit too small for every shard held open: each table is read shard by shard from its checked
    descriptor and served from memory; the same rows, and a swap after the check is not served either."""
    run = _mined(tmp_path / "runs")
    want = RunTables(run).read("sentences")
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    monkeypatch.setattr(served, "SPARE", 1 << 40)  # no hard limit leaves that many free
    try:
        assert RunTables(run).read("sentences").equals(want) and RunTables(run).dataset("sentences").count_rows() == 12
        con = RunTables(run).connect(say=False)
        original = con.sql(FIRST).fetchall()
        _swap(_shard(run))
        assert con.sql(FIRST).fetchall() == original
        assert con.sql("SELECT count(*) FROM sentences").fetchall() == [(12,)]
        assert {r[0] for r in con.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()
                } >= {"sentences", "triplets"}
        with pytest.raises(TableUnreadable, match=f"{_shard(run).name} is damaged"):
            RunTables(run).read("sentences")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)


def test_without_proc_pyarrow_reads_the_held_file_object(tmp_path, monkeypatch):
    """Where there is no /proc/self/fd (not Linux), pyarrow reads the checked descriptor through a file object."""
    run = _mined(tmp_path / "runs")
    want = RunTables(run).read("sentences")
    monkeypatch.setattr(served, "PROC", None)
    _swap_after_the_check(monkeypatch, _shard(run))
    assert RunTables(run).read("sentences").equals(want)


def test_embeddings_are_float_arrays_in_sql_whether_held_or_in_memory(tmp_path, monkeypatch):
    run = tmp_path / "r"
    vectors = np.arange(12, dtype=np.float32).reshape(4, 3)
    Store(run).write_table("embeddings", [pa.table({"sid": [1, 2, 3, 4], "emb": list(vectors)},
                                                   SCHEMAS["embeddings"])], key="k", manifest={"stage": "embeddings"})
    held = RunTables(run).connect(say=False).sql("SELECT typeof(emb), list_sum(emb::FLOAT[]) FROM embeddings "
                                                 "ORDER BY sid").fetchall()
    assert held == [("FLOAT[3]", float(v.sum())) for v in vectors]
    monkeypatch.setattr("contramine.pipeline.storage.tables.room_for", lambda n: False)
    assert RunTables(run).connect(say=False).sql("SELECT typeof(emb), list_sum(emb::FLOAT[]) FROM embeddings "
                                                 "ORDER BY sid").fetchall() == held


def test_a_cursor_or_a_database_file_never_reads_through_descriptors_it_does_not_hold(tmp_path):
    """The views are the connection's own (TEMP): a cursor of it, which outlives the connection object whose
    descriptors close when it goes, sees no view (it read another run's files through the reused descriptor
    numbers), and a database file given to `connect` keeps no view over this process' /proc/self/fd paths."""
    import duckdb

    run = _mined(tmp_path / "runs")
    cur = RunTables(run).connect(say=False).cursor()
    gc.collect()
    other = RunTables(_mined(tmp_path / "other")).connect(say=False)
    with pytest.raises(duckdb.CatalogException, match="sentences"):
        cur.sql(FIRST).fetchall()
    db = tmp_path / "x.duckdb"
    RunTables(run).connect(duckdb.connect(str(db)), say=False).close()
    assert duckdb.connect(str(db)).sql("SELECT count(*) FROM duckdb_views() WHERE NOT internal").fetchall() == [(0,)]
    assert other.sql("SELECT count(*) FROM sentences").fetchall() == [(12,)]


def test_an_open_sql_connection_never_answers_from_a_shard_rewritten_in_place(tmp_path, monkeypatch, capsys):
    """A rewrite of the very file (its owner made it writable; DuckDB reads the files again at every query): the
    query is one line, not the rewritten rows; and a shard others may write is refused, by `verify` too."""
    from contramine.flows import sql

    root = tmp_path / "runs"
    run = _mined(root)
    con, refused = open_run(run)
    shard = _shard(run)
    assert sql.run_query(con, FIRST, refused, 5) is None
    fd = next(fd for fd, path, *_ in served._HELD[con] if path == shard)  # a DuckDB error names the file, not the fd
    assert served.with_paths(con, f'Parquet file "{served.PROC}/{fd}"') == f'Parquet file "{shard}"'
    os.link(shard, tmp_path / "a-hard-link")  # moves its ctime alone (`--reuse-from`, a grace collection): the
    assert sql.run_query(con, FIRST, refused, 5) is None  # same bytes, hashed again, still answered
    (tmp_path / "a-hard-link").unlink()
    forged = _forged_same_size(shard)
    shard.chmod(0o644)
    shard.write_bytes(forged)  # the same inode
    capsys.readouterr()
    why = sql.run_query(con, FIRST, refused, 5)
    assert why is not None and f"{shard} changed since it was checked" in why and "forged" not in capsys.readouterr().out
    nobody = pwd.getpwnam("nobody").pw_uid
    shard.chmod(0o666)
    os.chown(shard, nobody, -1)  # another account's, that others may write: refused, by `verify` too
    assert main(_command("sql", root)) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{shard.name} is owned by uid {nobody}, not by the run folder's owner" in err, err
    assert main(["verify", "--run", "r", "--set", f"run.root={root}"]) == 2
    ours = run / "triplets" / _entries(run, "triplets")[0]["file"]
    ours.chmod(0o666)  # ours (a run mined before 0444 under a umask of 002): made read-only at its check, served
    assert RunTables(run).read("triplets").num_rows > 0 and (ours.stat().st_mode & 0o777) == 0o444


def test_another_accounts_files_in_our_run_and_relations_read_later(tmp_path):
    """A table folder others may write (made under a umask of 002) let another account rename its own 0444 shard
    and manifest over ours: refused, naming the owner. `open_run().sql()` reads its rows between two looks at the
    files (a lazy relation read a rewrite made after the call). A held file hard-linked twice still answers (its
    re-hash started at the end of the file, where the check's own hash had left the offset)."""
    import contramine
    from contramine.flows import sql

    root = tmp_path / "runs"
    run = _mined(root)
    con, refused = open_run(run)
    for i in range(2):
        os.link(_shard(run), tmp_path / f"link-{i}")
        assert sql.run_query(con, FIRST, refused, 5) is None, i
    handle = contramine.open_run("r", root=root)
    rel = handle.sql(FIRST)
    shard = _shard(run)
    forged = _forged_same_size(shard)
    shard.chmod(0o644)
    shard.write_bytes(forged)
    assert rel.fetchall() != [("forged",)]  # the rows read at the call
    with pytest.raises(Exception, match="changed since it was checked"):
        handle.sql(FIRST)
    nobody = pwd.getpwnam("nobody").pw_uid
    man = run / "triplets" / "_manifest.json"
    os.chown(man, nobody, -1)
    with pytest.raises(TableUnreadable, match=f"is owned by uid {nobody}, not by the run folder.s owner"):
        RunTables(run).read("triplets")
