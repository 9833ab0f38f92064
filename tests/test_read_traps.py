"""No trap in a file we open (issue 52, items 2 and 5): a FIFO, socket or device at a memo pack, a namespace record, a
run's or a table's manifest or a lock is one line naming it, never a hang or a traceback; a lock file is never
written in place (a hard link planted there, or shared by a `cp -al` copy, keeps its bytes); and who wrote a memo
pack is what the filesystem says, with a team key (`runner.memo_key`) that a forger without it cannot satisfy."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from contramine.pipeline.storage.lock import RunBusy, run_lock
from contramine.pipeline.memo.rows import RowMemo
from contramine.pipeline.memo.packs import FORMAT, RECORD, pack_record, values_hash
from contramine.pipeline.memo.store import write_pack_file
from memo_helpers import log_lines, memo_rows, vectors
from child_env import CHILD_PYTHONPATH

ROOT = Path(__file__).resolve().parent.parent
KEY = b"a team key of 32 characters, ok"
TEXTS = [f"sentence {i}" for i in range(40)]
OWNER = f"file owned by uid {os.getuid()}"


@contextlib.contextmanager
def within(seconds: int):
    """Fail (instead of hanging the suite) when the block is still running after `seconds`: a FIFO opened blocking
    waits for a writer forever."""
    def late(*_):
        raise TimeoutError(f"still running after {seconds} s (a FIFO opened for reading blocks until a writer comes)")
    old = signal.signal(signal.SIGALRM, late)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _memo(root: Path, key: bytes | None = None, verify: float = 0.0) -> RowMemo:
    return RowMemo(root, "embeddings", "encode", {"format": FORMAT, "code": "v1"}, verify=verify, key=key)


def _cli(*args: str) -> subprocess.CompletedProcess:
    """`contramine <args>` in a child, killed after 120 s: a hang fails the test instead of the suite."""
    return subprocess.run([sys.executable, "-m", "contramine.flows.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": CHILD_PYTHONPATH})


def _hold(folder: Path, what: str) -> subprocess.Popen:
    code = ("import sys, time; from contramine.pipeline.storage.lock import run_lock\n"
            "with run_lock(sys.argv[1], sys.argv[2]):\n    print('held', flush=True); time.sleep(300)")
    p = subprocess.Popen([sys.executable, "-c", code, str(folder), what], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                         env={**os.environ, "PYTHONPATH": CHILD_PYTHONPATH})
    assert p.stdout.readline().strip() == "held"
    return p


# ---- locks ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["run", "output folder"])
def test_a_hard_link_planted_at_a_lock_file_is_left_unchanged(tmp_path, where):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    folder, name, root = (run, ".lock", None) if where == "run" else (run / "export", ".sentences.lock", run)
    folder.mkdir(parents=True)
    os.link(victim, folder / name)
    with run_lock(folder, "mine", root=root, name=name):
        assert json.loads((folder / name).read_text())["pid"] == os.getpid()  # our record, in a file of its own
    assert victim.read_text() == "precious\n" and victim.stat().st_nlink == 1  # the link is gone, not its target
    with run_lock(folder, "again", root=root, name=name):  # and the lock works as before
        pass


def test_runs_copied_with_cp_al_do_not_report_each_other_busy(tmp_path):
    a, b, c, d = (tmp_path / x for x in "abcd")
    a.mkdir()
    with run_lock(a, "a"):
        pass
    subprocess.run(["cp", "-al", str(a), str(b)], check=True)
    assert (a / ".lock").stat().st_ino == (b / ".lock").stat().st_ino  # one inode, two runs
    holder = _hold(a, "mine a")
    try:
        with run_lock(b, "mine b"):  # not busy: a's holder took a fresh file of its own
            pass
        with pytest.raises(RunBusy, match=rf"is being written by pid {holder.pid} .*\(mine a\)"):
            run_lock(a).__enter__()
    finally:
        holder.kill()
        holder.wait()
    c.mkdir()
    holder = _hold(c, "mine c")  # copied while its holder runs: the copy's lock file is the held one
    try:
        subprocess.run(["cp", "-al", str(c), str(d)], check=True)
        with run_lock(d, "mine d"):
            pass
        with pytest.raises(RunBusy, match=rf"is being written by pid {holder.pid} "):
            run_lock(c).__enter__()  # c itself is still busy
    finally:
        holder.kill()
        holder.wait()
    with run_lock(c, "after"):  # its holder killed: never stale
        assert json.loads((c / ".lock").read_text())["what"] == "after"


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_a_fifo_or_socket_at_a_lock_is_one_line(tmp_path, kind):
    run = tmp_path / "run"
    run.mkdir()
    if kind == "fifo":
        os.mkfifo(run / ".lock")
    else:
        import socket

        s = socket.socket(socket.AF_UNIX)
        s.bind(str(run / ".lock"))
        s.close()
    with within(10), pytest.raises(RunBusy) as e:
        run_lock(run).__enter__()
    msg = str(e.value)
    assert "\n" not in msg and str(run / ".lock") in msg and ("a FIFO" if kind == "fifo" else "a socket") in msg


# ---- FIFOs where the memo and the tables read ----------------------------------------------------------------------
def test_a_fifo_named_like_a_pack_never_stalls_a_lookup(tmp_path, caplog):
    memo_rows(_memo(tmp_path), TEXTS[:10], [])
    fifo = _memo(tmp_path).dir / f"{'ab' * 16}.parquet"
    os.mkfifo(fifo)
    calls: list = []
    with within(20), caplog.at_level(logging.WARNING, logger="contramine.memo"):
        got = memo_rows(_memo(tmp_path), TEXTS[:20], calls)
    assert got.equals(vectors(TEXTS[:20])) and calls == [TEXTS[10:20]]  # the real packs still serve
    assert len(log_lines(caplog, str(fifo), "is a FIFO, not a regular file")) == 1


def test_a_fifo_at_a_table_manifest_is_one_line(tmp_path):
    from contramine.pipeline.storage.manifest import TableCorrupt, read_manifest

    table = tmp_path / "runs" / "r" / "sentences"
    table.mkdir(parents=True)
    os.mkfifo(table / "_manifest.json")
    with within(10), pytest.raises(TableCorrupt) as e:
        read_manifest(table)
    msg = str(e.value)
    assert "\n" not in msg and f"{table / '_manifest.json'} is a FIFO, not a regular file" in msg


@pytest.mark.parametrize("where", ["namespace record", "run manifest"])
def test_cache_commands_end_in_seconds_with_a_fifo_planted(tmp_path, where):
    """`contramine cache`, `--verify` and `--unreferenced`: each ends, names the FIFO, shows no traceback."""
    runs = tmp_path / "runs"
    memo = _memo(runs / ".memo")
    memo_rows(memo, TEXTS, [])
    (runs / "r" / "embeddings").mkdir(parents=True)
    if where == "namespace record":
        other = runs / ".memo" / "embeddings" / "encode-0123456789abcdef"
        other.mkdir()
        fifo = other / "_namespace.json"
    else:
        fifo = runs / "r" / "embeddings" / "_manifest.json"
    os.mkfifo(fifo)
    for args in (["cache"], ["cache", "--verify"], ["cache", "--unreferenced", "--dry-run"]):
        t0 = time.monotonic()
        p = _cli(*args, "--set", f"run.root={runs}")
        assert time.monotonic() - t0 < 100
        assert p.returncode == 0 and "Traceback" not in p.stderr, (args, p.stdout, p.stderr)
        if where == "namespace record" or args[-1] != "--verify":  # --verify reads no run's manifest
            assert f"{fifo} is a FIFO, not a regular file" in p.stderr, (args, p.stderr)
        if args[-1] == "--verify":
            assert "1 packs verified, none failed" in p.stdout, p.stdout
    assert fifo.exists() and memo.dir.is_dir()


# ---- who wrote a pack; the team key --------------------------------------------------------------------------------
def _forge_recomputed(pack: Path, user: str = "mallory") -> None:
    """Other values under the same keys, with the plain values hash recomputed: what a writer without the key can do."""
    table = pq.read_table(pack)
    values = vectors([t + "!" for t in TEXTS])
    record = {**pack_record(table.schema), "values": values_hash(values),
              "writer": {"user": user, "host": "elsewhere", "pid": 7, "time": "then", "code": "?"}}
    forged = table.replace_schema_metadata(None).set_column(1, "vec", values.column("vec"))
    write_pack_file(forged.replace_schema_metadata({RECORD: json.dumps(record)}), pack)


def test_with_a_team_key_a_pack_forged_with_a_recomputed_hash_is_refused(tmp_path, caplog):
    memo_rows(_memo(tmp_path, KEY), TEXTS, [])
    pack = next(_memo(tmp_path).dir.glob("*.parquet"))
    assert isinstance(pack_record(pq.read_schema(pack)).get("mac"), str)
    calls: list = []
    assert memo_rows(_memo(tmp_path, KEY), TEXTS, calls).equals(vectors(TEXTS)) and calls == []  # keyed: served
    assert memo_rows(_memo(tmp_path), TEXTS, calls).equals(vectors(TEXTS)) and calls == []  # keyless reader too
    _forge_recomputed(pack)
    mtime = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(pack.stat().st_mtime))
    with caplog.at_level(logging.WARNING, logger="contramine.memo"):
        got = memo_rows(_memo(tmp_path, KEY), TEXTS, calls)
    assert got.equals(vectors(TEXTS)) and calls == [TEXTS]  # refused without the audit, every row computed
    named = log_lines(caplog, str(pack), "keyed hash", OWNER, f"modified {mtime}", "moved to")
    assert len(named) == 1 and "mallory" not in named[0], [r.getMessage() for r in caplog.records]
    assert len(list((tmp_path / ".quarantine").rglob("*.parquet"))) == 1


def test_with_a_team_key_a_pack_of_another_key_or_none_is_refused(tmp_path, caplog):
    memo_rows(_memo(tmp_path, b"another team's key, 32 chars.."), TEXTS[:20], [])
    memo_rows(_memo(tmp_path), TEXTS[20:], [])  # written without a key
    calls: list = []
    with caplog.at_level(logging.WARNING, logger="contramine.memo"):
        assert memo_rows(_memo(tmp_path, KEY), TEXTS, calls).equals(vectors(TEXTS))
    assert sorted(t for c in calls for t in c) == sorted(TEXTS)
    assert len(log_lines(caplog, "not the team key's")) == 1 and len(log_lines(caplog, "no keyed values hash")) == 1
    calls.clear()
    assert memo_rows(_memo(tmp_path, KEY), TEXTS, calls).equals(vectors(TEXTS)) and calls == []  # rewritten keyed


def test_cache_verify_with_the_key_catches_what_it_cannot_without(tmp_path):
    runs = tmp_path / "runs"
    memo_rows(_memo(runs / ".memo", KEY), TEXTS, [])
    _forge_recomputed(next(_memo(runs / ".memo").dir.glob("*.parquet")))
    p = _cli("cache", "--verify", "--dry-run", "--set", f"run.root={runs}")
    assert p.returncode == 0 and "1 packs verified, none failed" in p.stdout, p.stdout + p.stderr  # keyless: passes
    p = subprocess.run([sys.executable, "-m", "contramine.flows.cli", "cache", "--verify", "--dry-run", "--set",
                        f"run.root={runs}"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": CHILD_PYTHONPATH, "CONTRAMINE_MEMO_KEY": KEY.decode()})
    assert p.returncode == 2 and "keyed hash" in p.stdout and OWNER in p.stdout and "mallory" not in p.stdout
    assert KEY.decode() not in p.stdout + p.stderr


def test_the_memo_key_comes_from_the_environment_and_is_never_recorded(monkeypatch):
    from contramine.pipeline.config import ConfigError, load_config

    monkeypatch.setenv("CONTRAMINE_MEMO_KEY", KEY.decode())
    cfg = load_config()
    assert cfg.runner.memo_key_bytes() == KEY
    assert KEY.decode() not in cfg.model_dump_json() + repr(cfg) + json.dumps(cfg.runner.model_dump(mode="json"))
    monkeypatch.setenv("CONTRAMINE_MEMO_KEY", "short")
    with pytest.raises(ConfigError, match="at least 16 characters"):
        load_config()
    monkeypatch.delenv("CONTRAMINE_MEMO_KEY")
    assert load_config().runner.memo_key_bytes() is None
