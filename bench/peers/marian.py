"""Translation engines on a model of opus-mt's size: CTranslate2 int8 and float32 vs HF transformers `generate`.

    python -m bench.peers.marian [--n 256] [--batch-size 32] [--src-len 32] [--tgt-len 32] [--repeats 2]

Model: a MarianMTModel of opus-mt's shape with random weights, built here in seconds (bench/fixtures/shapes.py: 6 + 6
layers, d_model 512, 8 heads, FFN 2048, vocabulary 58,101 as opus-mt-en-de; ~74M parameters), converted to
CTranslate2 (float32 and int8) into a temporary folder. Nothing is downloaded.
Inputs: `n` rows of `src_len` token ids (random ordinary tokens, then `</s>`), fed as ids to HF and as those ids'
token strings to CTranslate2: no tokenizer in the timing.
Decoding: greedy, and exactly `tgt_len` new tokens per row on both sides, so nothing depends on when a random
model would stop: HF `generate(min_new_tokens = max_new_tokens = tgt_len)` (eos suppressed until then), CTranslate2
`translate_batch(min_decoding_length = max_decoding_length = tgt_len)`; every output's length is checked.
Batches of `batch_size` rows on both sides (no padding: every row is as long). CPU, float32 torch for HF.
CTranslate2 threads as the pipeline sets them on CPU (pipeline/models/translate/engines/ct2.py): inter_threads = torch's thread
count, intra_threads = 1.
Measured: wall seconds of all `n` rows, encoder included, per engine; the engines run interleaved (HF, float32,
int8, then again) and each keeps its best of `repeats`, so a burst of other work on a shared machine does not land
on one engine only. Reported: target tokens/s (n x tgt_len / seconds; the unit of CTranslate2's published
numbers) with sentences/s beside it in the row, ratio = CTranslate2 / HF, and how many rows each CTranslate2
output equals HF's token for token (random weights: float32 may part from HF at near-ties, int8 rounds).
Published for comparison (PEERS.md, opus-mt en-de, newstest2014, beam search, 4 CPU threads): transformers 147
target tokens/s, CT2 int8 696 (4.7x).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

COMPUTE_TYPES = ("float32", "int8")


def _engines(path, tokens: list[str], threads: int) -> dict:
    import ctranslate2
    import torch

    out = {}
    for compute in COMPUTE_TYPES:
        folder = path.parent / f"ct2-{compute}"
        ctranslate2.converters.TransformersConverter(str(path)).convert(str(folder), quantization=compute)
        out[compute] = ctranslate2.Translator(str(folder), device="cpu", compute_type=compute,
                                              inter_threads=threads, intra_threads=1)
        torch.set_num_threads(threads)  # the shared libgomp took intra_threads as this thread's count (ct2.py)
    return out


def run(n: int = 256, batch_size: int = 32, src_len: int = 32, tgt_len: int = 32, repeats: int = 2) -> list[dict]:
    import torch
    from transformers import MarianMTModel

    from bench import smoke
    from bench.fixtures.shapes import OPUS_MT, TOY_MARIAN, build_marian, source_ids

    shape = TOY_MARIAN if smoke.on() else OPUS_MT
    n, batch_size, repeats = smoke.cap(n, 8), smoke.cap(batch_size, 4), smoke.cap(repeats, 1)
    src_len, tgt_len = smoke.cap(src_len, 8), smoke.cap(tgt_len, 8)
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="marian-bench-") as tmp:
        t0 = time.perf_counter()
        path, tokens = build_marian(os.path.join(tmp, "marian"), shape)
        model = MarianMTModel.from_pretrained(path).eval()
        ct2 = _engines(path, tokens, threads)
        setup = time.perf_counter() - t0
        ids = source_ids(n, src_len, shape["vocab_size"])
        src_tokens = [[tokens[i] for i in row] for row in ids.tolist()]
        params = sum(p.numel() for p in model.parameters())

        def hf(rows: slice = slice(None)) -> list[list[int]]:
            out = []
            with torch.inference_mode():
                for b in range(0, len(ids[rows]), batch_size):
                    x = ids[rows][b:b + batch_size]
                    seq = model.generate(input_ids=x, attention_mask=torch.ones_like(x), num_beams=1, do_sample=False,
                                         min_new_tokens=tgt_len, max_new_tokens=tgt_len)
                    out += seq[:, 1:].tolist()  # less the decoder start token
            return out

        def engine(compute: str):
            def go(rows: slice = slice(None)) -> list[list[int]]:
                res = ct2[compute].translate_batch(src_tokens[rows], max_batch_size=batch_size, batch_type="examples",
                                                   beam_size=1, min_decoding_length=tgt_len,
                                                   max_decoding_length=tgt_len)
                return [[index[t] for t in r.hypotheses[0]] for r in res]
            return go

        index = {t: i for i, t in enumerate(tokens)}
        sides = {"hf": hf, **{c: engine(c) for c in COMPUTE_TYPES}}
        for fn in sides.values():
            fn(slice(0, batch_size))  # warm-up: first-call allocations count for no side
        best: dict[str, float] = {}
        outputs: dict[str, list[list[int]]] = {}
        load = [round(os.getloadavg()[0], 2)]
        for _ in range(repeats):
            for name, fn in sides.items():
                t = time.perf_counter()
                outputs[name] = fn()
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - t)
        load.append(round(os.getloadavg()[0], 2))
    for name, out in outputs.items():
        lengths = {len(r) for r in out}
        if lengths != {tgt_len}:
            raise RuntimeError(f"marian_bench: {name} decoded lengths {sorted(lengths)}, not exactly {tgt_len}")
    what = (f"{'toy' if smoke.on() else 'opus-mt-shaped'} Marian ({params / 1e6:.1f}M parameters, vocab "
            f"{shape['vocab_size']}), random weights, CPU, {threads} threads, {n} rows of {src_len} source tokens, "
            f"exactly {tgt_len} new tokens each, greedy, batch {batch_size}, best of {repeats} interleaved; "
            f"load {load[0]} -> {load[1]}")
    print(f"marian: built and converted in {setup:.1f} s; {what}", flush=True)
    rows = []
    for compute in COMPUTE_TYPES:
        ours, peer = n * tgt_len / best[compute], n * tgt_len / best["hf"]
        same = sum(a == b for a, b in zip(outputs[compute], outputs["hf"]))
        print(f"ctranslate2 {compute}: {ours:.0f} tokens/s ({n / best[compute]:.1f} sentences/s) vs HF generate "
              f"{peer:.0f} tokens/s ({n / best['hf']:.1f} sentences/s) = x{ours / peer:.2f}; rows equal to HF's "
              f"{same}/{n}", flush=True)
        rows.append({"name": f"marian_{'toy' if smoke.on() else 'opus_shape'}_ct2_{compute}_vs_hf",
                     "ours": round(ours, 1), "peer": round(peer, 1), "unit": "tokens/s", "ratio": round(ours / peer, 3),
                     "goal": None, "ours_sentences_per_s": round(n / best[compute], 2),
                     "peer_sentences_per_s": round(n / best["hf"], 2), "rows_equal_to_hf": f"{same}/{n}",
                     "note": what})
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--src-len", type=int, default=32)
    ap.add_argument("--tgt-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    print(json.dumps(run(a.n, a.batch_size, a.src_len, a.tgt_len, a.repeats), indent=1))
