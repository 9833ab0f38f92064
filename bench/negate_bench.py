"""Throughput of the negation stage: `negate_texts` (lean pipes, batched `nlp.pipe`) vs the plain way,
a per-sentence `nlp(text)` loop with the full pipeline (NER, attribute ruler, lemmatizer all on), same rule.

Run: `python -m bench.negate_bench [--n 3000] [--batch-size 256] [--n-process 1]`.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import spacy

from pipeline.negate import DEFAULT_MODEL, load_nlp, negate_root_verb, negate_texts

WIKI = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wiki1m_head.txt"
GOAL = 5.0


def wiki_sentences(n: int, path: Path = WIKI) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for _, line in zip(range(n), f)]


def sentences_per_second(fn, texts: list[str]) -> tuple[float, list]:
    start = time.perf_counter()
    out = fn(texts)
    return len(texts) / (time.perf_counter() - start), out


def run(n: int = 3000, batch_size: int = 256, n_process: int = 1) -> list[dict]:
    texts = wiki_sentences(n)
    lean, full = load_nlp(DEFAULT_MODEL), spacy.load(DEFAULT_MODEL)
    # warm both pipelines so one-off allocations count for neither side
    negate_texts(texts[:64], lean), [full(t) for t in texts[:16]]
    ours, ours_out = sentences_per_second(lambda ts: negate_texts(ts, lean, batch_size, n_process), texts)
    peer, peer_out = sentences_per_second(lambda ts: [negate_root_verb(full(t)) for t in ts], texts)
    agree = sum(a.text == b.text for a, b in zip(ours_out, peer_out)) / len(texts)
    print(f"negate: ours {ours:.0f}/s (batch {batch_size}, {n_process} proc) vs full per-sentence {peer:.0f}/s; "
          f"outputs agree on {agree:.1%}")
    return [{"name": "negate", "ours": ours, "peer": peer, "unit": "sentences/s", "ratio": ours / peer, "goal": GOAL}]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--n-process", type=int, default=1)
    args = parser.parse_args()
    print(json.dumps(run(args.n, args.batch_size, args.n_process), indent=1))
