"""Glue between the stages and the text generators (back-translation models, the spaCy negator).

Model availability is decided once per process: a chain whose models cannot be loaded either stops the run with
the one-line `ModelUnavailable` message, or — when the profile sets `backtranslate.fallback = true` — is
skipped, and `generator_notes` says so plainly (the flows print it once, before any work).
"""
from __future__ import annotations

import functools
import json

import pyarrow as pa

from .models import ModelUnavailable, resolve_model
from .schema import SCHEMAS


@functools.cache
def _availability(chains_json: str, fallback: bool) -> tuple[tuple[str, ...], tuple[tuple[str, str, str], ...]]:
    from .backtranslate import chain_name

    used, skipped = [], []
    for names in json.loads(chains_json):
        problem = None
        for model in names:
            try:
                resolve_model(model, "translation model")
            except ModelUnavailable as e:
                problem = (model, str(e))
                break
        if problem is None:
            used.append(chain_name(names))
        elif fallback:
            skipped.append((chain_name(names), *problem))
        else:
            raise ModelUnavailable(problem[1])
    return tuple(used), tuple(skipped)


def available_chains(cfg) -> tuple[list[str], list[dict]]:
    """(names of chains that will run, [{chain, model, reason}] of skipped ones); raises without fallback."""
    used, skipped = _availability(json.dumps(cfg.backtranslate.chains), cfg.backtranslate.fallback)
    return list(used), [{"chain": c, "model": m, "reason": r} for c, m, r in skipped]


def generator_notes(cfg) -> list[str]:
    """What the generators can and cannot do in this run, in plain words (printed once per run)."""
    used, skipped = available_chains(cfg)
    notes = []
    for s in skipped:
        notes.append(f"backtranslate: cannot load {s['model']} (not available here) → chain {s['chain']} skipped")
    if skipped or not cfg.backtranslate.chains:
        what = "no back-translation chain is configured" if not cfg.backtranslate.chains else \
            ("no back-translation chain could be loaded" if not used else f"only {', '.join(used)} will run")
        pos = "the noise variants" if "noise" in cfg.scores.positives else "nothing (scores.positives has no 'noise')"
        notes.append(f"{what}: DebCSE positive candidates come from {pos}"
                     + ("" if used else "; OssCSE triplets get no paraphrase (negations only)"))
    return notes


@functools.lru_cache(maxsize=4)
def _load_chain(names: tuple[str, ...], cfg_json: str):
    from .backtranslate import load_chain
    from .config import BacktranslateCfg

    return load_chain(list(names), BacktranslateCfg.model_validate_json(cfg_json))



def backtranslate_shard(sentences: pa.Table, variants: pa.Table, cfg, progress: bool = False) -> pa.Table:
    """Every clean sentence (variant 0) and, when configured, its noised variants through every usable chain."""
    from .backtranslate import backtranslate, chain_name

    used, _ = available_chains(cfg)
    rows = list(zip(sentences.column("sid").to_pylist(), [0] * sentences.num_rows,
                    sentences.column("text").to_pylist()))
    if cfg.backtranslate.include_variants:
        rows += list(zip(variants.column("sid").to_pylist(), variants.column("variant").to_pylist(),
                         variants.column("text").to_pylist()))
    parts = []
    for names in cfg.backtranslate.chains:
        if chain_name(names) in used and rows:
            translators = _load_chain(tuple(names), cfg.backtranslate.model_dump_json())
            parts.append(backtranslate(rows, chain_name(names), translators, seed=cfg.run.seed, progress=progress))
    if not parts:
        return SCHEMAS["backtranslations"].empty_table()
    return pa.concat_tables(parts).sort_by([("sid", "ascending"), ("chain", "ascending"), ("variant", "ascending")])


@functools.lru_cache(maxsize=1)
def _nlp(model: str):
    from .negate import load_nlp

    return load_nlp(model)


def negate_shard(sentences: pa.Table, cfg) -> pa.Table:
    from .negate import negate_table

    c = cfg.negate
    return negate_table(sentences, _nlp(c.model), c.batch_size, c.n_process)
