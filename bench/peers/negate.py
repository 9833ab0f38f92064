"""Throughput of the negation stage: `negate_texts` (lean pipes, batched `nlp.pipe`) vs the plain way,
a per-sentence `nlp(text)` loop with the full pipeline (NER, attribute ruler, lemmatizer all on), same rule.

The two sides run in alternating chunks (ours first, then peer first, ...) so that load from other processes on
a shared machine hits both alike; with n_process > 1 ours runs as one call, so worker start-up is paid once.
Run: `python -m bench.peers.negate [--n 3000] [--batch-size 256] [--n-process 1 2]` (one row per process count).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import spacy

from contramine.pipeline.models.parser import DEFAULT_MODEL, load_nlp
from contramine.pipeline.stages.negate import negate_root_verb, negate_texts

WIKI = Path(__file__).resolve().parents[3] / "shared" / "data" / "wiki1m_head.txt"
GOAL = 5.0


def wiki_sentences(n: int, path: Path = WIKI) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for _, line in zip(range(n), f)]


def timed(fn, texts: list[str]) -> tuple[float, float, list]:
    """Wall seconds, CPU seconds of this process (blind to other processes' load; misses worker processes), output."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(texts)
    return time.perf_counter() - wall, time.process_time() - cpu, out


def one(n: int = 3000, batch_size: int = 256, n_process: int = 1, chunk: int = 500, nlps: tuple | None = None
        ) -> list[dict]:
    """One row; `nlps`: the (lean, full) pipelines when loaded already (loading is on neither side's clock)."""
    texts = wiki_sentences(n)
    lean, full = nlps or (load_nlp(DEFAULT_MODEL), spacy.load(DEFAULT_MODEL))
    ours_fn = lambda ts: negate_texts(ts, lean, batch_size, n_process)  # noqa: E731
    peer_fn = lambda ts: [negate_root_verb(full(t)) for t in ts]  # noqa: E731
    warm = max(1, n // 8)  # 64 and 16 at the full size; a few lines at toy size
    ours_fn(texts[:min(64, warm)]), peer_fn(texts[:min(16, warm)])  # one-off allocations count for neither side
    chunk = n if n_process > 1 else chunk
    wall, cpu, outputs = {"ours": 0.0, "peer": 0.0}, {"ours": 0.0, "peer": 0.0}, {"ours": [], "peer": []}
    for k, start in enumerate(range(0, n, chunk)):
        part = texts[start:start + chunk]
        for side in (("ours", "peer") if k % 2 == 0 else ("peer", "ours")):
            seconds, cpu_seconds, out = timed(ours_fn if side == "ours" else peer_fn, part)
            wall[side] += seconds
            cpu[side] += cpu_seconds
            outputs[side] += out
    ours, peer = n / wall["ours"], n / wall["peer"]
    agree = sum(a.text == b.text for a, b in zip(outputs["ours"], outputs["peer"])) / n
    print(f"negate: ours {ours:.0f}/s (batch {batch_size}, {n_process} proc) vs full-pipeline per-sentence "
          f"{peer:.0f}/s = {ours / peer:.2f}x wall; outputs identical on {agree:.1%}")
    if n_process == 1:
        print(f"        by CPU time of this process: ours {n / cpu['ours']:.0f}/s vs {n / cpu['peer']:.0f}/s = "
              f"{cpu['peer'] / cpu['ours']:.2f}x")
    name = "negate" if n_process == 1 else f"negate_{n_process}proc"
    return [{"name": name, "ours": ours, "peer": peer, "unit": "sentences/s", "ratio": ours / peer, "goal": GOAL}]


def run(n: int = 3000, batch_size: int = 256, procs: tuple[int, ...] = (1, 2)) -> list[dict]:
    """The stage's default (one process) and `negate.n_process=2` (spaCy worker processes: both cores)."""
    from bench import smoke

    n, batch_size = smoke.cap(n, 16), smoke.cap(batch_size, 8)
    nlps = load_nlp(DEFAULT_MODEL), spacy.load(DEFAULT_MODEL)  # loaded once for every row
    return [row for p in procs for row in one(n, batch_size, p, chunk=smoke.cap(500, 8), nlps=nlps)]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--n-process", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    print(json.dumps(run(args.n, args.batch_size, tuple(args.n_process)), indent=1))
