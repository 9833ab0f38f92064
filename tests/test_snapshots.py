"""A table is one computation or none (pipeline/storage/store.py, tables.py, lock.py): a rerun killed after some of
its shards leaves the previous computation readable whole in every reader, and the next run finishes it, reusing what
the killed one wrote; one writer per run folder; a folder name is never SQL; a manifest names only its own shards.
(The same kill on the real Dask cluster: tests/test_cluster.py.)"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contramine.flows.cli import main as cli_main
from contramine.pipeline.storage.lock import RunBusy, run_lock
from contramine.pipeline.storage.store import Store
from contramine.pipeline.storage.tables import RunTables, TableUnreadable

from hostile import plain_rows, wiki_lines, write_corpus
from mining_helpers import ROOT, SMALL, TABLES, _cli_env, _mine, _tables
from child_env import CHILD_PYTHONPATH

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("c") / "c.txt", plain_rows(wiki_lines(24)))


@pytest.fixture(scope="module")
def mean_run(corpus, tmp_path_factory):
    """A finished run (pooler mean), its tables as every reader returns them."""
    cfg = _mine(corpus, tmp_path_factory.mktemp("mean"), "r")
    return cfg, _tables(cfg.run.dir)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _start(cmd_args: list[str], root: Path, tmp: Path, pause_at: str = "", name: str = "r"):
    marker = tmp / f"paused-{time.monotonic_ns()}"
    env = _cli_env(CONTRAMINE_PAUSE_AT=pause_at, CONTRAMINE_PAUSE_MARKER=str(marker))
    cmd = [sys.executable, str(ROOT / "tests" / "hostile.py"), *cmd_args, "--run", name, "--set", *SMALL,
           f"run.root={root}"]
    log = open(tmp / f"{name}-{time.monotonic_ns()}.log", "wb")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT), marker, log.name


def _wait_paused(proc, marker: Path, log: str, timeout: float = 300) -> None:
    t0 = time.monotonic()
    while not marker.exists():
        assert proc.poll() is None, f"exited ({proc.returncode}) before its pause point:\n" + \
            Path(log).read_text(errors="replace")[-3000:]
        assert time.monotonic() - t0 < timeout, "pause point not reached"
        time.sleep(0.02)


def test_a_rerun_killed_after_a_shard_leaves_the_old_table_whole_then_finishes(mean_run, corpus, tmp_path):
    """The issue's case: embeddings finished with pooler mean, a rerun with pooler cls killed with SIGKILL after its
    first shard (one job at a time: shard 0 is written before shard 1 starts). Every reader serves the mean table
    whole; the next run reuses the cls shard the killed one wrote."""
    cfg, want = mean_run
    root = tmp_path / "runs"
    run_dir = _copy(cfg.run.dir, root / "r")
    old_manifest = Store(run_dir).manifest("embeddings")
    proc, marker, log = _start(["stage", "embeddings", "--corpus", str(corpus), "--set", "encoder.pooler=cls",
                                "runner.workers=1"],
                               root, tmp_path, pause_at="compute:embeddings:1")
    _wait_paused(proc, marker, log)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = Store(run_dir)
    new_files = {p.name for p in (run_dir / "embeddings").glob("part-*.parquet")} - \
        {e["file"] for e in old_manifest["files"]}
    assert len(new_files) == 1 and next(iter(new_files)).startswith("part-00000-of-00002.")  # cls shard 0, on disk

    # readers: the tables API (make train, make export, make report), DuckDB views (make sql), the trainer's key
    assert store.manifest("embeddings") == old_manifest
    assert RunTables(run_dir).read("embeddings").equals(want["embeddings"])
    from contramine.flows.sql import connect
    from contramine.trainer.keys import table_hash

    con = connect(run_dir)
    assert con.sql("SELECT count(*) FROM embeddings").fetchall()[0][0] == want["embeddings"].num_rows
    assert con.sql("SELECT list_sum(emb) FROM embeddings ORDER BY sid").fetchall() == \
        RunTables(Path(cfg.run.dir)).connect().sql("SELECT list_sum(emb) FROM embeddings ORDER BY sid").fetchall()
    assert table_hash(run_dir, "embeddings") == table_hash(cfg.run.dir, "embeddings")

    # the next run finishes the rerun: shard 0 reused from the killed run, shard 1 computed; nothing else listed
    assert cli_main(["stage", "embeddings", "--run", "r", "--corpus", str(corpus), "--set", *SMALL,
                     f"run.root={root}", "encoder.pooler=cls"]) == 0
    man = Store(run_dir).manifest("embeddings")
    assert (man["shards_computed"], man["shards_cached"]) == (1, 1)
    assert man["files"][0]["file"] in new_files
    # on disk: the new list, and the mean shards it replaced, kept runner.keep_replaced_s for readers that listed
    # them (pipeline/storage/grace.py); nothing else
    sides = {Path(e["file"]).with_suffix(".json").name for e in man["files"] + old_manifest["files"]}
    assert {p.name for p in (run_dir / "embeddings").glob("part-*")} == \
        {e["file"] for e in man["files"] + old_manifest["files"]} | sides
    assert sorted(json.loads((run_dir / "embeddings" / ".replaced.json").read_text())) == \
        sorted(e["file"] for e in old_manifest["files"])
    cls = RunTables(run_dir).read("embeddings")
    assert cls.num_rows == want["embeddings"].num_rows and not cls.equals(want["embeddings"])


def test_a_second_writer_stops_at_once_naming_the_first_and_a_killed_ones_lock_never_blocks(mean_run, corpus,
                                                                                              tmp_path, capsys):
    cfg, want = mean_run
    root = tmp_path / "runs"
    # the finished run without its `embeddings`: the first writer holds the lock while it computes them again, and
    # the run after the kill recomputes only them (same bytes, so every stage after them is reused)
    shutil.rmtree(_copy(cfg.run.dir, root / "r") / "embeddings")
    proc, marker, log = _start(["mine", "--corpus", str(corpus)], root, tmp_path, pause_at="compute:embeddings:0")
    _wait_paused(proc, marker, log)
    t0 = time.monotonic()
    code = cli_main(["mine", "--run", "r", "--corpus", str(corpus), "--set", *SMALL, f"run.root={root}"])
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if not ln.startswith("note: ")]
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert f"is being written by pid {proc.pid} on host" in err[0] and "contramine mine" in err[0], err
    assert time.monotonic() - t0 < 60
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert json.loads((root / "r" / ".lock").read_text())["pid"] == proc.pid  # the file stays; the lock does not
    assert cli_main(["mine", "--run", "r", "--corpus", str(corpus), "--set", *SMALL, f"run.root={root}"]) == 0
    assert Store(root / "r").manifest("embeddings")["shards_computed"] == 2
    got = _tables(root / "r")
    for table in TABLES:
        assert got[table].equals(want[table]), table


def test_the_lock_is_one_per_process_and_reentrant(tmp_path):
    with run_lock(tmp_path / "r", "outer"):
        with run_lock(tmp_path / "r", "inner"):  # a stage inside `make mine`
            pass
        probe = ("import sys; from contramine.pipeline.storage.lock import run_lock, RunBusy\n"
                 "try:\n    run_lock(sys.argv[1]).__enter__()\nexcept RunBusy as e:\n    print(e); sys.exit(3)")
        r = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "r")], cwd=ROOT, capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": CHILD_PYTHONPATH})
        assert r.returncode == 3 and f"pid {os.getpid()}" in r.stdout and "(outer)" in r.stdout, r.stdout + r.stderr
    with run_lock(tmp_path / "r"):  # released: free again
        pass
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / ".lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RunBusy, match="cannot open the run's lock file"):
        run_lock(tmp_path / "s").__enter__()
    assert not (tmp_path / "elsewhere").exists()


def test_a_folder_name_is_never_sql(mean_run, tmp_path, caplog):
    """A shared run with a table folder whose name carries SQL: `make sql` makes no view of it, names it once, runs
    none of it, and serves the other tables."""
    cfg, want = mean_run
    run_dir = _copy(cfg.run.dir, tmp_path / "runs" / "r")
    target = tmp_path / "written-by-the-folder.py"
    hostile = (f'x" AS SELECT 1; COPY (SELECT 42 AS x) TO \'{target}\' (HEADER false); '
               f'CREATE VIEW "y')
    (run_dir / hostile.replace("/", "%")).mkdir()
    evil = next(p for p in run_dir.iterdir() if p.name.startswith('x"'))
    (evil / "_manifest.json").write_text(json.dumps({"shards": 1}))
    (evil / "part-00000-of-00001.parquet").write_bytes(
        Store(run_dir).shard_path("sentences", 0, 2).read_bytes())
    from contramine.flows.sql import connect

    with caplog.at_level("WARNING", logger="contramine.tables"):
        con = connect(run_dir)
        views = {r[0] for r in con.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    assert not target.exists()
    assert views == set(RunTables(run_dir).names()) and "sentences" in views and not any('"' in v for v in views)
    assert sum("left out" in r.message and 'x"' in r.message for r in caplog.records) == 1
    assert con.sql("SELECT count(*) FROM sentences").fetchall()[0][0] == want["sentences"].num_rows


def test_a_manifest_names_only_its_own_shards(mean_run, tmp_path):
    """A manifest listing a path out of its folder (or a link in place of a shard) is refused in one line."""
    cfg, _ = mean_run
    run_dir = _copy(cfg.run.dir, tmp_path / "runs" / "r")
    man_path = run_dir / "pairs" / "_manifest.json"
    man = json.loads(man_path.read_text())
    man["files"][0]["file"] = "../sentences/" + man["files"][0]["file"]
    man_path.write_text(json.dumps(man))
    with pytest.raises(TableUnreadable, match="not a shard file name") as e:
        RunTables(run_dir).read("pairs")
    assert "\n" not in str(e.value)
    shard = Store(run_dir).shard_path("negations", 0, 2)
    shard.unlink()
    shard.symlink_to(tmp_path / "elsewhere.parquet")
    with pytest.raises(TableUnreadable, match=r"is not a plain file .*contramine stage negate"):
        RunTables(run_dir).read("negations")
    assert RunTables(run_dir).files_if_any("negations") == []


def test_a_damaged_shard_is_never_served_and_a_rerun_of_its_stage_repairs_it(mean_run, corpus, tmp_path, capsys):
    """A byte flipped in place in an `embeddings` shard of a mined run: `make sql` on it stops in one line naming the
    shard; the stage's rerun (no FORCE) recomputes exactly that shard (its key matches, its bytes do not), and every
    reader serves the original rows again."""
    cfg, want = mean_run
    root = tmp_path / "runs"
    run_dir = _copy(cfg.run.dir, root / "r")
    shard = Store(run_dir).shard_path("embeddings", 1, 2)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    with open(shard, "r+b") as f:  # in place, as a bad disk would
        f.write(bytes(data))
    assert cli_main(["sql", "--run", "r", "--query", "SELECT count(*) FROM embeddings", "--set",
                     f"run.root={root}"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"error: table `embeddings` of run 'r': shard {shard} is damaged"), last
    assert cli_main(["stage", "embeddings", "--run", "r", "--corpus", str(corpus), "--set", *SMALL,
                     f"run.root={root}"]) == 0
    man = Store(run_dir).manifest("embeddings")
    assert (man["shards_computed"], man["shards_cached"]) == (1, 1)
    assert RunTables(run_dir).read("embeddings").equals(want["embeddings"])
