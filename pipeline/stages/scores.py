"""Stage `scores`: both candidate pools of every anchor with their surface and semantic scores (METHODS §4).

- negatives: the anchor's `neighbours` (cos from that table, text from `sentences`);
- positives: its noised variants and/or the back-translations of the chains whose role serves DebCSE positives
  (`sources`: scores.positives with "auto" resolved against the run's chains, pipeline/roles.py), duplicates and
  copies of the anchor removed, embedded with the same encoder as the anchors so cos is comparable.
edit = normalised Levenshtein distance (char level by default). IPW happens in the next stage, so changing λ or
T never re-embeds anything.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from contramine.pipeline.engine.spec import Ctx, package_versions, stage
from contramine.pipeline.schema import SCHEMAS, table_vectors
from contramine.pipeline.models.translate.chains import POSITIVES, check_chains
from contramine.pipeline.models.encode.resource import ENCODE_MEMO, ENCODER, check_encoder, memo_encode
from contramine.pipeline.roles import rows_serving
from contramine.pipeline.text_distances import edit_distance


def _repeat(value: str, n: int) -> pa.Array:
    return pa.repeat(pa.scalar(value, pa.string()), n)


def negative_pool(neighbours: pa.Table, all_sentences: pa.Table) -> pa.Table:
    texts = all_sentences.select(["sid", "text"]).rename_columns(["cand_sid", "text"])
    pool = neighbours.select(["sid", "cand_sid", "cos"]).join(texts, "cand_sid", join_type="left outer")
    n = pool.num_rows
    return pa.table({"sid": pool.column("sid"), "kind": _repeat("neg", n), "cand_sid": pool.column("cand_sid"),
                     "text": pool.column("text"), "source": _repeat("neighbour", n), "cos": pool.column("cos"),
                     "variant": pa.nulls(n, pa.int32())})


def anchor_texts(sentences: pa.Table, sids) -> pa.ChunkedArray:
    """The anchor's text for every sid (null where the sid is not one of `sentences`), without Python objects."""
    return sentences.column("text").take(pc.index_in(sids, value_set=sentences.column("sid")))


def positive_texts(sentences: pa.Table, variants: pa.Table | None, backtranslations: pa.Table | None,
                   sources: list[str]) -> pa.Table:
    """(sid, text, source, variant) of positive candidates: distinct per anchor, never the anchor itself."""
    parts = []
    if "noise" in sources and variants is not None and variants.num_rows:
        parts.append(pa.table({"sid": variants.column("sid"), "text": variants.column("text"),
                               "source": _repeat("noise", variants.num_rows), "variant": variants.column("variant")}))
    bt = rows_serving(backtranslations, "positives") if backtranslations is not None else None
    if "backtranslation" in sources and bt is not None and bt.num_rows:
        parts.append(pa.table({"sid": bt.column("sid"), "text": bt.column("text"),
                               "source": pc.binary_join_element_wise("bt", bt.column("chain"), ":"),
                               "variant": bt.column("variant")}))
    if not parts:
        return pa.table({"sid": pa.array([], pa.int64()), "text": pa.array([], pa.string()),
                         "source": pa.array([], pa.string()), "variant": pa.array([], pa.int32())})
    cands = pa.concat_tables(parts).sort_by([("sid", "ascending"), ("source", "ascending"),
                                             ("variant", "ascending"), ("text", "ascending")])
    text, anchor = cands.column("text"), anchor_texts(sentences, cands.column("sid"))
    usable = pc.and_(pc.and_(pc.is_valid(anchor), pc.greater(pc.binary_length(text), 0)).fill_null(False),
                     pc.not_equal(text, anchor).fill_null(False))
    kept = cands.append_column("row", pa.array(np.arange(cands.num_rows))).filter(usable)
    # the first row of each (sid, text), in the sorted order
    first = kept.group_by(["sid", "text"], use_threads=False).aggregate([("row", "min")]).column("row_min")
    return cands.take(pa.array(np.sort(first.to_numpy()), pa.int64()))


