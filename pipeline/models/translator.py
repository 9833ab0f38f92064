"""Translation with any Hugging Face seq2seq model (METHODS §3 and §6), for the `backtranslate` stage.

    chain = load_chain(["Helsinki-NLP/opus-mt-en-zh", "Helsinki-NLP/opus-mt-zh-en"], cfg)   # or local paths
    table = backtranslate([(sid, variant, text), ...], chain_name(names), chain, seed=1234)

Outputs never depend on how rows are batched: batches are sorted by length and restored to input order, each row
gets its own length limit (forced eos), and sampling draws its noise from a per-row generator, so the same row
gives the same text alone, in a batch of 3 or of 64, on any shard or worker.

Sampling (do_sample) is plain ancestral sampling at temperature 1 from the model's (processed) scores; the model's
own temperature / top-k / top-p settings are not applied. Each hop's length cap is
min(max_length, max(max_new_tokens_min, ceil(max_new_tokens_factor x input tokens))) for that row.
"""
from __future__ import annotations

import copy

import pyarrow as pa
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList

from pipeline.config import BacktranslateCfg, chain_name  # noqa: F401  (chain_name: re-exported)
from pipeline.models.hub import pick_device, resolve_model
from pipeline.models.standin import StandInTranslator, is_standin
from pipeline.schema import SCHEMAS
from pipeline.seeding import row_seed

from pipeline.models.translation import (  # noqa: F401  (re-exported: other code imports them from here)
    NEEDS_TARGET, language_settings, marian_language_codes, row_limit, target_language_problem)


class GumbelSampler(LogitsProcessor):
    """Exact sampling from softmax(scores) as argmax(scores + Gumbel noise), the noise of score row r at decoding
    step t drawn from a CPU generator seeded by (seeds[r], t): independent of batch composition and device."""

    def __init__(self, seeds: list[int]):
        self.seeds = seeds

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        step, vocab = input_ids.shape[1], scores.shape[1]
        noise = torch.empty((len(self.seeds), vocab))
        for r, s in enumerate(self.seeds):
            u = torch.rand(vocab, generator=torch.Generator().manual_seed(row_seed(s, "gumbel", step)))
            noise[r] = -torch.log(-torch.log(u.clamp_min(1e-20)))
        return scores + noise.to(scores.device, scores.dtype)


class RowLengthLimit(LogitsProcessor):
    """Force eos once score row r has generated limits[r] tokens: the row keeps exactly the text that generate()
    with max_new_tokens = limits[r] gives it alone, whatever the longest input sharing its batch."""

    def __init__(self, limits: list[int], eos_id: int):
        self.limits, self.eos_id = torch.tensor(limits), eos_id

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        done = (self.limits <= input_ids.shape[1] - 1).to(scores.device)  # minus the decoder start token
        if done.any():
            eos = scores[:, self.eos_id].clone()
            eos = torch.where(torch.isfinite(eos), eos, torch.zeros_like(eos))
            scores = scores.masked_fill(done[:, None], float("-inf"))
            scores[done, self.eos_id] = eos[done]
        return scores


def resolve_dtype(setting: str, device: str) -> torch.dtype:
    if setting != "auto":
        return getattr(torch, setting)
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32  # half precision on CPU is slower here, and some ops lack kernels


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
        if seeds is None:  # the text itself seeds its row: still independent of batching
            seeds = [row_seed(0, "translate-text", t) for t in texts]
        ids = self.tokenizer([self.prefix + t for t in texts], truncation=True, max_length=c.max_length)["input_ids"]
        out: list[list[str] | None] = [[""] * k if not t.strip() else None for t in texts]  # nothing to translate
        order = sorted((i for i in range(len(texts)) if out[i] is None), key=lambda i: (-len(ids[i]), i))
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(order), desc=f"translate {chain_name([self.name])}", unit="sent")
        for b in range(0, len(order), c.batch_size):
            idx = order[b:b + c.batch_size]
            for i, hyps in zip(idx, self._generate([ids[i] for i in idx], [seeds[i] for i in idx], k)):
                out[i] = hyps
            if bar is not None:
                bar.update(len(idx))
        if bar is not None:
            bar.close()
        return out

    @torch.inference_mode()
    def _generate(self, batch: list[list[int]], seeds: list[int], k: int) -> list[list[str]]:
        c, width = self.cfg, max(len(x) for x in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, x in enumerate(batch):
            input_ids[r, :len(x)], mask[r, :len(x)] = torch.tensor(x), 1
        limits = [row_limit(len(x), c) for x in batch]
        gen = copy.deepcopy(self.gen)
        # one step past the longest cap: every row, the longest too, then ends on the eos we force, so beam scores
        # (which count that eos) do not depend on whether the row was the longest of its batch
        gen.update(do_sample=False, max_new_tokens=max(limits) + 1, min_new_tokens=None, pad_token_id=self.pad_id)
        procs = []
        if c.do_sample:  # k independent rows per input, greedy over Gumbel-perturbed scores = exact sampling
            input_ids, mask = input_ids.repeat_interleave(k, 0), mask.repeat_interleave(k, 0)
            limits = [n for n in limits for _ in range(k)]
            procs.append(GumbelSampler([row_seed(s, "translate-return", j) for s in seeds for j in range(k)]))
            gen.update(num_beams=1, num_return_sequences=1)
        else:  # beam rows of input r are r*num_beams ... r*num_beams + num_beams - 1
            limits = [n for n in limits for _ in range(c.num_beams)]
            gen.update(num_beams=c.num_beams, num_return_sequences=k)
        procs.append(RowLengthLimit(limits, self.eos_id))
        seqs = self.model.generate(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device),
                                   generation_config=gen, logits_processor=LogitsProcessorList(procs))
        if gen.forced_bos_token_id is not None:  # a language token is not text, whether or not a tokenizer says so
            seqs = seqs.masked_fill(seqs == gen.forced_bos_token_id, self.pad_id)
        texts = [" ".join(s.split()) for s in self.tokenizer.batch_decode(seqs, skip_special_tokens=True)]
        return [texts[r * k:(r + 1) * k] for r in range(len(batch))]


