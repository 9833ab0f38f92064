"""Our decode loop against HF `generate` on a GPU, at the 1M path's batches and at batch 64, greedy (issue 51).

    python -m bench.gpu.decode_loop [--rows 8000] [--dtype bfloat16]    # prints one JSON line per row

Model: a random Marian of opus-mt-en-de's shape (d_model 512, 6 + 6 layers, 8 heads, FFN 2048, 58,101 tokens), so
the step's arithmetic is a real model's. Rows: random token ids with wiki-like source lengths (8-64 tokens, mean
~28), sorted longest first, batched as the stage batches them (a 262,144-token budget: decoder rows x (longest
input + its cap)), or 64 rows a batch (HF `generate` as a user writes it). A random model rarely ends a row, so each
row is ended by a forced eos at a translation's length (1.1x its source; one row in 23 runs to its cap, 2x its
source, as a degenerate output does): the same per-row limit processor on both sides. Imports only torch,
transformers and pipeline/models/decode_*.py (no pipeline config), so it runs in a bare GPU image.
Reported: target tokens/s (tokens emitted, eos included), decode steps, and the loop's tokens equal to generate's.
"""
from __future__ import annotations

import argparse
import json
import math
import time

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, MarianConfig, MarianMTModel

from contramine.pipeline.models.translate.decode.loop import DecodeLoop

BUDGET = 262_144


class Limit(LogitsProcessor):
    """eos forced once a row has generated its limit (a device tensor of limits: no read, any order of rows)."""

    def __init__(self, limits, eos):
        self.limits, self.eos = limits, eos

    def subset(self, rows):
        return Limit(self.limits[torch.tensor(rows, device=self.limits.device)], self.eos)

    def __call__(self, input_ids, scores):
        done = (self.limits <= input_ids.shape[1] - 1)[:, None]
        eos = scores[:, self.eos].clone()
        scores.masked_fill_(done, float("-inf"))
        scores[:, self.eos] = torch.where(done[:, 0], torch.where(torch.isfinite(eos), eos, 0.0), eos)
        return scores


def model_of(dtype, device, tiny: bool = False):
    size = dict(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                encoder_ffn_dim=64, decoder_ffn_dim=64) if tiny else dict(
        d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
        encoder_ffn_dim=2048, decoder_ffn_dim=2048)
    cfg = MarianConfig(vocab_size=58101, decoder_vocab_size=58101, **size, pad_token_id=58100, eos_token_id=0, decoder_start_token_id=58100,
                       max_position_embeddings=512, scale_embedding=True, share_encoder_decoder_embeddings=True)
    torch.manual_seed(0)
    model = MarianMTModel(cfg).to(device, getattr(torch, dtype)).eval()
    model.generation_config = GenerationConfig(decoder_start_token_id=58100, eos_token_id=0, pad_token_id=58100,
                                               bad_words_ids=[[58100]], num_beams=1, do_sample=False)
    return model


def rows_of(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = (8 + torch.distributions.Gamma(2.0, 0.1).sample((n,)).clamp_max(56)).long().tolist()
    lengths.sort(reverse=True)
    ids = [torch.randint(1, 58000, (m - 1,), generator=g).tolist() + [0] for m in lengths]
    caps = [min(256, max(16, 2 * m)) for m in lengths]
    targets = [c if m % 23 == 0 else min(c, math.ceil(1.1 * m)) for m, c in zip(lengths, caps)]
    return ids, caps, targets


def batches(ids, caps, rows: int | None):
    out, start = [], 0
    while start < len(ids):
        n = rows or max(1, BUDGET // (len(ids[start]) + caps[start]))
        out.append(range(start, min(start + n, len(ids))))
        start = out[-1].stop
    return out


def decode(model, loop, ids, targets, parts, device):
    seqs_all, steps = [], 0
    torch.cuda.synchronize() if device == "cuda" else None
    t0 = time.perf_counter()
    for part in parts:
        rows = [ids[i] for i in part]
        width = max(len(r) for r in rows)
        x = torch.full((len(rows), width), 58100, dtype=torch.long)
        for j, r in enumerate(rows):
            x[j, :len(r)] = torch.tensor(r)
        mask = (x != 58100).long()
        limits = [targets[i] - 1 for i in part]  # tokens before the forced eos
        gen = GenerationConfig(**{**model.generation_config.to_dict(), "max_new_tokens": max(limits) + 1,
                                  "disable_compile": True})
        procs = LogitsProcessorList([Limit(torch.tensor(limits, device=device), 0)])
        x, mask = x.to(device, non_blocking=True), mask.to(device, non_blocking=True)
        if loop is not None:
            seqs = loop.generate(x, mask, gen, procs)
        else:
            seqs = model.generate(input_ids=x, attention_mask=mask, generation_config=gen, logits_processor=procs)
            steps += seqs.shape[1] - 1
        seqs_all.append(seqs)
    torch.cuda.synchronize() if device == "cuda" else None
    seconds = time.perf_counter() - t0
    tokens = sum(int(((s[:, 1:] != 58100)).sum()) for s in seqs_all)
    return seconds, tokens, (loop.steps if loop is not None else steps), seqs_all


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--rows", type=int, default=8000)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--skip-batch64", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="a 1 + 1 layer, d_model 32 model (a quick CPU check)")
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = model_of(a.dtype, device, a.tiny)
    ids, caps, targets = rows_of(a.rows)
    budget_parts, small_parts = batches(ids, caps, None), batches(ids, caps, 64)
    runs = [("loop", budget_parts), ("generate", budget_parts)] + ([] if a.skip_batch64 else
                                                                  [("generate_batch64", small_parts),
                                                                   ("loop_batch64", small_parts)])
    decode(model, DecodeLoop(model), ids[:256], targets[:256], batches(ids[:256], caps, 64), device)  # warm-up
    decode(model, None, ids[:256], targets[:256], batches(ids[:256], caps, 64), device)
    out = {}
    for name, parts in runs:
        loop = DecodeLoop(model) if name.startswith("loop") else None
        seconds, tokens, steps, seqs = decode(model, loop, ids, targets, parts, device)
        out[name] = seqs
        print(json.dumps({"row": name, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                          "dtype": a.dtype, "rows": a.rows, "batches": len(parts), "first_batch_rows": len(parts[0]),
                          "seconds": round(seconds, 3), "target_tokens": tokens,
                          "tokens_per_s": round(tokens / seconds), "decode_steps": steps}), flush=True)
    same = sum(bool(torch.equal(a_[:, :b.shape[1]], b)) for a_, b in zip(out["loop"], out["generate"]))
    print(json.dumps({"row": "agreement", "batches_equal": same, "of": len(out["loop"])}), flush=True)


if __name__ == "__main__":
    main()
