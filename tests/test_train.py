"""The trainer on a tiny random BERT: data reader, loop, kill/resume, checkpoints, CLI.

Everything runs on tiny mined tables written here with pipeline/schema.py and a tiny synthetic SentEval folder, so
the real evaluator (trainer/evaluate.py) scores dev and runs the final evaluation in well under a second.
"""
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
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from pipeline.config import load_config
from pipeline.encoder import Encoder
from pipeline.schema import SCHEMAS
from tiny_bert import WORDS, build_tiny_bert, tiny_encoder
from trainer import checkpoint as ckpt
from trainer.data import EpochBatches, MinedRows, TableMissing, epoch_permutation, make_loader
from trainer.train import main, train

ROOT = Path(__file__).resolve().parent.parent
VOCAB = [w for w in WORDS if w.isalpha()]


# ------------------------------------------------------------------------------------------------ fixtures
def sentence(rng: random.Random, lo: int = 4, hi: int = 12) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(rng.randint(lo, hi)))


def write_table(run_dir: Path, name: str, rows: list[dict], parts: int = 2) -> None:
    """A mined table as the pipeline writes it: part files, split by contiguous sid ranges (written in reverse
    order so the reader cannot rely on file order)."""
    d = run_dir / name
    d.mkdir(parents=True, exist_ok=True)
    chunks = np.array_split(np.arange(len(rows)), parts)
    for i, idx in reversed(list(enumerate(chunks))):
        pq.write_table(pa.Table.from_pylist([rows[j] for j in idx], schema=SCHEMAS[name]),
                       d / f"part-{i:05d}-of-{parts:05d}.parquet")


def sentences_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for sid in range(n):
        text = sentence(rng)
        out.append({"sid": sid * 3 + 1, "text": text, "n_words": len(text.split()), "line_no": sid})
    return out


def write_senteval(root: Path, n: int = 16, seed: int = 0) -> Path:
    """A SentEval-layout folder with n scored pairs per file: enough for every number evaluate_all reports."""
    rng = random.Random(seed)

    def pairs():
        return [(sentence(rng), sentence(rng), round(rng.uniform(0, 5), 2)) for _ in range(n)]

    for task in ("STS12", "STS13", "STS14", "STS15", "STS16"):
        d = root / "STS" / f"{task}-en-test"
        d.mkdir(parents=True)
        ps = pairs()
        (d / "STS.input.news.txt").write_text("".join(f"{a}\t{b}\n" for a, b, _ in ps))
        (d / "STS.gs.news.txt").write_text("".join(f"{g}\n" for *_, g in ps))
    d = root / "STS" / "STSBenchmark"
    d.mkdir(parents=True)
    for split in ("train", "dev", "test"):
        (d / f"sts-{split}.csv").write_text(
            "".join(f"main-captions\tMSRvid\t2012test\t{i:04d}\t{g}\t{a}\t{b}\n" for i, (a, b, g) in enumerate(pairs())))
    d = root / "SICK"
    d.mkdir(parents=True)
    for name in ("SICK_train.txt", "SICK_trial.txt", "SICK_test_annotated.txt"):
        (d / name).write_text("pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n" + "".join(
            f"{i}\t{a}\t{b}\t{g}\tNEUTRAL\n" for i, (a, b, g) in enumerate(pairs())))
    return root


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("bert") / "model", seed=0, dropout=0.1)


@pytest.fixture(scope="module")
def senteval(tmp_path_factory) -> Path:
    return write_senteval(tmp_path_factory.mktemp("senteval"))


