"""Back-translation on tiny random Marian / FSMT / M2M100 models loaded by path, as a real model would be."""
from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from contramine.pipeline.models import hub as models
from contramine.pipeline.config import chain_name
from contramine.pipeline.models.translate.chains import backtranslate, load_chain, load_translator
from contramine.pipeline.seeding import row_seed
from contramine.pipeline.config import BacktranslateCfg
from contramine.pipeline.models.hub import ModelUnavailable
from contramine.pipeline.schema import SCHEMAS
from bench.fixtures.tiny_mt import build_all, build_tiny_fsmt, build_tiny_marian, corpus_lines

# Small limits keep random models (which rarely stop on their own) fast; a spread of lengths makes some rows hit
# their own cap, which is what batching could otherwise change.
SMALL = dict(max_new_tokens_factor=1.0, max_new_tokens_min=4, max_length=48)
LINES = corpus_lines(120)[:40] + ["  The   cat\tsat on\n the mat.  ", "Short.", ""]


def cfg(**kw) -> BacktranslateCfg:
    """SMALL settings; a batch_size given means batches of that many rows (batch_tokens = 0)."""
    return BacktranslateCfg(**{**SMALL, **({"batch_tokens": 0} if "batch_size" in kw else {}), **kw})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return {k: str(v) for k, v in build_all(tmp_path_factory.mktemp("tiny_mt")).items()}


@pytest.fixture(scope="module")
def marian_chain(tiny):
    return [tiny["marian-en-xx"], tiny["marian-xx-en"]]


def rows(n_variants: int = 1) -> list[tuple[int, int, str]]:
    return [(10 + i, v, s) for i, s in enumerate(LINES) for v in range(n_variants)]


def run(names, seed=0, row_list=None, **kw) -> pa.Table:
    return backtranslate(row_list or rows(), chain_name(names), load_chain(names, cfg(**kw)), seed=seed)


def test_output_identical_for_any_batch_size(marian_chain):
    tables = [run(marian_chain, batch_size=bs) for bs in (1, 3, 64)]
    assert tables[0].equals(tables[1]) and tables[0].equals(tables[2])
    pivots = tables[0].column("pivot_text").to_pylist()  # junk fed to junk collapses; the first hop varies
    assert len(set(pivots)) > len(pivots) // 4, "outputs should depend on the input, else order is untested"


def test_translate_keeps_input_order(tiny):
    tr = load_translator(tiny["marian-en-xx"], cfg(batch_size=4))
    together = tr.translate(LINES)
    alone = [tr.translate([s])[0] for s in LINES]
    assert together == alone
    assert tr.translate(LINES[::-1]) == together[::-1]


def test_one_row_per_sentence_variant_chain(marian_chain):
    rs = rows(n_variants=3)
    t = run(marian_chain, row_list=rs)
    assert t.num_rows == len(rs)
    assert list(zip(t.column("sid").to_pylist(), t.column("variant").to_pylist())) == [(s, v) for s, v, _ in rs]
    assert set(t.column("chain").to_pylist()) == {"marian-en-xx>marian-xx-en"}
    assert set(t.column("model").to_pylist()) == {" > ".join(marian_chain)}


def test_pivot_is_first_hop_output(tiny, marian_chain):
    t = run(marian_chain)
    first = load_translator(tiny["marian-en-xx"], cfg())
    seeds = [row_seed(row_seed(0, "backtranslate", sid, v), "backtranslate-hop", 0) for sid, v, _ in rows()]
    assert t.column("pivot_text").to_pylist() == [o[0] for o in first.translate(LINES, seeds)]


@pytest.mark.parametrize("kw", [dict(do_sample=True, num_return_sequences=3),
                                dict(num_beams=3, num_return_sequences=2)])
