"""The trainer on a tiny random BERT: data reader, loop, kill/resume, checkpoints, CLI.

Everything runs on tiny mined tables written here with pipeline/schema.py and a tiny synthetic SentEval folder, so
the real evaluator (trainer/evaluate.py) scores dev and runs the final evaluation in well under a second.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from contramine.pipeline.config import load_config
from tiny_bert import tiny_encoder
from contramine.trainer import checkpoint as ckpt
from contramine.trainer.objectives import OBJECTIVES
from contramine.trainer.objectives.base import settings_of
from contramine.trainer.data import EpochBatches, MinedRows, epoch_permutation, make_loader
from contramine.pipeline.storage.tables import TableMissing
from contramine.trainer.train import main, train

from train_helpers import ROOT, read_metrics, sentences_rows, write_profile, write_table


def test_epoch_shuffle_is_deterministic_and_differs_between_epochs(tmp_path):
    write_table(tmp_path, "sentences", sentences_rows(50))
    rows = MinedRows(tmp_path, ("sentences",))
    assert len(rows) == 50
    a, b = epoch_permutation(50, 3, 0), epoch_permutation(50, 3, 0)
    assert np.array_equal(a, b) and sorted(a) == list(range(50))
    assert not np.array_equal(a, epoch_permutation(50, 3, 1))
    assert not np.array_equal(a, epoch_permutation(50, 4, 0))
    # rows come back ordered by sid whatever the part files' order
    assert [r["sid"] for r in rows.rows(np.arange(50))] == [s * 3 + 1 for s in range(50)]


@pytest.mark.parametrize("drop_last", [True, False])
def test_rank_sharding_covers_every_row_once_and_keeps_the_global_batch(tmp_path, drop_last):
    write_table(tmp_path, "sentences", sentences_rows(50))
    rows = MinedRows(tmp_path, ("sentences",))
    sids = lambda rs: [r["sid"] for r in rs]  # noqa: E731  (collate that returns the rows' sids)
    single = EpochBatches(rows, sids, 8, seed=1, epoch=2, drop_last=drop_last)
    for world in (2, 4):
        shards = [EpochBatches(rows, sids, 8, seed=1, epoch=2, rank=r, world=world, drop_last=drop_last)
                  for r in range(world)]
        seen = []
        for k in range(len(single)):
            parts = [s[k] for s in shards]
            assert sum(parts, []) == single[k], "the ranks' slices make up the single-process global batch"
            seen += sum(parts, [])
        assert len(seen) == len(set(seen)) == (48 if drop_last else 50)
    with pytest.raises(ValueError, match="divide"):
        EpochBatches(rows, sids, 8, seed=1, epoch=0, rank=0, world=3)


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_resumes_at_a_position(tmp_path, workers):
    if workers:
        # Worker processes fork from this process; in a test session that has already run Prefect flows a
        # forked DataLoader worker can die at shutdown (exit 1, no traceback) — an artefact of the shared test
        # process, not of training, which never runs Prefect. Check the multi-worker loader in a clean process.
        code = (f"import sys, pathlib; sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests')!r}]; "
                f"import test_train; test_train._loader_resume_check(pathlib.Path({str(tmp_path)!r}), {workers})")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
    else:
        _loader_resume_check(tmp_path, workers)


def _loader_resume_check(tmp_path, workers):
    write_table(tmp_path, "sentences", sentences_rows(40))
    rows = MinedRows(tmp_path, ("sentences",))
    collate = _SidCollate()
    full = list(make_loader(rows, collate, 8, seed=5, epoch=1, num_workers=workers))
    tail = list(make_loader(rows, collate, 8, seed=5, epoch=1, start=3, num_workers=workers))
    assert len(full) == 5 and tail == full[3:]
    # the global torch RNG (dropout) is untouched by building and iterating a loader
    state = torch.get_rng_state()
    list(make_loader(rows, collate, 8, seed=5, epoch=0, num_workers=workers))
    assert torch.equal(state, torch.get_rng_state())


class _SidCollate:
    """A picklable collate (DataLoader workers) returning the sids it was given."""

    def __call__(self, rows):
        return [r["sid"] for r in rows]


def test_reader_joins_tables_by_sid(tmp_path):
    sents = sentences_rows(6)
    write_table(tmp_path, "sentences", sents)
    sid = [r["sid"] for r in sents]
    write_table(tmp_path, "triplets", [
        {"sid": sid[1], "anchor": "IGNORED", "paraphrase": "para one", "negation": "neg one", "para_mer": 0.3,
         "para_chain": "de"},
        {"sid": sid[4], "anchor": "IGNORED", "paraphrase": None, "negation": "neg four", "para_mer": None,
         "para_chain": None}], parts=1)
    emb = np.random.default_rng(0).normal(size=(6, 5)).astype(np.float32)
    write_table(tmp_path, "embeddings", [{"sid": s, "emb": e.tolist()} for s, e in zip(sid, emb) if s != sid[2]])
    rows = MinedRows(tmp_path, ("sentences", "triplets", "embeddings"))
    out = rows.rows(np.array([4, 1, 2, 0]))
    assert [r["sid"] for r in out] == [sid[4], sid[1], sid[2], sid[0]]
    assert [r["text"] for r in out] == [sents[i]["text"] for i in (4, 1, 2, 0)]  # the row source's text
    assert (out[0]["paraphrase"], out[0]["negation"]) == (None, "neg four")
    assert (out[1]["paraphrase"], out[1]["negation"]) == ("para one", "neg one")
    assert out[3]["paraphrase"] is None and out[3]["negation"] is None
    assert np.array_equal(out[0]["emb"], emb[4]) and out[2]["emb"] is None
    assert set(out[0]) == {"sid", "text", "positives", "negatives", "paraphrase", "negation", "emb"}

    write_table(tmp_path, "pairs", [{"sid": 9, "anchor": "an anchor", "positives": ["p1", "p2"],
                                     "negatives": ["n1"]}], parts=1)
    (r,) = MinedRows(tmp_path, ("pairs",)).rows(np.array([0]))
    assert (r["text"], r["positives"], r["negatives"], r["emb"]) == ("an anchor", ["p1", "p2"], ["n1"], None)


def test_missing_table_names_it_and_its_stage(tmp_path, bert, senteval, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "empty").mkdir()  # runs that exist (one that does not: the next test)
    with pytest.raises(TableMissing, match=r"'pairs'.*contramine stage pairs --run run"):
        MinedRows(tmp_path / "run", ("pairs",))
    profile = write_profile(tmp_path / "p.toml", tmp_path, "empty", bert, senteval)
    assert main(["--profile", str(profile)]) == 2
    err = capsys.readouterr().err
    assert "'sentences'" in err and "contramine mine --run empty" in err
    assert str(tmp_path / "empty" / "sentences") in err


def test_a_run_that_does_not_exist_is_that_line(tmp_path, bert, senteval, capsys):
    profile = write_profile(tmp_path / "p.toml", tmp_path, "typo", bert, senteval)
    assert main(["--profile", str(profile)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'typo'}: no such run (`contramine mine --run typo` first)"


def test_fewer_rows_than_a_batch_is_one_line(tmp_path, bert, senteval, capsys):
    """A mine of an empty or tiny corpus: `train` says so in one line (it was a ValueError's traceback)."""
    write_table(tmp_path / "tiny", "sentences", sentences_rows(3), parts=1)
    profile = write_profile(tmp_path / "p.toml", tmp_path, "tiny", bert, senteval)
    assert main(["--profile", str(profile)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: table 'sentences'") and "has 3 rows, fewer than one batch of 8" \
        in err[0] and "train.batch_size" in err[0], err


# ------------------------------------------------------------------------------------------------ the loop
def test_loss_goes_down(tmp_path, bert, senteval):
    run = "r"
    write_table(tmp_path / run, "sentences", sentences_rows(16))
    cfg = load_config(str(write_profile(tmp_path / "p.toml", tmp_path, run, bert, senteval, pooler="mean",
                                        max_steps=30, eval_every=100, lr=3e-4)))
    res = train(cfg)
    losses = [m["loss"] for m in read_metrics(Path(res["metrics"])) if "loss" in m]
    assert len(losses) == 30 and all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses
    assert res["steps"] == 30 and res["best_step"] == 30  # evaluated at the last step even off the cadence
    assert (Path(res["best_dir"]) / "model.safetensors").is_file()


def test_resume_with_another_config_starts_fresh(tmp_path, bert, senteval, capsys):
    write_table(tmp_path / "r", "sentences", sentences_rows(24))
    p = write_profile(tmp_path / "p.toml", tmp_path, "r", bert, senteval, max_steps=4, eval_every=2)
    train(load_config(str(p)))
    # same config: last/ is already at the end, nothing is trained again
    res = train(load_config(str(p)))
    assert res["steps"] == 4 and "resumed at step 4" in capsys.readouterr().out
    res = train(load_config(str(p), ["train.lr=5e-4"]))
    out = capsys.readouterr()
    assert "another configuration" in out.err and "resumed" not in out.out
    assert len([m for m in read_metrics(Path(res["metrics"])) if "loss" in m]) == 4


def test_a_logged_row_holds_the_mean_of_its_steps(tmp_path, bert, senteval, capsys):
    """log_every = 3: rows at step 1, every 3 steps, every evaluation and the last step, each the mean of the steps
    since the previous row (the same run logged every step gives the per-step numbers); the numbers do not change
    the weights' trajectory, so log_every is not part of the resume key."""
    write_table(tmp_path / "r", "sentences", sentences_rows(16))
    profile = write_profile(tmp_path / "p.toml", tmp_path, "r", bert, senteval, max_steps=8, eval_every=5)
    every = train(load_config(str(profile)))
    per_step = {m["step"]: m for m in read_metrics(Path(every["metrics"])) if "loss" in m}
    assert sorted(per_step) == list(range(1, 9)) and all(m["steps_in_mean"] == 1 for m in per_step.values())
    res = train(load_config(str(profile), ["train.log_every=3"]))  # the same configuration: resumed, at its end
    assert "resumed at step 8" in capsys.readouterr().out and res["steps"] == 8

    res = train(load_config(str(profile), ["train.log_every=3", f"train.output={tmp_path / 'windows'}"]))
    rows = [m for m in read_metrics(Path(res["metrics"])) if "loss" in m]
    windows = {1: [1], 3: [2, 3], 5: [4, 5], 6: [6], 8: [7, 8]}  # 5: an evaluation; 8: the last step
    assert [m["step"] for m in rows] == list(windows)
    for row in rows:
        steps = windows[row["step"]]
        assert row["steps_in_mean"] == len(steps)
        for key in ("loss", "grad_norm", "acc"):
            assert row[key] == pytest.approx(np.mean([per_step[s][key] for s in steps]), rel=1e-6), (row, key)
        assert row["lr"] == per_step[row["step"]]["lr"]  # the rate after the row's step, as every row has it


@pytest.fixture(scope="module")
def all_tables(tmp_path_factory) -> Path:
    """Every table an objective reads, for one run: sentences, triplets (half the sentences), embeddings, pairs."""
    run = tmp_path_factory.mktemp("all") / "r"
    sents = sentences_rows(16)
    write_table(run, "sentences", sents)
    write_table(run, "triplets", [{"sid": r["sid"], "anchor": r["text"], "paraphrase": r["text"] + " again",
                                   "negation": "not " + r["text"], "para_mer": 0.3, "para_chain": "de"}
                                  for r in sents if r["sid"] % 2])
    emb = np.random.default_rng(0).normal(size=(16, 32)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    write_table(run, "embeddings", [{"sid": r["sid"], "emb": e.tolist()} for r, e in zip(sents, emb)])
    write_table(run, "pairs", [{"sid": r["sid"], "anchor": r["text"], "positives": [r["text"] + " too"],
                                "negatives": ["a dog", "the cat"]} for r in sents])
    return run


@pytest.mark.parametrize("objective", ["simcse", "debcse", "osscse", "whitenedcse", "dclr"])
def test_every_objective_trains_on_its_tables(all_tables, bert, senteval, objective):
    root = all_tables.parent
    cfg = load_config(str(write_profile(root / f"{objective}.toml", root, all_tables.name, bert, senteval,
                                        objective=objective, max_steps=3, eval_every=2, whitenedcse={"groups": 4})))
    res = train(cfg)
    assert res["steps"] == 3 and res["best_step"] in (2, 3)
    meta = json.loads((Path(res["best_dir"]) / "train_config.json").read_text())
    assert meta["pooler"] == ("mask" if objective == "osscse" else "cls_before_pooler")
    losses = [m["loss"] for m in read_metrics(Path(res["metrics"])) if "loss" in m]
    assert len(losses) == 3 and all(np.isfinite(losses))


def test_osscse_says_loudly_when_its_margin_term_has_no_data(all_tables, bert, senteval, capsys, tmp_path):
    """Offline mining gives triplets with negations but no paraphrases: l_m is then 0 all run long. The trainer says
    so once at the start; and the checkpoint records the template it trained with as its evaluation prompt."""
    root = tmp_path
    sents = sentences_rows(16)
    write_table(root / "neg-only", "sentences", sents)
    write_table(root / "neg-only", "triplets", [{"sid": r["sid"], "anchor": r["text"], "paraphrase": None,
                                                "negation": "not " + r["text"], "para_mer": None, "para_chain": None}
                                               for r in sents])
    templates = ['Here "{s}" means [MASK] .', 'So "{s}" is [MASK] .']
    cfg = load_config(str(write_profile(root / "o.toml", root, "neg-only", bert, senteval, objective="osscse",
                                        max_steps=2, eval_every=2, osscse={"templates": templates})))
    res = train(cfg)
    err = capsys.readouterr().err
    assert err.count("WARNING") == 1 and "l_m is 0" in err and "0 have a paraphrase, 16 a negation" in err
    meta = json.loads((Path(res["best_dir"]) / "train_config.json").read_text())
    assert meta["pooler"] == "mask" and meta["prompt"] == templates[0]
    assert all(m["l_m"] == 0 for m in read_metrics(Path(res["metrics"])) if "l_m" in m)
    # with paraphrase + negation rows there is no warning
    cfg = load_config(str(write_profile(root / "full.toml", all_tables.parent, all_tables.name, bert, senteval,
                                        objective="osscse", max_steps=1, eval_every=1)))
    train(cfg)
    assert "WARNING" not in capsys.readouterr().err


def test_make_eval_uses_the_checkpoints_own_settings(tmp_path, senteval, monkeypatch, capsys):
    """`make eval MODEL=<best>` scores a checkpoint with the pooler, prompt and length it was trained with."""
    from contramine.trainer import evaluate as ev

    enc = tiny_encoder(pooler="mask", seed=4, max_length=24, prompt='My "{s}" is [MASK] .')
    ckpt.save_encoder(tmp_path / "best", enc, {"objective": "osscse", "step": 1})
    monkeypatch.setattr(ev, "ARTIFACTS", tmp_path / "artifacts")
    assert ev.main(["--model", str(tmp_path / "best"), "--data-dir", str(senteval), "--name", "ckpt"]) == 0
    res = json.loads((tmp_path / "artifacts" / "eval" / "ckpt" / "results.json").read_text())
    assert (res["pooler"], res["max_length"]) == ("mask", 24)
    want = ev.evaluate_all(enc, senteval, progress=False)
    assert res["sts"] == want["sts"]
    # flags override the checkpoint's settings
    assert ev.main(["--model", str(tmp_path / "best"), "--data-dir", str(senteval), "--name", "flags",
                    "--pooler", "mean", "--max-length", "16"]) == 0
    res = json.loads((tmp_path / "artifacts" / "eval" / "flags" / "results.json").read_text())
    assert (res["pooler"], res["max_length"]) == ("mean", 16)


@pytest.mark.parametrize("profile,expect", [
    ("simcse-paper", {"objective": "simcse", "batch_size": 64, "lr": 3e-5, "epochs": 1, "max_length": 32,
                      "eval_every": 125, "pooler": "cls_before_pooler", "simcse.mlp_train_only": True}),
    ("whitenedcse-paper", {"objective": "whitenedcse", "batch_size": 64, "lr": 3e-5, "epochs": 1,
                           "whitenedcse.positives": 3}),
    ("dclr-paper", {"objective": "dclr", "batch_size": 128, "lr": 3e-5, "epochs": 3, "dclr.phi": 0.9,
                    "dclr.noise_per_row": 1}),
])
def test_paper_profiles(profile, expect):
    cfg = load_config(profile)
    assert cfg.train.model == "bert-base-uncased" and cfg.run.name == profile and cfg.train.temperature == 0.05
    settings = settings_of(OBJECTIVES[cfg.train.objective], cfg.train)  # [train.<objective>], validated
    for key, value in expect.items():
        section, _, name = key.rpartition(".")
        got = getattr(settings, name) if section else getattr(cfg.train, key)
        assert got == value, key


# ------------------------------------------------------------------------------------------------ dev precision
def _float32_state() -> dict:
    return {"cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "autocast": torch.is_autocast_enabled("cpu")}


@pytest.fixture
def tf32_training_settings():
    """TF32 on, as train() sets it on a GPU (this CPU-only suite cannot take that branch): the test's "training
    settings". Whatever the test does, the defaults are back afterwards."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    yield _float32_state()
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
    torch.set_float32_matmul_precision(saved[2])


def test_dev_evaluation_is_strict_float32_and_training_settings_come_back(tmp_path, bert, senteval, monkeypatch,
                                                                          tf32_training_settings):
    """During the dev evaluation inside training (every Encoder.encode call, i.e. the dev embeddings), TF32 is off,
    the float32 matmul precision is "highest" and no autocast is on, although the training steps around it run with
    TF32 and bf16 autocast; the training steps after an evaluation see their settings again, and so does the caller."""
    from contramine.pipeline.models.encode.encoder import Encoder

    from contramine.trainer.objectives.simcse import SimCSE

    seen = {"encode": [], "step": []}
    real_encode, real_forward = Encoder.encode, SimCSE.forward

    def encode(self, *a, **k):
        seen["encode"].append(_float32_state())
        return real_encode(self, *a, **k)

    def forward(self, batch):
        seen["step"].append(_float32_state())
        return real_forward(self, batch)

    monkeypatch.setattr(Encoder, "encode", encode)
    monkeypatch.setattr(SimCSE, "forward", forward)
    write_table(tmp_path / "r", "sentences", sentences_rows(16))
    cfg = load_config(str(write_profile(tmp_path / "p.toml", tmp_path, "r", bert, senteval, max_steps=5, eval_every=2,
                                        precision="bf16")))
    res = train(cfg)
    strict = {"cuda.matmul.allow_tf32": False, "cudnn.allow_tf32": False, "float32_matmul_precision": "highest",
              "autocast": False}
    assert len(seen["encode"]) == 3 and all(s == strict for s in seen["encode"])  # evaluations at steps 2, 4, 5
    training = {**tf32_training_settings, "autocast": True}
    assert len(seen["step"]) == 5 and all(s == training for s in seen["step"])  # steps 3 and 5 follow evaluations
    assert _float32_state() == tf32_training_settings and res["best_step"] in (2, 4, 5)


def test_best_dev_score_is_what_make_eval_computes_for_best(tmp_path, bert, senteval, monkeypatch,
                                                             tf32_training_settings):
    """The dev numbers best/ was chosen on (train_config.json, metrics.jsonl) equal `make eval`'s for best/, on the
    same data: STS-B dev and SICK trial, all pairs."""
    from contramine.trainer import evaluate as ev

    write_table(tmp_path / "r", "sentences", sentences_rows(24))
    cfg = load_config(str(write_profile(tmp_path / "p.toml", tmp_path, "r", bert, senteval, pooler="mean",
                                        max_steps=6, eval_every=2, eval_sick=True)))
    res = train(cfg)
    best = Path(res["best_dir"])
    meta = json.loads((best / "train_config.json").read_text())
    assert meta["step"] == res["best_step"] and set(meta["dev"]) == {"STSBenchmark/dev", "SICK/trial"}
    monkeypatch.setattr(ev, "ARTIFACTS", tmp_path / "artifacts")
    assert ev.main(["--model", str(best), "--data-dir", str(senteval), "--name", "best", "--probe", ""]) == 0
    made = json.loads((tmp_path / "artifacts" / "eval" / "best" / "results.json").read_text())
    assert made["dev"] == meta["dev"]
    assert meta["dev_score"] == res["best_dev"] == sum(made["dev"].values()) / 2
    logged = [m for m in read_metrics(Path(res["metrics"])) if m.get("step") == res["best_step"] and "dev" in m]
    assert logged[0]["dev"] == made["dev"] and logged[0]["dev_score"] == res["best_dev"]
