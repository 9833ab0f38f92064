"""Our decode loop (pipeline/models/translate/decode/loop.py, backtranslate.decoder = "loop", the default): on a CPU in
float32 its sequences equal transformers' generate token for token — greedy, sampling, beam search — for Marian and
FSMT, with rows of mixed lengths, per-row caps, banned tokens, a forced first token and several returns per input;
dropping finished rows changes no row; it reads the device back at most once every 4 decoding steps; models it
does not know keep generate, and the log says so."""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from contramine.pipeline.config import BacktranslateCfg
from contramine.pipeline.models.translate.chains import load_translator
from contramine.pipeline.seeding import row_seed
from tests.host_reads import HostReads
from tests.test_backtranslate import LINES, cfg, tiny  # noqa: F401 (tiny: the module's fixture)
from bench.fixtures.tiny_mt import build_tiny_marian, corpus_lines

MODES = {"greedy": {}, "sampling": dict(do_sample=True, num_return_sequences=3),
         "beam": dict(num_beams=4, num_return_sequences=3),  # transformers' defaults: length_penalty 1, no early stop
         "beam, early_stopping, length_penalty": dict(num_beams=5, num_return_sequences=2)}  # the two set below
EXTRA = {"beam, early_stopping, length_penalty": dict(early_stopping=True, length_penalty=0.6)}


def sequences(tr, texts, seeds, decoder: str) -> list[torch.Tensor]:
    """The token sequences each batch's decoding returned (generate's, or the loop's), batch by batch."""
    seen = []
    if decoder == "loop":
        run = tr.loop.generate
        tr.loop.generate = lambda *a: seen.append(run(*a)) or seen[-1]
    else:
        assert tr.loop is None
        run = tr.model.generate
        tr.model.generate = lambda **k: seen.append(run(**k)) or seen[-1]
    texts_out = tr.translate(texts, seeds)
    return seen, texts_out


def assert_same_tokens(ours: torch.Tensor, theirs: torch.Tensor, pad: int) -> None:
    """Equal row for row up to generate's width; past it the loop holds padding only (it may check for finished
    rows a few steps after generate stopped)."""
    width = theirs.shape[1]
    assert ours.shape[0] == theirs.shape[0] and ours.shape[1] >= width
    assert torch.equal(ours[:, :width], theirs), (ours[:, :width] != theirs).nonzero()[:5]
    assert bool((ours[:, width:] == pad).all())


def translators(path: str, mode: str, **kw):
    gen_cfg = {**MODES[mode], **kw}
    generate = load_translator(path, cfg(decoder="generate", **gen_cfg))
    loop = load_translator(path, cfg(**gen_cfg))
    for tr in (generate, loop):
        tr.gen.update(**EXTRA.get(mode, {}))
    return generate, loop


@pytest.mark.parametrize("model", ["marian-en-xx", "fsmt-en-de"])
@pytest.mark.parametrize("mode", list(MODES))
def test_the_loop_returns_generates_tokens(tiny, model, mode):
    """Batches of 16 rows of mixed lengths (several hit their own cap: SMALL caps), the same settings: every
    batch's sequences are generate's, token for token, and so are the texts."""
    generate, loop = translators(tiny[model], mode, batch_size=16)
    assert loop.loop is not None and generate.loop is None
    seeds = [row_seed(7, "test", i) for i in range(len(LINES))]
    theirs, their_texts = sequences(generate, LINES, seeds, "generate")
    ours, our_texts = sequences(loop, LINES, seeds, "loop")
    assert len(ours) == len(theirs) > 2
    for a, b in zip(ours, theirs):
        assert_same_tokens(a, b, loop.pad_id)
    assert our_texts == their_texts
    if model.startswith("marian"):
        assert loop.banned == [loop.pad_id]  # opus-mt's ban on <pad> applies in both


def test_a_forced_first_token_is_forced_by_the_loop_too(tiny):
    """forced_bos_token_id (a target-language token, as M2M100 / NLLB start with) goes through transformers' own
    processor in the loop too: the same tokens, the forced one first."""
    for mode in ("greedy", "beam"):
        generate, loop = translators(tiny["marian-en-xx"], mode, batch_size=8)
        for tr in (generate, loop):
            tr.gen.forced_bos_token_id = 5
        theirs, _ = sequences(generate, LINES[:20], None, "generate")
        ours, _ = sequences(loop, LINES[:20], None, "loop")
        for a, b in zip(ours, theirs):
            assert_same_tokens(a, b, loop.pad_id)
            assert bool((a[:, 1] == 5).all())


