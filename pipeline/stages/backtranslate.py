"""Stage `backtranslate`: every sentence through every usable translation chain, there and back (METHODS §3, §6).

Each chain serves a method (`ChainCfg.role`): DebCSE positives read the back-translations of "positives" chains
(the sentence and its noised variants), OssCSE paraphrases those of "paraphrases" chains (the clean sentence only,
unless the chain sets include_variants); "both" serves both. Each output row records its chain's role.

Which chains run, and on which engine and device, is decided once per run, where the flow runs, before any shard
(the `chains` resource, declared with the models in pipeline/models/translate/chains.py): a chain whose models cannot be
loaded either stops the run with the one-line `ModelUnavailable` message, or — when the profile sets
`backtranslate.fallback = true` — is skipped, and `generator_notes` says so plainly (the CLI prints it once, before
any work). Every shard, on any worker, runs the chains of that plan: a model that becomes loadable halfway through a
run does not give a table mixing both. A chain whose model needs a target language it was not given stops the run
whatever `fallback` says: a settings error.
"""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

from contramine.pipeline.config.backtranslation import BacktranslateCfg
from contramine.pipeline.config.base import result_settings
from contramine.pipeline.degenerate import degenerate_flag
from contramine.pipeline.memo.rows import NoMemo, row_key
from contramine.pipeline.engine.spec import Ctx, Memo, stage
from contramine.pipeline.models.translate.chains import CHAINS, chain_table, check_chains, translate_rows
from contramine.pipeline.schema import SCHEMAS

# Settings of `backtranslate` that decide which rows run or what the stage does with an output, never the output
# itself: out of the memo's namespace, so adding a chain or tuning the degenerate rule reuses every translation.
# (A chain's models, languages and engines are in each row's key: `chain_key`.)
NOT_A_TRANSLATION = frozenset({"chains", "fallback", "include_variants", "degenerate_max_ratio",
                               "degenerate_min_ratio", "degenerate_min_words", "target_lang", "source_lang"})
TRANSLATIONS = pa.schema([("pivot", pa.string()), ("texts", pa.list_(pa.string()))])


def translate_memo_facts(cfg, plan: dict) -> dict:
    """What shapes a row's translation besides its chain and the row: the generation settings, the run seed (a
    sampling model draws from it), the device kind and dtype generation runs at, the engines' code and versions."""
    chains = plan.get("chains") or {}
    return {"generation": {k: v for k, v in result_settings(cfg.backtranslate).items() if k not in NOT_A_TRANSLATION},
            "seed": cfg.run.seed, **{k: chains.get(k) for k in ("device", "dtype", "code", "versions")}}


TRANSLATE_MEMO = Memo("translate", translate_memo_facts)


def chain_key(chain, cfg: BacktranslateCfg, chains: dict) -> list:
    """The chain's part of a row's key: each model's files (fingerprint), engine (with its compute type) and
    languages."""
    return [[m, chains["models"].get(m), chains["engines"].get(m), cfg.target_lang.get(m), cfg.source_lang.get(m)]
            for m in chain.models]


def flag_degenerate(table: pa.Table, sources: dict[tuple[int, int], str], cfg: BacktranslateCfg) -> pa.Table:
    """`table` with its `flag` column set: why each output is degenerate against its input text, else null."""
    flags = [degenerate_flag(sources[(sid, variant)], text, cfg.degenerate_max_ratio, cfg.degenerate_min_ratio,
                             cfg.degenerate_min_words)
             for sid, variant, text in zip(table.column("sid").to_pylist(), table.column("variant").to_pylist(),
                                           table.column("text").to_pylist())]
    return table.set_column(table.schema.get_field_index("flag"), "flag", pa.array(flags, pa.string()))


def backtranslate_shard(sentences: pa.Table, variants: pa.Table, cfg, chains: dict, loaded,
                        progress: bool = False, memo=None) -> pa.Table:
    """Every clean sentence (variant 0) through every chain of the run's plan (`chains`: {used: [...]}); the noised
    variants too through the chains that translate them (`include_variants`). `loaded()` gives the loaded chains
    (called only when a row is not in the row `memo`)."""
    memo = memo or NoMemo("backtranslate", "translate")
    clean = list(zip(sentences.column("sid").to_pylist(), [0] * sentences.num_rows,
                     sentences.column("text").to_pylist()))
    noised = list(zip(variants.column("sid").to_pylist(), variants.column("variant").to_pylist(),
                      variants.column("text").to_pylist()))
    sources = {(sid, variant): text for sid, variant, text in clean + noised}
    parts = []
    for chain in cfg.backtranslate.chains:
        rows = clean + [r for r in noised if chain.translates_variant(r[1])]
        if chain.name in chains["used"] and rows:
            prefix = json.dumps(chain_key(chain, cfg.backtranslate, chains), sort_keys=True).encode()

            def compute(missing, rows=rows, chain=chain):
                pivots, outs = translate_rows([rows[i] for i in missing], loaded()[chain.name], cfg.run.seed,
                                              progress)
                return pa.table({"pivot": pa.array(pivots, pa.string()), "texts": pa.array(outs, TRANSLATIONS[1].type)})

            done = memo.rows([row_key(prefix, f"{sid}/{variant}", text) for sid, variant, text in rows], compute,
                             TRANSLATIONS)
            parts.append(chain_table(rows, done.column("pivot").to_pylist(), done.column("texts").to_pylist(),
                                     chain.name, " > ".join(chain.models), chain.role))
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
       resources=(CHAINS,), manifest=chains_manifest, checks=(check_chains,), memos=(TRANSLATE_MEMO,))
def backtranslate(ctx: Ctx) -> dict[str, pa.Table]:
    return {"backtranslations": backtranslate_shard(ctx.shard("sentences"), ctx.shard("variants"), ctx.cfg,
                                                    ctx.plan["chains"], lambda: ctx.resource("chains"),
                                                    ctx.progress, ctx.memo("translate"))}
