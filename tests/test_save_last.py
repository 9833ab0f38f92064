"""last/ written off the training step (trainer/save_last.py): the snapshot is what is written whatever the step does
next, one save at a time, errors come back to the training thread, and a run's last/ is whole when train returns."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from contramine.pipeline.config import load_config
from contramine.trainer import checkpoint as ckpt
from contramine.trainer.save_last import LastSaver, host_snapshot
from contramine.trainer.train import train
from train_helpers import sentences_rows, write_profile, write_table


def test_the_snapshot_is_written_whatever_the_step_changes_next(tmp_path, monkeypatch):
    release, writing = threading.Event(), threading.Event()
    real = ckpt.save_state

    def slow(*a, **k):
        writing.set()
        assert release.wait(30)
        return real(*a, **k)

    monkeypatch.setattr(ckpt, "save_state", slow)
    w = torch.zeros(4)
    state = {"objective": {"w": w}, "optimizer": {"state": {0: {"exp_avg": w * 0}}}, "step": 3, "rng": [w]}
    saver = LastSaver()
    saver.save(tmp_path / "last", state, {"step": 3})
    assert writing.wait(30) and saver.busy  # save returned while the write waits: the step goes on
    w.add_(1.0)  # the next step changes the live tensors in place
    release.set()
    saver.join()
    back = torch.load(tmp_path / "last" / "state.pt", weights_only=True)
    assert torch.equal(back["objective"]["w"], torch.zeros(4)) and back["step"] == 3 and not saver.busy


def test_one_save_at_a_time_in_order(tmp_path, monkeypatch):
    real, active, peak, order = ckpt.save_state, [0], [0], []

    def counted(dst, state, meta):
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        order.append(state["step"])
        real(dst, state, meta)
        active[0] -= 1

    monkeypatch.setattr(ckpt, "save_state", counted)
    saver = LastSaver()
    for step in range(1, 5):
        saver.save(tmp_path / "last", {"step": step, "t": torch.full((2,), float(step))}, {"step": step})
    saver.join()
    assert order == [1, 2, 3, 4] and peak[0] == 1
    assert torch.load(tmp_path / "last" / "state.pt", weights_only=True)["step"] == 4


def test_a_failed_save_is_raised_in_the_training_thread(tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt, "save_state", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    saver = LastSaver()
    saver.save(tmp_path / "last", {"step": 1}, {})
    with pytest.raises(OSError, match="disk full"):
        saver.join()
    saver.join()  # raised once
    saver.save(tmp_path / "last", {"step": 2}, {})
    saver.join_quietly()  # the caller's own error wins


def test_best_is_written_from_its_copy_before_last(tmp_path, monkeypatch):
    from tiny_bert import tiny_encoder
    from contramine.trainer.save_last import host_encoder

    enc = tiny_encoder(pooler="mean", seed=1)
    copy = host_encoder(enc)
    order, real_best, real_last = [], ckpt.save_encoder, ckpt.save_state
    monkeypatch.setattr(ckpt, "save_encoder", lambda *a: (order.append("best"), real_best(*a))[1])
    monkeypatch.setattr(ckpt, "save_state", lambda *a: (order.append("last"), real_last(*a))[1])
    want = {k: v.clone() for k, v in enc.model.state_dict().items()}
    saver = LastSaver()
    saver.save(tmp_path / "last", {"step": 2}, {"step": 2}, best=(tmp_path / "best", copy, {"step": 2}))
    with torch.no_grad():
        for p in enc.model.parameters():  # training goes on in place
            p.add_(1.0)
    saver.join()
    assert order == ["best", "last"]
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "best" / "model.safetensors"))
    assert all(torch.equal(saved[k], want[k]) for k in saved) and saved


def test_host_snapshot_copies_tensors_and_keeps_the_structure():
    t = torch.arange(3.0, requires_grad=True)
    snap = host_snapshot({"a": [t, (t, 2)], "b": None, "c": "x"})
    assert snap["a"][0] is not t and not snap["a"][0].requires_grad and isinstance(snap["a"][1], tuple)
    assert snap["a"][0].data_ptr() != t.data_ptr() and torch.equal(snap["a"][1][0], t.detach())
    assert snap["b"] is None and snap["c"] == "x"


def test_train_returns_with_its_last_checkpoint_on_disk_and_fails_with_a_failed_save(tmp_path, bert, senteval,
                                                                                      monkeypatch):
    write_table(tmp_path / "r", "sentences", sentences_rows(24))
    cfg = load_config(str(write_profile(tmp_path / "p.toml", tmp_path, "r", bert, senteval, max_steps=4,
                                        eval_every=2)))
    real, saved = ckpt.save_state, []

    def slow(dst, state, meta):  # slower than the steps: train must still wait for the last one
        time.sleep(0.3)
        real(dst, state, meta)
        saved.append(state["step"])

    monkeypatch.setattr(ckpt, "save_state", slow)
    res = train(cfg, resume=False)
    assert saved == [2, 4] and ckpt.load_state(res["last_dir"])["step"] == 4
    monkeypatch.setattr(ckpt, "save_state", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        train(cfg, resume=False)
