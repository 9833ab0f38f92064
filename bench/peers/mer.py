"""MER throughput: `contramine.pipeline.text_distances.mer` (Arrow tokenisation + dictionary encoding, one multi-threaded rapidfuzz
`cpdist` for the distances, editops only for pairs whose alignment is ambiguous) vs a per-pair `jiwer.mer` loop.

    python -m bench.peers.mer [--n 20000]

Pairs: wiki1m sentences (normalised, lower-cased, as tests/test_textdist.py feeds jiwer) against a copy with 1 to
n/3 random word deletions, insertions and substitutions (3 in 4 pairs) or an unrelated sentence (1 in 4).
Both sides give the same numbers (checked). Best of 3 wall times for ours, one pass for jiwer.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from contramine.pipeline.config import SHARED_DATA

GOAL = 20.0


def pairs(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    from contramine.pipeline.identity import normalise

    lines = [normalise(x).lower() for x in (SHARED_DATA / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()]
    lines = [x for x in lines if x.split()]
    rng = np.random.default_rng(seed)
    vocab = [w for x in lines[:2000] for w in x.split()]
    a, b = [], []
    for k in range(n):
        x = lines[k % len(lines)]
        if k % 4 == 0:
            y = lines[int(rng.integers(len(lines)))]
        else:
            w = x.split()
            for _ in range(int(rng.integers(1, max(2, len(w) // 3)))):
                op, p = int(rng.integers(3)), int(rng.integers(len(w) + 1))
                if op == 0 and len(w) > 1:
                    del w[min(p, len(w) - 1)]
                elif op == 1:
                    w.insert(p, vocab[int(rng.integers(len(vocab)))])
                else:
                    w[min(p, len(w) - 1)] = vocab[int(rng.integers(len(vocab)))]
            y = " ".join(w)
        a.append(x)
        b.append(y)
    return a, b


def run(n: int = 20_000) -> list[dict]:
    import jiwer

    from bench import smoke
    from contramine.pipeline.text_distances import mer

    n = smoke.cap(n, 400)
    a, b = pairs(n)
    mer(a[:100], b[:100])  # warm up
    t_ours = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        ours = mer(a, b)
        t_ours = min(t_ours, time.perf_counter() - t0)
    t0 = time.perf_counter()
    theirs = np.array([jiwer.mer(x, y) for x, y in zip(a, b)])
    t_jiwer = time.perf_counter() - t0
    assert np.array_equal(ours, theirs), "mer differs from jiwer"
    print(f"mer: {n} pairs, equal to jiwer: True; mean MER {ours.mean():.3f}")
    return [{"name": f"mer_{n // 1000}k_pairs", "ours": round(n / t_ours), "peer": round(n / t_jiwer),
             "unit": "pairs/s", "ratio": round(t_jiwer / t_ours, 3), "goal": GOAL}]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--n", type=int, default=20_000)
    print(json.dumps(run(ap.parse_args().n), indent=1))