def test_num_return_sequences_rows(marian_chain, kw):
    k = kw["num_return_sequences"]
    rs = rows(n_variants=2)
    t = run(marian_chain, row_list=rs, batch_size=5, **kw)
    assert t.num_rows == k * len(rs)
    keys = list(zip(t.column("sid").to_pylist(), t.column("variant").to_pylist()))
    assert keys == [(s, v) for s, v, _ in rs for _ in range(k)]
    pivots = t.column("pivot_text").to_pylist()
    assert all(len(set(pivots[i:i + k])) == 1 for i in range(0, len(pivots), k))  # returns share one pivot
    assert t.equals(run(marian_chain, row_list=rs, batch_size=64, **kw))


def test_sampling_is_deterministic_per_row(tiny):
    tr = load_translator(tiny["marian-en-xx"], cfg(do_sample=True, batch_size=3))
    seeds = [row_seed(7, "test", i) for i in range(len(LINES))]
    full = tr.translate(LINES, seeds)
    for j in (0, 7, 20, 40):  # the row alone, and among different neighbours
        assert tr.translate([LINES[j]], [seeds[j]]) == [full[j]]
        assert tr.translate([LINES[j], *LINES[25:31]], [seeds[j], *seeds[25:31]])[0] == full[j]
    other = tr.translate(LINES, [s + 1 for s in seeds])
    assert other != full, "a different seed should change some samples"
    greedy = load_translator(tiny["marian-en-xx"], cfg()).translate(LINES)
    assert full != greedy, "sampling should differ from greedy somewhere"


def test_sampling_leaves_global_rng_alone(tiny):
    tr = load_translator(tiny["marian-en-xx"], cfg(do_sample=True))
    torch.manual_seed(5)
    tr.translate(LINES[:5], list(range(5)))
    after = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(3))


def test_seed_changes_samples_in_backtranslate(marian_chain):
    a, b = run(marian_chain, seed=1, do_sample=True), run(marian_chain, seed=2, do_sample=True)
    assert a.equals(run(marian_chain, seed=1, do_sample=True, batch_size=2))
    assert a.column("text").to_pylist() != b.column("text").to_pylist()


@pytest.mark.parametrize("name", ["fsmt-en-de", "marian-en-xx"])
def test_fsmt_and_marian_load_by_path(tiny, name):
    tr = load_translator(tiny[name], cfg())
    assert type(tr.model).__name__ == {"fsmt-en-de": "FSMTForConditionalGeneration",
                                       "marian-en-xx": "MarianMTModel"}[name]
    assert tr.model.dtype == torch.float32 and not tr.model.training
    out = tr.translate(LINES)
    assert len(out) == len(LINES) and all(len(o) == 1 and isinstance(o[0], str) for o in out)
    assert any(o[0] for o in out)
    assert tr.translate(LINES, None) == out  # text-derived seeds: stable when none are given


def test_fsmt_chain_batching(tiny):
    names = [tiny["fsmt-en-de"], tiny["marian-xx-en"]]
    assert run(names, batch_size=1).equals(run(names, batch_size=64))


def test_m2m100_needs_and_uses_language_codes(tiny):
    path = tiny["m2m100"]
    with pytest.raises(ValueError, match="target_lang"):
        load_translator(path, cfg())
    with pytest.raises(ValueError, match="xx-nope"):
        load_translator(path, cfg(target_lang={path: "xx-nope"}))
    tr = load_translator(path, cfg(target_lang={path: "de"}, source_lang={path: "en"}))
    assert tr.gen.forced_bos_token_id == tr.tokenizer.get_lang_id("de")
    assert tr.tokenizer.src_lang == "en"
    out = tr.translate(LINES)
    assert all("__de__" not in o[0] for o in out)  # the forced language token is not part of the text
    assert any(o[0] for o in out)
    assert tr.translate(LINES[::-1]) == out[::-1]


def test_missing_hub_id_raises_model_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    models.clear_cache()
    try:
        with pytest.raises(ModelUnavailable, match="nobody-here/no-such-mt-model"):
            load_chain(["nobody-here/no-such-mt-model"], cfg())
    finally:
        models.clear_cache()


def test_missing_path_raises_model_unavailable(tmp_path, marian_chain):
    missing = str(tmp_path / "no-model-here")
    with pytest.raises(ModelUnavailable, match="no-model-here"):
        load_chain([marian_chain[0], missing], cfg())


