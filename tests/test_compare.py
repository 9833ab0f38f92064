"""`make compare` (trainer/compare.py): two objectives x two seeds x two steps on the tiny BERT, end to end; resume;
the paired bootstrap against a direct computation."""
from __future__ import annotations

import json

import numpy as np
import pytest

import trainer.train
from trainer import compare as cmp
from trainer.evaluate import spearman
from train_helpers import sentences_rows, write_profile, write_table


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("cmp") / "r"
    sents = sentences_rows(24)
    write_table(run, "sentences", sents)
    write_table(run, "pairs", [{"sid": r["sid"], "anchor": r["text"], "positives": [r["text"] + " too"],
                                "negatives": ["a dog", "the cat"]} for r in sents])
    return run


def _compare(tiny_run, bert, senteval):
    profile = write_profile(tiny_run.parent / "cmp.toml", tiny_run.parent, tiny_run.name, bert, senteval,
                            eval_every=1)
    return cmp.compare(str(profile), None, ["compare.steps=2", "compare.bootstrap=200"], ["simcse", "debcse"], 2)


def test_compare_trains_every_objective_and_seed_writes_table_json_plots_and_resumes(
        tiny_run, bert, senteval, monkeypatch):
    calls = []
    real_train = trainer.train.train

    def counting_train(cfg, resume=True):
        calls.append((cfg.train.objective, cfg.train.seed))
        return real_train(cfg, resume)

    monkeypatch.setattr(trainer.train, "train", counting_train)
    rep = _compare(tiny_run, bert, senteval)
    out = tiny_run / "compare"
    assert sorted(calls) == [("debcse", 7), ("debcse", 8), ("simcse", 7), ("simcse", 8)]
    # every run is an ordinary training run in its own folder, with its dev curve and its reproducing command
    for objective in ("simcse", "debcse"):
        for k in (0, 1):
            run = json.loads((out / objective / f"seed-{k}" / "run.json").read_text())
            assert run["steps"] == 2 and [s for s, _ in run["dev_curve"]] == [1, 2]
            assert (out / objective / f"seed-{k}" / "best" / "train_config.json").is_file()
            assert f"OBJECTIVE={objective}" in run["command"] and "train.max_steps=2" in run["command"]
            assert len(run["results"]["cosines"]["STSBenchmark"]) == 16
    saved = json.loads((out / "compare.json").read_text())
    assert saved["budget"]["steps"] == 2 and saved["seeds"] == 2 and saved["baseline"] == "simcse"
    assert set(saved["runs"]) == {"simcse", "debcse"} and set(saved["paired_bootstrap"]) == {"debcse"}
    assert len(saved["paired_bootstrap"]["debcse"]["per_seed"]) == 2
    # the table: the start model first, then each objective, mean ± std over seeds of the 7 tasks + average
    table = (out / "table.md").read_text().splitlines()
    assert [line.split("|")[1].strip() for line in table[2:]] == ["start", "simcse", "debcse"]
    assert "±" in table[3] and "pairs" in table[4] and table[0].count("|") == 17
    m, s = saved["summary"]["debcse"]["avg"]
    avgs = [r["results"]["sts"]["avg"] for r in saved["runs"]["debcse"]]
    assert m == pytest.approx(np.mean(avgs), abs=0.01) and s == pytest.approx(np.std(avgs, ddof=1), abs=0.01)
    for png in rep["plots"]:
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000

    # a second invocation trains nothing; a run whose run.json is gone (killed before it finished) is redone alone
    calls.clear()
    again = _compare(tiny_run, bert, senteval)
    assert calls == [] and again["table"] == rep["table"]
    (out / "debcse" / "seed-1" / "run.json").unlink()
    _compare(tiny_run, bert, senteval)
    assert calls == [("debcse", 8)]
    # another budget is another configuration: nothing is reused
    calls.clear()
    profile = tiny_run.parent / "cmp.toml"
    cmp.compare(str(profile), None, ["compare.steps=3", "compare.bootstrap=200"], ["simcse"], 1)
    assert calls == [("simcse", 7)]


def test_paired_bootstrap_against_a_direct_computation():
    rng = np.random.default_rng(0)
    gold = rng.uniform(0, 5, 300)
    good = [gold + rng.normal(0, 0.5, 300) for _ in range(2)]
    poor = [gold + rng.normal(0, 3.0, 300) for _ in range(2)]
    res = cmp.paired_bootstrap(gold, good, poor, n_boot=500)
    for k in range(2):
        direct = 100 * (spearman(good[k], gold) - spearman(poor[k], gold))
        assert res["per_seed"][k]["delta"] == pytest.approx(direct, abs=0.01)
        lo, hi = res["per_seed"][k]["ci95"]
        assert 0 < lo < direct < hi and res["per_seed"][k]["p_le_0"] == 0
    assert res["pooled"]["delta"] == pytest.approx(np.mean([s["delta"] for s in res["per_seed"]]), abs=0.01)
    same = cmp.paired_bootstrap(gold, good, good, n_boot=200)  # identical predictions: no difference at all
    assert same["pooled"] == {"delta": 0.0, "ci95": [0.0, 0.0], "p_le_0": 1.0}
    # ties: average ranks, as the evaluator's Spearman
    tied = np.round(good[0])
    assert cmp._spearman_rows(tied[None], gold[None])[0] == pytest.approx(spearman(tied, gold))
