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

from contramine.pipeline.config import load_config
from train_helpers import read_metrics, sentences_rows, write_profile, write_table
from contramine.trainer import curves
from contramine.trainer.train import train

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
    monkeypatch.setattr(curves, "serve", lambda run_dir, port: calls.append((run_dir, port)) or 0)
    monkeypatch.setattr(curves, "load_config",
                        lambda profile, sets: load_config(profile, sets + [f"run.root={tmp_path}"]))
    assert curves.main(["--run", "myrun", "--port", "6007"]) == 0
    assert calls == [(tmp_path / "myrun", 6007)]
    assert "--logdir " + str(tmp_path / "myrun") in capsys.readouterr().out


def _events(folder: Path, tag: str = "train/loss") -> Path:
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(log_dir=str(folder))
    w.add_scalar(tag, 1.0, 1)
    w.close()
    return folder


def test_tensorboard_never_follows_a_link_out_of_the_run_nor_loops(tmp_path):
    """A received run with `train/loop -> ..`, a folder linked to another run's curves and an event file linked from
    outside: TensorBoard (its multiplexer, with the listing `make tensorboard` gives it) sees the run's own curves
    only, and its walk ends."""
    from tensorboard.backend.event_processing import io_wrapper
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

    run = tmp_path / "r"
    _events(run / "train" / "simcse")
    _events(run / "compare" / "debcse" / "seed-0")
    outside = _events(tmp_path / "elsewhere" / "secret")
    (run / "train" / "loop").symlink_to("..", target_is_directory=True)
    (run / "train" / "stolen").symlink_to(outside, target_is_directory=True)
    (run / "train" / "simcse" / "best").mkdir()
    (run / "train" / "simcse" / "best" / "events.out.tfevents.1.x").symlink_to(next(outside.iterdir()))
    want = [str(run / "compare" / "debcse" / "seed-0"), str(run / "train" / "simcse")]
    assert curves.event_folders(run) == want
    assert curves.plain_files(str(run / "train" / "simcse" / "best")) == []

    mp = pytest.MonkeyPatch()
    with mp.context() as m:  # what serve() installs before TensorBoard starts
        m.setattr(io_wrapper, "GetLogdirSubdirectories", lambda path: tuple(curves.event_folders(path)))
        m.setattr(io_wrapper, "ListDirectoryAbsolute", curves.plain_files)
        mux = EventMultiplexer()
        mux.AddRunsFromDirectory(str(run))
        mux.Reload()
    assert sorted(mux.Runs()) == ["compare/debcse/seed-0", "train/simcse"]