def positive_cos(pos_t: pa.Table, embeddings: pa.Table, encode, chunk: int = 65536) -> np.ndarray:
    """cos(anchor, candidate) in float64 for every positive candidate; the float64 copies are made a chunk at a time."""
    if not pos_t.num_rows:
        return np.zeros(0)
    sids, vecs = table_vectors(embeddings)
    cand_vecs = encode(pos_t.column("text").to_pylist())
    rows = pc.index_in(pos_t.column("sid"), value_set=pa.array(sids)).to_numpy()
    return np.concatenate([np.einsum("nd,nd->n", cand_vecs[a:a + chunk].astype(np.float64),
                                     vecs[rows[a:a + chunk]].astype(np.float64))
                           for a in range(0, len(rows), chunk)])


def score_pools(sentences: pa.Table, embeddings: pa.Table, neighbours: pa.Table, all_sentences: pa.Table,
                variants: pa.Table | None, backtranslations: pa.Table | None, encode, cfg,
                sources: list[str]) -> pa.Table:
    """`scores` rows for one shard of anchors. `encode(texts) -> unit vectors` embeds positive candidates.
    Columnar: pools are built, joined and sorted in Arrow; edit distances run over Arrow columns in chunks."""
    neg = negative_pool(neighbours, all_sentences)
    pos_t = positive_texts(sentences, variants, backtranslations, sources)
    pos_cos = positive_cos(pos_t, embeddings, encode)
    n = pos_t.num_rows
    pos = pa.table({"sid": pos_t.column("sid"), "kind": _repeat("pos", n), "cand_sid": pa.nulls(n, pa.int64()),
                    "text": pos_t.column("text"), "source": pos_t.column("source"),
                    "cos": pa.array(pos_cos, pa.float32()), "variant": pos_t.column("variant")})
    pools = pa.concat_tables([neg.cast(pos.schema), pos])
    edit = edit_distance(anchor_texts(sentences, pools.column("sid")), pools.column("text"), cfg.scores.edit_level)
    pools = pools.append_column("edit", pa.array(edit, pa.float32()))
    pools = pools.sort_by([("sid", "ascending"), ("kind", "ascending"), ("source", "ascending"),
                           ("text", "ascending")])
    return pools.select(SCHEMAS["scores"].names + ["variant"])


# resources: the encoder embeds the positive candidates; the run's chains decide where positives come from (positives)
@stage(reads=("sentences", "embeddings", "neighbours", "variants", "backtranslations"),
       reads_whole=("sentences", "pool_sentences"),
       writes=("scores",), settings=("scores", "encoder", "embeddings"), resources=(ENCODER, POSITIVES),
       facts=lambda cfg: package_versions("rapidfuzz", "numpy"), checks=(check_encoder, check_chains),
       memos=(ENCODE_MEMO,))
def scores(ctx: Ctx) -> dict[str, pa.Table]:
    """The positive candidates' vectors come through the row memo (a grown corpus embeds only its new
    back-translations); `embeddings.from` reads them from its file."""
    cfg = ctx.cfg
    if cfg.embeddings.source is None:
        encode = lambda texts: memo_encode(texts, ctx.memo("encode"), lambda: ctx.resource("encoder"),  # noqa: E731
                                           cfg.encoder.batch_size, ctx.label("positives"))
    else:
        encode = lambda texts: ctx.resource("encoder").encode(texts, batch_size=cfg.encoder.batch_size,  # noqa: E731
                                                              progress=ctx.label("positives"))
    return {"scores": score_pools(ctx.shard("sentences"), ctx.shard("embeddings"), ctx.shard("neighbours"),
                                  ctx.whole("pool_sentences" if cfg.data.candidates is not None else "sentences"),
                                  ctx.shard("variants"), ctx.shard("backtranslations"),
                                  encode, cfg, ctx.plan["positives"]["sources"])}
