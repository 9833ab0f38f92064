"""Stage `embeddings`: sentences → L2-normalised float32 vectors from any HF encoder (METHODS §1)."""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.engine.spec import Ctx, package_versions, stage
from pipeline.models.encoder import Encoder, resolve_precision
from pipeline.models.hub import model_fingerprint, pick_device, resolve_model
from pipeline.schema import table_vectors, vectors_table  # noqa: F401  (table_vectors: re-exported)


@functools.lru_cache(maxsize=2)
def cached_encoder(model: str, pooler: str, max_length: int, device: str, prompt: str, precision: str) -> Encoder:
    """One encoder per process (and per setting): shard tasks in the same worker reuse it."""
    return Encoder.load(model, pooler=pooler, max_length=max_length, device=device, prompt=prompt, precision=precision)


def encoder_from(cfg) -> Encoder:
    """`encoder.model`, or the vectors of `embeddings.from` where that is set."""
    if cfg.embeddings.source is not None:
        from pipeline.models.precomputed import precomputed_encoder

        return precomputed_encoder(cfg.embeddings.source)
    e = cfg.encoder
    return cached_encoder(e.model, e.pooler, e.max_length, e.device, e.prompt, e.precision)


def encoder_facts(cfg) -> str:
    """What decides the encoder's numbers besides its settings: its files, the device and precision it runs at (or
    the content of the `embeddings.from` file)."""
    if cfg.embeddings.source is not None:
        from pipeline.engine.store import file_hash

        src = Path(cfg.embeddings.source)
        return f"precomputed={file_hash(src) if src.is_file() else 'missing:' + str(src)}"
    device = pick_device(cfg.encoder.device)
    return (f"model={model_fingerprint(resolve_model(cfg.encoder.model, 'encoder'))};device={device.split(':')[0]};"
            f"precision={resolve_precision(cfg.encoder.precision, device)};{package_versions('torch', 'transformers')}")


def embed_sentences(sentences: pa.Table, encoder: Encoder, batch_size: int, progress: str | bool = False) -> pa.Table:
    texts = sentences.column("text").to_pylist()
    if not texts:
        return vectors_table(np.zeros(0, np.int64), np.zeros((0, encoder.dim), np.float32))
    vecs = encoder.encode(texts, batch_size=batch_size, normalize=True, progress=progress)
    return vectors_table(sentences.column("sid").to_numpy(), vecs)


@stage(reads=("sentences",), writes=("embeddings",), settings=("encoder", "embeddings"),
       facts=encoder_facts)
def embeddings(ctx: Ctx) -> dict[str, pa.Table]:
    return {"embeddings": embed_sentences(ctx.shard("sentences"), encoder_from(ctx.cfg), ctx.cfg.encoder.batch_size,
                                          progress=ctx.label("embeddings"))}
