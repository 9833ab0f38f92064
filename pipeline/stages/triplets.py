"""Stage `triplets` (OssCSE §4, METHODS §6): (anchor, paraphrase, negation). An anchor with neither is left out;
one with only one of them keeps the other null (the loss skips that term)."""
from __future__ import annotations

import pyarrow as pa

from contramine.pipeline.engine.spec import Ctx, stage
from contramine.pipeline.schema import SCHEMAS


def build_triplets(sentences: pa.Table, paraphrases: pa.Table, negations: pa.Table | None) -> pa.Table:
    para = {s: (t, m, c) for s, t, m, c in zip(*(paraphrases.column(k).to_pylist()
                                                   for k in ("sid", "text", "mer", "chain")))}
    neg = {}
    if negations is not None:
        neg = {s: t for s, t in zip(negations.column("sid").to_pylist(), negations.column("text").to_pylist()) if t}
    out: dict[str, list] = {k: [] for k in SCHEMAS["triplets"].names}
    for sid, anchor in zip(sentences.column("sid").to_pylist(), sentences.column("text").to_pylist()):
        p, n = para.get(sid), neg.get(sid)
        if p is None and n is None:
            continue
        out["sid"].append(sid)
        out["anchor"].append(anchor)
        out["paraphrase"].append(p[0] if p else None)
        out["negation"].append(n)
        out["para_mer"].append(p[1] if p else None)
        out["para_chain"].append(p[2] if p else None)
    return pa.table(out, schema=SCHEMAS["triplets"])


@stage(reads=("sentences", "paraphrases", "negations"), writes=("triplets",))
def triplets(ctx: Ctx) -> dict[str, pa.Table]:
    return {"triplets": build_triplets(ctx.shard("sentences"), ctx.shard("paraphrases"), ctx.shard("negations"))}
