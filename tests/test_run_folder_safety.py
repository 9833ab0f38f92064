"""A run folder received from someone else: a planted pickle in last/state.pt runs no code and is one `error:` line,
and no file the trainer, the evaluator or the report writes goes through a symlink planted in the run (every other
writer, planted index plans and output-folder locks: tests/test_links_everywhere.py)."""
from __future__ import annotations

import json
import os
import pickle
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hostile import one_line, run_with_a_table
from contramine.pipeline.config import load_config
from contramine.pipeline.storage.safe_paths import UnsafePath, check_below, open_append
from contramine.trainer import checkpoint as ckpt
from contramine.trainer.train import train
from train_helpers import ROOT, read_metrics, sentences_rows, write_profile, write_table
from child_env import CHILD_PYTHONPATH

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
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": CHILD_PYTHONPATH}
    p = subprocess.run([sys.executable, "-m", "contramine.flows.cli", "train", "--profile", str(profile)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr
    assert one_line(p.stderr) == f"error: {msg}"
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
    """Train, dying right after last/ is saved at step 2 (of 4): a same-configuration rerun resumes at step 2. (last/
    is written on a background thread: the training thread dies once that write is done.)"""
    from contramine.trainer.save_last import LastSaver

    real = LastSaver.save

    def save_then_die(self, *a, **k):
        real(self, *a, **k)
        self.join()
        raise Killed

    monkeypatch.setattr(LastSaver, "save", save_then_die)
    with pytest.raises(Killed):
        train(load_config(str(profile)))
    monkeypatch.setattr(LastSaver, "save", real)


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
def test_report_replaces_planted_links_and_leaves_their_targets(tmp_path):
    from contramine.pipeline.report import write_report

    run = run_with_a_table(tmp_path / "r")
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
    from contramine.pipeline.report import write_report

    run = run_with_a_table(tmp_path / "r")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (run / "report").symlink_to(target, target_is_directory=True)
    with pytest.raises(UnsafePath, match=r"/r/report is a symbolic link inside .*: contramine does not write"):
        write_report(run)
    assert list(target.iterdir()) == []
    p = subprocess.run([sys.executable, "-m", "contramine.pipeline.report", str(run)], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": CHILD_PYTHONPATH}, timeout=120)
    assert p.returncode == 2 and one_line(p.stderr).startswith(f"error: {run / 'report'} is a symbolic link")
    assert list(target.iterdir()) == []


def test_compare_plots_and_checkpoint_json_replace_links(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from contramine.trainer.compare_report import save_png

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
    from contramine.trainer import evaluate

    monkeypatch.setattr(evaluate, "ARTIFACTS", tmp_path / "artifacts")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / "eval").symlink_to(target, target_is_directory=True)
    assert evaluate.main(["--model", "no-such-model", "--name", "x"]) == 2
    assert one_line(capsys.readouterr().err).startswith(f"error: {tmp_path / 'artifacts' / 'eval'} is a symbolic link")
    assert list(target.iterdir()) == []
