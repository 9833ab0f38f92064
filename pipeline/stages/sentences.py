"""Stage `sentences`: corpus → sentences + rejected, every input record in exactly one of the two, split into the
run's contiguous sid ranges. How records are read (every corpus form) and filtered: pipeline/corpus/."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from contramine.pipeline.corpus import corpus_of, shard_bounds, split_sentences
from contramine.pipeline.engine.spec import Ctx, stage
from contramine.pipeline.identity import unicode_facts


def corpus_facts(cfg) -> str:
    """The corpus' identity (every part's name and content hash: a file edited in place, same name, size and mtime,
    is read again; a hub dataset's resolved commit) and Python's Unicode tables, which NFC follows (a Python upgrade
    that changes them normalises the corpus again)."""
    return "corpus:" + corpus_of(cfg.data, cfg.data.corpus).identity() + ";" + unicode_facts()


def corpus_manifest(cfg, store, n: int, plan=None) -> dict:
    """The corpus, its records, and each part's records in reading order: a sentence's `line_no` L is in the part
    whose range holds it, at line L - first_line_no + 1."""
    # a rejected row stands for `lines` records (a run of one record repeated, or its repeats past the row cap)
    lines = sum(store.cached_rows("sentences", i, n) for i in range(n)) + \
        int(pc.sum(store.read("rejected", n).column("lines")).as_py() or 0)
    sources = corpus_of(cfg.data, cfg.data.corpus).sources()
    if len(sources) == 1:
        sources = [(sources[0][0], lines)]  # one part (or a dataset, whose count is what was read): no recount
    first, parts = 1, []
    for name, records in sources:
        parts.append({"source": name, "first_line_no": first, "lines": records})
        first += records
    return {"corpus": str(cfg.data.corpus), "corpus_lines": lines, "corpus_parts": parts}


def check(cfg) -> None:
    corpus_of(cfg.data, cfg.data.corpus).check()


@stage(writes=("sentences", "rejected"), settings=("sentences",), facts=corpus_facts, manifest=corpus_manifest,
       one_job=True, checks=(check,))
def sentences(ctx: Ctx) -> dict[str, list[pa.Table]]:
    """One pass over the corpus; both tables split into the run's contiguous sid ranges."""
    c = ctx.cfg.sentences
    kept, rejected = split_sentences(corpus_of(ctx.cfg.data, ctx.cfg.data.corpus), c.min_words, c.max_words,
                                     c.max_chars, c.rejected_chars, c.rejected_rows)
    return {"sentences": [kept.slice(a, b - a) for a, b in shard_bounds(kept.num_rows, ctx.n)],
            "rejected": [rejected.slice(a, b - a) for a, b in shard_bounds(rejected.num_rows, ctx.n)]}
