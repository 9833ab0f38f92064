"""The settings of the `backtranslate` stage: its chains, generation, engines and degenerate-output rules."""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from contramine.pipeline.config.base import Section


ChainRole = Literal["positives", "paraphrases", "both"]


def chain_name(models: list[str]) -> str:
    """Short stable chain name: the last path component of each model, e.g. 'opus-mt-en-zh>opus-mt-zh-en'."""
    return ">".join(Path(n.rstrip("/")).name or n for n in models)


class ChainCfg(Section):
    """One back-translation chain: models applied in turn, and which method its outputs serve.

    role = "positives": DebCSE positive candidates (METHODS §3), translating the sentence and its noised variants;
    role = "paraphrases": OssCSE paraphrase candidates (§6), translating the clean sentence only;
    role = "both": either use. `include_variants` (default: true for positives/both, false for paraphrases) says
    whether the noised variants are translated too (5x the work with 4 variants); a number N translates variants
    1..N only (the default profile: 1, to keep an offline `make mine` within minutes)."""
    models: list[str] = Field(min_length=1)
    role: ChainRole = "both"
    include_variants: bool | int | None = None

    @field_validator("include_variants")
    @classmethod
    def _variants(cls, value):
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            raise ValueError(f"include_variants must be true, false or a number of variants >= 0, not {value}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _from_list(cls, value):
        return {"models": value} if isinstance(value, list) else value  # [["a", "b"]]: the short form

    @property
    def translates_variants(self) -> bool:
        return bool(self.include_variants) if self.include_variants is not None else self.role != "paraphrases"

    def translates_variant(self, variant: int) -> bool:
        """Whether noised variant `variant` (1, 2, ...) goes through this chain."""
        v = self.include_variants
        if v is None or isinstance(v, bool):
            return self.translates_variants
        return variant <= v

    @property
    def name(self) -> str:
        return chain_name(self.models)

    def serves(self, role: str) -> bool:
        return self.role in (role, "both")


def bergamot_greedy_problem(cfg: "BacktranslateCfg", name: str) -> str | None:
    """Why these generation settings cannot run on Bergamot model `name`, else None: its engine decodes greedily,
    one output per sentence."""
    asked = [s for s, on in (("do_sample = true", cfg.do_sample), (f"num_beams = {cfg.num_beams}", cfg.num_beams > 1),
                             (f"num_return_sequences = {cfg.num_return_sequences}", cfg.num_return_sequences > 1))
             if on]
    if not asked:
        return None
    return (f"backtranslate: {', '.join(asked)} with Bergamot model {name!r}: the Bergamot engine decodes greedily, "
            f"one output per sentence; remove those settings or use a Hugging Face model for that chain")


class BacktranslateCfg(Section):
    # Each chain: {models = [...], role = "positives" | "paraphrases" | "both", include_variants = bool}; the short
    # form ["model-a", "model-b"] is a chain with role "both".
    chains: list[ChainCfg] = []
    fallback: bool = False  # when a model cannot be loaded: skip that chain (said once, loudly) instead of failing
    include_variants: bool | None = Field(None, description="deprecated: set include_variants per chain; when "
                                                            "set, it applies to every chain that does not set its own")
    num_beams: int = Field(1, ge=1)
    do_sample: bool = False
    num_return_sequences: int = Field(1, ge=1)
    max_new_tokens_factor: float = Field(2.0, gt=0.0)
    max_new_tokens_min: int = Field(16, ge=1)
    max_length: int = Field(256, ge=8)
    device: str = "auto"
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    # Language codes: model id -> target language. Multi-target Marian models (opus-mt-en-zh: >>cmn_Hans<<, ...)
    # take a >>code<< token, M2M100 / NLLB a language code; a model that needs one and has none stops the run.
    target_lang: dict[str, str] = {}
    source_lang: dict[str, str] = {}
    # Which library generates (pipeline/models/translate/engines/ct2.py): "hf" (transformers generate), "ctranslate2" (every model
    # converted on first use; refused for architectures its converter lacks, e.g. FSMT/wmt19), or "auto"
    # (CTranslate2 where the model converts — Marian/opus-mt, M2M100, NLLB — and HF otherwise).
    engine: Literal["hf", "ctranslate2", "auto"] = "hf"
    # CTranslate2's weights and arithmetic: "auto" = int8 on CPU, float16 on a GPU.
    compute_type: Literal["auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "float16", "bfloat16",
                          "float32"] = "auto"
    # Rows per batch where batches are not sized by tokens: batch_tokens = 0 (or "auto" on CTranslate2 on a CPU).
    batch_size: int = Field(32, ge=1)
    # Batches sized by tokens (rows sorted longest first; a row's output does not depend on its batch). A batch takes
    # inputs while, on HF generate, its decoder rows (inputs x num_beams, or x num_return_sequences when sampling)
    # times its longest input plus that input's length cap (the tokens its caches hold at the end) stay within this
    # budget; on CTranslate2, its padded source tokens (CTranslate2's batch_type = "tokens"). 0 = batch_size rows.
    # "auto" = sized for the device: on a GPU 262,144 on HF (~2,700 rows of 32-token inputs) and 65,536 on
    # CTranslate2; on a CPU 8,192 on HF (~85 such rows: what measured best there, docs/backtranslation.md) and
    # batch_size rows on CTranslate2.
    batch_tokens: int | Literal["auto"] = "auto"
    # Who runs the HF engine's decoding: "loop" = our own loop (pipeline/models/translate/decode/loop.py: encoder and
    # cross-attention once per batch, preallocated caches, next token chosen on the device, finished rows dropped,
    # the device read every few steps), for Marian and FSMT models; "generate" = transformers' generate. Models the
    # loop does not know (M2M100, NLLB, ...) and kv_cache = "static" / compile = true use generate (the log says
    # so). An execution setting: on a CPU the loop's tokens equal generate's (tests/test_decode_loop.py); on a GPU,
    # whose kernels promise no such thing, the chains' plan records it (another decoder there recomputes).
    decoder: Literal["loop", "generate"] = "loop"
    # HF generate's key/value cache: "static" preallocates it once per batch for max_length + 2 tokens (one length
    # for every batch, so a row's output still does not depend on its batch; the shape torch.compile needs);
    # models without static-cache support (FSMT, the wmt19 models) keep "dynamic". A static cache is generate's: the
    # decode loop keeps its own caches. "auto" = "dynamic" on every device, so the loop decodes (a CPU measured
    # static at 0.77-0.86x). On an H200 static measured fastest (86.6k target tokens/s at the 1M path's batches
    # against 18.2k for the loop, 2026-11-28), but there the loop paid a cuDNN attention plan every decoding step,
    # ~49 ms each, which mining no longer uses (pipeline/models/attention_kernels.py): BENCHMARKS.md.
    kv_cache: Literal["auto", "dynamic", "static"] = "auto"
    # torch.compile HF generate's decoding step (needs kv_cache = "static"; on a GPU with CUDA graphs, as transformers
    # does). Compiles for each new batch shape; on a CPU it measured no faster. Not yet measured on a GPU.
    compile: bool = False
    # Bergamot models (pipeline/models/translate/engines/bergamot.py): Python threads sharing one loaded direction. An execution
    # setting: a row's text does not depend on it, so it is left out of the cache key.
    threads: int = Field(2, ge=1)
    # Degenerate outputs (pipeline/degenerate.py): a back-translation whose word count is above max_ratio x (or below
    # min_ratio x) its input's, with at least min_words words in the longer of the two, or that repeats itself where
    # its input does not, keeps its row with `flag` saying why, and is neither a positive nor a paraphrase.
    degenerate_max_ratio: float = Field(1.5, gt=1.0)
    degenerate_min_ratio: float = Field(0.5, gt=0.0, lt=1.0)
    degenerate_min_words: int = Field(6, ge=1)

    # how fast, not what (never in a key): a row's output does not depend on its batch (tests/test_backtranslate.py,
    # tests/test_translate_device.py, tests/test_ct2.py: each row alone equals the batch) nor on the threads sharing
    # a Bergamot direction
    EXECUTION: ClassVar[frozenset[str]] = frozenset({"threads", "batch_size", "batch_tokens", "decoder"})
    # the chains' plan records each model's engine (with its compute type) and, where an engine runs on torch, the
    # device kind and dtype, and HF generate's cache and compilation where they are not the plain dynamic cache
    # (pipeline/models/translate/chains.py): Bergamot always runs on the CPU, whatever these say
    RESOLVED: ClassVar[frozenset[str]] = frozenset({"device", "dtype", "compute_type", "engine", "kv_cache", "compile"})

    @model_validator(mode="after")
    def _bergamot_greedy(self):
        for chain in self.chains:
            for name in chain.models:
                problem = bergamot_greedy_problem(self, name) if name.startswith("bergamot:") else None
                if problem:
                    raise ValueError(problem.removeprefix("backtranslate: "))  # the loader names the section
        return self

    @model_validator(mode="after")
    def _generation(self):
        """Generation settings that contradict each other, whatever the model: refused when the config is read,
        not when a stage loads its first model. (After `_bergamot_greedy`: a Bergamot chain's refusal names more.)"""
        if self.do_sample and self.num_beams > 1:
            raise ValueError(f"do_sample = true with num_beams = {self.num_beams}: sampling draws one token at a "
                             f"time and keeps no beams; set num_beams = 1 to sample, or do_sample = false for beam "
                             f"search")
        if not self.do_sample and self.num_return_sequences > self.num_beams:
            raise ValueError(f"num_return_sequences = {self.num_return_sequences} > num_beams = {self.num_beams} "
                             f"without do_sample: beam search returns at most num_beams different outputs (the rest "
                             f"would be copies); raise num_beams, or set do_sample = true")
        return self

    @model_validator(mode="after")
    def _engine_settings(self):
        if self.engine == "hf" and self.compute_type != "auto":
            raise ValueError("backtranslate.compute_type is a CTranslate2 setting and engine = 'hf': set "
                             "backtranslate.engine = 'ctranslate2' or 'auto' (the HF engine's is `dtype`)")
        if self.compile and self.kv_cache != "static":
            raise ValueError("backtranslate.compile = true needs backtranslate.kv_cache = 'static' (transformers "
                             "compiles the decoding step of a static cache only)")
        if isinstance(self.batch_tokens, int) and self.batch_tokens < 0:
            raise ValueError(f"backtranslate.batch_tokens must be 'auto', 0 (batch_size rows) or a positive number "
                             f"of tokens, not {self.batch_tokens}")
        if self.engine == "ctranslate2" and self.do_sample:
            raise ValueError("backtranslate.do_sample with engine = 'ctranslate2': its sampler draws from per-thread "
                             "generators that per-row seeds cannot reach, so rows would not be reproducible; use "
                             "engine = 'hf' (or 'auto', which samples with HF) for sampling")
        return self

    @model_validator(mode="after")
    def _global_variants(self):
        if self.include_variants is not None:
            for chain in self.chains:
                if chain.include_variants is None:
                    chain.include_variants = self.include_variants
        return self

    def chains_for(self, role: str) -> list[ChainCfg]:
        return [c for c in self.chains if c.serves(role)]
