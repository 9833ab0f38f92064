"""Stage `neighbours`: DebCSE's negative pool (METHODS §2).

For each sentence: the top `pool_size` sentences by cosine among those with lo ≤ cos ≤ hi (itself excluded;
identical texts share a sid, so they are excluded too). Exact by construction with a flat index:

  1. k-NN with k = pool_size + slack + a margin for neighbours above the band.
  2. Recompute in float64 from the stored vectors the cosine of every returned candidate that could be in the
     band and in the pool (scores are float32 with ~1e-6 error, or TF32 / bf16 with a wider bound; ranking, band
     edges and the stored `cos` use the exact values; `band.resolve` says which candidates the score already
     rules out, with the bound `score_tolerance`).
  3. A query is finished when (a) every sentence was returned, or (b) the smallest returned score + eps is
     below lo (nothing unseen can be in the band), or (c) it has pool_size in-band candidates and the
     pool_size-th exact cosine is above the smallest returned score + eps (nothing unseen can outrank it).
     Unfinished queries are searched again with k doubled.

A block of queries is resolved at once, in array operations (pipeline/search/band.py): with FAISS on the host,
k-NN block by block; with the torch engine on its device (pipeline/search/torch_exact.py), where a block's full
score rows stay in memory, so step 3's widening reads them again instead of searching again, and only the pools
come back. This is the "k-NN, widened where too few survive the band" of METHODS §2; it avoids a range search at
the floor, which at 1M sentences returns a large share of all pairs. IVF / HNSW indexes (approximate: recall is
measured on a sample against exact search) and GPU indexes are settings, and so is what searches
(`neighbours.engine`: FAISS, or exact flat search in torch on a GPU FAISS cannot use) and, for torch on a GPU, the
scores' precision (`neighbours.score_precision`: the pools are the same at each).
"""
from __future__ import annotations

import pyarrow as pa

from contramine.pipeline.engine.spec import Ctx, stage
from contramine.pipeline.schema import table_vectors
from contramine.pipeline.search.band import band_neighbours
from contramine.pipeline.search.index import INDEX, index_facts


@stage(reads=("embeddings",), reads_whole=("embeddings", "pool_embeddings"), writes=("neighbours",),
       settings=("neighbours",), resources=(INDEX,), manifest=index_facts)
def neighbours(ctx: Ctx) -> dict[str, pa.Table]:
    c = ctx.cfg.neighbours
    base_sids, base, index, cpu_index = ctx.resource("index")
    q_sids, q = table_vectors(ctx.shard("embeddings"))
    return {"neighbours": band_neighbours(q, q_sids, base, base_sids, index, cpu_index, c.lo, c.hi, c.pool_size,
                                          c.slack, c.max_block_elems, progress=ctx.progress, skip_top=c.skip_top)}
