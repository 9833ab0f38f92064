"""Translation with any Hugging Face seq2seq model (METHODS §3 and §6), for the `backtranslate` stage.

    tr = load_engine(name, path, cfg, device="cpu", dtype="float32")   # translate/chains.py loads it as the run's plan says
    tr.translate(texts, seeds)

Outputs never depend on how rows are batched: batches are sorted by length and restored to input order, each row
gets its own length limit (forced eos), and sampling draws its noise from a per-row generator, so the same row
gives the same text alone, in a batch of 3, of 64 or of thousands, on any shard or worker (on a CPU: tested; a GPU's
kernels may round differently with the batch's shape, so there a bf16 decode may pick another token at a near-tie,
and `runner.memo = "auto"` stays off).

Batches: filled to `batch_tokens` (the budget counts each input's decoder rows times its batch's longest input plus
that input's cap), or `batch_size` rows where it is 0; "auto" is thousands of rows on a GPU (262,144 tokens) and
8,192 tokens on a CPU (what measured best there: docs/backtranslation.md).
The decoding loop keeps its work on the device: the length limits are decided from the host's list (no device read
per step), sampling's noise is computed where the scores are (decode/mt19937.py), and a banned token (opus-mt's <pad>) is
one column set in place, not a bias tensor added to every score (our loop's greedy decoding: -inf in the output
projection's bias, decode/steps.py) (tests/test_translate_device.py: no processor of
ours reads a value back). What transformers still reads per step: "is every row done" (its DeferredStopCheck, which
avoids the wait, is used on mps only in transformers 5.23) and, in Marian's forward, two SDPA mask-skip checks that a
compiled step skips. `kv_cache = "static"` preallocates the cache for max_length + 2 tokens (the same length for every
batch) and `compile = true` compiles the decoding step (CUDA graphs on a GPU); both measured slower on a CPU and are
off by default until a GPU measures them (docs/backtranslation.md).

Sampling (do_sample) is plain ancestral sampling at temperature 1 from the model's (processed) scores; the model's
own temperature / top-k / top-p settings are not applied. Each hop's length cap is
min(max_length, max(max_new_tokens_min, ceil(max_new_tokens_factor x input tokens))) for that row.
"""
from __future__ import annotations

import bisect
import copy
import itertools
import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, CompileConfig, LogitsProcessor, LogitsProcessorList

from contramine.pipeline.config.backtranslation import BacktranslateCfg, chain_name
from contramine.pipeline.models.attention_kernels import without_cudnn_attention
from contramine.pipeline.models.translate.decode.loop import DecodeLoop, KNOWN_TYPES, supports
from contramine.pipeline.models.translate.decode.tokens import input_ids
from contramine.pipeline.models.translate.decode.tokens import texts as decoded_texts
from contramine.pipeline.models.translate.decode.mt19937 import mt19937_uniform
from contramine.pipeline.seeding import row_seed

from contramine.pipeline.models.translate.settings import batch_token_budget, language_settings, resolve_kv_cache, row_limit

log = logging.getLogger(__name__)


class GumbelSampler(LogitsProcessor):
    """Exact sampling from softmax(scores) as argmax(scores + Gumbel noise), the noise of score row r at decoding
    step t being -log(-log(u)) of the uniforms torch's CPU generator draws when seeded by (seeds[r], t): independent
    of batch composition and device.

    On a CPU each row draws from its own generator. Elsewhere (a GPU) the same uniforms are computed on the device
    for every row at once (pipeline/models/translate/decode/mt19937.py: bit for bit; the GPU's log may round the noise's last bit
    otherwise), so the noise never crosses from the host: only the rows' step seeds do, hashed on the host
    (row_seed, tens of microseconds a row) and copied without waiting. The device path is the slower one on a CPU
    (~7x here), the host path the slower one at a GPU's batch sizes (a generator per row and step, 1-5 ms each
    for a 58k vocabulary on this box)."""

    def __init__(self, seeds: list[int], on_device: bool | None = None):
        self.seeds, self.on_device = seeds, on_device  # on_device: None = wherever the scores are not on a CPU

    def subset(self, rows: list[int]) -> "GumbelSampler":
        """The sampler of score rows `rows` only (the decode loop drops finished rows)."""
        return GumbelSampler([self.seeds[r] for r in rows], self.on_device)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        step, vocab = input_ids.shape[1], scores.shape[1]
        step_seeds = [row_seed(s, "gumbel", step) for s in self.seeds]
        if self.on_device if self.on_device is not None else scores.device.type != "cpu":
            pinned = scores.device.type == "cuda"
            seeds = torch.tensor(step_seeds, pin_memory=pinned).to(scores.device, non_blocking=pinned)
            u = mt19937_uniform(seeds, vocab)
            return scores + (-torch.log(-torch.log(u.clamp_min(1e-20)))).to(scores.dtype)
        noise = torch.empty((len(self.seeds), vocab))
        for r, s in enumerate(step_seeds):
            u = torch.rand(vocab, generator=torch.Generator().manual_seed(s))
            noise[r] = -torch.log(-torch.log(u.clamp_min(1e-20)))
        return scores + noise.to(scores.device, scores.dtype)


