"""Stage `embeddings`: sentences → L2-normalised float32 vectors from any HF encoder (METHODS §1)."""
from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa

from .encoder import Encoder


@functools.lru_cache(maxsize=2)
def cached_encoder(model: str, pooler: str, max_length: int, device: str, prompt: str, precision: str) -> Encoder:
    """One encoder per process (and per setting): shard tasks in the same worker reuse it."""
    return Encoder.load(model, pooler=pooler, max_length=max_length, device=device, prompt=prompt, precision=precision)


def encoder_from(cfg) -> Encoder:
    e = cfg.encoder
    return cached_encoder(e.model, e.pooler, e.max_length, e.device, e.prompt, e.precision)


def vectors_table(sids: np.ndarray, vectors: np.ndarray) -> pa.Table:
    """sid + emb as a fixed-size list (DuckDB: FLOAT[d])."""
    d = vectors.shape[1] if vectors.ndim == 2 else 0
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1))
    return pa.table({"sid": pa.array(sids, pa.int64()), "emb": pa.FixedSizeListArray.from_arrays(flat, d)})


def table_vectors(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(sids, vectors float32 [n, d]) from an embeddings table."""
    sids = table.column("sid").to_numpy()
    col = table.column("emb").combine_chunks()
    if len(col) == 0:
        return sids, np.zeros((0, 0), dtype=np.float32)
    d = col.type.list_size if pa.types.is_fixed_size_list(col.type) else len(col[0])
    return sids, col.flatten().to_numpy(zero_copy_only=False).reshape(-1, d).astype(np.float32, copy=False)


def embed_sentences(sentences: pa.Table, encoder: Encoder, batch_size: int, progress: str | bool = False) -> pa.Table:
    texts = sentences.column("text").to_pylist()
    if not texts:
        return vectors_table(np.zeros(0, np.int64), np.zeros((0, encoder.dim), np.float32))
    vecs = encoder.encode(texts, batch_size=batch_size, normalize=True, progress=progress)
    return vectors_table(sentences.column("sid").to_numpy(), vecs)
