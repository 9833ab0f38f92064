"""Stage `pool_sentences`: `data.candidates` → the negative pool's own sentences + pool_rejected (the `corpus`
argument of sentence-transformers' `mine_hard_negatives`: negatives from another corpus than the anchors').

The candidate file is read and filtered exactly as the `sentences` stage reads the corpus (same normalisation,
length limits, sids, rejections with their reasons), and split into the run's shards. With `data.candidates` unset
(the default) both tables are empty and `neighbours` searches the anchors' own sentences, as DebCSE does.
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from pipeline.engine.spec import Ctx, stage
from pipeline.engine.store import file_hash
from pipeline.schema import SCHEMAS
from pipeline.corpus import CorpusError, shard_bounds, split_sentences
from pipeline.identity import unicode_facts


def pool_facts(cfg) -> str:
    """The candidate file's content hash and, as for `sentences`, the Unicode tables its NFC follows."""
    src = cfg.data.candidates
    if src is None:
        return "candidates:none"  # no file, nothing normalised: the Unicode tables play no part
    if not Path(src).is_file():
        raise CorpusError(f"data.candidates {src}: no such file")
    return "candidates:" + file_hash(Path(src)) + ";" + unicode_facts()


def read_pool(path: Path | None, min_words: int, max_words: int, max_chars: int) -> tuple[pa.Table, pa.Table]:
    if path is None:
        return SCHEMAS["sentences"].empty_table(), SCHEMAS["rejected"].empty_table()
    try:
        return split_sentences(Path(path), min_words, max_words, max_chars)
    except CorpusError as e:
        raise CorpusError(f"data.candidates: {e}") from None


@stage(writes=("pool_sentences", "pool_rejected"), settings=("sentences",), facts=pool_facts, one_job=True)
def pool_sentences(ctx: Ctx) -> dict[str, list[pa.Table]]:
    c = ctx.cfg.sentences
    kept, rejected = read_pool(ctx.cfg.data.candidates, c.min_words, c.max_words, c.max_chars)
    return {"pool_sentences": [kept.slice(a, b - a) for a, b in shard_bounds(kept.num_rows, ctx.n)],
            "pool_rejected": [rejected.slice(a, b - a) for a, b in shard_bounds(rejected.num_rows, ctx.n)]}
