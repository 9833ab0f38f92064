"""A tiny translation model that stops like a real one, for the translation benches (ct2, backtranslate).

The tests' tiny random Marian models (tests/tiny_mt.py) are built for agreement tests: they rarely end on `</s>`
where a translation would, so in a speed test most rows decode to their length cap, and an engine is timed on how
it handles caps instead of how it decodes. Here the same architecture and SentencePiece vocabulary
(`build_tiny_marian`: d_model 32, one encoder and one decoder layer) is trained for about a minute on CPU to copy
its input (wiki1m lines 1,000 on; the benches translate lines 400-911), so it ends each output with `</s>` after
about as many tokens as it read, as a real translation model stops near its input's length.

    path = copy_model()          # artifacts/bench/tiny-copy-marian-<key>/: trained once, then reused
    python -m bench.tiny_copy    # train it (or find it) and print how well it copies the benches' lines

Training is seeded (weights, batch order): the same settings give the same batches and the same start; the
resulting bits can still differ between CPUs and thread counts (float sums), so the folder is keyed by the
settings and reused, never retrained, while it is there. `training.json` in it records what it learned.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from pipeline.config import ROOT

OUT = ROOT / "artifacts" / "bench"
SEED = 1
STEPS = 1500  # about a minute on this 2-core box when it is quiet (the copy is learnt by step ~1000)
BATCH = 64
LR = 2e-3
WARMUP = 50
MAX_TOKENS = 128  # training lines are cut here: the benches' rows are this long at most
TRAIN_LINES = (1000, 12000)  # wiki1m head lines; the tokenizer read lines 0-399, the benches use 400-911
SMOKE_STEPS = 20  # bench/smoke.py's toy model (trained in seconds, copies nothing yet)
VERSION = 2  # bump when the recipe changes in a way the settings below do not show


def _key(steps: int = STEPS) -> str:
    tiny = (ROOT / "tests" / "tiny_mt.py").read_bytes()  # the architecture and vocabulary come from there
    settings = dict(seed=SEED, steps=steps, batch=BATCH, lr=LR, warmup=WARMUP, max_tokens=MAX_TOKENS,
                    lines=TRAIN_LINES, version=VERSION, tiny_mt=hashlib.sha256(tiny).hexdigest())
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


def copy_model(out: Path | None = None, steps: int | None = None) -> Path:
    """The trained copy model's folder (a MarianMT model + tokenizer, loadable by path), training it first when
    it is not there yet: into a temporary folder renamed into place when complete. In smoke mode (bench/smoke.py)
    a 20-step model in the smoke folder: it does not copy yet, which a smoke run does not need."""
    from bench import smoke

    steps = steps or smoke.cap(STEPS, SMOKE_STEPS)
    final = (out or (smoke.work_dir() if smoke.on() else OUT)) / f"tiny-copy-marian-{_key(steps)}"
    if (final / "training.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"note: training the benches' tiny copy model into {final} (once, about a minute)", file=sys.stderr,
          flush=True)
    try:
        facts = _train(tmp, steps)
        (tmp / "training.json").write_text(json.dumps(facts, indent=1))
        try:
            os.rename(tmp, final)
        except OSError:  # another process finished first
            if not (final / "training.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"note: trained in {facts['seconds']} s; copies {facts['exact_copies']:.0%} of the benches' lines "
          f"exactly, stops within 2 tokens of the input's length on {facts['length_within_2']:.0%}",
          file=sys.stderr, flush=True)
    return final


def _batch(rows: list[list[int]], pad: int):
    import torch

    width = max(map(len, rows))
    x = torch.full((len(rows), width), pad)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    y = torch.full((len(rows), width), -100)
    for r, ids in enumerate(rows):
        x[r, :len(ids)] = y[r, :len(ids)] = torch.tensor(ids)
        mask[r, :len(ids)] = 1
    return x, mask, y


def _train(folder: Path, steps: int = STEPS) -> dict:
    import torch
    from transformers import MarianMTModel, MarianTokenizer

    from tests.tiny_mt import build_tiny_marian, corpus_lines

    build_tiny_marian(folder, seed=SEED)  # tokenizer, config and generation settings; the weights are replaced
    tok = MarianTokenizer.from_pretrained(folder)
    random = MarianMTModel.from_pretrained(folder)
    torch.manual_seed(SEED)
    model = MarianMTModel(random.config)  # the library's own initialisation (small weights), not the tests' std 0.3
    model.generation_config = random.generation_config
    # opus-mt's decoder starts from <pad>'s zero embedding, and CTranslate2's Marian conversion assumes it (it drops
    # the row): the row starts at zero, and is put back to zero after every step (the tied output layer moves it)
    pad_row = model.model.shared.weight[tok.pad_token_id]
    model.train()
    lines = corpus_lines(TRAIN_LINES[1])[TRAIN_LINES[0]:] or corpus_lines()
    data = tok(lines, truncation=True, max_length=MAX_TOKENS)["input_ids"]  # each ends with </s>: copied too
    data.sort(key=len)  # a batch is BATCH neighbours in length from a random start: little padding
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP) * max(0.05, 1 - s / steps))
    order = torch.Generator().manual_seed(SEED)
    start, loss = time.perf_counter(), None
    for step in range(steps):
        first = int(torch.randint(len(data) - BATCH + 1, (1,), generator=order))
        x, mask, y = _batch(data[first:first + BATCH], tok.pad_token_id)
        loss = model(input_ids=x, attention_mask=mask, labels=y).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        with torch.no_grad():
            pad_row.zero_()
        if (step + 1) % 250 == 0:
            print(f"  step {step + 1}/{steps}: loss {loss.item():.3f}, {time.perf_counter() - start:.0f} s",
                  file=sys.stderr, flush=True)
    seconds = time.perf_counter() - start
    model.eval().save_pretrained(folder)
    return {"seed": SEED, "steps": steps, "batch": BATCH, "lr": LR, "seconds": round(seconds, 1),
            "final_loss": round(loss.item(), 4), "torch_threads": torch.get_num_threads(),
            **evaluate(folder, 512 if steps == STEPS else 16)}


def evaluate(folder: str | Path, n: int = 512) -> dict:
    """How the model does on the benches' lines (greedy, caps 2x the input, as the pipeline's default): exact
    copies, and outputs whose length is within 2 tokens of the input's (eos included on both sides)."""
    import torch
    from transformers import MarianMTModel, MarianTokenizer

    from tests.tiny_mt import corpus_lines

    tok, model = MarianTokenizer.from_pretrained(folder), MarianMTModel.from_pretrained(folder).eval()
    texts = corpus_lines(400 + n)[400:400 + n]
    exact = near = 0
    with torch.inference_mode():
        for b in range(0, len(texts), 64):
            part = texts[b:b + 64]
            enc = tok(part, return_tensors="pt", padding=True, truncation=True, max_length=MAX_TOKENS)
            out = model.generate(**enc, max_new_tokens=2 * enc["input_ids"].shape[1], num_beams=1, do_sample=False)
            got = tok.batch_decode(out, skip_special_tokens=True)
            exact += sum(" ".join(a.split()) == " ".join(b.split()) for a, b in zip(got, part))
            out_len = ((out != tok.pad_token_id).sum(1)).tolist()  # text tokens + eos (pad = decoder start)
            near += sum(abs(o - i) <= 2 for o, i in zip(out_len, enc["attention_mask"].sum(1).tolist()))
    return {"exact_copies": exact / len(texts), "length_within_2": near / len(texts), "eval_lines": len(texts)}


if __name__ == "__main__":
    path = copy_model()
    print(path)
    print((path / "training.json").read_text())
