"""HF generate at the card's pace (pipeline/models/translate/engines/hf.py): batches by tokens, the decoding loop's work kept on
the device, the static cache and compilation, sampling's noise computed where the scores are. On a CPU every row's
output equals the row alone, at any batching, and no logits processor of ours reads a value back from the device."""
from __future__ import annotations

import sys

import pytest
import torch

from contramine.pipeline.config import BacktranslateCfg
from contramine.pipeline.models.translate.chains import load_translator
from contramine.pipeline.seeding import row_seed
from tests.test_backtranslate import LINES, SMALL, cfg, tiny  # noqa: F401 (tiny: the module's fixture)

MODES = {"greedy": {}, "beam": dict(num_beams=2, num_return_sequences=2),
         "sampling": dict(do_sample=True, num_return_sequences=2)}


@pytest.mark.parametrize("mode", list(MODES))
def test_batches_by_tokens_equal_each_row_alone(tiny, mode):
    """Batches filled to a token budget, rows of mixed lengths side by side: a row's output is its output alone,
    at a small budget (batches of a few rows) and at one large enough for every row at once."""
    seeds = [row_seed(3, "test", i) for i in range(len(LINES))]
    tr = load_translator(tiny["marian-en-xx"], cfg(**MODES[mode]))
    picked = sorted({*range(0, len(LINES), 4), len(LINES) - 2, len(LINES) - 1})  # and "Short." and the empty text
    alone = {j: tr.translate([LINES[j]], [seeds[j]])[0] for j in picked}
    lengths = sorted((len(x) for x in tr.tokenizer(LINES)["input_ids"]), reverse=True)
    k = MODES[mode].get("num_return_sequences", 1)
    for budget in (150, 10**6):
        tr.cfg = cfg(batch_tokens=budget, **MODES[mode])
        sizes = [len(b) for b in tr.batches(lengths, k)]
        assert sizes == [len(LINES)] if budget == 10**6 else (len(sizes) > 2 and max(sizes) > 1), sizes
        out = tr.translate(LINES, seeds)
        assert {j: out[j] for j in picked} == alone, (mode, budget)


def test_a_token_budget_counts_each_input_decoder_rows_and_caps():
    """A batch of inputs sorted longest first holds as many inputs as fit: decoder rows per input (num_beams, or
    the returns when sampling) x (its longest input + that input's length cap) <= the budget; never fewer than one."""
    from contramine.pipeline.models.translate.engines.hf import Translator

    def batches(lengths, budget, k=1, **kw):
        tr = Translator.__new__(Translator)
        tr.cfg, tr.device = cfg(batch_tokens=budget, **kw), "cpu"
        return [len(b) for b in tr.batches(lengths, k)]

    lengths = [10, 10, 8, 5, 5, 5, 2]  # caps (SMALL): max(4, length) -> 10 + 10 = 20 tokens per row of the first
    assert batches(lengths, 40) == [2, 2, 3]  # 40 // 20, then 8 + 8 = 16 -> 2, then 5 + 5 = 10 -> 4 > the 3 left
    assert batches(lengths, 19) == [1] * 7  # not even the longest fits: one row each
    assert batches(lengths, 120, num_beams=3, num_return_sequences=2) == [2, 2, 3]  # 3 beams: 60 per input
    assert batches(lengths, 120, k=3, do_sample=True, num_return_sequences=3) == [2, 2, 3]
    assert batches(lengths, 0, batch_size=3) == [3, 3, 1]  # no budget: batch_size rows


def test_auto_batching_is_sized_for_the_device():
    """"auto": thousands of rows on a GPU, 8,192 tokens on a CPU (what measured best there: ~85 rows of
    32-token inputs); CTranslate2 keeps batch_size rows on a CPU."""
    from contramine.pipeline.models.translate.settings import batch_token_budget
    from contramine.pipeline.models.translate.engines.hf import Translator

    assert cfg().batch_tokens == "auto"
    assert batch_token_budget("auto", "cpu", "hf") == 8_192 and batch_token_budget("auto", "cuda:1", "hf") == 262_144
    assert batch_token_budget("auto", "cuda", "ctranslate2") == 65_536 and batch_token_budget(500, "cuda", "hf") == 500
    assert batch_token_budget("auto", "cpu", "ctranslate2") == 0
    tr = Translator.__new__(Translator)
    tr.cfg = BacktranslateCfg()  # the stage's defaults: a 32-token input caps at 64 tokens
    tr.device = "cuda"
    assert [len(b) for b in tr.batches([32] * 6000, 1)] == [2730, 2730, 540]
    tr.device = "cpu"
    assert {len(b) for b in tr.batches([32] * 6800, 1)} == {85}
    with pytest.raises(ValueError, match="batch_tokens must be 'auto', 0"):
        cfg(batch_tokens=-1)


