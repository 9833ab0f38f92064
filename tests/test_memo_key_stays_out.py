"""A secret setting given on the command line (`--set runner.memo_key=...`) reaches the memo through the
environment, never Prefect: a flow's overrides are its run's parameters, kept in Prefect's database (a file under
the shared artifacts/) and sent to its API server. Nor do the run folder (manifests, config records) or the logs
hold it."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from contramine.flows.cli import main
from contramine.pipeline.config.mining import MEMO_KEY_ENV
from contramine.pipeline.memo.cache import verify

from mining_helpers import SMALL

pytestmark = pytest.mark.usefixtures("prefect_harness")

ROOT = Path(__file__).resolve().parent.parent
WIKI = ROOT.parent / "shared" / "data" / "wiki1m_head.txt"
KEY = "tEaM-kEy-0f-32-cHaRaCtErS-xq7Zp9"


def _prefect_database_files() -> list[Path]:
    from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL

    url = PREFECT_SERVER_DATABASE_CONNECTION_URL.value()  # sqlite+aiosqlite:///<file>: the harness' own database
    db = Path(url.split(":///", 1)[1])
    return [p for p in db.parent.glob(db.name + "*") if p.is_file()]  # with its -wal and -shm, when there


def test_a_memo_key_on_the_command_line_keys_the_memo_and_stays_out_of_prefect(tmp_path, capsys, caplog,
                                                                               monkeypatch):
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_LOGGING_TO_API_ENABLED, temporary_settings

    monkeypatch.setenv(MEMO_KEY_ENV, "set by the CLI below, removed after the test")
    monkeypatch.delenv(MEMO_KEY_ENV)
    corpus, root = tmp_path / "c30.txt", tmp_path / "runs"
    corpus.write_text("\n".join(WIKI.read_text(encoding="utf-8").splitlines()[:30]) + "\n", encoding="utf-8")
    sets = [*SMALL, f"run.root={root}", "encoder.model=standin:encoder-32", "runner.memo=on"]
    # the runs' logs go to Prefect's database too (the tests keep them off it elsewhere: tests/conftest.py)
    with caplog.at_level(logging.DEBUG), temporary_settings({PREFECT_LOGGING_TO_API_ENABLED: True}):
        for stage in ("sentences", "embeddings"):
            assert main(["stage", stage, "--run", "k", "--corpus", str(corpus), "--set", *sets,
                         f"runner.memo_key={KEY}"]) == 0, capsys.readouterr().err
        APILogWorker.drain_all(timeout=30)  # the runs' logs are in the database before it is read
    checked, bad = verify(root / ".memo", dry_run=True, key=KEY.encode())
    assert checked >= 1 and bad == []  # the packs the run wrote carry the key's hash...
    checked, bad = verify(root / ".memo", dry_run=True, key=b"another team's key, 32 characters")
    assert len(bad) == checked  # ...and no other key's
    databases = _prefect_database_files()
    held = b"".join(p.read_bytes() for p in databases)
    assert b"runner.memo=on" in held and b"Finished in state Completed" in held  # the runs' parameters and logs
    for path in [*databases, *(p for p in root.rglob("*") if p.is_file())]:
        assert KEY.encode() not in path.read_bytes(), path
    out = capsys.readouterr()
    assert KEY not in out.out + out.err + caplog.text
    assert out.err.count("on the command line can be read by every local account") == 2  # each command warns


def test_a_memo_key_in_a_profile_keys_every_pack(tmp_path, capsys, monkeypatch):
    """`[runner] memo_key = ...` in a profile file: the jobs get the config without its secrets and read the key from
    the environment, so it goes there too (it was dropped: every pack was written without its keyed hash)."""
    monkeypatch.setenv(MEMO_KEY_ENV, "set by the CLI below, removed after the test")
    monkeypatch.delenv(MEMO_KEY_ENV)
    corpus, root = tmp_path / "c30.txt", tmp_path / "runs"
    corpus.write_text("\n".join(WIKI.read_text(encoding="utf-8").splitlines()[:30]) + "\n", encoding="utf-8")
    profile = tmp_path / "keyed.toml"
    profile.write_text(f'inherit = "default"\n[runner]\nmemo_key = "{KEY}"\nmemo = "on"\n', encoding="utf-8")
    profile.chmod(0o600)
    sets = [*SMALL, f"run.root={root}", "encoder.model=standin:encoder-32"]
    for stage in ("sentences", "embeddings"):
        assert main(["stage", stage, "--profile", str(profile), "--run", "k", "--corpus", str(corpus), "--set",
                     *sets]) == 0, capsys.readouterr().err
    checked, bad = verify(root / ".memo", dry_run=True, key=KEY.encode())
    assert checked >= 1 and bad == []
    assert all(KEY.encode() not in p.read_bytes() for p in root.rglob("*") if p.is_file())


def test_a_profiles_key_and_another_in_the_environment_are_one_line(tmp_path, capsys, monkeypatch):
    """The parent would key with the profile's and the jobs with the environment's: every pack then failed."""
    monkeypatch.setenv(MEMO_KEY_ENV, "an-older-key-of-32-characters-xx")
    profile = tmp_path / "keyed.toml"
    profile.write_text(f'inherit = "default"\n[runner]\nmemo_key = "{KEY}"\n', encoding="utf-8")
    assert main(["stage", "sentences", "--profile", str(profile), "--run", "k", "--corpus", str(tmp_path / "c.txt"),
                 "--set", f"run.root={tmp_path / 'runs'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "runner.memo_key: the profile gives one and $CONTRAMINE_MEMO_KEY another" in err and KEY not in err