def test_schema_exact(marian_chain):
    t = run(marian_chain, row_list=rows()[:5])
    assert t.schema.equals(SCHEMAS["backtranslations"])
    empty = backtranslate([], "c", load_chain(marian_chain, cfg()))
    assert empty.num_rows == 0 and empty.schema.equals(SCHEMAS["backtranslations"])


def test_whitespace_normalised(tiny, marian_chain):
    t = run(marian_chain)
    for col in ("text", "pivot_text"):
        assert all(s == " ".join(s.split()) for s in t.column(col).to_pylist())
    fsmt = load_translator(tiny["fsmt-en-de"], cfg()).translate(LINES)
    assert all(o[0] == " ".join(o[0].split()) for o in fsmt)


def test_length_cap_follows_the_row(tiny):
    """Each row ends where generate() alone with max_new_tokens = its own cap ends, whatever shares its batch."""
    tr = load_translator(tiny["marian-en-xx"], cfg(max_new_tokens_min=2, max_new_tokens_factor=0.5, batch_size=64))
    batched = tr.translate(LINES)
    for j in range(0, len(LINES), 6):
        enc = tr.tokenizer([LINES[j]], return_tensors="pt", truncation=True, max_length=48)
        cap = max(2, math.ceil(0.5 * enc["input_ids"].shape[1]))
        with torch.inference_mode():
            seq = tr.model.generate(**enc, max_new_tokens=cap, num_beams=1, do_sample=False)
        alone = " ".join(tr.tokenizer.decode(seq[0], skip_special_tokens=True).split())
        assert batched[j] == [alone if LINES[j].strip() else ""]  # an empty text is not sent to generate()


def test_invalid_generation_settings_are_refused_by_the_config():
    with pytest.raises(ValueError, match="do_sample = true with num_beams = 2"):
        cfg(do_sample=True, num_beams=2)
    with pytest.raises(ValueError, match="num_return_sequences = 2 > num_beams = 1 without do_sample"):
        cfg(num_return_sequences=2)
    ok = cfg(do_sample=True, num_return_sequences=3)  # sampling: any number of returns, one beam
    with pytest.raises(ValueError, match="do_sample = true with num_beams = 4"):
        ok.num_beams = 4  # an assignment is checked too


def test_row_seed_and_chain_name():
    import numpy as np
    from contramine.pipeline.seeding import row_rng

    assert row_seed(1, "s", 2, 3) == row_seed(1, "s", 2, 3) != row_seed(1, "s", 2, 4)
    assert 0 <= row_seed(0, "backtranslate", 5, 1) < 2**63
    assert row_seed(0, "t", "some text") == row_seed(0, "t", "some text") != row_seed(0, "t", "other text")
    # one scheme: the integer seed and the numpy stream come from the same SeedSequence
    want = np.random.SeedSequence([0, __import__("zlib").crc32(b"backtranslate"), 5, 1]).generate_state(1, np.uint64)
    assert row_seed(0, "backtranslate", 5, 1) == int(want[0]) >> 1
    assert row_rng(3, "noise", 7, 1).random() == np.random.default_rng([3, __import__("zlib").crc32(b"noise"), 7, 1]).random()
    assert chain_name(["Helsinki-NLP/opus-mt-en-zh", "/a/b/opus-mt-zh-en/"]) == "opus-mt-en-zh>opus-mt-zh-en"


def test_tiny_models_are_reproducible(tmp_path, tiny):
    for build, name, seed in ((build_tiny_marian, "marian-en-xx", 1), (build_tiny_fsmt, "fsmt-en-de", 3)):
        again = build(tmp_path / name, seed=seed)
        vocab = "vocab.json" if name.startswith("marian") else "merges.txt"
        for f in ("model.safetensors", vocab):
            assert (again / f).read_bytes() == (Path(tiny[name]) / f).read_bytes(), f"{name}/{f} differs"


