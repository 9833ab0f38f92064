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

import hashlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from contramine.pipeline.config.backtranslation import BacktranslateCfg
from contramine.pipeline.config.base import result_settings
from contramine.pipeline.degenerate import degenerate_flags
from contramine.pipeline.memo.rows import NoMemo
from contramine.pipeline.engine.spec import Ctx, Memo, stage
from contramine.pipeline.models.translate.chains import CHAINS, check_chains, translate_rows
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


def row_suffixes(sid: pa.Array, variant: pa.Array, text: pa.Array) -> list[bytes]:
    """What `row_key(prefix, f"{sid}/{variant}", text)` hashes after the prefix, per row (the same for every chain):
    each part tagged and length-prefixed as row_key does, joined by Arrow."""
    def lengths(column: pa.Array) -> pa.Array:  # each value's byte length, 8 bytes little-endian
        n = pc.binary_length(column).to_numpy(zero_copy_only=False).astype("<i8")
        return pa.FixedSizeBinaryArray.from_buffers(pa.binary(8), len(n), [None, pa.py_buffer(n.tobytes())]).cast(
            pa.binary())

    name = pc.binary_join_element_wise(sid.cast(pa.string()), variant.cast(pa.string()), "/").cast(pa.binary())
    data, tag = text.cast(pa.binary()), pa.scalar(b"s")
    return pc.binary_join_element_wise(tag, lengths(name), name, tag, lengths(data), data, pa.scalar(b"")).to_pylist()


def row_keys(prefix: bytes, suffixes: list[bytes]) -> list[bytes]:
    """`row_key(prefix, f"{sid}/{variant}", text)` of each row from its `row_suffixes` (tests/test_degenerate_flags.py
    checks they are equal): the prefix hashed once, its state copied per row."""
    head = hashlib.blake2b(digest_size=16)
    head.update(b"b" + len(prefix).to_bytes(8, "little") + prefix)
    keys = []
    for suffix in suffixes:
        h = head.copy()
        h.update(suffix)
        keys.append(h.digest())
    return keys


def chain_rows(sid: pa.Array, variant: pa.Array, source: pa.Array, done: pa.Table, chain) -> pa.Table:
    """`chains.chain_table` of one chain's input rows (`sid`, `variant`, `source`: where their text is) and their
    translations (`done`: pivot, texts), built column by column, with each output's `source` beside it (what the
    degenerate check reads)."""
    texts = done.column("texts").combine_chunks()
    at = pa.array(np.repeat(np.arange(len(sid)), pc.list_value_length(texts).fill_null(0).to_numpy()))
    n = len(at)

    def const(value: str) -> pa.Array:
        return pa.repeat(pa.scalar(value, pa.string()), n)

    columns = [sid.take(at), const(chain.name), variant.take(at), done.column("pivot").combine_chunks().take(at),
               pc.list_flatten(texts), const(" > ".join(chain.models)), const(chain.role), pa.nulls(n, pa.string())]
    return pa.Table.from_arrays(columns, schema=SCHEMAS["backtranslations"]).append_column("source", source.take(at))


def backtranslate_shard(sentences: pa.Table, variants: pa.Table, cfg, chains: dict, loaded,
                        progress: bool = False, memo=None) -> pa.Table:
    """Every clean sentence (variant 0) through every chain of the run's plan (`chains`: {used: [...]}); the noised
    variants too through the chains that translate them (`include_variants`). `loaded()` gives the loaded chains
    (called only when a row is not in the row `memo`)."""
    memo = memo or NoMemo("backtranslate", "translate")
    # every input row, the clean sentences then the noised variants
    sid = pa.concat_arrays([sentences.column("sid").combine_chunks().cast(pa.int64()),
                            variants.column("sid").combine_chunks().cast(pa.int64())])
    variant = pa.concat_arrays([pa.array(np.zeros(sentences.num_rows, np.int32)),
                                variants.column("variant").combine_chunks().cast(pa.int32())])
    text = pa.concat_arrays([sentences.column("text").combine_chunks().cast(pa.string()),
                             variants.column("text").combine_chunks().cast(pa.string())])
    suffixes = row_suffixes(sid, variant, text)
    variant_of = variant.to_numpy()
    parts = []
    for chain in cfg.backtranslate.chains:
        translated = [v for v in np.unique(variant_of).tolist() if v == 0 or chain.translates_variant(v)]
        taken = np.flatnonzero(np.isin(variant_of, translated))
        if chain.name in chains["used"] and len(taken):
            prefix = json.dumps(chain_key(chain, cfg.backtranslate, chains), sort_keys=True).encode()

            def compute(missing, taken=taken, chain=chain):
                at = pa.array(taken[np.asarray(missing, np.int64)])
                rows = list(zip(sid.take(at).to_pylist(), variant.take(at).to_pylist(), text.take(at).to_pylist()))
                pivots, outs = translate_rows(rows, loaded()[chain.name], cfg.run.seed, progress)
                return pa.table({"pivot": pa.array(pivots, pa.string()), "texts": pa.array(outs, TRANSLATIONS[1].type)})

            done = memo.rows(row_keys(prefix, [suffixes[i] for i in taken]), compute, TRANSLATIONS)
            at = pa.array(taken)
            parts.append(chain_rows(sid.take(at), variant.take(at), at, done, chain))
    if not parts:
        return SCHEMAS["backtranslations"].empty_table()
    table = pa.concat_tables(parts).sort_by([("sid", "ascending"), ("chain", "ascending"), ("variant", "ascending")])
    c = cfg.backtranslate
    sources = pa.DictionaryArray.from_arrays(table.column("source").combine_chunks(), text)  # each input's text once
    flags = degenerate_flags(sources, table.column("text"), c.degenerate_max_ratio,
                             c.degenerate_min_ratio, c.degenerate_min_words)
    return table.drop_columns(["source"]).set_column(table.schema.get_field_index("flag"), "flag", flags)


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
