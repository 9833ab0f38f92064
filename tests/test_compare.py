"""`make compare` (trainer/compare.py): two objectives x two seeds x two steps on the tiny BERT, end to end; resume;
the paired bootstrap against a direct computation."""
from __future__ import annotations

import json

import numpy as np
import pytest

import contramine.trainer.train
from contramine.trainer import compare as cmp
from contramine.trainer import compare_report
from contramine.pipeline.config import ConfigError
from contramine.pipeline.storage.tables import TableMissing
from contramine.trainer.evaluate import spearman
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
    real_train = contramine.trainer.train.train

    def counting_train(cfg, resume=True):
        calls.append((cfg.train.objective, cfg.train.seed))
        return real_train(cfg, resume)

    monkeypatch.setattr(contramine.trainer.train, "train", counting_train)
    rep = _compare(tiny_run, bert, senteval)
    out = tiny_run / "compare"
    assert sorted(calls) == [("debcse", 7), ("debcse", 8), ("simcse", 7), ("simcse", 8)]
    # every run is an ordinary training run in its own folder, with its dev curve and its reproducing command
    for objective in ("simcse", "debcse"):
        for k in (0, 1):
            run = json.loads((out / objective / f"seed-{k}" / "run.json").read_text())
            assert run["steps"] == 2 and [s for s, _ in run["dev_curve"]] == [1, 2]
            assert (out / objective / f"seed-{k}" / "best" / "train_config.json").is_file()
            assert f"--objective {objective}" in run["command"] and "train.max_steps=2" in run["command"]
            assert len(run["results"]["cosines"]["STSBenchmark"]) == 16
    saved = json.loads((out / "compare.json").read_text())
    assert saved["budget"]["steps"] == 2 and saved["seeds"] == 2 and saved["baseline"] == "simcse"
    assert set(saved["runs"]) == {"simcse", "debcse"} and set(saved["paired_bootstrap"]) == {"debcse"}
    assert len(saved["paired_bootstrap"]["debcse"]["per_seed"]) == 2
    # the table: the start model first (one row per pooler: here both objectives read cls_before_pooler), then each
    # objective, its pooler, mean ± std over seeds of the 7 tasks + average, Δ against its start and the baseline
    table = (out / "table.md").read_text().splitlines()
    assert [line.split("|")[1].strip() for line in table[2:]] == ["start (cls_before_pooler)", "simcse", "debcse"]
    assert [line.split("|")[2].strip() for line in table[2:]] == ["cls_before_pooler"] * 3
    assert "±" in table[3] and "pairs" in table[4] and table[0].count("|") == 19
    assert "vs its start" in table[0] and "vs simcse" in table[0]
    assert set(saved["paired_bootstrap_vs_start"]) == {"simcse", "debcse"}
    boot = (out / "bootstrap.md").read_text()  # per seed and pooled: debcse against its start and against simcse
    firsts = [line.split("|")[1:3] for line in boot.splitlines() if line.startswith("| ") and "---" not in line]
    assert sorted((a.strip(), b.strip()) for a, b in firsts[1:]) == [
        ("debcse", "simcse"), ("debcse", "start (cls_before_pooler)"), ("simcse", "start (cls_before_pooler)")]
    assert "seed 8" in boot
    assert saved["start_of"] == {"simcse": "start (cls_before_pooler)", "debcse": "start (cls_before_pooler)"}
    m, s = saved["summary"]["debcse"]["avg"]
    avgs = [r["results"]["sts"]["avg"] for r in saved["runs"]["debcse"]]
    assert m == pytest.approx(np.mean(avgs), abs=0.01) and s == pytest.approx(np.std(avgs, ddof=1), abs=0.01)
    assert rep["plots"] == ["dev_curves.png", "sts_bars.png", "delta_stsb.png"]
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
    assert compare_report._spearman_rows(tied[None], gold[None])[0] == pytest.approx(spearman(tied, gold))


@pytest.fixture(scope="module")
def osscse_run(tmp_path_factory):
    """sentences, triplets (paraphrase and negation for half the rows) and pairs; a second run 'other' of the same
    sentences with other pairs (as if mined with another encoder)."""
    root = tmp_path_factory.mktemp("cmp-oss")
    sents = sentences_rows(24)
    for name, extra in (("r", " too"), ("other", " as well")):
        write_table(root / name, "sentences", sents)
        write_table(root / name, "pairs", [{"sid": r["sid"], "anchor": r["text"], "positives": [r["text"] + extra],
                                            "negatives": ["a dog", "the cat"]} for r in sents])
    write_table(root / "r", "triplets", [{"sid": r["sid"], "anchor": r["text"], "paraphrase": "so " + r["text"],
                                          "negation": "not " + r["text"], "para_mer": 0.3, "para_chain": "de"}
                                         for r in sents if r["sid"] % 2])
    return root / "r"


