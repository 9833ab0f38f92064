"""The stage graph and the shard runner (no Prefect here: flows/ wraps these functions in tasks and flows).

A stage reads whole tables or the same-numbered shard of per-sentence tables and writes shards of its output
tables. `run_shard` computes a shard's cache key from everything it depends on — the content hashes of the
input shards it reads, the config sections it reads, the run seed and the source of the modules that compute
it — and skips the work when an intact shard with that key is already on disk.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import embeddings as emb_mod
from . import ipw, neighbours, noise, pairs, paraphrases, scores, sentences
from .config import Config
from .store import ShardInfo, Store, atomic_write_json, combine, file_hash

FORMAT = "contramine-1"


@dataclass(frozen=True)
class Stage:
    name: str
    outputs: tuple[str, ...]
    shard_inputs: tuple[str, ...] = ()  # shard i of these tables
    whole_inputs: tuple[str, ...] = ()  # every shard of these tables
    sections: tuple[str, ...] = ()      # config sections that change the result
    modules: tuple[str, ...] = ()       # modules whose source is the stage's code version
    global_job: bool = False            # one job writes every shard (sentences)


@dataclass
class Ctx:
    """What a shard computation sees: the config, its shard index, and readers for its inputs."""
    cfg: Config
    store: Store
    i: int
    n: int

    def shard(self, table: str) -> pa.Table:
        return self.store.read_shard(table, self.i, self.n)

    def whole(self, table: str) -> pa.Table:
        return self.store.read(table, self.n)


STAGES: dict[str, Stage] = {s.name: s for s in [
    Stage("sentences", ("sentences", "rejected"), sections=("sentences",), modules=("sentences",), global_job=True),
    Stage("embeddings", ("embeddings",), ("sentences",), sections=("encoder",), modules=("embeddings", "encoder")),
    Stage("neighbours", ("neighbours",), ("embeddings",), ("embeddings",), ("neighbours",), ("neighbours",)),
    Stage("noise", ("variants",), ("sentences",), ("sentences",), ("noise",), ("noise",)),
    Stage("backtranslate", ("backtranslations",), ("sentences", "variants"), (), ("backtranslate",),
          ("backtranslate", "generators")),
    Stage("negate", ("negations",), ("sentences",), (), ("negate",), ("negate", "generators")),
    Stage("scores", ("scores",), ("sentences", "embeddings", "neighbours", "variants", "backtranslations"),
          ("sentences",), ("scores", "encoder"), ("scores", "textdist", "encoder")),
    Stage("ipw", ("candidates",), ("scores",), (), ("ipw",), ("ipw",)),
    Stage("pairs", ("pairs",), ("sentences", "candidates"), (), (), ("pairs",)),
    Stage("paraphrases", ("paraphrases",), ("sentences", "backtranslations"), (), ("paraphrases",),
          ("paraphrases", "textdist")),
    Stage("triplets", ("triplets",), ("sentences", "paraphrases", "negations"), (), (), ("paraphrases",)),
]}
ORDER = list(STAGES)


def stage_names() -> list[str]:
    return ORDER


PIPELINE = Path(__file__).resolve().parent


def imported_modules(source: str) -> set[str]:
    """The pipeline modules a source file imports, anywhere in it (function-level imports too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".") if node.level == 0 else ["pipeline", *(node.module or "").split(".")]
            parts = [p for p in parts if p]
            if parts[:1] != ["pipeline"]:
                continue
            out.update([parts[1]] if len(parts) > 1 else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("pipeline."))
    return out


def module_closure(roots: tuple[str, ...], root: Path = PIPELINE) -> list[str]:
    """`roots` and every pipeline module they import, transitively (sorted): what a stage's result depends on."""
    seen, todo = set(), list(roots)
    while todo:
        m = todo.pop()
        if m in seen or not (root / f"{m}.py").is_file():
            continue
        seen.add(m)
        todo += sorted(imported_modules((root / f"{m}.py").read_text()) - seen)
    return sorted(seen)


@functools.cache
def code_version(*modules: str, root: Path = PIPELINE) -> str:
    """Hash of the source of the stage's modules and of every pipeline module they import (derived, never listed by
    hand), plus this file (the adapters): editing any code a stage runs invalidates its shards."""
    h = hashlib.blake2b(FORMAT.encode(), digest_size=16)
    for m in module_closure(modules, root):
        h.update(m.encode() + b"\0" + (root / f"{m}.py").read_bytes())
    h.update((root / "stages.py").read_bytes())  # not its imports: it imports every stage
    return h.hexdigest()


