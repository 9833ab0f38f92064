"""TensorBoard curves: `make train` writes event files beside metrics.jsonl whose loss, lr, grad-norm and dev series
are the log's numbers (as float32, TensorBoard's scalar type); a resumed run rewrites them from the trimmed log, so no
step is there twice; a missing tensorboard never stops training; `make tensorboard` refuses a RUN outside artifacts."""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import load_config
from train_helpers import read_metrics, sentences_rows, write_profile, write_table
from trainer import curves
from trainer.train import train

pytest.importorskip("tensorboard")


def scalar_series(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def raw_steps(folder: Path) -> Counter:
    """(tag, step) over every event file as written, without TensorBoard's purge logic in between."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    seen = Counter()
    for f in folder.glob("events.out.tfevents.*"):
        for ev in EventFileLoader(str(f)).Load():
            for v in ev.summary.value:
                seen[(v.tag, ev.step)] += 1
    return seen


def log_series(records: list[dict], key: str, sub: str | None = None) -> list[tuple[int, float]]:
    out = []
    for r in records:
        v = r.get(key)
        v = v.get(sub) if sub and isinstance(v, dict) else v
        if isinstance(v, (int, float)):
            out.append((r["step"], float(np.float32(v))))
    return out


@pytest.fixture
def profile(tmp_path, bert, senteval):
    write_table(tmp_path / "r", "sentences", sentences_rows(24))
    return write_profile(tmp_path / "p.toml", tmp_path, "r", bert, senteval, max_steps=4, eval_every=2)


def test_event_files_equal_metrics_jsonl_and_a_resume_writes_no_step_twice(profile):
    res = train(load_config(str(profile)))
    out, log = Path(res["metrics"]).parent, Path(res["metrics"])
    records = read_metrics(log)
    series = scalar_series(out)
    assert series["train/loss"] == log_series(records, "loss") and len(series["train/loss"]) == 4
    assert series["train/lr"] == log_series(records, "lr")
    assert series["train/grad_norm"] == log_series(records, "grad_norm")
    assert series["train/acc"] == log_series(records, "acc")
    dev_sets = next(r["dev"] for r in records if "dev" in r)
    for name in dev_sets:
        assert series[f"dev/{name}"] == log_series(records, "dev", name) and len(series[f"dev/{name}"]) == 2
    assert series["dev/score"] == log_series(records, "dev_score")

    # a run killed after its checkpoint logged steps it will redo: the resume drops them from the log and the curves
    with open(log, "a") as f:
        f.write(json.dumps({"step": 5, "loss": 99.0, "lr": 0.0}) + "\n")
    res = train(load_config(str(profile)))
    assert res["steps"] == 4
    assert scalar_series(out)["train/loss"] == log_series(read_metrics(log), "loss") == series["train/loss"]
    steps = raw_steps(out)
    assert max(steps.values()) == 1, [k for k, n in steps.items() if n > 1]  # no duplicate, in any event file
    assert ("train/loss", 5) not in steps and ("train/loss", 4) in steps


def test_a_missing_tensorboard_never_stops_training(profile, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # `import` raises ImportError
    res = train(load_config(str(profile)))
    assert res["steps"] == 4 and len([r for r in read_metrics(Path(res["metrics"])) if "loss" in r]) == 4
    assert not list(Path(res["metrics"]).parent.glob("events.out.tfevents.*"))
    assert "no TensorBoard curves" in capsys.readouterr().err


def test_make_tensorboard_opens_the_run_and_refuses_a_run_outside_artifacts(tmp_path, monkeypatch, capsys):
    assert curves.main(["--run", ".."]) == 2
    assert "run.name '..'" in capsys.readouterr().err
    (tmp_path / "myrun").mkdir()
    calls = []
    monkeypatch.setattr(curves.os, "execv", lambda exe, argv: calls.append(argv))
    monkeypatch.setattr(curves, "load_config",
                        lambda profile, sets: load_config(profile, sets + [f"run.root={tmp_path}"]))
    curves.main(["--run", "myrun", "--port", "6007"])
    assert calls and calls[0][-4:] == ["--logdir", str(tmp_path / "myrun"), "--port", "6007"]
    assert "tensorboard.main" in calls[0]
