"""Stage `sentences`: corpus → sentences + rejected, every input line in exactly one of the two, split into the run's
contiguous sid ranges. How lines are read, normalised, rejected and given a sid: pipeline/corpus.py."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from pipeline.corpus import check_corpus, shard_bounds, split_sentences
from pipeline.engine.spec import Ctx, stage
from pipeline.engine.store import file_hash
from pipeline.identity import unicode_facts


def corpus_facts(cfg) -> str:
    """The corpus' content hash (a file edited in place, same name, size and mtime, is read again) and Python's
    Unicode tables, which NFC follows (a Python upgrade that changes them normalises the corpus again)."""
    return "corpus:" + file_hash(Path(cfg.data.corpus)) + ";" + unicode_facts()


def corpus_manifest(cfg, store, n: int, plan=None) -> dict:
    lines = sum(store.cached_rows(t, i, n) for t in ("sentences", "rejected") for i in range(n))
    return {"corpus": str(cfg.data.corpus), "corpus_lines": lines}


@stage(writes=("sentences", "rejected"), settings=("sentences",), facts=corpus_facts, manifest=corpus_manifest,
       one_job=True, checks=(lambda cfg: check_corpus(cfg.data.corpus),))
def sentences(ctx: Ctx) -> dict[str, list[pa.Table]]:
    """One pass over the corpus; both tables split into the run's contiguous sid ranges."""
    c = ctx.cfg.sentences
    kept, rejected = split_sentences(Path(ctx.cfg.data.corpus), c.min_words, c.max_words, c.max_chars)
    return {"sentences": [kept.slice(a, b - a) for a, b in shard_bounds(kept.num_rows, ctx.n)],
            "rejected": [rejected.slice(a, b - a) for a, b in shard_bounds(rejected.num_rows, ctx.n)]}
