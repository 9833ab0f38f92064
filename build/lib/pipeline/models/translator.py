"""Translation with any Hugging Face seq2seq model (METHODS §3 and §6), for the `backtranslate` stage.

    tr = load_engine(name, path, cfg, device="cpu", dtype="float32")   # chains.py loads it as the run's plan says
    tr.translate(texts, seeds)

Outputs never depend on how rows are batched: batches are sorted by length and restored to input order, each row
gets its own length limit (forced eos), and sampling draws its noise from a per-row generator, so the same row
gives the same text alone, in a batch of 3 or of 64, on any shard or worker.

Sampling (do_sample) is plain ancestral sampling at temperature 1 from the model's (processed) scores; the model's
own temperature / top-k / top-p settings are not applied. Each hop's length cap is
min(max_length, max(max_new_tokens_min, ceil(max_new_tokens_factor x input tokens))) for that row.
"""
from __future__ import annotations

import copy

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList

from pipeline.config.backtranslation import BacktranslateCfg, chain_name
from pipeline.seeding import row_seed

from pipeline.models.translation import language_settings, row_limit


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


def load_engine(name: str, path: str, cfg: BacktranslateCfg, device: str, dtype: str) -> Translator:
    """The HF generate engine for model `name` (resolved to `path`) on `device` in `dtype`, as the run's plan says
    (pipeline/models/chains.py decides; nothing is decided here)."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSeq2SeqLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
    return Translator(name, tokenizer, model, cfg, device)
