"""Stage `pairs`: the trainer's DebCSE input, one row per anchor: its sampled positives and negatives in draw
order (empty lists where a pool was empty; the trainer then falls back to in-batch negatives)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from contramine.pipeline.engine.spec import Ctx, stage
from contramine.pipeline.schema import SCHEMAS


def grouped_lists(keys: np.ndarray, values: pa.Array, wanted: np.ndarray) -> pa.ListArray:
    """For each of `wanted`, the `values` whose key equals it, in their order: `keys` is sorted, so each wanted key's
    values are one run, found by binary search; a wanted key may repeat or be absent (an empty list)."""
    lo, hi = np.searchsorted(keys, wanted, "left"), np.searchsorted(keys, wanted, "right")
    counts = hi - lo
    offsets: np.ndarray = np.zeros(len(wanted) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    # the run of each wanted key, laid end to end: lo[k] + 0, 1, ..., counts[k] - 1
    take = np.repeat(lo - offsets[:-1], counts) + np.arange(offsets[-1])
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values.take(pa.array(take, pa.int64())),
                                    type=pa.list_(pa.string()))


def build_pairs(sentences: pa.Table, candidates: pa.Table) -> pa.Table:
    """`candidates`' `kind` may be a dictionary column (the stage reads it so). Each kind's chosen rows are sorted
    by (sid, pick): Arrow's sort is stable, so equal keys keep the table's order, as a sort by (sid, kind, pick)
    before the kind's filter did."""
    chosen = candidates.filter(candidates.column("chosen"))
    sids = sentences.column("sid").cast(pa.int64()).to_numpy()
    lists = {}
    for kind in ("pos", "neg"):
        rows = chosen.filter(pc.equal(chosen.column("kind"), kind)).sort_by([("sid", "ascending"), ("pick", "ascending")])
        lists[kind] = grouped_lists(rows.column("sid").to_numpy(), rows.column("text").combine_chunks(), sids)
    return pa.table({"sid": pa.array(sids, pa.int64()), "anchor": sentences.column("text"),
                     "positives": lists["pos"], "negatives": lists["neg"]}, schema=SCHEMAS["pairs"])


@stage(reads=("sentences", "candidates"), writes=("pairs",))
def pairs(ctx: Ctx) -> dict[str, pa.Table]:
    # the 5 of candidates' 13 columns that pairs read: at 100k a shard's read fell from 0.38 to 0.18 CPU seconds;
    # `kind` ("pos" / "neg" on every row) as a dictionary column: its millions of strings are not made
    return {"pairs": build_pairs(ctx.shard("sentences"), ctx.shard("candidates", CANDIDATE_COLUMNS, dictionary=("kind",)))}


CANDIDATE_COLUMNS = ("sid", "kind", "pick", "text", "chosen")
