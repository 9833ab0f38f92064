"""HF generate through the pipeline's Translator on an opus-mt-shaped Marian, at the stage's batching and at batching
sized for a GPU, beside plain `generate` at batch 64 as a user writes it.

    python -m bench.peers.translate [--n 64] [--hollow] [--settings '[{"batch_tokens": 0}, {}, ...]']

Model: random weights, bench/fixtures/shapes.py's OPUS_MT (6 + 6 layers, d_model 512, vocabulary 58,101); --hollow: the same
layers and vocabulary with d_model 8 (the same calls per decoding step and the same (rows x vocabulary) score
tensors, almost none of the layers' arithmetic), so its time per step is what the host spends per step.
Inputs: `n` rows of 8-40 tokens ('▁w<id>' words of the model's word-level vocabulary, then </s>), in a fixed order;
length caps as the stage's defaults (2x the input, at least 16). Random weights rarely end a row early, so most rows
decode to their cap, as a batch's longest row does.
ours: `Translator.translate(texts)` (length-sorted batches, per-row caps on the device, greedy, float32) at each
settings dict (default: 32 rows, the stage's default "auto" (8,192 tokens on a CPU) and a GPU's, 262,144 tokens).
peer: for each 64 rows in input order, tokenizer(padding=True) -> generate(max_new_tokens = 2x the longest input,
greedy) -> batch_decode: what one writes without the pipeline.
Measured: target tokens/s (the tokens each generate call returns per row, less the decoder start and padding, up to
the row's own cap: the peer decodes every row of a batch to the batch's cap, and the tokens past a row's cap are not
counted), sentences/s, decoding steps, ms per step and the
ms per step spent outside the model's forward (the logits processors, token selection, cache handling: host work on
a GPU). Each side runs `repeats` times interleaved, best kept. CPU float32 by default (torch's thread count as set):
there the seconds are the process's CPU seconds (time.process_time; wall seconds beside them), which other work on
a shared box inflates far less than wall time (one thread: the CPU seconds are the time it would take alone).
run(device="cuda", dtype="bfloat16") measures a GPU the same way, in wall seconds.
Runs on older code too (PYTHONPATH at another checkout: only `contramine.pipeline.models.translate.engines.hf.load_engine` and
`contramine.pipeline.config.BacktranslateCfg` are used), so a change is measured against the commit before it in one run.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

HOLLOW = dict(d_model=8, encoder_attention_heads=1, decoder_attention_heads=1, encoder_ffn_dim=8, decoder_ffn_dim=8)
# 32 rows (the stage's batching before batch_tokens), the stage's "auto" here (8,192 tokens on a CPU), a GPU's budget
# HF generate's batching (rows, the default budget, a GPU's budget): the Meter counts generate's steps, so each side
# pins `decoder = "generate"` (our loop, which calls no model forward, is measured in bench/peers/ct2.py)
DEFAULT_SETTINGS = ({"batch_tokens": 0, "decoder": "generate"}, {"decoder": "generate"},
                    {"batch_tokens": 262_144, "decoder": "generate"})


class Meter:
    """Counts decoding steps and the target tokens each generate call returns and, with `inside`, the seconds spent
    inside the model (forward and encoder), by wrapping the model's methods (the pipeline's code is not touched).
    Without `inside` nothing runs inside generate's loop but the model itself (what torch.compile needs)."""

    def __init__(self, model, pad_id: int, clock=time.perf_counter, inside: bool = True):
        self.steps = self.tokens = 0
        self.inside, self.clock = 0.0, clock
        wrapped = [(model, "forward"), (model.get_encoder(), "forward")] if inside else []
        for owner, attr in (*wrapped, (model, "generate")):
            setattr(owner, attr, self._wrap(getattr(owner, attr), attr == "generate", pad_id))

    def _wrap(self, fn, is_generate: bool, pad_id: int):
        import torch

        def wrapped(*a, **k):
            t = self.clock()
            out = fn(*a, **k)
            if is_generate:  # each row's tokens up to its cap (the stage's default: 2x its input, at least 16)
                caps = (2 * k["attention_mask"].sum(1)).clamp(16, 256).to(out.device)  # greedy: a row per input
                self.tokens += int(torch.minimum((out[:, 1:] != pad_id).sum(1), caps).sum())
                self.steps += out.shape[1] - 1  # one decoding step per generated position
            else:
                self.inside += self.clock() - t
            return out
        return wrapped

    def reset(self) -> None:
        self.steps = self.tokens = 0
        self.inside = 0.0


def label(settings: dict) -> str:
    """A result name's part for a settings dict: 'stage' for the stage's defaults, else its keys and values."""
    return "_".join(f"{k}{v}" for k, v in sorted(settings.items()) if k != "decoder") or "stage"


def texts_for(n: int, vocab_size: int, seed: int = 0) -> list[str]:
    import torch

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 41, (n,), generator=g).tolist()
    return [" ".join(f"▁w{int(i)}" for i in torch.randint(0, vocab_size - 3, (k,), generator=g)) + " </s>"
            for k in lengths]