def test_compare_has_a_start_row_per_pooler_osscse_in_both_forms_and_rows_on_other_mined_runs(
        osscse_run, bert, senteval, monkeypatch):
    """OssCSE's paper form reads the [MASK] of its first template: its own start row is the start under that pooler
    and prompt, its Δ is against that start; the start-pooler variant reads the configured pooler; debcse trains on
    the run of compare.mined_runs too (a row of its own, its tables from that run); a rerun reuses everything."""
    calls = []
    real_train = contramine.trainer.train.train

    def counting_train(cfg, resume=True):
        calls.append((cfg.train.output.split("/compare/")[1], cfg.run.name))
        return real_train(cfg, resume)

    monkeypatch.setattr(contramine.trainer.train, "train", counting_train)
    profile = write_profile(osscse_run.parent / "oss.toml", osscse_run.parent, "r", bert, senteval, eval_every=1)
    sets = ["compare.steps=2", "compare.bootstrap=100", "compare.mined_runs=other"]
    rep = cmp.compare(str(profile), None, sets, ["simcse", "debcse", "osscse"], 1)
    out = osscse_run / "compare"
    assert sorted(calls) == sorted([("simcse/seed-0", "r"), ("debcse/seed-0", "r"), ("debcse@other/seed-0", "other"),
                                    ("osscse/seed-0", "r"), ("osscse-start-pooler/seed-0", "r")])
    mask = 'mask · This sentence : "{s}" means [MASK] .'
    assert rep["start_of"] == {"simcse": "start (cls_before_pooler)", "debcse": "start (cls_before_pooler)",
                               "debcse@other": "start (cls_before_pooler)", "osscse": "start (mask)",
                               "osscse-start-pooler": "start (cls_before_pooler)"}
    assert (out / "start.json").is_file() and len(list(out.glob("start-mask-*.json"))) == 1
    assert rep["starts"]["start (mask)"]["results"]["pooler"] == "mask"
    assert rep["starts"]["start (cls_before_pooler)"]["results"]["pooler"] == "cls_before_pooler"
    # each run trained and was evaluated under its row's pooler
    best = lambda n: json.loads((out / n / "seed-0" / "best" / "train_config.json").read_text())  # noqa: E731
    assert best("osscse")["pooler"] == "mask" and best("osscse-start-pooler")["pooler"] == "cls_before_pooler"
    assert rep["runs"]["osscse"][0]["results"]["pooler"] == "mask"
    assert rep["runs"]["osscse-start-pooler"][0]["extras"]["form"] == "start-pooler"
    assert "train.osscse.form=start-pooler" in rep["runs"]["osscse-start-pooler"][0]["command"]
    assert "--run other" in rep["runs"]["debcse@other"][0]["command"]
    # Δ against its own start: the mask-pooled start's STS-B cosines for osscse, a direct computation
    gold = cmp._stsb_gold(contramine.trainer.train.load_config(str(profile)))
    for name, start in (("osscse", "start (mask)"), ("osscse-start-pooler", "start (cls_before_pooler)")):
        ours = rep["runs"][name][0]["results"]["cosines"]["STSBenchmark"]
        theirs = rep["starts"][start]["results"]["cosines"]["STSBenchmark"]
        direct = 100 * (spearman(ours, gold) - spearman(theirs, gold))
        assert rep["paired_bootstrap_vs_start"][name]["pooled"]["delta"] == pytest.approx(direct, abs=0.01)
    table = (out / "table.md").read_text().splitlines()
    names = [line.split("|")[1].strip() for line in table[2:]]
    assert names == ["start (cls_before_pooler)", "start (mask)", "simcse", "debcse", "debcse@other", "osscse",
                     "osscse-start-pooler"]
    poolers = dict(zip(names, (line.split("|")[2].strip() for line in table[2:])))
    assert poolers["start (mask)"] == mask == poolers["osscse"]
    assert poolers["osscse-start-pooler"] == "cls_before_pooler"

    calls.clear()  # a second invocation trains and evaluates nothing
    again = cmp.compare(str(profile), None, sets, ["simcse", "debcse", "osscse"], 1)
    assert calls == [] and again["table"] == rep["table"]


