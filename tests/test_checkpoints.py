"""Checkpoints of the trainer: kill -9 and resume to the same weights, the final evaluation, `best` loading in
AutoModel and sentence-transformers for every pooler, and DDP ranks equal to one process."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from contramine.pipeline.config import load_config
from contramine.pipeline.models.encode.encoder import Encoder
from tiny_bert import build_tiny_bert, tiny_encoder
from contramine.trainer import checkpoint as ckpt
from contramine.trainer.train import train
from train_helpers import ROOT, read_metrics, sentence, sentences_rows, write_profile, write_senteval, write_table


KILLER = """
import os, sys, time
import contramine.trainer.checkpoint as ckpt
saves, real = [0], ckpt.save_state
def save_then_hang(*a, **k):
    real(*a, **k)
    saves[0] += 1
    if saves[0] == int(os.environ["KILL_AFTER_SAVES"]):
        open(os.environ["SAVED_MARKER"], "w").close()
        time.sleep(600)  # a long training step: the test kills us here
ckpt.save_state = save_then_hang
from contramine.trainer.train import main
sys.exit(main(sys.argv[1:]))
"""


def _run(args, env, **kw):
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def test_kill_and_resume_ends_at_the_same_weights(tmp_path, bert, senteval):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(ROOT)}
    rows = sentences_rows(40)  # batch 8: 5 steps per epoch, 14 steps cross two epoch boundaries
    for run in ("whole", "killed"):
        write_table(tmp_path / run, "sentences", rows)
    # a row every 2 steps and at every checkpoint (3, 6, ...): windows of 1 or 2 steps on both sides of the kill
    common = dict(max_steps=14, eval_every=3, warmup_steps=2, weight_decay=0.01, log_every=2)
    whole = write_profile(tmp_path / "whole.toml", tmp_path, "whole", bert, senteval, num_workers=2, **common)
    killed = write_profile(tmp_path / "killed.toml", tmp_path, "killed", bert, senteval, num_workers=0, **common)

    p = _run(["-m", "contramine.trainer.train", "--profile", str(whole)], env)
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out

    marker = tmp_path / "saved"
    p = _run(["-c", KILLER, "--profile", str(killed)],
             {**env, "KILL_AFTER_SAVES": "3", "SAVED_MARKER": str(marker)})
    deadline = time.time() + 300
    while not marker.exists():
        assert p.poll() is None and time.time() < deadline, p.communicate()[0] if p.poll() is not None else "timeout"
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL
    last = tmp_path / "killed" / "train" / "simcse" / "last"
    mid = ckpt.load_state(last)
    assert (mid["step"], mid["epoch"], mid["batch_in_epoch"]) == (9, 1, 4)  # killed mid-run, mid-epoch

    p = _run(["-m", "contramine.trainer.train", "--profile", str(killed)], env)
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out
    assert "resumed at step 9" in out

    a = ckpt.load_state(tmp_path / "whole" / "train" / "simcse" / "last")
    b = ckpt.load_state(last)
    assert a["step"] == b["step"] == 14
    for k, v in a["objective"].items():
        torch.testing.assert_close(b["objective"][k], v, rtol=0, atol=1e-6, msg=k)
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        torch.testing.assert_close(sb["exp_avg_sq"], sa["exp_avg_sq"], rtol=0, atol=1e-9)
    assert a["best"] == b["best"] and a["best_step"] == b["best_step"]
    ma = [m for m in read_metrics(tmp_path / "whole" / "train" / "simcse" / "metrics.jsonl") if "loss" in m]
    mb = [m for m in read_metrics(last.parent / "metrics.jsonl") if "loss" in m]
    # the killed run's rows after its checkpoint are gone; the resumed run writes the rows (the same windows) an
    # uninterrupted run writes
    assert [m["step"] for m in mb] == [m["step"] for m in ma] == [1, 2, 3, 4, 6, 8, 9, 10, 12, 14]
    assert [m["steps_in_mean"] for m in mb] == [m["steps_in_mean"] for m in ma] == [1, 1, 1, 1, 2, 2, 1, 1, 2, 2]
    np.testing.assert_allclose([m["loss"] for m in mb], [m["loss"] for m in ma], rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------------------ checkpoints
@pytest.fixture(scope="module")
def mean_run(tmp_path_factory, bert, senteval):
    """A short mean-pooling run with the real final evaluation."""
    root = tmp_path_factory.mktemp("mean")
    write_table(root / "r", "sentences", sentences_rows(24))
    cfg = load_config(str(write_profile(root / "p.toml", root, "r", bert, senteval, pooler="mean",
                                        max_steps=6, eval_every=3, final_eval=True)))
    return cfg, train(cfg)


def test_final_eval_writes_results(mean_run, capsys):
    cfg, res = mean_run
    best = Path(res["best_dir"])
    results = json.loads((best / "results.json").read_text())
    start = json.loads((best / "start_results.json").read_text())
    assert set(results["sts"]) >= {"STS12", "STSBenchmark", "SICKRelatedness", "avg"}
    assert results["pooler"] == "mean" and start["sts"]["avg"] is not None
    assert res["results"]["best"]["sts"] == results["sts"]
    meta = json.loads((best / "train_config.json").read_text())
    assert meta["step"] == res["best_step"] and meta["st_exact"] and meta["config"]["train"]["max_steps"] == 6


def test_best_loads_with_automodel_and_sentence_transformers(mean_run):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    cfg, res = mean_run
    best = Path(res["best_dir"])
    ours = Encoder.load(str(best), pooler="mean", max_length=128, device="cpu")
    hf = AutoModel.from_pretrained(best)
    for k, v in hf.state_dict().items():
        assert torch.equal(v, ours.model.state_dict()[k]), k
    texts = [sentence(random.Random(i), 3, 40) for i in range(9)] + ["", "a"]
    st = SentenceTransformer(str(best), device="cpu")
    assert st.max_seq_length == 128  # eval length: the tiny BERT's 128 positions (no ST config to inherit)
    np.testing.assert_allclose(st.encode(texts), ours.encode(texts), atol=1e-5)


def test_best_carries_a_model_card_that_sentence_transformers_loads(mean_run):
    """`make train` writes best/README.md: objective, data, settings, the STS results of the final evaluation, and
    the papers to cite; sentence-transformers loads the folder with that card (and would push it to the Hub)."""
    from sentence_transformers import SentenceTransformer

    from contramine.pipeline.citations import CITATIONS

    cfg, res = mean_run
    best = Path(res["best_dir"])
    card = (best / "README.md").read_text(encoding="utf-8")
    assert card.startswith("---\nlibrary_name: sentence-transformers\n")
    objective = cfg.train.objective
    assert f"- {objective}\n" in card and f"of run `{cfg.run.name}`" in card  # which objective, which data
    assert '"max_steps": 6' in card  # the settings
    results = json.loads((best / "results.json").read_text())
    row = next(line for line in card.splitlines() if line.startswith("| this model |"))
    assert row.split(" | ")[-1].rstrip(" |") == f"{results['sts']['avg']:.2f}"  # the final STS results
    assert CITATIONS[objective] in card
    st = SentenceTransformer(str(best), device="cpu")
    assert st._model_card_text == card


@pytest.mark.parametrize("pooler,exact", [("cls_before_pooler", True), ("cls", True), ("mean", True),
                                          ("avg_first_last", False), ("mask", False)])
def test_sentence_transformers_modules_per_pooler(tmp_path, pooler, exact):
    from sentence_transformers import SentenceTransformer

    enc = tiny_encoder(pooler=pooler, seed=3, max_length=32)
    ckpt.save_encoder(tmp_path / "best", enc, {"objective": "simcse", "step": 1})
    meta = json.loads((tmp_path / "best" / "train_config.json").read_text())
    assert meta["st_exact"] is exact and meta["pooler"] == pooler
    assert (meta["st_note"] is None) is exact
    if not exact:
        assert pooler in (tmp_path / "best" / "README.md").read_text()
    st = SentenceTransformer(str(tmp_path / "best"), device="cpu")
    texts = ["the man plays the guitar .", "a dog ran in the park", "two women were walking home"]
    if exact:
        np.testing.assert_allclose(st.encode(texts), enc.encode(texts), atol=1e-5)


# ------------------------------------------------------------------------------------------------ DDP, profiles
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_two_ranks_match_one_process(tmp_path):
    """torchrun, 2 CPU ranks (gloo): each takes half of every global batch; with dropout off the weights equal the
    single-process run's (up to float summation order)."""
    bert = build_tiny_bert(tmp_path / "bert", dropout=0.0)
    senteval = write_senteval(tmp_path / "senteval")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    states = {}
    for run, launcher in (("one", []), ("two", ["-m", "torch.distributed.run", "--nproc_per_node", "2",
                                                 "--master_addr", "127.0.0.1", "--master_port", str(_free_port())])):
        write_table(tmp_path / run, "sentences", sentences_rows(32))
        profile = write_profile(tmp_path / f"{run}.toml", tmp_path, run, bert, senteval, pooler="mean", dropout=0.0,
                                max_steps=6, eval_every=3)
        if launcher:
            p = _run(launcher + ["-m", "contramine.trainer.train", "--profile", str(profile)], env)
            out, _ = p.communicate(timeout=300)
            assert p.returncode == 0, out
        else:  # the one process: this one (a subprocess would only add its imports)
            train(load_config(str(profile)))
        states[run] = ckpt.load_state(tmp_path / run / "train" / "simcse" / "last")
    assert len(states["two"]["rng"]) == 2 and states["two"]["step"] == 6
    for k, v in states["one"]["objective"].items():
        torch.testing.assert_close(states["two"]["objective"][k], v, rtol=0, atol=1e-5, msg=k)