def test_length_limit_reads_nothing_from_the_device():
    """The per-row length limit is decided from the host's list of limits: the processor runs on meta tensors
    (which have no values to read: any .any() or .item() raises) and equals the masked form on real ones."""
    from contramine.pipeline.models.translate.engines.hf import RowLengthLimit

    limits, eos = [5, 5, 4, 2, 2], 3
    proc = RowLengthLimit(limits, eos)
    for step in range(1, 8):
        proc(torch.zeros((5, step), dtype=torch.long, device="meta"), torch.empty((5, 11), device="meta"))
    g = torch.Generator().manual_seed(0)
    for step in range(1, 8):
        scores = torch.randn((5, 11), generator=g)
        scores[1, eos], scores[4, eos] = float("-inf"), float("nan")  # a banned or broken eos still ends the row
        done = torch.tensor(limits) <= step - 1
        want = scores.masked_fill(done[:, None], float("-inf"))
        want[done, eos] = torch.where(torch.isfinite(scores[:, eos]), scores[:, eos], 0.0)[done]
        got = proc(torch.zeros((5, step), dtype=torch.long), scores.clone())
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=f"step {step}")
    with pytest.raises(ValueError, match="must not increase"):
        RowLengthLimit([2, 5], eos)


def test_a_banned_token_scores_as_transformers_ban_scores_it(tiny):
    """opus-mt bans <pad> (bad_words_ids = [[pad]]): one column set to -inf in place gives the scores transformers'
    NoBadWordsLogitsProcessor gives by adding a bias tensor."""
    from transformers import NoBadWordsLogitsProcessor

    from contramine.pipeline.models.translate.engines.hf import BannedTokens

    scores = torch.randn((6, 50), generator=torch.Generator().manual_seed(2))
    scores[0, 7], scores[1, 3], scores[2, 9] = float("-inf"), float("nan"), float("inf")
    ids = torch.zeros((6, 3), dtype=torch.long)
    want = NoBadWordsLogitsProcessor([[7], [9]], eos_token_id=0)(ids, scores.clone())
    got = BannedTokens([7, 9])(ids, scores.clone())
    got[2, 9] = want[2, 9]  # +inf + -inf: transformers' sum is nan, the ban's -inf (no finite model scores +inf)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    tr = load_translator(tiny["marian-en-xx"], cfg())
    assert tr.banned == [tr.pad_id] and tr.gen.bad_words_ids is None


@pytest.mark.parametrize("mode", list(MODES))
def test_static_cache_gives_the_dynamic_outputs_and_each_row_alone(tiny, mode):
    """kv_cache = "static": one cache length for every batch (max_length + 2), so a row alone equals the batch, and
    on a CPU the outputs are those of the dynamic cache. FSMT has no static cache: it keeps the dynamic one."""
    seeds = [row_seed(5, "test", i) for i in range(len(LINES))]
    static = load_translator(tiny["marian-en-xx"], cfg(kv_cache="static", batch_size=16, **MODES[mode]))
    assert static.static_cache
    batched = static.translate(LINES, seeds)
    assert batched == load_translator(tiny["marian-en-xx"], cfg(**MODES[mode])).translate(LINES, seeds)
    for j in (0, 13, 40):
        assert static.translate([LINES[j]], [seeds[j]]) == [batched[j]]
    if mode == "greedy":
        fsmt = load_translator(tiny["fsmt-en-de"], cfg(kv_cache="static"))
        assert not fsmt.static_cache
        assert fsmt.translate(LINES) == load_translator(tiny["fsmt-en-de"], cfg()).translate(LINES)


def test_compile_is_passed_to_generate_and_needs_the_static_cache(tiny, monkeypatch):
    """compile = true hands transformers a CompileConfig for the decoding step (CUDA graphs on a GPU; on a CPU it
    must be told to compile); without it generate is told not to compile, even with a static cache on a GPU."""
    with pytest.raises(ValueError, match="compile = true needs backtranslate.kv_cache = 'static'"):
        cfg(compile=True)
    seen = []
    for kw in (dict(kv_cache="static", compile=True), dict(kv_cache="static"), dict(decoder="generate")):
        tr = load_translator(tiny["marian-en-xx"], cfg(**kw))
        generate = tr.model.generate
        monkeypatch.setattr(tr.model, "generate", lambda *a, **k: seen.append(k["generation_config"]) or generate(
            *a, **{**k, "generation_config": k["generation_config"].__class__.from_dict(
                {**k["generation_config"].to_dict(), "compile_config": None, "disable_compile": True})}))
        tr.translate(LINES[:2])
    compiled, static, plain = seen
    assert compiled.compile_config.mode == "default" and compiled.compile_config._compile_all_devices
    assert compiled.cache_implementation == static.cache_implementation == "static"
    assert static.disable_compile and plain.disable_compile and plain.cache_implementation is None
    assert compiled.max_cache_len == static.max_cache_len == SMALL["max_length"] + 2


