"""Negative-pool search: `band_neighbours` (flat index, exact band + top pool_size with widening) vs a bare
`faiss.IndexFlatIP.search` k-NN with k = pool_size, on the same vectors.

    python -m bench.neighbours_bench [--sizes 12000 50000]

Vectors: 384-d unit vectors with topic structure like MiniLM sentence embeddings (one random topic direction per 100
sentences, each sentence = its topic + Gaussian noise of a random scale, normalised; a query's top-64 cosines mostly lie in 0.3-0.7, a few above the
0.75 ceiling so widening happens), seeded. Each side searches every vector against all of them (self included:
the bare k-NN does not even drop itself). band_neighbours also recomputes the candidates' cosines in float64, drops
out-of-band ones and widens k for queries whose band is not settled: the price of exactness. Best of 2 (alternated).
"""
from __future__ import annotations

import argparse
import json
import time

import faiss
import numpy as np

GOAL = 0.77  # band_neighbours within 1.3x of the bare k-NN


def vectors(n: int, d: int = 384, per_topic: int = 100, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((max(1, n // per_topic), d)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    noise = rng.uniform(0.45, 1.3, size=(n, 1)).astype(np.float32)  # tight and loose members of a topic
    x = centres[rng.integers(len(centres), size=n)] + noise * rng.standard_normal((n, d)).astype(np.float32) / np.sqrt(d)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def one(n: int, pool_size: int = 64) -> dict:
    from pipeline.config import NeighboursCfg
    from pipeline.search.band import band_neighbours
    from pipeline.search.faiss_index import build_index

    x = vectors(n)
    sids = np.arange(n, dtype=np.int64)
    cfg = NeighboursCfg()
    times = {"ours": [], "bare": []}
    for side in ("ours", "bare", "bare", "ours"):
        t0 = time.perf_counter()
        if side == "ours":
            index, cpu = build_index(x, "flat", cfg)
            table = band_neighbours(x, sids, x, sids, index, cpu, cfg.lo, cfg.hi, pool_size, cfg.slack,
                                    cfg.max_block_elems)
        else:
            bare = faiss.IndexFlatIP(x.shape[1])
            bare.add(x)
            scores, _ = bare.search(x, pool_size)
        times[side].append(time.perf_counter() - t0)
    t_ours, t_bare = min(times["ours"]), min(times["bare"])
    above = float((scores[:, 1:] > cfg.hi).mean())
    print(f"neighbours n={n}: {table.num_rows} pool rows ({table.num_rows / n:.1f}/query); share of bare top-{pool_size} "
          f"above the {cfg.hi} ceiling {above:.3f}; times ours {[round(t, 2) for t in times['ours']]} "
          f"bare {[round(t, 2) for t in times['bare']]}; faiss threads {faiss.omp_get_max_threads()}")
    return {"name": f"neighbours_flat_{n // 1000}k", "ours": round(n / t_ours, 1), "peer": round(n / t_bare, 1),
            "unit": "queries/s", "ratio": round(t_bare / t_ours, 3), "goal": GOAL}


def run(sizes: tuple[int, ...] = (12_000, 50_000)) -> list[dict]:
    from bench import smoke

    return [one(n) for n in smoke.cap(sizes, (2_000,))]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[12_000, 50_000])
    print(json.dumps(run(tuple(ap.parse_args().sizes)), indent=1))
