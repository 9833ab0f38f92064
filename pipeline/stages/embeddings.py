"""Stage `embeddings`: sentences → L2-normalised float32 vectors from any HF encoder (METHODS §1).

The encoder is a declared resource (`ENCODER`, declared next to the model in pipeline/models/encode/resource.py):
resolved once per run — the model's fingerprint, the device kind and precision it runs at, or the content of the
`embeddings.from` file — and loaded once per process for that plan. `pool_embeddings` and `scores` declare it too.
"""
from __future__ import annotations

import pyarrow as pa

from contramine.pipeline.engine.spec import Ctx, stage
from contramine.pipeline.models.encode.resource import ENCODE_MEMO, ENCODER, check_encoder, embed_sentences


@stage(reads=("sentences",), writes=("embeddings",), settings=("encoder", "embeddings"), resources=(ENCODER,),
       checks=(check_encoder,), memos=(ENCODE_MEMO,))
def embeddings(ctx: Ctx) -> dict[str, pa.Table]:
    """Each text's vector from the row memo where an earlier shard, layout or run encoded it (the model loads only
    for the others); `embeddings.from` (vectors read from a file) needs no memo."""
    memo = ctx.memo("encode") if ctx.cfg.embeddings.source is None else None
    return {"embeddings": embed_sentences(ctx.shard("sentences"), lambda: ctx.resource("encoder"),
                                          ctx.cfg.encoder.batch_size, progress=ctx.label("embeddings"), memo=memo)}