def test_the_device_sampler_draws_the_host_generators_numbers():
    """Sampling's noise without the host: pipeline/models/translate/decode/mt19937.py computes, for many seeds at once and on any
    device, the uniforms torch's CPU generator draws from each seed, bit for bit; the sampler's device path (what a
    GPU runs) then adds the same noise as one generator per row (what a CPU runs), here on the CPU."""
    from contramine.pipeline.models.translate.decode.mt19937 import mt19937_uniform
    from contramine.pipeline.models.translate.engines.hf import GumbelSampler

    seeds = [0, 1, 5489, 2**32 + 3, 2**63 - 1, *(row_seed(9, "test", i) for i in range(11))]
    for n in (1, 623, 624, 625, 1249, 2000):
        want = torch.stack([torch.rand(n, generator=torch.Generator().manual_seed(s)) for s in seeds])
        assert torch.equal(mt19937_uniform(torch.tensor(seeds), n), want), n
    g = torch.Generator().manual_seed(1)
    for vocab in (401, 1000):
        scores = torch.randn((len(seeds), vocab), generator=g)
        ids = torch.zeros((len(seeds), 7), dtype=torch.long)
        host, device = GumbelSampler(seeds, on_device=False), GumbelSampler(seeds, on_device=True)
        assert torch.equal(host(ids, scores), device(ids, scores)), vocab
        assert not torch.equal(host(ids, scores), host(ids[:, :6], scores))  # another step, other noise


class HostReads(torch.overrides.TorchFunctionMode):
    """Counts the tensor calls that read a value back to the host (on a GPU: a wait for the device), split into
    those made inside one of engines/hf.py's logits processors and the rest (transformers' own loop)."""

    READS = {"__bool__", "item", "tolist", "numpy", "__int__", "__float__", "__index__", "cpu", "nonzero", "equal"}

    def __init__(self):
        super().__init__()
        self.ours, self.theirs = [], []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.READS:
            frame, ours = sys._getframe(1), False
            while frame is not None and not ours:
                ours = frame.f_code.co_name == "__call__" and frame.f_code.co_filename.endswith("engines/hf.py")
                frame = frame.f_back
            (self.ours if ours else self.theirs).append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode", list(MODES))
def test_our_logits_processors_read_nothing_back_at_any_step(tiny, mode):
    """A whole translate() on the CPU, every tensor call watched: the length limits, the ban and the sampler read
    no value back from the device at any step (the same code runs on a GPU, where each read is a wait). What the
    greedy and sampling loops still read is transformers': "is every row done" (StopCheck) and, in Marian's
    forward, whether the decoder's and the encoder's padding masks can be skipped under SDPA (masking_utils), three
    values a step (docs/backtranslation.md); this pins that count so a new read per step shows."""
    from contramine.pipeline.models.translate.engines.hf import GumbelSampler

    tr = load_translator(tiny["marian-en-xx"], cfg(batch_size=8, decoder="generate", **MODES[mode]))  # (the
    steps = []  # decode loop's reads: tests/test_decode_loop.py)
    forward = tr.model.forward
    tr.model.forward = lambda *a, **k: steps.append(1) or forward(*a, **k)  # one call a decoding step
    with HostReads() as reads:
        tr.translate(LINES, [row_seed(4, "test", i) for i in range(len(LINES))])
    assert tr.banned and reads.ours == [], reads.ours
    if mode != "beam":  # (beam search's own loop reads more: its beams' bookkeeping, not ours)
        assert reads.theirs.count("__bool__") <= 3 * len(steps) + 4 * len(range(0, len(LINES), 8)), reads.theirs
    seeds = [row_seed(1, "test", i) for i in range(5)]
    with HostReads() as reads:  # the device path of the sampler (a GPU's), run on the CPU
        GumbelSampler(seeds, on_device=True)(torch.zeros((5, 3), dtype=torch.long), torch.zeros((5, 401)))
    assert reads.ours == reads.theirs == []