def test_rows_objectives_then_their_variants_then_their_rows_on_other_mined_runs():
    from contramine.pipeline.config import load_config

    cfg = load_config("default", ["compare.mined_runs=simcse-mined"])
    names = lambda objectives: [e["name"] for e in cmp.entries(cfg, objectives)]  # noqa: E731
    assert names(["simcse", "debcse", "osscse", "dclr"]) == [
        "simcse", "debcse", "debcse@simcse-mined", "osscse", "osscse-start-pooler", "dclr"]
    assert names(["simcse", "osscse-start-pooler"]) == ["simcse", "osscse-start-pooler"]  # a variant alone
    variant = cmp.entries(cfg, ["osscse"])[1]
    assert variant["objective"] == "osscse" and variant["sets"] == ["train.osscse.form=start-pooler"]
    mined = cmp.entries(cfg, ["debcse"])[1]
    assert mined["run"] == "simcse-mined" and cmp.run_overrides(cfg, mined, 1, 100)[-2].endswith(
        "/default/compare/debcse@simcse-mined/seed-1")
    assert names(["simcse"]) == ["simcse"] and not cmp.entries(load_config("default", ["compare.variants={}"]),
                                                                 ["osscse"])[1:]
    with pytest.raises(ValueError, match="unknown objective"):
        cmp.entries(cfg, ["simcse", "nope"])


def test_a_mined_run_of_other_sentences_or_without_pairs_stops_the_compare_before_anything_trains(
        tmp_path, bert, senteval, monkeypatch):
    """compare.mined_runs must name the same corpus mined with another encoder: a run whose sentences differ (another
    corpus, other filters) or that has no pairs yet is refused in one line naming it, and nothing trains or loads."""
    calls = []
    monkeypatch.setattr(contramine.trainer.train, "train", lambda cfg, resume=True: calls.append(cfg) or {})
    monkeypatch.setattr(cmp, "start_results", lambda *a, **k: calls.append(a) or {})
    sents = sentences_rows(12)
    pairs = lambda rows: [{"sid": r["sid"], "anchor": r["text"], "positives": [r["text"] + " too"],  # noqa: E731
                           "negatives": ["a dog"]} for r in rows]
    write_table(tmp_path / "r", "sentences", sents)
    write_table(tmp_path / "r", "pairs", pairs(sents))
    other = [dict(r, text=r["text"] + " again") if r["sid"] == sents[5]["sid"] else r for r in sents]
    write_table(tmp_path / "elsewhere", "sentences", other)
    write_table(tmp_path / "elsewhere", "pairs", pairs(other))
    write_table(tmp_path / "unmined", "sentences", sents)
    profile = write_profile(tmp_path / "p.toml", tmp_path, "r", bert, senteval, eval_every=1)
    with pytest.raises(ConfigError, match=rf"run 'elsewhere' .* 1 sid\(s\) differ .* first sid {sents[5]['sid']} .*"
                                          r"'debcse@elsewhere' would compare corpora"):
        cmp.compare(str(profile), None, ["compare.steps=1", "compare.mined_runs=elsewhere"], ["simcse", "debcse"], 1)
    with pytest.raises(TableMissing, match=r"'pairs' not found at .*unmined/pairs/ .* `pairs` stage"):
        cmp.compare(str(profile), None, ["compare.steps=1", "compare.mined_runs=unmined"], ["simcse", "debcse"], 1)
    with pytest.raises(TableMissing, match=r"nosuch: no such run \(`contramine mine --run nosuch` first\)"):
        cmp.compare(str(profile), "nosuch", ["compare.steps=1"], ["simcse"], 1)  # a typo'd run: not a table it lacks
    with pytest.raises(TableMissing, match=r"'pairs' not found at .*unmined/pairs/ .* `pairs` stage"):
        cmp.compare(str(profile), "unmined", [], ["simcse"], 1)  # budget_steps reads its pairs first
    assert calls == []
    # the same sentences mined otherwise (other positives): accepted
    write_table(tmp_path / "same", "sentences", sents)
    write_table(tmp_path / "same", "pairs", [dict(p, positives=["so " + p["anchor"]]) for p in pairs(sents)])
    cfg = contramine.trainer.train.load_config(str(profile), ["compare.mined_runs=same"])
    plan = cmp.entries(cfg, ["debcse"])
    cmp.check_inputs(cfg, {e["name"]: contramine.trainer.train.load_config(str(profile), [f"run.name={e['run'] or 'r'}"])
                           for e in plan}, plan)