@pytest.mark.parametrize("mode", ["greedy", "sampling", "beam"])
def test_dropping_finished_rows_changes_no_row(tiny, mode):
    """Rows (or settled beam inputs) dropped at every step, or never: the same texts, in a batch or alone."""
    seeds = [row_seed(2, "test", i) for i in range(len(LINES))]
    tr = load_translator(tiny["marian-en-xx"], cfg(batch_size=16, **MODES[mode]))
    tr.loop.check_every = 10**6  # never checked: every row runs to the batch's longest cap
    never = tr.translate(LINES, seeds)
    tr.loop.check_every = 1
    assert tr.translate(LINES, seeds) == never
    assert [tr.translate([LINES[j]], [seeds[j]])[0] for j in (0, 17, 41)] == [never[j] for j in (0, 17, 41)]


def test_on_a_cpu_the_loop_stops_at_the_step_its_last_row_ends(tiny):
    """A read of a CPU tensor waits for nothing, so there the greedy loop looks at its done flags every step and runs
    exactly generate's decoding steps on the same batches; reading as on a GPU (every check_every steps) it runs
    past them. The texts are generate's either way. The random model's eos logit is raised by 2, so that rows end
    at different steps before their caps, as a trained model's do."""
    generate, loop = translators(tiny["marian-en-xx"], "greedy", batch_size=16)
    for tr in (generate, loop):
        with torch.no_grad():
            tr.model.final_logits_bias[0, tr.model.config.eos_token_id] += 2.0
    forward, counted = generate.model.forward, []
    generate.model.forward = lambda *a, **k: counted.append(1) or forward(*a, **k)
    theirs = generate.translate(LINES)
    steps = {}
    for free in (None, False):  # None: the default, free on this CPU
        loop.loop.free_reads, loop.loop.steps = free, 0
        assert loop.translate(LINES) == theirs
        steps[free] = loop.loop.steps
    assert steps[None] == len(counted) < steps[False], (steps, len(counted))


def test_weights_changed_in_place_between_batches_are_what_the_next_batch_decodes_with(tiny):
    """The loop keeps copies made from the weights (K and V side by side, the scaled token embeddings): a model
    changed in place after a translation (fine-tuned, or loaded into) decodes with its new weights, as generate."""
    generate, loop = translators(tiny["marian-en-xx"], "greedy", batch_size=16)
    assert loop.translate(LINES[:8]) == generate.translate(LINES[:8])
    for tr in (generate, loop):
        with torch.no_grad():
            for layer in tr.model.model.decoder.layers:
                layer.self_attn.v_proj.weight.mul_(-3.0)
            tr.model.model.decoder.embed_tokens.weight.add_(0.5)
    assert loop.translate(LINES) == generate.translate(LINES)


def test_threads_sharing_a_model_while_its_copies_are_made_decode_as_one_thread(tiny, monkeypatch):
    """A stage's shards on threads share one loaded model: a thread that starts while another is still making the
    loop's copies of the weights (slowed here) decodes with whole copies, not half-made ones."""
    from contramine.pipeline.models.translate.decode.steps import Seq2SeqSteps

    generate, loop = translators(tiny["marian-en-xx"], "greedy", batch_size=16)
    want = generate.translate(LINES)
    make = Seq2SeqSteps._input_tables
    monkeypatch.setattr(Seq2SeqSteps, "_input_tables", lambda self: time.sleep(0.3) or make(self))
    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(lambda _: loop.translate(LINES), range(2))) == [want, want]


def test_host_reads_at_most_one_in_four_decoding_steps(tmp_path):
    """debcse-paper's back-translation (greedy, opus-mt-en-zh and back: a multi-target Marian model, the stage's
    default caps and batches), counted on the CPU with tests/host_reads.py, the loop reading as on a GPU (free_reads
    off): the loop reads the device <= 0.25 times a decoding step; transformers' generate reads it more than twice a
    step on the same batches."""
    there = build_tiny_marian(tmp_path / "en-zh", seed=1, target_codes=(">>cmn_Hans<<", ">>yue_Hant<<"))
    back = build_tiny_marian(tmp_path / "zh-en", seed=2)
    texts = corpus_lines(300)[:120]
    for decoder in ("loop", "generate"):
        settings = BacktranslateCfg(decoder=decoder, target_lang={str(there): ">>cmn_Hans<<"})
        hops = [load_translator(str(there), settings), load_translator(str(back), settings)]
        steps, reads = 0, 0
        for tr in hops:
            if decoder == "generate":
                forward = tr.model.forward
                counted = []
                tr.model.forward = lambda *a, _f=forward, _c=counted, **k: _c.append(1) or _f(*a, **k)
            if tr.loop is not None:
                tr.loop.free_reads = False
            with HostReads() as seen:
                texts_out = tr.translate(texts)
            reads += seen.count
            steps += tr.loop.steps if decoder == "loop" else len(counted)
        assert steps > 300 and texts_out and all(len(t) == 1 for t in texts_out)
        per_step = reads / steps
        assert per_step <= 0.25 if decoder == "loop" else per_step > 2, (decoder, reads, steps)