def run(n: int = 64, hollow: bool = False, settings: list[dict] | None = None, repeats: int = 2,
        device: str = "cpu", dtype: str = "float32", inside: bool | None = None) -> list[dict]:
    """Rows as bench/run.py takes them. `device` / `dtype` let a GPU check call it ("cuda", "bfloat16"): there the
    time outside the model is not measured (kernels run asynchronously; `inside` defaults to a CPU only, and a
    compiled decoding step must not be wrapped) and ms per step is the figure."""
    import torch

    from bench import smoke
    from bench.fixtures.shapes import OPUS_MT, TOY_MARIAN, build_marian
    from contramine.pipeline.config import BacktranslateCfg
    from contramine.pipeline.models.translate.engines.hf import load_engine

    shape = TOY_MARIAN if smoke.on() else {**OPUS_MT, **(HOLLOW if hollow else {})}
    n, repeats, warm = smoke.cap(n, 4), smoke.cap(repeats, 1), smoke.cap(4, 1)
    settings = list(settings or DEFAULT_SETTINGS)
    with tempfile.TemporaryDirectory(prefix="translate-bench-") as tmp:
        path, _ = build_marian(os.path.join(tmp, "marian"), shape)
        translators = [load_engine("bench", str(path), BacktranslateCfg(**s), device, dtype) for s in settings]
        model, tok = translators[0].model, translators[0].tokenizer
        for tr in translators[1:]:
            tr.model = model  # one model: the sides differ in batching only
        cuda = device.startswith("cuda")
        clock = time.perf_counter if cuda else time.process_time  # a CPU: the process's own seconds (module doc)
        inside = not cuda if inside is None else inside
        meter = Meter(model, translators[0].pad_id, clock, inside)
        texts = texts_for(n, shape["vocab_size"])

        def plain(rows: list[str] = texts) -> None:
            with torch.inference_mode():
                for b in range(0, len(rows), 64):
                    enc = tok(rows[b:b + 64], return_tensors="pt", padding=True).to(device)
                    seq = model.generate(**enc, max_new_tokens=2 * enc["input_ids"].shape[1], num_beams=1,
                                         do_sample=False)
                    tok.batch_decode(seq, skip_special_tokens=True)

        sides = {label(s): (lambda tr=tr: tr.translate(texts)) for s, tr in zip(settings, translators)}
        sides["plain_generate_bs64"] = plain
        plain(texts[:warm])  # warm-up: first-call allocations count for no side
        translators[0].translate(texts[:warm])
        best: dict[str, dict] = {}
        load = [round(os.getloadavg()[0], 2)]
        for _ in range(repeats):
            for name, fn in sides.items():
                meter.reset()
                t, wall = clock(), time.perf_counter()
                fn()
                if cuda:
                    torch.cuda.synchronize(device)
                s = clock() - t
                if name not in best or s < best[name]["s"]:
                    best[name] = {"s": s, "wall": time.perf_counter() - wall, "steps": meter.steps,
                                  "tokens": meter.tokens, "inside": meter.inside}
        load.append(round(os.getloadavg()[0], 2))
    what = (f"{'toy' if smoke.on() else 'hollow' if hollow else 'opus-mt-shaped'} Marian, random weights, {device}, "
            f"{torch.get_num_threads()} threads, {n} rows of 8-40 tokens, greedy {dtype}, best of {repeats}, "
            f"{'wall' if cuda else 'CPU'} seconds; load {load[0]} -> {load[1]}")
    print(f"translate: {what}", flush=True)
    peer = best["plain_generate_bs64"]
    rows = []
    for name, b in best.items():
        rate = b["tokens"] / b["s"]
        host = round(1000 * (b["s"] - b["inside"]) / b["steps"], 3) if inside else None
        line = (f"{name}: {rate:.1f} target tokens/s, {n / b['s']:.2f} sentences/s (wall {b['wall']:.1f} s), "
                f"{b['steps']} steps, {1000 * b['s'] / b['steps']:.2f} ms/step"
                + (f", {host:.2f} ms/step outside the model" if inside else ""))
        print(line, flush=True)
        rows.append({"name": f"translate_{'hollow' if hollow else 'opus_shape'}_{name}", "ours": round(rate, 1),
                     "peer": round(peer["tokens"] / peer["s"], 1), "unit": "tokens/s",
                     "ratio": round(rate / (peer["tokens"] / peer["s"]), 3), "goal": None,
                     "sentences_per_s": round(n / b["s"], 3),
                     "ms_per_step": round(1000 * b["s"] / b["steps"], 3),
                     "host_ms_per_step": host, "note": what})
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--hollow", action="store_true")
    ap.add_argument("--settings", type=json.loads, default=None)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    print(json.dumps(run(a.n, a.hollow, a.settings, a.repeats), indent=1))
