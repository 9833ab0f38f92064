"""Stage `paraphrases` (OssCSE §4 step 2, METHODS §6).

Among the back-translations of the clean sentence (variant 0) by every chain whose role serves OssCSE
paraphrases ("paraphrases" or "both"; DebCSE's positive chains are not used), keep those with
mer_lo ≤ MER(anchor, candidate) ≤ mer_hi and take the one with the highest MER (most different surface; ties:
chain name, then text). triplets: (anchor, paraphrase, negation); an anchor with neither is left out, one with
only one of them keeps the other null (the loss skips that term).
"""
from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from contramine.pipeline.engine.spec import Ctx, package_versions, stage
from contramine.pipeline.schema import SCHEMAS
from contramine.pipeline.roles import rows_serving
from contramine.pipeline.text_distances import mer


def pick_paraphrases(sentences: pa.Table, backtranslations: pa.Table, mer_lo: float, mer_hi: float) -> pa.Table:
    anchors = dict(zip(sentences.column("sid").to_pylist(), sentences.column("text").to_pylist()))
    bt = rows_serving(backtranslations, "paraphrases")
    bt = bt.filter(pc.equal(bt.column("variant"), 0)) if bt.num_rows else bt
    sids, texts, chains = bt.column("sid").to_pylist(), bt.column("text").to_pylist(), bt.column("chain").to_pylist()
    rows = [(s, t, c) for s, t, c in zip(sids, texts, chains) if s in anchors and t]
    scores: Iterable[float] = mer([anchors[s] for s, _, _ in rows], [t for _, t, _ in rows]) if rows else []
    best: dict[int, tuple] = {}
    for (sid, text, chain), m in zip(rows, scores):
        if mer_lo <= m <= mer_hi:
            cand = (-m, chain, text)
            if sid not in best or cand < best[sid]:
                best[sid] = cand
    keep = sorted(best)
    return pa.table({"sid": pa.array(keep, pa.int64()), "text": [best[s][2] for s in keep],
                     "mer": pa.array([-best[s][0] for s in keep], pa.float64()),
                     "chain": [best[s][1] for s in keep]}, schema=SCHEMAS["paraphrases"])


@stage(reads=("sentences", "backtranslations"), writes=("paraphrases",), settings=("paraphrases",),
       facts=lambda cfg: package_versions("rapidfuzz"))
def paraphrases(ctx: Ctx) -> dict[str, pa.Table]:
    c = ctx.cfg.paraphrases
    return {"paraphrases": pick_paraphrases(ctx.shard("sentences"), ctx.shard("backtranslations"), c.mer_lo, c.mer_hi)}
