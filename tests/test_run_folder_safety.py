"""A run folder received from someone else: a planted pickle in last/state.pt runs no code and is one `error:` line,
no file any writer (tables, export, _index, report, train, compare, eval, locks) writes, renames or deletes goes
through a symlink planted in the run, a planted index plan is never loaded, and one output folder has one writer."""
from __future__ import annotations

import json
import os
import pickle
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hostile import plant, tree, victim_folder
from pipeline.config import load_config
from pipeline.engine.safe_paths import UnsafePath, check_below, open_append
from pipeline.schema import SCHEMAS
from trainer import checkpoint as ckpt
from trainer.train import train
from train_helpers import ROOT, read_metrics, sentences_rows, write_profile, write_table

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class Poison:
    """Unpickling this runs `touch <marker>`: what a planted state.pt would do under torch.load(weights_only=False)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def _outside(tmp_path: Path, text: str = "precious\n") -> Path:
    victim = tmp_path / "outside" / "victim.txt"
    victim.parent.mkdir(exist_ok=True)
    victim.write_text(text)
    return victim


def _one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    return lines[-1]


@pytest.fixture
def tiny_run(tmp_path, bert, senteval):
    """A run with a sentences table and a 4-step simcse profile; returns (profile path, run dir, objective dir)."""
    write_table(tmp_path / "r", "sentences", sentences_rows(24))
    profile = write_profile(tmp_path / "p.toml", tmp_path, "r", bert, senteval, max_steps=4, eval_every=2)
    return profile, tmp_path / "r", tmp_path / "r" / "train" / "simcse"


# ------------------------------------------------------------------------------------------------ resume state
def test_the_poison_is_real(tmp_path):
    """The payload the next tests plant does run its command under a plain unpickler (so their `marker absent`
    means something)."""
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps(Poison(marker)))
    assert marker.exists()


@pytest.mark.parametrize("as_torch_file", [True, False], ids=["torch-zip", "raw-pickle"])
def test_poisoned_state_runs_no_code_and_is_one_line(tiny_run, tmp_path, as_torch_file):
    profile, _, out = tiny_run
    marker = tmp_path / "pwned"
    state = out / "last" / "state.pt"
    state.parent.mkdir(parents=True)
    payload = {"config_hash": Poison(marker), "step": 1}
    if as_torch_file:
        torch.save(payload, state)
    else:
        state.write_bytes(pickle.dumps(payload))
    with pytest.raises(ckpt.CheckpointError) as e:
        train(load_config(str(profile)))  # what `make train` runs, resuming from last/ by default
    msg = str(e.value)
    assert "\n" not in msg and str(state) in msg and "weights-only loading refused it" in msg and "Remove" in msg
    if as_torch_file:
        assert "unsupported GLOBAL posix.system" in msg  # it says what the file tried to call
    assert not marker.exists()
    assert not (out / "metrics.jsonl").exists()  # refused before anything was written

    if not as_torch_file:
        return
    # the command line (once: ~15 s): exit 2, the last line is the one error line, no traceback, no code run
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "flows.cli", "train", "--profile", str(profile)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr
    assert _one_line(p.stderr) == f"error: {msg}"
    assert not marker.exists()


def _valid_state() -> dict:
    return {"objective": {"w": torch.zeros(2)}, "optimizer": {"state": {}, "param_groups": []}, "scheduler": {},
            "scaler": {}, "step": 2, "epoch": 0, "batch_in_epoch": 2, "best": float("-inf"), "best_step": None,
            "config_hash": "abc", "rng": [ckpt.rng_state()]}


def _old_format_state() -> dict:  # what the trainer wrote before states were weights-only: numpy's RNG tuple
    import random

    s = _valid_state()
    s["rng"] = [{"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
                 "cuda": None}]
    return s


@pytest.mark.parametrize("write, says", [
    (lambda p: torch.save(_old_format_state(), p), "weights-only loading refused"),
    (lambda p: torch.save({"step": 3}, p), "it lacks objective"),
    (lambda p: torch.save([1, 2], p), "it holds a list"),
    (lambda p: torch.save({**_valid_state(), "step": "3"}, p), "step not of the type"),
    (lambda p: torch.save({**_valid_state(), "rng": [{"python": 1}]}, p), "RNG states not in the form"),
    (lambda p: (torch.save(_valid_state(), p), p.write_bytes(p.read_bytes()[:200])), "does not load as a torch file"),
    (lambda p: p.write_text("not a checkpoint\n"), "weights-only loading refused it (Unsupported operand"),
], ids=["old-format", "wrong-keys", "not-a-dict", "wrong-type", "bad-rng", "truncated", "text"])
def test_unusable_state_is_one_line_naming_the_file(tmp_path, write, says):
    last = tmp_path / "last"
    last.mkdir()
    write(last / "state.pt")
    with pytest.raises(ckpt.CheckpointError) as e:
        ckpt.load_state(last)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{last / 'state.pt'}: ") and says in msg
    assert f"Remove {last}" in msg and "--no-resume" in msg


def test_state_round_trips_weights_only_and_restores_the_generators(tmp_path):
    torch.manual_seed(1)
    np.random.seed(2)
    np.random.standard_normal()  # numpy's cached Gaussian is part of its state
    s = _valid_state()
    ckpt.save_state(tmp_path / "last", s, {})
    want = (np.random.standard_normal(), np.random.rand(), torch.rand(3))
    torch.load(tmp_path / "last" / "state.pt", weights_only=True)  # loads without any allowlisting
    ckpt.set_rng_state(ckpt.load_state(tmp_path / "last")["rng"][0])
    got = (np.random.standard_normal(), np.random.rand(), torch.rand(3))
    assert got[:2] == want[:2] and torch.equal(got[2], want[2])


def test_state_that_does_not_fit_the_model_is_one_line(tiny_run):
    profile, _, out = tiny_run
    train(load_config(str(profile)))
    last = out / "last"
    state = ckpt.load_state(last)
    state["objective"] = {"not.a.weight": torch.zeros(1)}  # the same configuration hash, foreign weights
    torch.save(state, last / "state.pt")
    with pytest.raises(ckpt.CheckpointError, match=r"state\.pt: it does not fit this model \(RuntimeError") as e:
        train(load_config(str(profile)))
    assert "\n" not in str(e.value)


class Killed(BaseException):
    pass


def _train_killed_after_first_checkpoint(profile: Path, monkeypatch) -> None:
    """Train, dying right after last/ is saved at step 2 (of 4): a same-configuration rerun resumes at step 2."""
    real = ckpt.save_state

    def save_then_die(*a, **k):
        real(*a, **k)
        raise Killed

    monkeypatch.setattr(ckpt, "save_state", save_then_die)
    with pytest.raises(Killed):
        train(load_config(str(profile)))
    monkeypatch.setattr(ckpt, "save_state", real)


def test_metrics_log_never_writes_through_a_symlink(tiny_run, tmp_path, monkeypatch, capsys):
    profile, _, out = tiny_run
    victim = _outside(tmp_path)
    out.mkdir(parents=True)
    log = out / "metrics.jsonl"
    log.symlink_to(victim)  # a fresh start: the log is removed, then appended to
    events = out / "events.out.tfevents.0.planted"
    events.symlink_to(victim)  # an old event file: removed as a link, its target untouched
    _train_killed_after_first_checkpoint(profile, monkeypatch)
    assert victim.read_text() == "precious\n" and not events.is_symlink()
    assert log.is_file() and not log.is_symlink()
    assert [m["step"] for m in read_metrics(log) if "loss" in m] == [1, 2]

    log.unlink()  # a resume: the log is trimmed to the resumed step, then appended to
    log.symlink_to(victim)
    res = train(load_config(str(profile)))
    assert "resumed at step 2" in capsys.readouterr().out and res["steps"] == 4
    assert victim.read_text() == "precious\n"
    assert log.is_file() and not log.is_symlink()
    assert [m["step"] for m in read_metrics(log) if "loss" in m] == [3, 4]  # nothing read from the link's target


def test_resume_drops_a_torn_log_line(tiny_run, monkeypatch):
    profile, _, out = tiny_run
    _train_killed_after_first_checkpoint(profile, monkeypatch)
    log = out / "metrics.jsonl"
    with open(log, "a") as f:  # a run killed after its checkpoint: a step logged past it, then half a line
        f.write('{"step": 3, "loss": 99.0}\n{"step": 4, "loss": 0.')
    train(load_config(str(profile)))
    losses = [m for m in read_metrics(log) if "loss" in m]
    assert [m["step"] for m in losses] == [1, 2, 3, 4] and losses[2]["loss"] != 99.0


@pytest.mark.parametrize("link", ["train", "train/simcse", "train/simcse/last", "train/simcse/best"])
def test_a_linked_folder_in_the_run_is_refused(tiny_run, tmp_path, link):
    profile, run, _ = tiny_run
    target = tmp_path / "outside-dir"
    target.mkdir()
    (run / link).parent.mkdir(parents=True, exist_ok=True)
    (run / link).symlink_to(target, target_is_directory=True)
    with pytest.raises(UnsafePath) as e:
        train(load_config(str(profile)))
    assert str(e.value).startswith(f"{run / link} is a symbolic link inside {run}") and "\n" not in str(e.value)
    assert list(target.iterdir()) == []


def test_the_run_folder_itself_may_be_a_link(tmp_path, bert, senteval):
    real = tmp_path / "big-disk" / "r"
    write_table(real, "sentences", sentences_rows(24))
    (tmp_path / "r").symlink_to(real, target_is_directory=True)
    profile = write_profile(tmp_path / "p.toml", tmp_path, "r", bert, senteval, max_steps=2, eval_every=2)
    train(load_config(str(profile)))
    assert (real / "train" / "simcse" / "metrics.jsonl").is_file()


def test_open_append_replaces_a_link_and_check_below_ignores_the_root(tmp_path):
    victim = _outside(tmp_path)
    (tmp_path / "run").symlink_to(tmp_path / "outside", target_is_directory=True)  # the run itself: allowed
    check_below(tmp_path / "run", tmp_path / "run" / "victim.txt")
    real = tmp_path / "real"
    real.mkdir()
    (real / "log.txt").symlink_to(victim)
    with pytest.raises(UnsafePath, match="log.txt is a symbolic link"):
        check_below(real, real / "log.txt", final=True)
    with open_append(real, real / "log.txt") as f:
        f.write("log\n")
    assert victim.read_text() == "precious\n" and (real / "log.txt").read_text() == "log\n"


# ------------------------------------------------------------------------------------------------ symlinks: report
def _run_with_a_table(run: Path) -> Path:
    """One table and its manifest: the report draws the stage-seconds plot."""
    d = run / "sentences"
    d.mkdir(parents=True)
    rows = [{"sid": i, "text": f"sentence number {i}", "n_words": 3, "line_no": i} for i in range(5)]
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMAS["sentences"]), d / "part-00000-of-00001.parquet")
    (d / "_manifest.json").write_text(json.dumps({"stage": "sentences", "seconds": 1.5, "rows": {"sentences": 5},
                                                  "config": {}, "table": "sentences", "shards": 1}))
    return run


def test_report_replaces_planted_links_and_leaves_their_targets(tmp_path):
    from pipeline.report import write_report

    run = _run_with_a_table(tmp_path / "r")
    victim = _outside(tmp_path)
    png_victim = victim.with_name("victim.png")
    png_victim.write_text("not a png\n")
    (run / "report").mkdir()
    (run / "report" / "index.md").symlink_to(victim)
    (run / "report" / "stage_seconds.png").symlink_to(png_victim)
    index = write_report(run)
    assert victim.read_text() == "precious\n" and png_victim.read_text() == "not a png\n"
    assert index == run / "report" / "index.md" and index.is_file() and not index.is_symlink()
    assert "# Mining report" in index.read_text()
    png = run / "report" / "stage_seconds.png"
    assert png.is_file() and not png.is_symlink() and png.read_bytes().startswith(PNG_MAGIC)
    assert not list((run / "report").glob("*.tmp"))


def test_report_refuses_a_linked_report_folder(tmp_path):
    from pipeline.report import write_report

    run = _run_with_a_table(tmp_path / "r")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (run / "report").symlink_to(target, target_is_directory=True)
    with pytest.raises(UnsafePath, match=r"/r/report is a symbolic link inside .*: contramine does not write"):
        write_report(run)
    assert list(target.iterdir()) == []
    p = subprocess.run([sys.executable, "-m", "pipeline.report", str(run)], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert p.returncode == 2 and _one_line(p.stderr).startswith(f"error: {run / 'report'} is a symbolic link")
    assert list(target.iterdir()) == []


def test_compare_plots_and_checkpoint_json_replace_links(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trainer.compare_report import save_png

    victim = _outside(tmp_path)
    (tmp_path / "sts_bars.png").symlink_to(victim)
    fig = plt.figure()
    save_png(fig, tmp_path / "sts_bars.png")
    plt.close(fig)
    (tmp_path / "modules.json").symlink_to(victim)
    ckpt._write_json(tmp_path / "modules.json", [1])
    assert victim.read_text() == "precious\n"
    png = tmp_path / "sts_bars.png"
    assert png.read_bytes().startswith(PNG_MAGIC) and not png.is_symlink()
    assert json.loads((tmp_path / "modules.json").read_text()) == [1]


def test_evaluate_refuses_a_linked_eval_folder_before_loading_a_model(tmp_path, monkeypatch, capsys):
    from trainer import evaluate

    monkeypatch.setattr(evaluate, "ARTIFACTS", tmp_path / "artifacts")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / "eval").symlink_to(target, target_is_directory=True)
    assert evaluate.main(["--model", "no-such-model", "--name", "x"]) == 2
    assert _one_line(capsys.readouterr().err).startswith(f"error: {tmp_path / 'artifacts' / 'eval'} is a symbolic link")
    assert list(target.iterdir()) == []


# ------------------------------------------------------------------------------------------------ links: every writer
# Each test plants a link to a victim folder (hostile.victim_folder: files under the names contramine writes) where a
# command writes, renames or deletes, and checks the command refuses in one line naming the link, or writes around
# it, and that not a byte or a name of the victim changed.
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
    from pipeline.engine.store import Store

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
    from pipeline.export import export_run

    victim, before = _victim(tmp_path)
    run = _run_with_a_table(tmp_path / "r")
    plant(run / link, victim if link == "export" else victim / "sentences")
    with pytest.raises(UnsafePath) as e:
        export_run(run, "sentences")
    _refused(e, run / link)
    assert tree(victim) == before
    if link == "export":  # the command line: exit 2, the one line last, nothing written (~5 s: once)
        p = subprocess.run([sys.executable, "-m", "flows.cli", "export", "--run", "r", "--format", "sentences",
                            "--set", f"run.root={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert p.returncode == 2 and _one_line(p.stderr) == f"error: {e.value}", p.stderr
        assert tree(victim) == before


def _hnsw_run(tmp_path: Path):
    from pipeline.engine.store import Store
    from pipeline.schema import vectors_table

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
    from pipeline.search import index as ix

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
    from pipeline.engine.store import file_hash

    sids = plan_path.parent / plan["sids"]
    np.save(sids, np.arange(10**6, 10**6 + 400, dtype=np.int64))
    plan_path.write_text(json.dumps({**plan, "hashes": {**plan["hashes"], plan["sids"]: file_hash(sids)}}))


@pytest.mark.parametrize("plant_it", [_plant_sids, _plant_file, _plant_hash, _plant_consistent],
                         ids=["sids-outside", "file-outside", "hash-mismatch", "ids-no-sentence-has"])
def test_a_planted_index_plan_is_never_loaded_but_built_again(tmp_path, plant_it, caplog):
    from pipeline.search import index as ix

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
    from pipeline.search import index as ix

    cfg, store, _ = _hnsw_run(tmp_path)
    plan = ix.index_plan(cfg, store, 1)
    victim, _ = _victim(tmp_path)
    for bad in ("../../victim/notes.txt", str(victim / "notes.txt"), ".lock"):
        with pytest.raises(UnsafePath, match="the neighbours plan names .* as its file: not a file of"):
            ix.load_index(cfg, store, 1, {**plan, "file": bad})


def test_a_report_rerun_removes_only_the_plots_it_draws(tmp_path):
    from pipeline.report import write_report

    run = _run_with_a_table(tmp_path / "r")
    victim, before = _victim(tmp_path)
    (run / "report").mkdir()
    (run / "report" / "my_own.png").write_bytes(b"kept\n")
    plant(run / "report" / "rejected.png", victim / "stage_seconds.png")  # a plot this run no longer draws
    write_report(run)
    left = sorted(p.name for p in (run / "report").iterdir())
    assert left == [".lock", "index.md", "my_own.png", "stage_seconds.png"] and tree(victim) == before


def test_a_linked_compare_folder_is_refused_before_anything_trains(tiny_run, tmp_path):
    from trainer import compare as cmp

    profile, run, _ = tiny_run
    victim, before = _victim(tmp_path)
    plant(run / "compare", victim)
    with pytest.raises(UnsafePath) as e:
        cmp.compare(str(profile), None, ["compare.steps=1"], ["simcse"], 1)
    _refused(e, run / "compare")
    assert tree(victim) == before


def _hold(folder: Path, root: Path, what: str):
    """Another process holding `folder`'s lock until killed (started, and holding, when this returns)."""
    code = ("import sys, time; from pipeline.engine.lock import run_lock\n"
            "with run_lock(sys.argv[1], sys.argv[3], root=sys.argv[2]):\n    print('held', flush=True); time.sleep(300)")
    p = subprocess.Popen([sys.executable, "-c", code, str(folder), str(root), what], cwd=ROOT, text=True,
                         stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.stdout.readline().strip() == "held"
    return p


def test_two_trainings_of_one_objective_and_run_the_second_stops_in_one_line(tiny_run):
    from pipeline.engine.lock import RunBusy, run_lock

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
        p = subprocess.run([sys.executable, "-m", "flows.cli", "train", "--profile", str(profile)], cwd=ROOT,
                           env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 2 and _one_line(p.stderr) == f"error: {msg}", p.stderr
    finally:
        holder.kill()
        holder.wait()


def test_export_report_and_compare_lock_their_output_folders(tiny_run, tmp_path):
    from pipeline.engine.lock import RunBusy
    from pipeline.export import export_run
    from pipeline.report import write_report
    from trainer import compare as cmp

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
    code = ("import sys, time; from pipeline.engine.lock import run_lock\n"
            "with run_lock(sys.argv[1], 'theirs', root=sys.argv[2], name='.sentences.lock'):\n"
            "    print('held', flush=True); time.sleep(300)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(run / "export"), str(run)], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert holder.stdout.readline().strip() == "held"
    try:
        with pytest.raises(RunBusy, match=r"is being written by pid .*\(theirs\)"):
            export_run(run, "sentences")
    finally:
        holder.kill()
        holder.wait()
    assert not (run / "export" / "sentences").exists()
