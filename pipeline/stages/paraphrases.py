"""Stage `paraphrases` (OssCSE §4 step 2, METHODS §6).

Among the back-translations of the clean sentence (variant 0) by every chain whose role serves OssCSE
paraphrases ("paraphrases" or "both"; DebCSE's positive chains are not used), keep those with
mer_lo ≤ MER(anchor, candidate) ≤ mer_hi and take the one with the highest MER (most different surface; ties:
chain name, then text). triplets: (anchor, paraphrase, negation); an anchor with neither is left out, one with
only one of them keeps the other null (the loss skips that term).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from contramine.pipeline.engine.spec import Ctx, package_versions, stage
from contramine.pipeline.schema import SCHEMAS
from contramine.pipeline.roles import rows_serving
from contramine.pipeline.text_distances import mer


def pick_paraphrases(sentences: pa.Table, backtranslations: pa.Table, mer_lo: float, mer_hi: float) -> pa.Table:
    bt = rows_serving(backtranslations, "paraphrases")
    bt = bt.filter(pc.equal(bt.column("variant"), 0)) if bt.num_rows else bt
    anchor = sentences.column("text").take(pc.index_in(bt.column("sid"), value_set=sentences.column("sid")))
    usable = pc.and_(pc.is_valid(anchor), pc.greater(pc.binary_length(bt.column("text")), 0).fill_null(False))
    rows = pa.table({"sid": bt.column("sid"), "text": bt.column("text"), "chain": bt.column("chain"),
                     "anchor": anchor}).filter(usable)
    scores = mer(rows.column("anchor").combine_chunks(), rows.column("text").combine_chunks()) if rows.num_rows \
        else np.zeros(0)
    rows = rows.append_column("mer", pa.array(scores, pa.float64()))
    rows = rows.filter(pc.and_(pc.greater_equal(rows.column("mer"), mer_lo), pc.less_equal(rows.column("mer"), mer_hi)))
    # each anchor's best: the highest MER, then the first chain, then the first text; the first row of its sid
    rows = rows.sort_by([("sid", "ascending"), ("mer", "descending"), ("chain", "ascending"), ("text", "ascending")])
    sid = rows.column("sid").to_numpy()
    first = np.flatnonzero(np.diff(sid, prepend=sid[:1] - 1) != 0) if len(sid) else np.zeros(0, np.int64)
    best = rows.take(pa.array(first, pa.int64()))
    return pa.table({"sid": best.column("sid"), "text": best.column("text"), "mer": best.column("mer"),
                     "chain": best.column("chain")}, schema=SCHEMAS["paraphrases"])


@stage(reads=("sentences", "backtranslations"), writes=("paraphrases",), settings=("paraphrases",),
       facts=lambda cfg: package_versions("rapidfuzz"))
def paraphrases(ctx: Ctx) -> dict[str, pa.Table]:
    c = ctx.cfg.paraphrases
    return {"paraphrases": pick_paraphrases(ctx.shard("sentences"),
                                            ctx.shard("backtranslations", BACKTRANSLATION_COLUMNS), c.mer_lo, c.mer_hi)}


# what paraphrases read of a back-translation (its pivot text, the largest column, and its model are not read)
BACKTRANSLATION_COLUMNS = ("sid", "chain", "variant", "text", "role", "flag")