def test_models_the_loop_does_not_know_use_generate_and_say_so(tiny, caplog):
    """M2M100 (and NLLB) keep transformers' generate, and so do generate's own settings (a static cache,
    compilation); the log names the model and why. decoder = "generate" uses generate without a word."""
    with caplog.at_level(logging.INFO, logger="contramine.pipeline.models.translate.engines.hf"):
        m2m = load_translator(tiny["m2m100"], cfg(target_lang={tiny["m2m100"]: "de"}))
        static = load_translator(tiny["marian-en-xx"], cfg(kv_cache="static"))
        plain = load_translator(tiny["marian-en-xx"], cfg(decoder="generate"))
    assert m2m.loop is static.loop is plain.loop is None
    said = [r.getMessage() for r in caplog.records]
    assert any("m2m100" in m and "'m2m_100' is not one the loop knows" in m for m in said), said
    assert any("kv_cache = 'static'" in m for m in said) and len(said) == 2, said
    assert m2m.translate(LINES[:3])  # and generate still translates


def test_decoder_is_an_execution_setting():
    """Which decoder runs changes no output on a CPU (the tests above), so it is kept out of cache keys, as batch
    sizes are; any other value is refused when the config is read."""
    assert "decoder" in BacktranslateCfg.EXECUTION and BacktranslateCfg().decoder == "loop"
    with pytest.raises(ValueError, match="decoder"):
        BacktranslateCfg(decoder="fast")


def test_marian_input_ids_through_sentencepieces_batch_call_equal_the_tokenizers(tmp_path):
    """engines/hf.py's token ids (pipeline/models/translate/decode/tokens.py: one SentencePiece call for the rows) are the
    tokenizer's, truncation and a multi-target >>code<< prefix included; text holding special tokens and other
    tokenizers go through the tokenizer itself."""
    from transformers import AutoTokenizer

    from contramine.pipeline.models.translate.decode.tokens import input_ids

    path = build_tiny_marian(tmp_path / "m", target_codes=(">>cmn_Hans<<",))
    tok = AutoTokenizer.from_pretrained(path)
    lines = corpus_lines(600) + ["  The   cat\tsat on\n the mat.  ", "", "a </s> b", "x <unk> y", "émoji 😀 ü"]
    for prefix in ("", ">>cmn_Hans<< ", ">>xx<< "):
        texts = [prefix + t for t in lines]
        for max_length in (256, 8):
            assert input_ids(tok, texts, max_length) == tok(texts, truncation=True, max_length=max_length)[
                "input_ids"], (prefix, max_length)


def test_marian_texts_through_sentencepieces_batch_call_equal_the_tokenizers(tmp_path):
    """engines/hf.py's output texts (fast_tokens.texts: one SentencePiece decode for the rows) are
    tokenizer.batch_decode(..., skip_special_tokens=True)'s: for real translations' ids and random ones holding
    special tokens, language codes and empty rows, as lists and as one padded array; also for a tokenizer whose
    source and target SentencePiece differ and for one with separate vocabularies."""
    import random
    import shutil

    from transformers import AutoTokenizer, MarianTokenizer

    from bench.fixtures.tiny_mt import _spm_bytes
    from contramine.pipeline.models.translate.decode.tokens import input_ids, texts

    path = build_tiny_marian(tmp_path / "m", target_codes=(">>cmn_Hans<<",))
    other = tmp_path / "other"
    shutil.copytree(path, other)
    (other / "target.spm").write_bytes(_spm_bytes(corpus_lines()[::3], 120))  # another SentencePiece
    separate = MarianTokenizer(source_spm=str(path / "source.spm"), target_spm=str(other / "target.spm"),
                               vocab=str(path / "vocab.json"), target_vocab_file=str(path / "vocab.json"),
                               separate_vocabs=True)
    lines = corpus_lines(300) + ["  The   cat\tsat on\n the mat.  ", "", "émoji 😀 ü"]
    rng = random.Random(0)
    for tok in (AutoTokenizer.from_pretrained(path), AutoTokenizer.from_pretrained(other), separate):
        n = len(tok.get_vocab())
        rows = input_ids(tok, lines, 256) + [[rng.randrange(n) for _ in range(rng.randrange(24))] for _ in range(400)]
        rows += [[], [tok.eos_token_id], [tok.pad_token_id, 5, tok.eos_token_id, tok.pad_token_id]]
        assert texts(tok, rows) == tok.batch_decode(rows, skip_special_tokens=True), type(tok).__name__
        # a batch's ids as the loop returns them (one array, pad after eos): the same texts, by SentencePiece ids
        width = max(map(len, rows)) + 2
        batch = np.array([r + [tok.pad_token_id] * (width - len(r)) for r in rows if r])
        assert texts(tok, batch) == tok.batch_decode(batch.tolist(), skip_special_tokens=True)


