"""Negative-pool search: `band_neighbours` (flat index, exact band + top pool_size with widening) vs a bare
`faiss.IndexFlatIP.search` k-NN with k = pool_size, on the same vectors.

    python -m bench.peers.neighbours [--sizes 12000 50000] [--host 50000]

Vectors: 384-d unit vectors with topic structure like MiniLM sentence embeddings (one random topic direction per 100
sentences, each sentence = its topic + Gaussian noise of a random scale, normalised; a query's top-64 cosines mostly lie in 0.3-0.7, a few above the
0.75 ceiling so widening happens), seeded. Each side searches every vector against all of them (self included:
the bare k-NN does not even drop itself). band_neighbours also recomputes the candidates' cosines in float64, drops
out-of-band ones and widens k for queries whose band is not settled: the price of exactness. Best of 2 (alternated).

Rows: `neighbours_flat_<n>k` (FAISS, the CPU's engine) at each size; `neighbours_torch_<n>k` (the torch engine,
`TorchExact` on the CPU: the stage where FAISS is not installed) at the first size, against the same bare k-NN;
`neighbours_host_<n>k`: the host's own work per query (`host_seconds`): band_neighbours over an index that returns
k-NN computed beforehand (`HollowIndex`), against the bare k-NN's time per query, i.e. what resolving costs next to
searching. On a GPU FAISS index that host work is the whole cost beside the card's; the torch engine on a GPU does it
on the device and leaves the host only the pools (`band.Pools`).
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


def one(n: int, pool_size: int = 64, engine: str = "faiss") -> dict:
    from contramine.pipeline.config import NeighboursCfg
    from contramine.pipeline.search.band import band_neighbours
    from contramine.pipeline.search.faiss_index import build_index
    from contramine.pipeline.search.torch_exact import TorchExact

    x = vectors(n)
    sids = np.arange(n, dtype=np.int64)
    cfg = NeighboursCfg()
    times = {"ours": [], "bare": []}
    for side in ("ours", "bare", "bare", "ours"):
        t0 = time.perf_counter()
        if side == "ours":
            index, cpu = build_index(x, "flat", cfg) if engine == "faiss" else (TorchExact(x),) * 2
            table = band_neighbours(x, sids, x, sids, index, cpu, cfg.lo, cfg.hi, pool_size, cfg.slack,
                                    cfg.max_block_elems)
        else:
            bare = faiss.IndexFlatIP(x.shape[1])
            bare.add(x)
            scores, _ = bare.search(x, pool_size)
        times[side].append(time.perf_counter() - t0)
    t_ours, t_bare = min(times["ours"]), min(times["bare"])
    above = float((scores[:, 1:] > cfg.hi).mean())
    print(f"neighbours {engine} n={n}: {table.num_rows} pool rows ({table.num_rows / n:.1f}/query); share of bare "
          f"top-{pool_size} above the {cfg.hi} ceiling {above:.3f}; times ours {[round(t, 2) for t in times['ours']]} "
          f"bare {[round(t, 2) for t in times['bare']]}; faiss threads {faiss.omp_get_max_threads()}")
    return {"name": f"neighbours_{'flat' if engine == 'faiss' else 'torch'}_{n // 1000}k", "ours": round(n / t_ours, 1),
            "peer": round(n / t_bare, 1), "unit": "queries/s", "ratio": round(t_bare / t_ours, 3),
            "goal": GOAL if engine == "faiss" else None}


class HollowIndex:
    """An index that searches nothing: `search(x, k)` returns the k-NN of `x` computed beforehand (rows found by
    their first coordinate, unique among the queries), so a band search over it times the host's own work. k past
    what was computed: a real search of those rows."""

    def __init__(self, queries: np.ndarray, scores: np.ndarray, ids: np.ndarray, real):
        self.order = np.argsort(queries[:, 0], kind="stable")
        self.keys = queries[self.order, 0]
        if len(np.unique(self.keys)) != len(self.keys):
            raise ValueError("HollowIndex: the queries' first coordinates are not unique")
        self.scores, self.ids, self.real = scores, ids, real

    def search(self, x: np.ndarray, k: int):
        if k > self.ids.shape[1]:
            return self.real.search(x, k)
        rows = self.order[np.searchsorted(self.keys, x[:, 0])]
        return self.scores[rows, :k], self.ids[rows, :k]


def host_seconds(n_base: int, n_queries: int, sample: int = 5_000, pool_size: int = 64) -> tuple[float, float]:
    """(host seconds per query of band_neighbours, bare k-NN seconds per query) at n_queries queries against an
    n_base base: the queries are a `sample` of the base, repeated, whose k-NN (k up to 4x the first) is computed
    once, timed per query as the peer; best of 2."""
    from contramine.pipeline.config import NeighboursCfg
    from contramine.pipeline.search.band import band_neighbours

    cfg = NeighboursCfg()
    x = vectors(n_base)
    sids = np.arange(n_base, dtype=np.int64)
    picked = np.sort(np.random.default_rng(1).choice(n_base, min(sample, n_base), replace=False))
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    t0 = time.perf_counter()
    scores, ids = index.search(x[picked], pool_size)
    t_knn = (time.perf_counter() - t0) / len(picked)
    scores, ids = index.search(x[picked], 4 * (pool_size + cfg.slack + 17))
    hollow = HollowIndex(x[picked], scores, ids, index)
    rows = picked[np.arange(n_queries) % len(picked)]
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        band_neighbours(x[rows], sids[rows], x, sids, hollow, hollow, cfg.lo, cfg.hi, pool_size, cfg.slack,
                        cfg.max_block_elems)
        best = min(best, time.perf_counter() - t0)
    return best / n_queries, t_knn


def host_row(n: int) -> dict:
    t_host, t_knn = host_seconds(n, n)
    print(f"neighbours host n={n}: {t_host * 1e6:.1f} µs/query resolving (host), bare k-NN {t_knn * 1e6:.1f} µs/query")
    return {"name": f"neighbours_host_{n // 1000}k", "ours": round(1 / t_host, 1), "peer": round(1 / t_knn, 1),
            "unit": "queries/s", "ratio": round(t_knn / t_host, 3), "goal": None}


def run(sizes: tuple[int, ...] = (12_000, 50_000), host: int = 50_000) -> list[dict]:
    from bench import smoke

    sizes = smoke.cap(sizes, (2_000,))
    return [one(n) for n in sizes] + [one(smoke.cap(sizes[0], 1_000), engine="torch"), host_row(smoke.cap(host, 1_000))]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--sizes", type=int, nargs="+", default=[12_000, 50_000])
    ap.add_argument("--host", type=int, default=50_000)
    args = ap.parse_args()
    print(json.dumps(run(tuple(args.sizes), args.host), indent=1))
