"""Readers and a writer at the same time (pipeline/storage/grace.py): a stage's commit keeps the shards it replaces
for runner.keep_replaced_s, so a `sql` that listed them before the commit answers; the next commit after that, or
`contramine cache --prune`, removes them."""
from __future__ import annotations

import threading
import time

import pyarrow as pa

from contramine.pipeline.storage.grace import RECORD
from contramine.pipeline.engine.upkeep import prune_replaced
from contramine.pipeline.storage.store import Store
from contramine.pipeline.storage.tables import RunTables
from contramine.pipeline.schema import SCHEMAS
from test_manifest_shapes import _mined


def _commit(store: Store, key: str, rows: list[dict]) -> None:
    store.write_table("sentences", [pa.Table.from_pylist(rows[:6], SCHEMAS["sentences"]),
                                    pa.Table.from_pylist(rows[6:], SCHEMAS["sentences"])], key=key,
                      manifest={"stage": "sentences"})


def test_sql_queries_while_a_stage_commits_the_same_table_all_answer(tmp_path):
    from train_helpers import sentences_rows

    run = _mined(tmp_path / "runs")
    rows, stop, answers, errors = sentences_rows(12), threading.Event(), [], []

    def writer():
        store, i = Store(run, keep_replaced_s=600), 0
        while not stop.is_set():  # commit after commit, each under a new key: new files, the old ones replaced
            _commit(store, f"k{i}", rows)
            i += 1
            time.sleep(0.002)  # (a stage commits once: here the commits come as fast as the reader's queries)

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(25):
            try:
                con = RunTables(run).connect(say=False)
                answers.append(con.sql("SELECT count(*), sum(sid) FROM sentences").fetchall()[0])
            except Exception as e:  # noqa: BLE001 - every failure is collected and shown
                errors.append(repr(e))
    finally:
        stop.set()
        t.join()
    assert i_commits(run) > 3, "the commits and the queries overlapped"
    assert not errors, errors[:3]
    assert set(answers) == {(12, sum(r["sid"] for r in rows))}


def i_commits(run) -> int:
    return len(list((run / "sentences").glob("part-00000-*.parquet")))


def test_replaced_shards_stay_their_grace_then_the_next_commit_or_prune_removes_them(tmp_path):
    from train_helpers import sentences_rows

    run, rows = _mined(tmp_path / "runs"), sentences_rows(12)
    first = {p.name for p in (run / "sentences").glob("part-*")}
    _commit(Store(run, keep_replaced_s=600), "k2", rows)
    held = {p.name for p in (run / "sentences").glob("part-*")}
    assert first < held and (run / "sentences" / RECORD).is_file()  # the replaced shards and sidecars stay
    assert prune_replaced(run.parent, keep_s=600) == []  # within their grace: kept
    gone = prune_replaced(run.parent, keep_s=0)
    assert sorted(p.name for p, _ in gone) == sorted(first)
    assert {p.name for p in (run / "sentences").glob("part-*")} == held - first
    assert RunTables(run).read("sentences").num_rows == 12
    _commit(Store(run, keep_replaced_s=600), "k3", rows)
    _commit(Store(run, keep_replaced_s=0), "k4", rows)  # a commit past the grace collects what earlier ones kept
    assert len(list((run / "sentences").glob("part-*.parquet"))) == 2
