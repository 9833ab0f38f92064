"""Back-translation throughput: `backtranslate` (length-sorted batches, per-row caps) vs a plain per-sentence
`model.generate` loop, both on HF generate.

    python -m bench.peers.backtranslate [--n 512]

Model: the tests' tiny Marian trained for about a minute to copy its input (bench/fixtures/tiny_copy.py, cached under
artifacts/bench/), so it ends its outputs with `</s>` as a real model does; chain: that model twice, CPU.
ours: `backtranslate` at batch sizes 8 / 32 / 128, greedy, float32.
peer: for each sentence in input order, tokenizer([s]) -> generate(max_new_tokens=its cap) -> decode, hop by hop
      (batch 1, so no sorting and no padding); measured once and shared by the three rows.
Same caps on both sides (`contramine.pipeline.models.translate.settings.row_limit` with the pipeline's defaults: 2x the input's
tokens, at least 16), so greedy outputs should agree; the agreement is printed. The model is tiny (d_model 32):
this measures batching and overhead, not real MT speed.
"""
from __future__ import annotations

import argparse
import json
import time

SETTINGS: dict = {}  # caps: BacktranslateCfg's defaults
BATCH_SIZES = (8, 32, 128)


def plain_loop(translators, texts: list[str]) -> list[str]:
    """What one writes without the pipeline: one sentence at a time, each hop in turn."""
    import torch

    from contramine.pipeline.models.translate.settings import row_limit

    with torch.inference_mode():
        for tr in translators:
            out = []
            for s in texts:
                enc = tr.tokenizer([s], return_tensors="pt", truncation=True, max_length=tr.cfg.max_length)
                seq = tr.model.generate(**enc, max_new_tokens=row_limit(enc["input_ids"].shape[1], tr.cfg),
                                        num_beams=1, do_sample=False)
                out.append(" ".join(tr.tokenizer.decode(seq[0], skip_special_tokens=True).split()))
            texts = out
    return texts


def run(n: int = 512) -> list[dict]:
    from bench import smoke
    from bench.fixtures.tiny_copy import copy_model
    from contramine.pipeline.config import BacktranslateCfg
    from contramine.pipeline.config import chain_name
    from contramine.pipeline.models.translate.chains import backtranslate, load_chain
    from bench.fixtures.tiny_mt import corpus_lines

    n, warm = smoke.cap(n, 4), smoke.cap(4, 1)
    texts = corpus_lines(400 + n)[400:400 + n]  # past the lines the tokenizer was trained on
    rows = [(i, 0, s) for i, s in enumerate(texts)]
    model = str(copy_model())  # trained once (about a minute), outside every timing
    names = [model, model]
    chain = load_chain(names, BacktranslateCfg(**SETTINGS))
    plain_loop(chain, texts[:warm])  # warm-up for both sides
    start = time.perf_counter()
    peer_out = plain_loop(chain, texts)
    peer = n / (time.perf_counter() - start)
    results = []
    for bs in BATCH_SIZES:
        chain = load_chain(names, BacktranslateCfg(**{**SETTINGS, "batch_size": bs, "batch_tokens": 0}))
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
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--n", type=int, default=512)
    print(json.dumps(run(parser.parse_args().n), indent=1))
