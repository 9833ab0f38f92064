"""Stage `pool_embeddings`: the vectors of `pool_sentences` (the `data.candidates` corpus), by the same encoder as
`embeddings` (or the same `embeddings.from` file). Empty, and no model loaded, when `data.candidates` is unset."""
from __future__ import annotations

import pyarrow as pa

from contramine.pipeline.engine.spec import Ctx, stage
from contramine.pipeline.schema import SCHEMAS
from contramine.pipeline.models.encode.resource import ENCODE_MEMO, ENCODER, embed_sentences


@stage(reads=("pool_sentences",), writes=("pool_embeddings",), settings=("encoder", "embeddings"),
       resources=(ENCODER,), memos=(ENCODE_MEMO,))
def pool_embeddings(ctx: Ctx) -> dict[str, pa.Table]:
    shard = ctx.shard("pool_sentences")
    if not shard.num_rows:
        return {"pool_embeddings": SCHEMAS["embeddings"].empty_table()}
    memo = ctx.memo("encode") if ctx.cfg.embeddings.source is None else None
    return {"pool_embeddings": embed_sentences(shard, lambda: ctx.resource("encoder"), ctx.cfg.encoder.batch_size,
                                               progress=ctx.label("pool embeddings"), memo=memo)}
