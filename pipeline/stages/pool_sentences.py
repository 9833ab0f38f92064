"""Stage `pool_sentences`: `data.candidates` → the negative pool's own sentences + pool_rejected (the `corpus`
argument of sentence-transformers' `mine_hard_negatives`: negatives from another corpus than the anchors').

The candidate corpus (any form `data.corpus` takes) is read and filtered exactly as the `sentences` stage reads the
corpus (same normalisation, length limits, sids, rejections with their reasons), and split into the run's shards.
With `data.candidates` unset (the default) both tables are empty and `neighbours` searches the anchors' own
sentences, as DebCSE does.
"""
from __future__ import annotations

import pyarrow as pa

from contramine.pipeline.corpus import CorpusError, corpus_of, shard_bounds, split_sentences
from contramine.pipeline.engine.spec import Ctx, stage
from contramine.pipeline.identity import unicode_facts
from contramine.pipeline.schema import SCHEMAS


def pool_facts(cfg) -> str:
    """The candidate corpus' identity and, as for `sentences`, the Unicode tables its NFC follows."""
    if cfg.data.candidates is None:
        return "candidates:none"  # no file, nothing normalised: the Unicode tables play no part
    try:
        return "candidates:" + corpus_of(cfg.data, cfg.data.candidates).identity() + ";" + unicode_facts()
    except CorpusError as e:
        raise CorpusError(f"data.candidates: {e}") from None


def read_pool(data, sentences_cfg) -> tuple[pa.Table, pa.Table]:
    if data.candidates is None:
        return SCHEMAS["sentences"].empty_table(), SCHEMAS["rejected"].empty_table()
    c = sentences_cfg
    try:
        return split_sentences(corpus_of(data, data.candidates), c.min_words, c.max_words, c.max_chars,
                               c.rejected_chars, c.rejected_rows)
    except CorpusError as e:
        raise CorpusError(f"data.candidates: {e}") from None


@stage(writes=("pool_sentences", "pool_rejected"), settings=("sentences",), facts=pool_facts, one_job=True)
def pool_sentences(ctx: Ctx) -> dict[str, list[pa.Table]]:
    kept, rejected = read_pool(ctx.cfg.data, ctx.cfg.sentences)
    return {"pool_sentences": [kept.slice(a, b - a) for a, b in shard_bounds(kept.num_rows, ctx.n)],
            "pool_rejected": [rejected.slice(a, b - a) for a, b in shard_bounds(rejected.num_rows, ctx.n)]}
