"""Stage `neighbours`: DebCSE's negative pool (METHODS §2).

For each sentence: the top `pool_size` sentences by cosine among those with lo ≤ cos ≤ hi (itself excluded;
identical texts share a sid, so they are excluded too). Exact by construction with a flat index:

  1. k-NN with k = pool_size + slack + a margin for neighbours above the band.
  2. Recompute in float64 from the stored vectors the cosine of every returned candidate that could be in the
     band and in the pool (FAISS scores are float32 with ~1e-6 error; ranking, band edges and the stored `cos` use
     the exact values; `_resolve_block` says which candidates the float32 score already rules out).
  3. A query is finished when (a) every sentence was returned, or (b) the smallest returned FAISS score + eps is
     below lo (nothing unseen can be in the band), or (c) it has pool_size in-band candidates and the
     pool_size-th exact cosine is above the smallest returned score + eps (nothing unseen can outrank it).
     Unfinished queries are searched again with k doubled.

This is the "k-NN, widened where too few survive the band" of METHODS §2; it avoids a range search at the
floor, which at 1M sentences returns a large share of all pairs. IVF / HNSW indexes (approximate: recall is
measured on a sample against exact search) and GPU indexes are settings, and so is what searches
(`neighbours.engine`): FAISS, or exact flat search in torch (pipeline/search/torch_exact.py); the search itself is in pipeline/search/ on a GPU FAISS cannot use.
"""
from __future__ import annotations

import pyarrow as pa

from pipeline.engine.spec import Ctx, stage
from pipeline.schema import table_vectors
from pipeline.search.band import band_neighbours
from pipeline.search.index import INDEX, index_facts


@stage(reads=("embeddings",), reads_whole=("embeddings", "pool_embeddings"), writes=("neighbours",),
       settings=("neighbours",), resources=(INDEX,), manifest=index_facts)
def neighbours(ctx: Ctx) -> dict[str, pa.Table]:
    c = ctx.cfg.neighbours
    base_sids, base, index, cpu_index = ctx.resource("index")
    q_sids, q = table_vectors(ctx.shard("embeddings"))
    return {"neighbours": band_neighbours(q, q_sids, base, base_sids, index, cpu_index, c.lo, c.hi, c.pool_size,
                                          c.slack, c.max_block_elems, progress=ctx.progress, skip_top=c.skip_top)}