class BannedTokens(LogitsProcessor):
    """Tokens the model must never generate (one-token entries of its generation_config.bad_words_ids, e.g.
    opus-mt's <pad>): their scores set to -inf in place, a column each. transformers' NoBadWordsLogitsProcessor
    gives the same scores by adding a bias tensor: three passes over rows x vocabulary every step, on a GPU's
    thousands of rows ~0.6 GB each for a 58k vocabulary."""

    def __init__(self, token_ids: list[int]):
        self.token_ids = token_ids

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        for t in self.token_ids:
            scores.select(1, t).fill_(float("-inf"))
        return scores


class RowLengthLimit(LogitsProcessor):
    """Force eos once score row r has generated limits[r] tokens: the row keeps exactly the text that generate()
    with max_new_tokens = limits[r] gives it alone, whatever the longest input sharing its batch.

    The limits must not increase along the batch (translate() sorts each batch longest first), so the rows done at
    a step are its last rows, counted here from the host's list: the device is never read, and a step before the
    first row is done does nothing. A done row's scores become -inf but for eos, which keeps its own (0 if it was
    not finite); changed in place (generate hands each step its own scores)."""

    def __init__(self, limits: list[int], eos_id: int):
        if any(a < b for a, b in zip(limits, limits[1:])):
            raise ValueError("RowLengthLimit: the limits must not increase along the batch (sort it longest first)")
        self.negated, self.eos_id = [-n for n in limits], eos_id

    def subset(self, rows: list[int]) -> "RowLengthLimit":
        """The limits of score rows `rows` only, in order (the decode loop drops finished rows)."""
        return RowLengthLimit([-self.negated[r] for r in rows], self.eos_id)

    def force(self, tokens: torch.Tensor, cur_len: int) -> None:
        """__call__ after the argmax (the decode loop's greedy path, at `cur_len` tokens so far): the done rows'
        chosen tokens set to eos in place, the argmax of the scores __call__ leaves them, without a pass over the
        scores."""
        live = bisect.bisect_left(self.negated, -(cur_len - 1))
        if live < len(self.negated):
            tokens.narrow(0, live, len(self.negated) - live).fill_(self.eos_id)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        live = bisect.bisect_left(self.negated, -(input_ids.shape[1] - 1))  # rows whose limit is above the step
        if live < len(self.negated):  # (input_ids holds the decoder start token too)
            done = scores[live:]
            eos = done[:, self.eos_id].clone()
            done.fill_(float("-inf"))
            done[:, self.eos_id] = torch.where(torch.isfinite(eos), eos, torch.zeros_like(eos))
        return scores


