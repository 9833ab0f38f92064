"""Stage `triplets` (OssCSE §4, METHODS §6): (anchor, paraphrase, negation). An anchor with neither is left out;
one with only one of them keeps the other null (the loss skips that term)."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from contramine.pipeline.engine.spec import Ctx, stage
from contramine.pipeline.schema import SCHEMAS


def build_triplets(sentences: pa.Table, paraphrases: pa.Table, negations: pa.Table | None) -> pa.Table:
    sids = sentences.column("sid")
    if negations is not None:  # a skipped negation (null) or an empty one is no negation
        text = negations.column("text")
        negations = negations.filter(pc.greater(pc.binary_length(text), 0).fill_null(False))
    else:
        negations = SCHEMAS["negations"].empty_table()
    para = pc.index_in(sids, value_set=paraphrases.column("sid"))
    neg = pc.index_in(sids, value_set=negations.column("sid"))
    keep = pc.or_(pc.is_valid(para), pc.is_valid(neg))
    para, neg = pc.filter(para, keep), pc.filter(neg, keep)
    kept = sentences.filter(keep)
    return pa.table({"sid": kept.column("sid"), "anchor": kept.column("text"),
                     "paraphrase": paraphrases.column("text").take(para),
                     "negation": negations.column("text").take(neg),
                     "para_mer": paraphrases.column("mer").take(para),
                     "para_chain": paraphrases.column("chain").take(para)}, schema=SCHEMAS["triplets"])


@stage(reads=("sentences", "paraphrases", "negations"), writes=("triplets",))
def triplets(ctx: Ctx) -> dict[str, pa.Table]:
    return {"triplets": build_triplets(ctx.shard("sentences"), ctx.shard("paraphrases"), ctx.shard("negations"))}
