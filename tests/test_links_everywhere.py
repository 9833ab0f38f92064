"""No write, rename or delete through a link, at every writer: a link to a victim folder (hostile.victim_folder: files
under the names contramine writes) planted where a command writes, renames or deletes is refused in one line naming
it, or written around, and not a byte or a name of the victim changes. Also: a planted index plan is never loaded,
and one output folder has one writer (two `make train` of one objective and run: the second stops in one line)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from hostile import one_line, plant, run_with_a_table, tree, victim_folder
from contramine.pipeline.config import load_config
from contramine.pipeline.storage.safe_paths import UnsafePath
from contramine.pipeline.schema import SCHEMAS
from test_run_folder_safety import tiny_run  # noqa: F401 -- the fixture: a sentences table, a 4-step profile
from train_helpers import ROOT
from contramine.trainer.train import train
from child_env import CHILD_PYTHONPATH


def _victim(tmp_path: Path) -> tuple[Path, dict]:
    v = victim_folder(tmp_path / "victim")
    return v, tree(v)


def _refused(e, link: Path) -> None:
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{link} is a symbolic link inside "), msg


def _table(n: int) -> list[pa.Table]:
    rows = [{"sid": i, "text": f"sentence number {i}", "n_words": 3, "line_no": i} for i in range(n)]
    return [pa.Table.from_pylist(rows, schema=SCHEMAS["sentences"])]


def test_a_linked_table_folder_is_refused_and_a_commit_deletes_only_its_own_names(tmp_path):
    from contramine.pipeline.storage.store import Store

    victim, before = _victim(tmp_path)
    run = tmp_path / "r"
    plant(run / "sentences", victim)
    with pytest.raises(UnsafePath) as e:
        Store(run).write_table("sentences", _table(5), "k")
    _refused(e, run / "sentences")
    assert tree(victim) == before

    # a real table folder: a link named like a stale shard is removed as a link, a file the project does not write
    # stays, a folder named like a shard stays
    (run / "sentences").unlink()
    (run / "sentences").mkdir()
    plant(run / "sentences" / "part-00000-of-00002.parquet", victim / "part-00000-of-00001.parquet")
    (run / "sentences" / "README.txt").write_text("mine\n")
    (run / "sentences" / "part-00001-of-00002.parquet").mkdir()
    Store(run).write_table("sentences", _table(5), "k")
    left = sorted(p.name for p in (run / "sentences").iterdir())
    assert "part-00000-of-00002.parquet" not in left and "README.txt" in left
    assert "part-00001-of-00002.parquet" in left and "_manifest.json" in left
    assert tree(victim) == before


@pytest.mark.parametrize("link", ["export", "export/sentences"])
def test_a_linked_export_folder_is_refused_before_anything_is_read(tmp_path, link):
    from contramine.pipeline.export import export_run

    victim, before = _victim(tmp_path)
    run = run_with_a_table(tmp_path / "r")
    plant(run / link, victim if link == "export" else victim / "sentences")
    with pytest.raises(UnsafePath) as e:
        export_run(run, "sentences")
    _refused(e, run / link)
    assert tree(victim) == before
    if link == "export":  # the command line: exit 2, the one line last, nothing written (~5 s: once)
        p = subprocess.run([sys.executable, "-m", "contramine.flows.cli", "export", "--run", "r", "--format", "sentences",
                            "--set", f"run.root={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": CHILD_PYTHONPATH})
        assert p.returncode == 2 and one_line(p.stderr) == f"error: {e.value}", p.stderr
        assert tree(victim) == before


def _hnsw_run(tmp_path: Path):
    from contramine.pipeline.storage.store import Store
    from contramine.pipeline.schema import vectors_table

    rng = np.random.default_rng(0)
    x = rng.standard_normal((400, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    sids = np.arange(400, dtype=np.int64) * 2 + 1
    Store(tmp_path / "r").write_table("embeddings", [vectors_table(sids, x)], "k")
    cfg = load_config("default", [f"run.root={tmp_path}", "run.name=r", "run.shards=1", "neighbours.index=hnsw",
                                  "neighbours.hnsw_m=4", "neighbours.pool_size=8", "neighbours.recall_sample=50",
                                  "neighbours.min_recall=0"])
    return cfg, Store(tmp_path / "r"), sids


def test_a_linked_index_folder_is_refused_before_the_index_is_built(tmp_path):
    from contramine.pipeline.search import index as ix

    victim, before = _victim(tmp_path)
    cfg, store, _ = _hnsw_run(tmp_path)
    plant(store.dir("neighbours") / "_index", victim)
    with pytest.raises(UnsafePath) as e:
        ix.index_plan(cfg, store, 1)
    _refused(e, store.dir("neighbours") / "_index")
    assert tree(victim) == before


def _plant_sids(plan_path: Path, victim: Path, plan: dict) -> None:  # ids no sentence has, at a path outside
    np.save(victim / "evil.npy", np.arange(10**6, 10**6 + 400, dtype=np.int64))
    plan_path.write_text(json.dumps({**plan, "sids": "../../../victim/evil.npy"}))


def _plant_file(plan_path: Path, victim: Path, plan: dict) -> None:  # faiss.read_index of a file of the victim
    plan_path.write_text(json.dumps({**plan, "file": str(victim / "notes.txt")}))


def _plant_hash(plan_path: Path, victim: Path, plan: dict) -> None:  # the right name, other ids, the old hash
    np.save(plan_path.parent / plan["sids"], np.arange(10**6, 10**6 + 400, dtype=np.int64))


def _plant_consistent(plan_path: Path, victim: Path, plan: dict) -> None:  # other ids, the hash re-recorded
    from contramine.pipeline.storage.store import file_hash

    sids = plan_path.parent / plan["sids"]
    np.save(sids, np.arange(10**6, 10**6 + 400, dtype=np.int64))
    plan_path.write_text(json.dumps({**plan, "hashes": {**plan["hashes"], plan["sids"]: file_hash(sids)}}))


@pytest.mark.parametrize("plant_it", [_plant_sids, _plant_file, _plant_hash, _plant_consistent],
                         ids=["sids-outside", "file-outside", "hash-mismatch", "ids-no-sentence-has"])
def test_a_planted_index_plan_is_never_loaded_but_built_again(tmp_path, plant_it, caplog):
    from contramine.pipeline.search import index as ix

    cfg, store, sids = _hnsw_run(tmp_path)
    plan = ix.index_plan(cfg, store, 1)
    folder = store.dir("neighbours") / "_index"
    plan_path = next(folder.glob("hnsw-*.json"))
    recorded = json.loads(plan_path.read_text())
    assert set(recorded["hashes"]) == {plan["file"], plan["sids"]} and plan_path.name.startswith("hnsw-")
    victim, _ = _victim(tmp_path)
    plant_it(plan_path, victim, recorded)
    before = tree(victim)
    again = ix.index_plan(cfg, store, 1)
    assert again == plan and f"the index plan {plan_path}" in caplog.text and "building the index again" in caplog.text
    got_sids, _, index, _ = ix.load_index(cfg, store, 1, again)
    assert np.array_equal(got_sids, sids) and index.ntotal == len(sids)
    assert tree(victim) == before
    assert json.loads(plan_path.read_text())["hashes"] == recorded["hashes"]  # rebuilt whole


def test_a_plan_naming_a_path_outside_the_index_folder_is_refused_by_every_loader(tmp_path):
    from contramine.pipeline.search import index as ix

    cfg, store, _ = _hnsw_run(tmp_path)
    plan = ix.index_plan(cfg, store, 1)
    victim, _ = _victim(tmp_path)
    for bad in ("../../victim/notes.txt", str(victim / "notes.txt"), ".lock"):
        with pytest.raises(UnsafePath, match="the neighbours plan names .* as its file: not a file of"):
            ix.load_index(cfg, store, 1, {**plan, "file": bad})


def test_a_report_rerun_removes_only_the_plots_it_draws(tmp_path):
    from contramine.pipeline.report import write_report

    run = run_with_a_table(tmp_path / "r")
    victim, before = _victim(tmp_path)
    (run / "report").mkdir()
    (run / "report" / "my_own.png").write_bytes(b"kept\n")
    plant(run / "report" / "rejected.png", victim / "stage_seconds.png")  # a plot this run no longer draws
    write_report(run)
    left = sorted(p.name for p in (run / "report").iterdir())
    assert left == [".lock", "index.md", "my_own.png", "stage_seconds.png"] and tree(victim) == before


def test_a_linked_compare_folder_is_refused_before_anything_trains(tiny_run, tmp_path):
    from contramine.trainer import compare as cmp

    profile, run, _ = tiny_run
    victim, before = _victim(tmp_path)
    plant(run / "compare", victim)
    with pytest.raises(UnsafePath) as e:
        cmp.compare(str(profile), None, ["compare.steps=1"], ["simcse"], 1)
    _refused(e, run / "compare")
    assert tree(victim) == before


@pytest.mark.parametrize("where", ["train", "objective", "best"])
def test_a_linked_training_folder_is_refused_before_anything_trains(tiny_run, tmp_path, where):
    """`<run>/train`, `<run>/train/<objective>` or its `best/` a link: refused in one line, nothing written there."""
    profile, run, out = tiny_run
    victim, before = _victim(tmp_path)
    link = {"train": run / "train", "objective": out, "best": out / "best"}[where]
    link.parent.mkdir(parents=True, exist_ok=True)
    plant(link, victim)
    with pytest.raises(UnsafePath) as e:
        train(load_config(str(profile)))
    assert "\n" not in str(e.value) and " is a symbolic link inside " in str(e.value), str(e.value)
    assert tree(victim) == before


def _hold(folder: Path, root: Path, what: str):
    """Another process holding `folder`'s lock until killed (started, and holding, when this returns)."""
    code = ("import sys, time; from contramine.pipeline.storage.lock import run_lock\n"
            "with run_lock(sys.argv[1], sys.argv[3], root=sys.argv[2]):\n    print('held', flush=True); time.sleep(300)")
    p = subprocess.Popen([sys.executable, "-c", code, str(folder), str(root), what], cwd=ROOT, text=True,
                         stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": CHILD_PYTHONPATH})
    assert p.stdout.readline().strip() == "held"
    return p


def test_two_trainings_of_one_objective_and_run_the_second_stops_in_one_line(tiny_run):
    from contramine.pipeline.storage.lock import RunBusy, run_lock

    profile, run, out = tiny_run
    holder = _hold(out, run, "make train simcse")
    try:
        with pytest.raises(RunBusy) as e:
            train(load_config(str(profile)))
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"{out} is being written by pid {holder.pid} on host ")
        assert "(make train simcse): wait for it to end" in msg
        assert not (out / "metrics.jsonl").exists()
        with run_lock(run / "train" / "debcse", "make train debcse", root=run):  # another objective: its own lock
            pass
        # the command line: exit 2, the one line last (~15 s: once)
        p = subprocess.run([sys.executable, "-m", "contramine.flows.cli", "train", "--profile", str(profile)], cwd=ROOT,
                           env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": CHILD_PYTHONPATH}, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 2 and one_line(p.stderr) == f"error: {msg}", p.stderr
    finally:
        holder.kill()
        holder.wait()


def test_export_report_and_compare_lock_their_output_folders(tiny_run, tmp_path):
    from contramine.pipeline.storage.lock import RunBusy
    from contramine.pipeline.export import export_run
    from contramine.pipeline.report import write_report
    from contramine.trainer import compare as cmp

    profile, run, _ = tiny_run
    for folder, call in ((run / "report", lambda: write_report(run)),
                         (run / "compare", lambda: cmp.compare(str(profile), None, ["compare.steps=1"], ["simcse"], 1))):
        holder = _hold(folder, run, "theirs")
        try:
            with pytest.raises(RunBusy, match=rf"^{folder} is being written by pid {holder.pid} .*\(theirs\)"):
                call()
        finally:
            holder.kill()
            holder.wait()
    code = ("import sys, time; from contramine.pipeline.storage.lock import run_lock\n"
            "with run_lock(sys.argv[1], 'theirs', root=sys.argv[2], name='.sentences.lock'):\n"
            "    print('held', flush=True); time.sleep(300)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(run / "export"), str(run)], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": CHILD_PYTHONPATH})
    assert holder.stdout.readline().strip() == "held"
    try:
        with pytest.raises(RunBusy, match=r"is being written by pid .*\(theirs\)"):
            export_run(run, "sentences")
    finally:
        holder.kill()
        holder.wait()
    assert not (run / "export" / "sentences").exists()
