"""Stage `embeddings`: sentences → L2-normalised float32 vectors from any HF encoder (METHODS §1).

The encoder is a declared resource (pipeline/engine/resources.py): resolved once per run — the model's fingerprint,
the device kind and precision it runs at, or the content of the `embeddings.from` file — and loaded once per
process for that plan. `pool_embeddings` and `scores` declare the same resource.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.engine.resources import Resource
from pipeline.engine.spec import Ctx, package_versions, stage
from pipeline.models.encoder import Encoder, resolve_precision
from pipeline.models.hub import model_fingerprint, pick_device, resolve_model
from pipeline.schema import table_vectors, vectors_table  # noqa: F401  (table_vectors: re-exported)


def encoder_plan(cfg, store=None, n: int = 0) -> dict:
    """What decides the encoder's numbers besides its settings: its files, the device kind and precision it runs
    at (a Dask worker picks its own GPU of that kind), or the content of the `embeddings.from` file."""
    if cfg.embeddings.source is not None:
        from pipeline.engine.store import file_hash

        src = Path(cfg.embeddings.source)
        return {"precomputed": file_hash(src) if src.is_file() else f"missing:{src}"}
    device = pick_device(cfg.encoder.device)
    return {"model": model_fingerprint(resolve_model(cfg.encoder.model, "encoder")), "device": device.split(":")[0],
            "precision": resolve_precision(cfg.encoder.precision, device),
            "versions": package_versions("torch", "transformers")}


def load_encoder(cfg, store=None, n: int = 0, plan: dict | None = None) -> Encoder:
    """`encoder.model`, or the vectors of `embeddings.from` where that is set."""
    if cfg.embeddings.source is not None:
        from pipeline.models.precomputed import PrecomputedEncoder

        return PrecomputedEncoder(Path(cfg.embeddings.source))
    e = cfg.encoder
    return Encoder.load(e.model, pooler=e.pooler, max_length=e.max_length, device=e.device, prompt=e.prompt,
                        precision=e.precision)


ENCODER = Resource("encoder", encoder_plan, load_encoder)


def embed_sentences(sentences: pa.Table, encoder: Encoder, batch_size: int, progress: str | bool = False) -> pa.Table:
    texts = sentences.column("text").to_pylist()
    if not texts:
        return vectors_table(np.zeros(0, np.int64), np.zeros((0, encoder.dim), np.float32))
    vecs = encoder.encode(texts, batch_size=batch_size, normalize=True, progress=progress)
    return vectors_table(sentences.column("sid").to_numpy(), vecs)


@stage(reads=("sentences",), writes=("embeddings",), settings=("encoder", "embeddings"), resources=(ENCODER,))
def embeddings(ctx: Ctx) -> dict[str, pa.Table]:
    return {"embeddings": embed_sentences(ctx.shard("sentences"), ctx.resource("encoder"), ctx.cfg.encoder.batch_size,
                                          progress=ctx.label("embeddings"))}
