"""Glue between the stages and the text generators (back-translation models, the spaCy negator).

Model availability is decided once per process: a chain whose models cannot be loaded either stops the run with
the one-line `ModelUnavailable` message, or — when the profile sets `backtranslate.fallback = true` — is
skipped, and `generator_notes` says so plainly (the flows print it once, before any work). A chain whose model
needs a target language it was not given stops the run whatever `fallback` says: that is a settings error.

Each chain serves a method (`ChainCfg.role`): DebCSE positives read the back-translations of "positives" chains,
OssCSE paraphrases those of "paraphrases" chains ("both" serves both).
"""
from __future__ import annotations

import functools

import pyarrow as pa

from .config import BacktranslateCfg, ConfigError
from .models import ModelUnavailable, resolve_model
from .schema import SCHEMAS


@functools.cache
def _availability(bt_json: str) -> tuple[tuple[str, ...], tuple[tuple[str, str, str], ...]]:
    from .backtranslate import target_language_problem

    bt = BacktranslateCfg.model_validate_json(bt_json)
    used, skipped = [], []
    for chain in bt.chains:
        problem = None
        for model in chain.models:
            try:
                path = resolve_model(model, "translation model")
            except ModelUnavailable as e:
                problem = (model, str(e))
                break
            language = target_language_problem(model, path, bt)
            if language is not None:
                raise ConfigError(language)
        if problem is None:
            used.append(chain.name)
        elif bt.fallback:
            skipped.append((chain.name, *problem))
        else:
            raise ModelUnavailable(problem[1])
    return tuple(used), tuple(skipped)


def available_chains(cfg) -> tuple[list[str], list[dict]]:
    """(names of chains that will run, [{chain, model, reason}] of skipped ones); raises without fallback."""
    used, skipped = _availability(cfg.backtranslate.model_dump_json())
    return list(used), [{"chain": c, "model": m, "reason": r} for c, m, r in skipped]


def positive_sources(cfg) -> list[str]:
    """Where DebCSE's positive candidates come from in this run (scores.positives, with "auto" resolved)."""
    if cfg.scores.positives != "auto":
        return list(cfg.scores.positives)
    used, _ = available_chains(cfg)
    return ["backtranslation"] if any(c.name in used for c in cfg.backtranslate.chains_for("positives")) else ["noise"]


def generator_notes(cfg) -> list[str]:
    """What the generators can and cannot do in this run, in plain words (printed once per run)."""
    used, skipped = available_chains(cfg)
    notes = [f"backtranslate: cannot load {s['model']} (not available here) → chain {s['chain']} skipped"
             for s in skipped]
    chains = cfg.backtranslate.chains
    pos_chains = [c.name for c in cfg.backtranslate.chains_for("positives") if c.name in used]
    para_chains = [c.name for c in cfg.backtranslate.chains_for("paraphrases") if c.name in used]
    if not chains or skipped:
        sources = positive_sources(cfg)
        pos = {"noise": "the noise variants (a stand-in for back-translations)",
               "backtranslation": "back-translations by " + (", ".join(pos_chains) or "no chain: none")}
        what = "no back-translation chain is configured" if not chains else \
            ("no back-translation chain could be loaded" if not used else f"only {', '.join(used)} will run")
        notes.append(f"{what}: DebCSE positive candidates come from {' and '.join(pos[s] for s in sources)}"
                     + ("" if para_chains else "; OssCSE triplets get no paraphrase (negations only)"))
    return notes


@functools.lru_cache(maxsize=4)
def _load_chain(names: tuple[str, ...], cfg_json: str):
    from .backtranslate import load_chain

    return load_chain(list(names), BacktranslateCfg.model_validate_json(cfg_json))


def backtranslate_shard(sentences: pa.Table, variants: pa.Table, cfg, progress: bool = False) -> pa.Table:
    """Every clean sentence (variant 0) through every usable chain; the noised variants too through the chains
    that translate them (`include_variants`). Each output row records its chain's role."""
    from .backtranslate import backtranslate

    used, _ = available_chains(cfg)
    clean = list(zip(sentences.column("sid").to_pylist(), [0] * sentences.num_rows,
                     sentences.column("text").to_pylist()))
    noised = list(zip(variants.column("sid").to_pylist(), variants.column("variant").to_pylist(),
                      variants.column("text").to_pylist()))
    parts = []
    for chain in cfg.backtranslate.chains:
        rows = clean + (noised if chain.translates_variants else [])
        if chain.name in used and rows:
            translators = _load_chain(tuple(chain.models), cfg.backtranslate.model_dump_json())
            parts.append(backtranslate(rows, chain.name, translators, seed=cfg.run.seed, progress=progress,
                                       role=chain.role))
    if not parts:
        return SCHEMAS["backtranslations"].empty_table()
    return pa.concat_tables(parts).sort_by([("sid", "ascending"), ("chain", "ascending"), ("variant", "ascending")])


def rows_serving(backtranslations: pa.Table, role: str) -> pa.Table:
    """The back-translations whose chain serves `role` ("positives" or "paraphrases")."""
    import pyarrow.compute as pc

    if not backtranslations.num_rows:
        return backtranslations
    return backtranslations.filter(pc.is_in(backtranslations.column("role"), pa.array([role, "both"])))


@functools.lru_cache(maxsize=1)
def _nlp(model: str):
    from .negate import load_nlp

    return load_nlp(model)


def negate_shard(sentences: pa.Table, cfg) -> pa.Table:
    from .negate import negate_table

    c = cfg.negate
    return negate_table(sentences, _nlp(c.model), c.batch_size, c.n_process)

