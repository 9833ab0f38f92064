"""Back-translation engines: `backtranslate.engine = "ctranslate2"` vs HF `generate` (our "hf" engine), same
model, same sentences, same batch size, same per-row length caps, both through `backtranslate`.

    python -m bench.ct2_bench [--n 512]

Model: the tiny random Marian chain en->xx->en of tests/tiny_mt.py (d_model 32, 2 layers), CPU, greedy, batch 32.
ours: CTranslate2 float32 (must agree with HF token for token) and int8 (the CPU default of engine = "ctranslate2").
peer: HF transformers `generate`, the engine the pipeline used before (greedy, float32, same batches).
What this shows: per-step framework overhead, which is most of a small model's step in HF (Python, hooks, logits
processors) and which CTranslate2's C++ decoder removes. What it does not show: the speed-up on a real opus-mt model,
where matrix products dominate; CTranslate2 publishes 4.7x (int8, 4 threads, CPU) and 9.1x (float16, A10G) over
transformers for opus-mt en-de at the same BLEU (PEERS.md). One-time conversion is outside the timing (it is cached).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

SETTINGS = dict(max_new_tokens_factor=1.0, max_new_tokens_min=8, max_length=128, batch_size=32)


def run(n: int = 512) -> list[dict]:
    before = os.environ.get("HF_HUB_CACHE")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["HF_HUB_CACHE"] = f"{tmp}/hub"  # conversions land beside it: gone with the temporary folder
        try:
            return _measure(tmp, n)
        finally:
            os.environ.pop("HF_HUB_CACHE") if before is None else os.environ.update(HF_HUB_CACHE=before)


def _measure(tmp: str, n: int) -> list[dict]:
    from pipeline.config import BacktranslateCfg
    from pipeline.models.translator import backtranslate, chain_name, load_chain
    from tests.tiny_mt import build_tiny_marian, corpus_lines

    texts = corpus_lines(400 + n)[400:400 + n]  # past the lines the tokenizer was trained on
    rows = [(i, 0, s) for i, s in enumerate(texts)]
    names = [str(build_tiny_marian(f"{tmp}/en-xx", seed=1)), str(build_tiny_marian(f"{tmp}/xx-en", seed=2))]

    def timed(**engine) -> tuple[float, list[str]]:
        chain = load_chain(names, BacktranslateCfg(**SETTINGS, **engine))  # converts here, once, untimed
        backtranslate(rows[:32], chain_name(names), chain)  # warm-up
        start = time.perf_counter()
        table = backtranslate(rows, chain_name(names), chain)
        return n / (time.perf_counter() - start), table.column("text").to_pylist()

    peer, hf_out = timed(engine="hf")
    results = []
    for compute in ("float32", "int8"):
        ours, out = timed(engine="ctranslate2", compute_type=compute)
        agree = sum(a == b for a, b in zip(out, hf_out)) / n
        print(f"ctranslate2 {compute}: {ours:.1f} sentences/s vs HF generate {peer:.1f}/s (x{ours / peer:.2f}); "
              f"outputs equal to HF on {agree:.1%}", flush=True)
        results.append({"name": f"backtranslate_ct2_{compute}_vs_hf", "ours": ours, "peer": peer,
                        "unit": "sentences/s", "ratio": ours / peer, "goal": None,
                        "note": f"tiny random Marian, CPU, batch 32; equal to HF on {agree:.0%}"})
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=512)
    print(json.dumps(run(parser.parse_args().n), indent=1))