def test_banned_tokens_in_the_output_bias_score_as_the_ban_processor_scores_them(tiny):
    """The greedy loop's bans are -inf in the batch's copy of the output bias (one addmm, no pass over the scores):
    each step's logits equal the unbanned step's with BannedTokens applied, for Marian (final_logits_bias) and
    FSMT (no bias of its own); the model's bias is left as it was; the cross-attention bias stays aligned to 8
    columns when rows are dropped."""
    from contramine.pipeline.models.translate.decode.steps import Seq2SeqSteps
    from contramine.pipeline.models.translate.engines.hf import BannedTokens

    for name in ("marian-en-xx", "fsmt-en-de"):
        tr = load_translator(tiny[name], cfg())
        ids = torch.tensor([[5, 9, 11, 7, -2], [6, 8, -2, -1, -1], [12, -2, -1, -1, -1]])  # -1: pad, -2: eos
        ids = torch.where(ids == -1, tr.pad_id, torch.where(ids == -2, tr.eos_id, ids))
        mask = (ids != tr.pad_id).long()
        steps, banned = Seq2SeqSteps(tr.model), [3, tr.pad_id]
        before = [b.clone() for b in tr.model.buffers()]
        plain, folded = steps.start(ids, mask, 6), steps.start(ids, mask, 6, banned)
        tokens = torch.full((3,), tr.pad_id)
        for t in range(4):
            want = BannedTokens(banned)(None, steps.step(plain, tokens, t).clone())
            got = steps.step(folded, tokens, t)
            assert torch.equal(got, want) and bool(got[:, banned].eq(float("-inf")).all())
            tokens = got.argmax(-1)
        assert all(torch.equal(a, b) for a, b in zip(before, tr.model.buffers()))
        if folded.enc_bias is not None:
            folded.select(torch.tensor([2, 0]))
            assert folded.cross_mask.stride(0) % 8 == 0 and folded.cross_mask.shape[-1] == ids.shape[1]


def test_forcing_after_the_argmax_picks_the_forced_scores_argmax():
    """Forced bos, forced eos (several eos ids: the first) and each row's length limit, written into the argmax's
    result, give the token the argmax of the processors' scores gives, at every step, a banned or broken eos too."""
    from transformers import ForcedBOSTokenLogitsProcessor, ForcedEOSTokenLogitsProcessor, GenerationConfig

    from contramine.pipeline.models.translate.decode.loop import greedy_plan
    from contramine.pipeline.models.translate.engines.hf import BannedTokens, GumbelSampler, RowLengthLimit

    limits, eos = [6, 5, 5, 2, 1], 3
    procs = [ForcedBOSTokenLogitsProcessor(4), ForcedEOSTokenLogitsProcessor(8, [eos, 9]), BannedTokens([0]),
             GumbelSampler([row_seed(5, "test", r) for r in range(5)]), RowLengthLimit(limits, eos)]
    banned, forcings, rest = greedy_plan(procs, GenerationConfig(forced_eos_token_id=[eos, 9]))
    assert banned == [0] and len(forcings) == 3 and [type(p) for p in rest] == [GumbelSampler]
    g = torch.Generator().manual_seed(0)
    for cur_len in range(1, 8):
        ids = torch.zeros((5, cur_len), dtype=torch.long)
        scores = torch.randn((5, 12), generator=g)
        scores[1, eos], scores[4, eos] = float("-inf"), float("nan")
        want = scores.clone()
        for p in procs:
            want = p(ids, want)
        biased = scores.clone()
        biased[:, banned] = float("-inf")
        got = rest(ids, biased).argmax(-1)
        for f in forcings:
            f.force(got, cur_len)
        assert torch.equal(got, want.argmax(-1)), cur_len
    assert greedy_plan(procs[:2] + [BannedTokens([eos])], GenerationConfig(forced_eos_token_id=eos)) is None


def test_a_processor_the_loop_cannot_fold_runs_as_generate_runs_it(tiny):
    """A setting whose processor the greedy plan does not know (a repetition penalty) keeps transformers'
    processors on float32 scores: still generate's tokens."""
    generate, loop = translators(tiny["marian-en-xx"], "greedy", batch_size=8)
    for tr in (generate, loop):
        tr.gen.repetition_penalty = 1.5
    theirs, _ = sequences(generate, LINES[:20], None, "generate")
    ours, _ = sequences(loop, LINES[:20], None, "loop")
    for a, b in zip(ours, theirs):
        assert_same_tokens(a, b, loop.pad_id)
