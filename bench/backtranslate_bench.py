"""Back-translation throughput: `backtranslate` (length-sorted batches, per-row caps) vs a plain per-sentence
`model.generate` loop, both through the tiny random Marian chain en->xx->en of tests/tiny_mt.py.

    python -m bench.backtranslate_bench [--n 512]

ours: `backtranslate` at batch sizes 8 / 32 / 128, greedy, float32 on CPU.
peer: for each sentence in input order, tokenizer([s]) -> generate(max_new_tokens=its cap) -> decode, hop by hop
      (batch 1, so no sorting and no padding); measured once and shared by the three rows.
Same caps on both sides (factor 1.0 x input tokens, at least 8: random models rarely stop on their own, and the
default factor 2 only makes both sides slower), so greedy outputs should agree; the agreement is printed.
The models are junk-emitting random weights (d_model 32): this measures batching and overhead, not real MT speed.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch

from pipeline.models.translator import backtranslate, chain_name, load_chain
from pipeline.config import BacktranslateCfg
from tests.tiny_mt import build_tiny_marian, corpus_lines

SETTINGS = dict(max_new_tokens_factor=1.0, max_new_tokens_min=8, max_length=128)
BATCH_SIZES = (8, 32, 128)


@torch.inference_mode()
def plain_loop(translators, texts: list[str]) -> list[str]:
    """What one writes without the pipeline: one sentence at a time, each hop in turn."""
    for tr in translators:
        out = []
        for s in texts:
            enc = tr.tokenizer([s], return_tensors="pt", truncation=True, max_length=tr.cfg.max_length)
            seq = tr.model.generate(**enc, max_new_tokens=tr._limit(enc["input_ids"].shape[1]), num_beams=1,
                                    do_sample=False)
            out.append(" ".join(tr.tokenizer.decode(seq[0], skip_special_tokens=True).split()))
        texts = out
    return texts


def run(n: int = 512) -> list[dict]:
    texts = corpus_lines(400 + n)[400:400 + n]  # past the lines the tokenizer was trained on
    rows = [(i, 0, s) for i, s in enumerate(texts)]
    with tempfile.TemporaryDirectory() as tmp:
        names = [str(build_tiny_marian(f"{tmp}/en-xx", seed=1)), str(build_tiny_marian(f"{tmp}/xx-en", seed=2))]
        chain = load_chain(names, BacktranslateCfg(**SETTINGS))
        plain_loop(chain, texts[:4])  # warm-up for both sides
        start = time.perf_counter()
        peer_out = plain_loop(chain, texts)
        peer = n / (time.perf_counter() - start)
        results = []
        for bs in BATCH_SIZES:
            chain = load_chain(names, BacktranslateCfg(batch_size=bs, **SETTINGS))
            start = time.perf_counter()
            table = backtranslate(rows, chain_name(names), chain)
            ours = n / (time.perf_counter() - start)
            agree = sum(a == b for a, b in zip(table.column("text").to_pylist(), peer_out)) / n
            print(f"backtranslate bs={bs}: {ours:.1f} sentences/s vs per-sentence loop {peer:.1f}/s "
                  f"(x{ours / peer:.2f}); outputs agree on {agree:.1%}")
            results.append({"name": f"backtranslate_bs{bs}", "ours": ours, "peer": peer, "unit": "sentences/s",
                            "ratio": ours / peer, "goal": None})
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=512)
    print(json.dumps(run(parser.parse_args().n), indent=1))
