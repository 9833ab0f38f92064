"""The public surface users write against (contramine/__init__.py, contramine/losses.py): a run's tables from Python
(`contramine.open_run(name).sql(...)` / `.table(...)`), `contramine.mine(...)` for notebooks, and the losses."""
from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pytest

import contramine
from contramine.pipeline.errors import ExpectedError
from contramine.pipeline.schema import SCHEMAS
from contramine.pipeline.storage.store import Store


def test_open_run_gives_sql_over_the_tables_and_arrow(tmp_path):
    rows = {"sid": [1, 2, 3], "text": ["a b", "c d e", "f"], "n_words": [2, 3, 1], "line_no": [0, 1, 2]}
    Store(tmp_path / "r1").write_table("sentences", [pa.table(rows, schema=SCHEMAS["sentences"])], "test")
    run = contramine.open_run("r1", root=tmp_path)
    assert run.sql("SELECT sum(n_words) FROM sentences").fetchall() == [(6,)]
    table = run.table("sentences")
    assert isinstance(table, pa.Table) and table.column("text").to_pylist() == rows["text"]


def test_open_run_of_a_missing_run_is_one_line_naming_the_folder(tmp_path):
    with pytest.raises(ExpectedError, match=rf"no run 'nope': {tmp_path / 'nope'} is not a folder .*contramine mine"):
        contramine.open_run("nope", root=tmp_path)


def test_importing_contramine_imports_none_of_its_parts():
    """`import contramine` is instant: the parts (and torch, Prefect) load when a function needs them."""
    probe = ("import sys, contramine; print(sorted(m for m in sys.modules if m.startswith('contramine.') "
             "or m.split('.')[0] in ('torch', 'prefect', 'duckdb')))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_mine_is_the_mine_flow_with_the_cli_arguments(monkeypatch):
    import contramine.flows.mine as flows_mine

    seen = {}
    monkeypatch.setattr(flows_mine, "mine_flow", lambda **kw: seen.update(kw) or {"sentences": {"sentences": 3}})
    got = contramine.mine(corpus="c.txt", run="nb", overrides=("neighbours.k=8",))
    assert got == {"sentences": {"sentences": 3}}
    assert seen == {"profile": "default", "run": "nb", "corpus": "c.txt", "overrides": ["neighbours.k=8"]}


def test_the_losses_are_the_trainers():
    from contramine import losses
    from contramine.trainer import st_losses

    for name in ("DebCSELoss", "OssCSELoss", "WhitenedCSELoss", "DCLRLoss", "SimCSELoss"):
        assert getattr(losses, name) is getattr(st_losses, name)