def _versions(*packages: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    def v(p: str) -> str:
        try:
            return version(p)
        except PackageNotFoundError:
            return "-"
    return ",".join(f"{p}={v(p)}" for p in packages)


def encoder_facts(cfg: Config) -> str:
    """What decides the encoder's numbers besides its settings: its files, the device and precision it runs at."""
    from .encoder import resolve_precision
    from .models import model_fingerprint, pick_device, resolve_model

    device = pick_device(cfg.encoder.device)
    return (f"model={model_fingerprint(resolve_model(cfg.encoder.model, 'encoder'))};device={device.split(':')[0]};"
            f"precision={resolve_precision(cfg.encoder.precision, device)};{_versions('torch', 'transformers')}")


def extra_key(stage: Stage, cfg: Config) -> str:
    """Facts outside the config that change a stage's result: input files, resolved models, device and precision,
    library versions."""
    if stage.name == "sentences":
        return "corpus:" + file_hash(Path(cfg.data.corpus))
    if stage.name == "embeddings":
        return encoder_facts(cfg)
    if stage.name == "scores":
        from .generators import positive_sources
        return f"{encoder_facts(cfg)};positives={','.join(positive_sources(cfg))};{_versions('rapidfuzz')}"
    if stage.name == "neighbours":
        return _versions("faiss-cpu", "faiss-gpu")
    if stage.name == "backtranslate":
        from .backtranslate import generation_facts
        from .generators import available_chains
        return "chains:" + json.dumps(available_chains(cfg)[0]) + ";" + generation_facts(cfg)
    if stage.name == "negate":
        from .negate import pipeline_version
        return f"spacy-model={pipeline_version(cfg.negate.model)};{_versions('spacy')}"
    if stage.name == "paraphrases":
        return _versions("rapidfuzz")
    return ""


def shard_key(stage: Stage, cfg: Config, store: Store, i: int, n: int, extra: str = "") -> str:
    inputs = [f"{t}[{i}]={store.shard_hash(t, i, n)}" for t in stage.shard_inputs]
    inputs += [f"{t}[*]={store.table_hash(t, n)}" for t in stage.whole_inputs]
    return combine(stage.name, code_version(*stage.modules), cfg.section_hash(*stage.sections),
                   f"seed={cfg.run.seed}", f"shards={n}", extra, *inputs)


def run_shard(name: str, cfg: Config, i: int, force: bool = False, progress: bool = False) -> dict:
    """Compute (or reuse) shard i of a stage's outputs. Returns a small JSON-able summary."""
    stage, store, n = STAGES[name], Store(cfg.run.dir), cfg.run.shards
    key = shard_key(stage, cfg, store, i, n, extra_key(stage, cfg))
    cached = [store.cached_shard(t, i, n, key) for t in stage.outputs]
    if not force and all(cached):
        return {"stage": name, "shard": i, "cached": True, "rows": {c.table: c.rows for c in cached}, "seconds": 0.0}
    t0 = time.perf_counter()
    tables = COMPUTE[name](Ctx(cfg, store, i, n), progress)
    seconds = time.perf_counter() - t0
    infos: list[ShardInfo] = [store.write_shard(t, i, n, tables[t], key, seconds) for t in stage.outputs]
    return {"stage": name, "shard": i, "cached": False, "rows": {x.table: x.rows for x in infos}, "seconds": seconds}


def run_global(name: str, cfg: Config, force: bool = False, progress: bool = False) -> list[dict]:
    """A stage whose one job writes every shard (sentences: reading the corpus is one sequential pass)."""
    stage, store, n = STAGES[name], Store(cfg.run.dir), cfg.run.shards
    key = shard_key(stage, cfg, store, 0, n, extra_key(stage, cfg))
    cached = [store.cached_shard(t, i, n, key) for t in stage.outputs for i in range(n)]
    if not force and all(cached):
        return [{"stage": name, "shard": c.index, "table": c.table, "cached": True, "rows": c.rows} for c in cached]
    t0 = time.perf_counter()
    tables = COMPUTE[name](Ctx(cfg, store, 0, n), progress)
    seconds = time.perf_counter() - t0
    out = []
    for t, parts in tables.items():
        for i, part in enumerate(parts):
            info = store.write_shard(t, i, n, part, key, seconds / n)
            out.append({"stage": name, "shard": i, "table": t, "cached": False, "rows": info.rows})
    return out


def finish_stage(name: str, cfg: Config, results: list[dict], wall: float) -> dict:
    """Write each output table's manifest: config, inputs, rows, seconds. Returns the manifest."""
    stage, store, n = STAGES[name], Store(cfg.run.dir), cfg.run.shards
    manifest = {
        "stage": name, "config": {s: getattr(cfg, s).model_dump(mode="json") for s in stage.sections},
        "config_hash": cfg.section_hash(*stage.sections), "seed": cfg.run.seed, "code": code_version(*stage.modules),
        "inputs": {t: store.table_hash(t, n) for t in (*stage.shard_inputs, *stage.whole_inputs)},
        "rows": {t: sum(store.cached_rows(t, i, n) for i in range(n)) for t in stage.outputs},
        "seconds": round(sum(store.shard_seconds(stage.outputs[0], i, n) for i in range(n)), 3),
        "wall_seconds_last_run": round(wall, 3),
        "shards_computed": len({r["shard"] for r in results if not r["cached"]}),
        "shards_cached": len({r["shard"] for r in results if r["cached"]}),
        "extra": extra_key(stage, cfg),
    }
    if name == "sentences":
        manifest["corpus"] = str(cfg.data.corpus)
        manifest["corpus_lines"] = manifest["rows"]["sentences"] + manifest["rows"]["rejected"]
    if name == "backtranslate":
        from .generators import available_chains
        manifest["chains_used"], manifest["chains_skipped"] = available_chains(cfg)
    if name == "neighbours":  # per-shard facts files: written where the shard ran (a Dask worker, too)
        for i in range(n):
            if (facts := _facts_path(store, i, n)).is_file():
                manifest.update(json.loads(facts.read_text()))
    for t in stage.outputs:
        store.finish(t, n, manifest)
    return manifest


# ---- the computations: thin adapters from stored shards to the pure functions ----

def _sentences(ctx: Ctx, progress: bool) -> dict[str, list[pa.Table]]:
    c = ctx.cfg.sentences
    kept, rejected = sentences.split_sentences(Path(ctx.cfg.data.corpus), c.min_words, c.max_words, c.max_chars)
    split = lambda t: [t.slice(a, b - a) for a, b in sentences.shard_bounds(t.num_rows, ctx.n)]  # noqa: E731
    return {"sentences": split(kept), "rejected": split(rejected)}


def _embeddings(ctx: Ctx, progress: bool) -> dict[str, pa.Table]:
    enc = emb_mod.encoder_from(ctx.cfg)
    return {"embeddings": emb_mod.embed_sentences(ctx.shard("sentences"), enc, ctx.cfg.encoder.batch_size,
                                                  progress=progress and f"embeddings {ctx.i + 1}/{ctx.n}")}


def _facts_path(store: Store, i: int, n: int) -> Path:
    """Index kind and sampled recall of neighbours shard i, beside the shard (kept when the shard is reused)."""
    return store.dir("neighbours") / f"facts-{i:05d}-of-{n:05d}.json"


@functools.lru_cache(maxsize=1)
def _index_for(run_dir: str, n: int, table_hash: str, settings: str, seed: int):
    cfg = Config.model_validate({"neighbours": json.loads(settings)}).neighbours
    base_sids, base = emb_mod.table_vectors(Store(Path(run_dir)).read("embeddings", n))
    kind = neighbours.choose_index(len(base_sids), cfg)
    index, cpu_index = neighbours.build_index(base, kind, cfg, seed) if len(base_sids) else (None, None)
    return base_sids, base, kind, index, cpu_index


def _neighbours(ctx: Ctx, progress: bool) -> dict[str, pa.Table]:
    c = ctx.cfg.neighbours
    base_sids, base, kind, index, cpu_index = _index_for(
        str(ctx.store.root), ctx.n, ctx.store.table_hash("embeddings", ctx.n), c.model_dump_json(), ctx.cfg.run.seed)
    q_sids, q = emb_mod.table_vectors(ctx.shard("embeddings"))
    exact = kind == "flat"
    table = neighbours.band_neighbours(q, q_sids, base, base_sids, index, cpu_index, c.lo, c.hi, c.pool_size,
                                       c.slack, c.max_block_elems, progress=progress)
    facts = {"index": kind, "exact": exact}
    if not exact and c.recall_sample and len(q_sids):
        pick = np.random.default_rng(ctx.cfg.run.seed).choice(len(q_sids), min(len(q_sids), c.recall_sample), False)
        ref = neighbours.exact_band_neighbours(q[pick], q_sids[pick], base, base_sids, c.lo, c.hi, c.pool_size)
        sub = table.filter(pc.is_in(table.column("sid"), pa.array(q_sids[pick])))
        facts[f"recall_shard_{ctx.i}"] = neighbours.recall_at_pool(sub, ref)
    atomic_write_json(_facts_path(ctx.store, ctx.i, ctx.n), facts)
    return {"neighbours": table}


@functools.lru_cache(maxsize=1)
def _vocab(run_dir: str, n: int, table_hash: str, top: int) -> tuple[str, ...]:
    texts = Store(Path(run_dir)).read("sentences", n).column("text").to_pylist()
    return tuple(noise.frequent_words(texts, top))


def _noise(ctx: Ctx, progress: bool) -> dict[str, pa.Table]:
    vocab = _vocab(str(ctx.store.root), ctx.n, ctx.store.table_hash("sentences", ctx.n), ctx.cfg.noise.top_words)
    return {"variants": noise.noise_sentences(ctx.shard("sentences"), list(vocab), ctx.cfg.noise, ctx.cfg.run.seed)}


def _backtranslate(ctx: Ctx, progress: bool) -> dict[str, pa.Table]:
    from .generators import backtranslate_shard
    return {"backtranslations": backtranslate_shard(ctx.shard("sentences"), ctx.shard("variants"), ctx.cfg, progress)}


def _negate(ctx: Ctx, progress: bool) -> dict[str, pa.Table]:
    from .generators import negate_shard
    return {"negations": negate_shard(ctx.shard("sentences"), ctx.cfg)}


def _scores(ctx: Ctx, progress: bool) -> dict[str, pa.Table]:
    enc = emb_mod.encoder_from(ctx.cfg)
    encode = lambda texts: enc.encode(texts, batch_size=ctx.cfg.encoder.batch_size,  # noqa: E731
                                      progress=progress and f"positives {ctx.i + 1}/{ctx.n}")
    from .generators import positive_sources
    return {"scores": scores.score_pools(ctx.shard("sentences"), ctx.shard("embeddings"), ctx.shard("neighbours"),
                                         ctx.whole("sentences"), ctx.shard("variants"),
                                         ctx.shard("backtranslations"), encode, ctx.cfg, positive_sources(ctx.cfg))}


def _ipw(ctx: Ctx, progress: bool) -> dict[str, pa.Table]:
    return {"candidates": ipw.ipw_table(ctx.shard("scores"), ctx.cfg.ipw, ctx.cfg.run.seed)}


def _pairs(ctx: Ctx, progress: bool) -> dict[str, pa.Table]:
    return {"pairs": pairs.build_pairs(ctx.shard("sentences"), ctx.shard("candidates"))}


def _paraphrases(ctx: Ctx, progress: bool) -> dict[str, pa.Table]:
    c = ctx.cfg.paraphrases
    return {"paraphrases": paraphrases.pick_paraphrases(ctx.shard("sentences"), ctx.shard("backtranslations"),
                                                        c.mer_lo, c.mer_hi)}


def _triplets(ctx: Ctx, progress: bool) -> dict[str, pa.Table]:
    return {"triplets": paraphrases.build_triplets(ctx.shard("sentences"), ctx.shard("paraphrases"),
                                                   ctx.shard("negations"))}


COMPUTE: dict[str, Callable] = {
    "sentences": _sentences, "embeddings": _embeddings, "neighbours": _neighbours, "noise": _noise,
    "backtranslate": _backtranslate, "negate": _negate, "scores": _scores, "ipw": _ipw, "pairs": _pairs,
    "paraphrases": _paraphrases, "triplets": _triplets,
}
