"""Stage `pairs`: the trainer's DebCSE input, one row per anchor: its sampled positives and negatives in draw
order (empty lists where a pool was empty; the trainer then falls back to in-batch negatives)."""
from __future__ import annotations

import pyarrow as pa

from contramine.pipeline.engine.spec import Ctx, stage
from contramine.pipeline.schema import SCHEMAS


def build_pairs(sentences: pa.Table, candidates: pa.Table) -> pa.Table:
    chosen = candidates.filter(candidates.column("chosen")).sort_by(
        [("sid", "ascending"), ("kind", "ascending"), ("pick", "ascending")])
    pos: dict[int, list[str]] = {}
    neg: dict[int, list[str]] = {}
    for sid, kind, text in zip(chosen.column("sid").to_pylist(), chosen.column("kind").to_pylist(),
                               chosen.column("text").to_pylist()):
        (pos if kind == "pos" else neg).setdefault(sid, []).append(text)
    sids = sentences.column("sid").to_pylist()
    return pa.table({"sid": pa.array(sids, pa.int64()), "anchor": sentences.column("text"),
                     "positives": pa.array([pos.get(s, []) for s in sids], pa.list_(pa.string())),
                     "negatives": pa.array([neg.get(s, []) for s in sids], pa.list_(pa.string()))},
                    schema=SCHEMAS["pairs"])


@stage(reads=("sentences", "candidates"), writes=("pairs",))
def pairs(ctx: Ctx) -> dict[str, pa.Table]:
    return {"pairs": build_pairs(ctx.shard("sentences"), ctx.shard("candidates"))}