def write_profile(path: Path, root: Path, run: str, model: Path, senteval: Path, pooler: str = "cls_before_pooler",
                  **train) -> Path:
    """A self-contained profile (no `inherit`): the tests do not depend on configs/default.toml."""
    settings = {"objective": "simcse", "batch_size": 8, "lr": 1e-3, "max_steps": 12, "eval_every": 4,
                "eval_max_pairs": 0, "num_workers": 0, "final_eval": False, "seed": 7, **train}
    lines = ["[run]", f'name = "{run}"', f'root = "{root}"', "[data]", f'senteval_dir = "{senteval}"',
             f'probe = "{root / "no-probe.tsv"}"', "[encoder]", f'model = "{model}"', f'pooler = "{pooler}"',
             "max_length = 64", "[train]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ------------------------------------------------------------------------------------------------ data reader
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
    with pytest.raises(TableMissing, match=r"'pairs'.*make stage STAGE=pairs"):
        MinedRows(tmp_path / "run", ("pairs",))
    profile = write_profile(tmp_path / "p.toml", tmp_path, "empty", bert, senteval)
    assert main(["--profile", str(profile)]) == 2
    err = capsys.readouterr().err
    assert "'sentences'" in err and "make mine" in err and str(tmp_path / "empty" / "sentences") in err


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
                                        objective=objective, max_steps=3, eval_every=2, whitened_groups=4)))
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
                                        max_steps=2, eval_every=2, osscse_templates=templates)))
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
    from trainer import evaluate as ev

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


KILLER = """
import os, sys, time
import trainer.checkpoint as ckpt
saves, real = [0], ckpt.save_state
def save_then_hang(*a, **k):
    real(*a, **k)
    saves[0] += 1
    if saves[0] == int(os.environ["KILL_AFTER_SAVES"]):
        open(os.environ["SAVED_MARKER"], "w").close()
        time.sleep(600)  # a long training step: the test kills us here
ckpt.save_state = save_then_hang
from trainer.train import main
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
    common = dict(max_steps=14, eval_every=3, warmup_steps=2, weight_decay=0.01)
    whole = write_profile(tmp_path / "whole.toml", tmp_path, "whole", bert, senteval, num_workers=2, **common)
    killed = write_profile(tmp_path / "killed.toml", tmp_path, "killed", bert, senteval, num_workers=0, **common)

    p = _run(["-m", "trainer.train", "--profile", str(whole)], env)
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

    p = _run(["-m", "trainer.train", "--profile", str(killed)], env)
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
    assert [m["step"] for m in mb] == list(range(1, 15))  # the killed run's steps after its checkpoint are gone
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


def test_atomic_dir_survives_errors_and_interrupted_swaps(tmp_path):
    dst = tmp_path / "last"
    with ckpt.atomic_dir(dst) as d:
        (d / "f").write_text("one")
    with pytest.raises(RuntimeError):
        with ckpt.atomic_dir(dst) as d:
            (d / "f").write_text("half")
            raise RuntimeError("killed while writing")
    assert (dst / "f").read_text() == "one" and [p.name for p in tmp_path.iterdir()] == ["last"]
    # a kill between the two renames leaves only .last.old: recover() puts it back
    os.rename(dst, tmp_path / ".last.old")
    (tmp_path / ".last.tmp-x").mkdir()
    assert ckpt.load_state(dst) is None and (dst / "f").read_text() == "one"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]
    assert dst.stat().st_mode & 0o777 == 0o777 & ~ckpt._umask()  # not mkdtemp's owner-only mode


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
        args = launcher + ["-m", "trainer.train", "--profile", str(profile)] if launcher else \
            ["-m", "trainer.train", "--profile", str(profile)]
        p = _run(args, env)
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out
        states[run] = ckpt.load_state(tmp_path / run / "train" / "simcse" / "last")
    assert len(states["two"]["rng"]) == 2 and states["two"]["step"] == 6
    for k, v in states["one"]["objective"].items():
        torch.testing.assert_close(states["two"]["objective"][k], v, rtol=0, atol=1e-5, msg=k)


@pytest.mark.parametrize("profile,expect", [
    ("simcse-paper", {"objective": "simcse", "batch_size": 64, "lr": 3e-5, "epochs": 1, "max_length": 32,
                      "eval_every": 125, "pooler": "cls_before_pooler", "mlp_train_only": True}),
    ("whitenedcse-paper", {"objective": "whitenedcse", "batch_size": 64, "lr": 3e-5, "epochs": 1,
                           "whitened_positives": 3}),
    ("dclr-paper", {"objective": "dclr", "batch_size": 128, "lr": 3e-5, "epochs": 3, "dclr_phi": 0.9, "dclr_k": 1}),
])
def test_paper_profiles(profile, expect):
    cfg = load_config(profile)
    assert cfg.train.model == "bert-base-uncased" and cfg.run.name == profile and cfg.train.temperature == 0.05
    for key, value in expect.items():
        assert getattr(cfg.train, key) == value, key