# ---------------------------------------------------------------- target languages (multi-target Marian)

@pytest.fixture(scope="module")
def zh_like(tmp_path_factory):
    """A multi-target Marian model, like Helsinki-NLP/opus-mt-en-zh: its input must start with a >>code<< token."""
    return str(build_tiny_marian(tmp_path_factory.mktemp("zh") / "opus-mt-en-zh", seed=1,
                                 target_codes=(">>cmn_Hans<<", ">>cmn_Hant<<", ">>yue_Hant<<")))


def test_multi_target_marian_needs_its_language_token(zh_like):
    from contramine.pipeline.models.translate.settings import marian_language_codes, target_language_problem

    assert marian_language_codes(zh_like) == [">>cmn_Hans<<", ">>cmn_Hant<<", ">>yue_Hant<<"]
    problem = target_language_problem(zh_like, zh_like, cfg())
    assert "\n" not in problem and "target_lang" in problem and ">>cmn_Hans<<" in problem and zh_like in problem
    with pytest.raises(ValueError, match="target_lang"):
        load_translator(zh_like, cfg())
    assert "is not a target-language token" in target_language_problem(zh_like, zh_like,
                                                                         cfg(target_lang={zh_like: "deu"}))
    for code in (">>cmn_Hans<<", "cmn_Hans"):  # with or without the brackets
        assert target_language_problem(zh_like, zh_like, cfg(target_lang={zh_like: code})) is None
    hans = load_translator(zh_like, cfg(target_lang={zh_like: ">>cmn_Hans<<"}))
    assert hans.tokenizer.tokenize(hans.prefix + "The cat.")[0] == ">>cmn_Hans<<"
    yue = load_translator(zh_like, cfg(target_lang={zh_like: "yue_Hant"}))
    assert hans.translate(LINES) != yue.translate(LINES)  # the token reaches the model
    one_target = build_tiny_marian(Path(zh_like).parent / "one-target", seed=2)
    assert target_language_problem(str(one_target), one_target, cfg()) is None


def test_paper_profiles_name_the_zh_script():
    from contramine.pipeline.config import load_config

    assert load_config("debcse-paper").backtranslate.target_lang["Helsinki-NLP/opus-mt-en-zh"] == ">>cmn_Hans<<"


def test_mine_stops_before_any_work_without_a_target_language(zh_like, tiny, tmp_path, capsys):
    from contramine.flows.cli import main as cli_main

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(LINES[:5]) + "\n")
    chain = f'backtranslate.chains=[["{zh_like}", "{tiny["marian-xx-en"]}"]]'
    for fallback in ("true", "false"):  # a settings error, not a missing model: fallback does not skip it
        code = cli_main(["mine", "--corpus", str(corpus), "--set", chain, f"backtranslate.fallback={fallback}",
                         f"run.root={tmp_path / 'runs'}"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and "\n" not in err and "target_lang" in err and "opus-mt-en-zh" in err, err
        assert not (tmp_path / "runs").exists()


def test_a_target_language_for_a_single_target_marian_model_stops_mine_before_any_work(tiny, tmp_path, capsys):
    from contramine.flows.cli import main as cli_main
    from contramine.pipeline.models.translate.settings import target_language_problem

    one = tiny["marian-xx-en"]  # no >>code<< tokens: it translates into one language
    problem = target_language_problem(one, one, cfg(target_lang={one: "de"}))
    assert "\n" not in problem and "single-target Marian" in problem and repr(one) in problem and "'de'" in problem
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(LINES[:5]) + "\n")
    chain = f'backtranslate.chains=[["{tiny["marian-en-xx"]}", "{one}"]]'
    code = cli_main(["mine", "--corpus", str(corpus), "--set", chain,
                     f'backtranslate.target_lang={{"{one}" = "de"}}', "encoder.model=standin:encoder-32",
                     f"run.root={tmp_path / 'runs'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and err.startswith("error: ") and "single-target Marian" in err, err
    assert not (tmp_path / "runs").exists()  # refused before Prefect started: nothing written
