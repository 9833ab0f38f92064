"""The encoder as a declared resource (pipeline/engine/resources.py) of the stages that embed (`embeddings`,
`pool_embeddings`, `scores`): its plan and loading, the check before any work, the row memo its vectors go through,
and a table of sentences embedded. The model and its pooling: encode/encoder.py.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import torch

from contramine.pipeline.identity import unicode_facts
from contramine.pipeline.memo.rows import row_key
from contramine.pipeline.engine.resources import Resource, cuda_device
from contramine.pipeline.engine.spec import Memo, package_versions
from contramine.pipeline.models.encode.encoder import Encoder, held_dtype, resolve_precision
from contramine.pipeline.models.encode.precomputed import PrecomputedEncoder
from contramine.pipeline.models.hub import model_fingerprint, pick_device, resolve_model
from contramine.pipeline.schema import vectors_table
from contramine.pipeline.storage.store import file_hash


def encoder_plan(cfg, store=None, n: int = 0, plan: dict | None = None) -> dict:
    """What decides the encoder's numbers besides its settings: its files, the device kind and precision it runs
    at (a Dask worker takes its own GPU of that kind) and the dtype `encode` holds its weights in there (a GPU's
    bf16 is bf16 weights, a CPU's bf16 autocast over float32 ones), on a GPU the batch budget (`encoder.batch_tokens`,
    an execution setting: it stays out of the section hash, and a CPU's key, where batching cannot change a vector),
    or the content of the `embeddings.from` file."""
    if cfg.embeddings.source is not None:
        src = Path(cfg.embeddings.source)  # its rows are matched by text, through `normalise`: Unicode's tables too
        return {"precomputed": file_hash(src) if src.is_file() else f"missing:{src}", "unicode": unicode_facts()}
    device = pick_device(cfg.encoder.device)
    kind, precision = device.split(":")[0], resolve_precision(cfg.encoder.precision, device)
    weights = str(held_dtype(precision, kind) or torch.float32).removeprefix("torch.")
    out = {"model": model_fingerprint(resolve_model(cfg.encoder.model, "encoder")), "device": kind,
           "precision": precision, "weights": weights, "versions": package_versions("torch", "transformers")}
    if kind == "cuda":  # a GPU's vector may depend on its batch (its kernels promise nothing): the budget is keyed;
        out["batch_tokens"] = cfg.encoder.batch_tokens  # on a CPU it never does (tests/test_execution_settings.py)
    return out


def load_encoder(cfg, store=None, n: int = 0, plan: dict | None = None) -> "Encoder":
    """`encoder.model` on the plan's device kind and precision (never decided again here), or the vectors of
    `embeddings.from` where that is set."""
    if cfg.embeddings.source is not None:
        return PrecomputedEncoder(Path(cfg.embeddings.source))  # type: ignore[return-value]  # duck-typed (encode, dim)
    e, plan = cfg.encoder, plan or encoder_plan(cfg)
    device = cuda_device(plan["device"], f"encoder {e.model}")
    return Encoder.load(e.model, pooler=e.pooler, max_length=e.max_length, device=device, prompt=e.prompt,
                        precision=plan["precision"], batch_tokens=e.batch_tokens)


ENCODER = Resource("encoder", encoder_plan, load_encoder, reads=("encoder", "embeddings"))


def check_encoder(cfg) -> None:
    """Before any work: the encoder resolves (downloaded where needed), unless `embeddings.from` replaces it."""
    if cfg.embeddings.source is None:
        resolve_model(cfg.encoder.model, "encoder")


def encode_memo_facts(cfg, plan: dict) -> dict:
    """What shapes a text's vector besides the text: the encoder's settings and its plan (model files, device kind,
    precision, library versions)."""
    return {"settings": cfg.section_hash("encoder", "embeddings"), "encoder": plan.get("encoder")}


ENCODE_MEMO = Memo("encode", encode_memo_facts)  # declared by the stages that embed: embeddings, pool_embeddings, scores


def memo_encode(texts: list[str], memo, load: Callable[[], "Encoder"], batch_size: int,
                progress: str | bool = False) -> np.ndarray:
    """Unit vectors of `texts`, float32 [n, d]: those in the row memo (keyed by the text) read from it, the rest
    encoded by `load()` (the model is loaded only when a text is missing). Equal to encoding them all: `encode` is
    batch-independent (its docstring), so a text's vector does not depend on which others are encoded with it. A
    vector is stored as its 4·d raw bytes (one fixed-size binary column: no list levels to write or decode)."""
    def compute(missing: np.ndarray) -> pa.Table:
        vecs = np.ascontiguousarray(load().encode([texts[i] for i in missing], batch_size=batch_size, normalize=True,
                                                  progress=progress), dtype=np.float32)
        return pa.table({"vec": pa.FixedSizeBinaryArray.from_buffers(pa.binary(4 * vecs.shape[1]), len(missing),
                                                                     [None, pa.py_buffer(vecs)])})

    if not texts:
        return np.zeros((0, 0), np.float32)
    col = memo.rows([row_key(t) for t in texts], compute).column("vec").combine_chunks()
    width = col.type.byte_width
    data = np.frombuffer(col.buffers()[1], np.uint8)[col.offset * width:(col.offset + len(col)) * width]
    return data.view(np.float32).reshape(len(texts), width // 4).copy()


def embed_sentences(sentences: pa.Table, load: Callable[[], "Encoder"], batch_size: int,
                    progress: str | bool = False, memo=None) -> pa.Table:
    """sentences(sid, text) -> embeddings(sid, emb): L2-normalised float32 rows, by the encoder `load()` gives
    (called only when a text needs it); through the row memo when one is given."""
    texts = sentences.column("text").to_pylist()
    if not texts:
        return vectors_table(np.zeros(0, np.int64), np.zeros((0, load().dim), np.float32))
    if memo is None:
        vecs = load().encode(texts, batch_size=batch_size, normalize=True, progress=progress)
    else:
        vecs = memo_encode(texts, memo, load, batch_size, progress)
    return vectors_table(sentences.column("sid").to_numpy(), vecs)