def load_translator(name: str, cfg: BacktranslateCfg) -> Translator:
    """Load a seq2seq translation model by path or hub id; ModelUnavailable when it cannot be found. Generation
    settings that contradict each other (do_sample with beams, more returns than beams) never get here:
    BacktranslateCfg refuses them when the config is read (pipeline/translation_config.py)."""
    if is_standin(name):
        return StandInTranslator(name, cfg.num_return_sequences)  # same interface, no weights: `make scale`
    path = resolve_model(name, "translation model")
    from pipeline.models.bergamot import is_bergamot_folder, load_bergamot_translator

    if is_bergamot_folder(path):  # its own engine, whatever `engine` says (no other library runs these models)
        return load_bergamot_translator(name, path, cfg)
    device = pick_device(cfg.device)
    from pipeline.models.ct2 import engine_for, load_ct2_translator

    if engine_for(name, path, cfg) == "ctranslate2":
        return load_ct2_translator(name, path, cfg, device)
    dtype = resolve_dtype(cfg.dtype, device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSeq2SeqLM.from_pretrained(path, dtype=dtype).to(device).eval()
    return Translator(name, tokenizer, model, cfg, device)


def load_chain(names: list[str], cfg: BacktranslateCfg) -> list[Translator]:
    """One Translator per hop; a model named twice (e.g. one M2M100 both ways) is loaded once."""
    loaded: dict[str, Translator] = {}
    for n in names:
        if n not in loaded:
            loaded[n] = load_translator(n, cfg)
    return [loaded[n] for n in names]


def backtranslate(rows: list[tuple[int, int, str]], chain_name: str, translators: list[Translator],
                  seed: int = 0, progress: bool = False, role: str = "both") -> pa.Table:
    """Translate (sid, variant, text) rows through the chain, one hop after another.

    Intermediate hops keep their first return only; the last hop returns num_return_sequences texts, each its own
    output row (same sid, variant and pivot_text), so with k returns a row yields k outputs of one pivot.
    pivot_text is the first hop's output. Rows come out in input order, returns in order within a row. `role` (the
    chain's ChainCfg.role) is recorded on every row.
    """
    if not translators:
        raise ValueError(f"chain {chain_name!r} has no models")
    row_seeds = [row_seed(seed, "backtranslate", sid, variant) for sid, variant, _ in rows]
    current, pivots = [text for _, _, text in rows], None
    for hop, tr in enumerate(translators):
        last = hop == len(translators) - 1
        out = tr.translate(current, [row_seed(s, "backtranslate-hop", hop) for s in row_seeds], progress,
                           num_return_sequences=None if last else 1)
        if pivots is None:
            pivots = [o[0] for o in out]
        if not last:
            current = [o[0] for o in out]
    model = " > ".join(t.name for t in translators)
    cols = {k: [] for k in SCHEMAS["backtranslations"].names}
    for (sid, variant, _), pivot, hyps in zip(rows, pivots, out):
        for text in hyps:
            for key, val in zip(cols, (sid, chain_name, variant, pivot, text, model, role, None)):
                cols[key].append(val)  # flag: set by the stage (pipeline/degenerate.py)
    return pa.Table.from_pydict(cols, schema=SCHEMAS["backtranslations"])