class Translator:
    """One loaded translation model with the generation settings of a BacktranslateCfg."""

    def __init__(self, name: str, tokenizer, model, cfg: BacktranslateCfg, device: str):
        self.name, self.tokenizer, self.model, self.cfg, self.device = name, tokenizer, model, cfg, device
        self.gen = copy.deepcopy(model.generation_config)
        self.prefix = ""
        self._set_languages()
        eos = self.gen.eos_token_id if self.gen.eos_token_id is not None else model.config.eos_token_id
        self.eos_id = eos[0] if isinstance(eos, (list, tuple)) else eos
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else model.config.pad_token_id
        self.pad_id = pad if pad is not None else self.eos_id
        bad = self.gen.bad_words_ids or []  # one-token bans as a column each (BannedTokens), longer ones stay with HF
        self.banned = [w[0] for w in bad if len(w) == 1]
        self.gen.bad_words_ids = [w for w in bad if len(w) > 1] or None
        # a static cache where the model supports one (FSMT does not: it keeps the dynamic cache)
        self.static_cache = resolve_kv_cache(cfg.kv_cache, device) == "static" and bool(getattr(model, "_can_compile_fullgraph", False))
        self.compile_config = None
        self.loop = self._decode_loop()
        if cfg.compile and self.static_cache:
            cuda = device.startswith("cuda")
            self.compile_config = CompileConfig(mode="reduce-overhead" if cuda else "default")  # CUDA graphs on a GPU
            self.compile_config._compile_all_devices = not cuda  # transformers compiles on a GPU only, unless told

    def _decode_loop(self):
        """Our decode loop (decode/loop.py) where the settings ask for it and it knows the model, else None
        (transformers' generate), said in the log when the loop was asked for."""
        if self.cfg.decoder != "loop":
            return None
        kind = self.model.config.model_type
        why = (f"its type {kind!r} is not one the loop knows ({', '.join(KNOWN_TYPES)})" if not supports(self.model)
               else "kv_cache = 'static' / compile = true are settings of generate" if self.static_cache
               or self.cfg.compile else None)
        if why is None:
            return DecodeLoop(self.model)
        log.info("backtranslate: %s decodes with transformers' generate: %s", self.name, why)
        return None

    def _set_languages(self) -> None:
        self.prefix, target = language_settings(self.name, self.tokenizer, self.cfg, self.model.config.model_type)
        if target is not None:
            self.gen.forced_bos_token_id = self.tokenizer.convert_tokens_to_ids(target)

    def translate(self, texts: list[str], seeds: list[int] | None = None, progress: bool = False,
                  num_return_sequences: int | None = None) -> list[list[str]]:
        """num_return_sequences (default: the config's) translations per text, in input order. An empty text
        translates to empty texts (generate would otherwise invent a sentence from a lone </s>)."""
        c, k = self.cfg, num_return_sequences or self.cfg.num_return_sequences
        if not texts:
            return []
        if seeds is None and c.do_sample:  # the text itself seeds its row: still independent of batching
            seeds = [row_seed(0, "translate-text", t) for t in texts]  # (greedy and beam search draw nothing)
        ids = input_ids(self.tokenizer, [self.prefix + t for t in texts], c.max_length)  # (one SentencePiece call)
        out: list[list[str] | None] = [[""] * k if not t.strip() else None for t in texts]  # nothing to translate
        order = sorted((i for i in range(len(texts)) if out[i] is None), key=lambda i: (-len(ids[i]), i))
        bar = None
        if progress:
            bar = tqdm(total=len(order), desc=f"translate {chain_name([self.name])}", unit="sent")
        # the host's text work a batch (decoding the ids, normalising) runs on a worker thread while the next
        # batch decodes on the device; results are collected in batch order, so nothing depends on the thread
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="detokenise") as pool:
            done = []
            for part in self.batches([len(ids[i]) for i in order], k):
                idx = [order[j] for j in part]
                seqs = self._generate(  # seeds: set above where the config samples
                    [ids[i] for i in idx], [seeds[i] for i in idx] if c.do_sample else None, k)  # type: ignore[index]
                done.append((idx, pool.submit(self._texts, seqs, len(idx), k)))
            for idx, texts_of in done:
                for i, hyps in zip(idx, texts_of.result()):
                    out[i] = hyps
                if bar is not None:
                    bar.update(len(idx))
        if bar is not None:
            bar.close()
        return out  # type: ignore[return-value]  # every row translated by now

    def batches(self, lengths: list[int], k: int) -> list[range]:
        """Batches of rows sorted longest first (`lengths` in tokens): `batch_size` rows each, or with a token
        budget as many rows as fit in it, counting each input's decoder rows (num_beams, or k when sampling) times
        the tokens its batch's longest input and that input's length cap hold."""
        budget = batch_token_budget(self.cfg.batch_tokens, self.device, "hf")
        if not budget:
            step = self.cfg.batch_size
            return [range(b, min(b + step, len(lengths))) for b in range(0, len(lengths), step)]
        rows_per_input = k if self.cfg.do_sample else self.cfg.num_beams
        out, start = [], 0
        while start < len(lengths):
            first = lengths[start]  # the batch's longest input: its width and the largest cap
            n = max(1, budget // (rows_per_input * (first + row_limit(first, self.cfg))))
            out.append(range(start, min(start + n, len(lengths))))
            start = out[-1].stop
        return out

    @torch.inference_mode()
    def _generate(self, batch: list[list[int]], seeds: list[int] | None, k: int) -> torch.Tensor:
        """The batch's output token ids (len(batch) x k rows, input by input), left on the device. `seeds`: one a
        row where the config samples (None otherwise)."""
        c = self.cfg
        input_ids, mask = padded(batch, self.pad_id)
        limits = [row_limit(len(x), c) for x in batch]
        gen = copy.deepcopy(self.gen)
        # one step past the longest cap: every row, the longest too, then ends on the eos we force, so beam scores
        # (which count that eos) do not depend on whether the row was the longest of its batch
        gen.update(do_sample=False, max_new_tokens=max(limits) + 1, min_new_tokens=None, pad_token_id=self.pad_id)
        if self.static_cache:  # one length for every batch (c.max_length + 2 covers any cap): no batch sets it
            gen.update(cache_implementation="static", max_cache_len=c.max_length + 2)
        if self.compile_config is not None:
            gen.compile_config = self.compile_config
        else:
            gen.disable_compile = True
        procs = [BannedTokens(self.banned)] if self.banned else []  # first, where transformers' own ban ran
        if c.do_sample:  # k independent rows per input, greedy over Gumbel-perturbed scores = exact sampling
            input_ids, mask = input_ids.repeat_interleave(k, 0), mask.repeat_interleave(k, 0)
            limits = [n for n in limits for _ in range(k)]
            assert seeds is not None  # one a row where the config samples (translate sets them)
            procs.append(GumbelSampler([row_seed(s, "translate-return", j) for s in seeds for j in range(k)]))
            gen.update(num_beams=1, num_return_sequences=1)
        else:  # beam rows of input r are r*num_beams ... r*num_beams + num_beams - 1
            limits = [n for n in limits for _ in range(c.num_beams)]
            gen.update(num_beams=c.num_beams, num_return_sequences=k)
        procs.append(RowLengthLimit(limits, self.eos_id))
        decode = self.loop.generate if self.loop is not None else (
            lambda ids, m, g, p: self.model.generate(input_ids=ids, attention_mask=m, generation_config=g,
                                                     logits_processor=p))
        with without_cudnn_attention(self.device):  # keys grow a position a step: no cuDNN plan to build per step
            seqs = decode(input_ids.to(self.device), mask.to(self.device), gen, LogitsProcessorList(procs))
        if gen.forced_bos_token_id is not None:  # a language token is not text, whether or not a tokenizer says so
            seqs = seqs.masked_fill(seqs == gen.forced_bos_token_id, self.pad_id)
        return seqs

    def _texts(self, seqs: torch.Tensor, n: int, k: int) -> list[list[str]]:
        """The texts of a batch's `n` x `k` output rows, whitespace normalised, k a row (one read of the ids)."""
        texts = [" ".join(s.split()) for s in decoded_texts(self.tokenizer, seqs.cpu().numpy())]
        return [texts[r * k:(r + 1) * k] for r in range(n)]


def padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids right-padded with `pad`, attention mask), int64 [rows, longest], built in numpy in one piece:
    torch.tensor of a Python list converts one int at a time (~60 ms for a GPU batch of 3,000 rows, against ~5)."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    keep = np.arange(lengths.max()) < lengths[:, None]
    ids = np.full(keep.shape, pad, dtype=np.int64)
    ids[keep] = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum()))
    return torch.from_numpy(ids), torch.from_numpy(keep.astype(np.int64))


def load_engine(name: str, path: str, cfg: BacktranslateCfg, device: str, dtype: str) -> Translator:
    """The HF generate engine for model `name` (resolved to `path`) on `device` in `dtype`, as the run's plan says
    (pipeline/models/translate/chains.py decides; nothing is decided here)."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSeq2SeqLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
    return Translator(name, tokenizer, model, cfg, device)
