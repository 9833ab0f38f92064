"""The host bench (`make bench` runs it; alone: `python -m bench.host.bench`): what the host's own work lets a GPU
do in each job of the 1M path, measured without a GPU, on today's code and on this checkout's in the same run.

    python -m bench.host.bench                          # base = a git export of BASE_COMMIT, new = this checkout
    python -m bench.host.bench --base /tmp/hostbench-base   # base = another checkout (e.g. `git worktree add`)
    python -m bench.host.bench --base-commit HEAD~3 --reps 3 --jobs encode train
    python -m bench.host.bench --set new:generate.batch_tokens=8192   # a setting of one job on one side (or both)
    BENCH_SMOKE=1 python -m bench.host.bench            # toy sizes (tests/test_bench_modules.py)

On a GPU a job runs at the pace of its host when the host's work per batch outlasts the card's: the check on an
H100 (BENCHMARKS.md) spent 4.1 ms per decode step where the arithmetic is ~0.02 ms. Here each job runs with its model's
arithmetic removed (bench/host/jobs.py: a hollow BERT, a hollow Marian, a search index whose GEMM and top-k are done
before the clock starts), so what is timed on this CPU is what the host does: tokenising, batching, copying, Python,
the models' own op dispatch (run on one token), the objective, the optimiser. Its inverse is a ceiling: the most a
GPU could do with this host code however fast its arithmetic (sentences/s, target tokens/s, queries/s, steps/s).

- encode: `Encoder.encode` over wiki1m lines (the file, repeated), at the encoder's default batch size and bf16
  (a GPU's precision). Its ceiling is the host's work with tokenising apart (other cores: this box has two): a
  second timing with tokenising answered from a memo (model_jobs.py Remembered: the background threads' token
  arrays now, the tokenizer call before); tokenising alone on its own row, through encode's path (pipeline_tokenising).
- generate: `Translator.translate`, greedy, at the stage's defaults under a GPU's batching (32 rows a batch before
  issue 46; after it `batch_tokens = "auto"`, which on a GPU is 262,144 tokens: bench/host/model_jobs.py gpu_batch;
  `--set new:generate.batch_tokens=8192` times the CPU's budget instead; ~3,000 rows a batch, the 1M path's), each
  row emitting a translation's length (0.8-1.3x its source's tokens; one row in 23 runs to its cap:
  bench/host/hollow.py target_lengths), through our decode loop where the checkout has one (HollowSteps), else HF
  generate. Its ceiling: the target tokens emitted over the measured time of that run (not fitted; the hollow
  model's own CPU work at thousands of rows a batch counts against it).
- search: `band_neighbours` with the torch engine as it runs on an 80 GB GPU against a 1M base, in two measured
  parts (bench/host/search_jobs.py job_search): the host's cost of a block (its ops and Python, timed on blocks of
  a GPU block's queries against a 128-row base: a 1M base's scores are a GPU's work) over those queries, plus the
  host's work per query (before issue 46: numpy's resolve of each block's top-k on the real 384-d queries; now:
  copying the finished pools back and building the table).
- resolve (context, no goal): the same queries through an index that has only `search(x, k)` (FAISS, CPU or GPU),
  its GEMM and top-k done beforehand: the host's resolve per query, which does not depend on the base size.
- train: one DebCSE step (batch 64 x <= 32 tokens) as trainer/train.py's loop runs it on a GPU, the batch collated
  beforehand (DataLoader workers); collate's time per step is reported apart.

The two checkouts: `--base PATH`, or by default a `git archive` of `--base-commit` (BASE_COMMIT: the commit before
issue 46's work) in a temporary folder; the new side is this checkout. Each measurement runs in a subprocess whose
PYTHONPATH is that checkout (`python -P bench/host/jobs.py`: the hollow models and jobs are this checkout's, the same
on both sides), base and new alternating, `reps` rounds; each side's fastest round is kept. Per job the rows are: the
ceiling new vs base (goal: >= 3x; from the wall time), the ceiling vs the issue's absolute goal (GOALS: met or not),
host microseconds per unit, wall and CPU (the process's CPU time, every thread: beside other work on this shared box
it moves less than the wall time, but a thread that overlaps another adds to it), and the torch ops and host reads
(syncs on a GPU) per unit. It prints its own table with the details, writes
host_bench.json and host_bench.png (host time per unit, base vs new) under artifacts/bench/ (the smoke folder in
smoke mode).

Timings vary with the load of this shared box: compare the two sides of one run, not runs.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from bench import smoke
from bench.host.jobs import run_workers

ROOT = Path(__file__).resolve().parents[2]
BASE_COMMIT = "fce09b0"  # the last commit before issue 46 ("the card sets the pace"): today's code
JOBS = ("encode", "generate", "search", "resolve", "train")
UNIT = {"encode": "sentence", "generate": "target token", "search": "query", "resolve": "query", "train": "step"}
CEILING = {"encode": "sentences/s", "generate": "tokens/s", "search": "queries/s", "resolve": "queries/s",
           "train": "steps/s"}
# issue 46's, on this box; "resolve" (an index with only `search`: FAISS) is context, not one of the four GPU jobs
GOALS = {"encode": 50_000, "generate": 300_000, "search": 200_000, "resolve": None, "train": 40}
RATIO_GOAL = 3.0  # each ceiling >= 3x today's
SIZES = {
    "full": dict(encode_n=8_000, gen_n=6_000, search_n=20_000, train_steps=20, train_warmup=3, repeats=1, reps=3,
                 lines=11_000, spm_vocab=8_000),
    "smoke": dict(encode_n=16, gen_n=4, search_n=200, train_steps=1, train_warmup=1, repeats=1, reps=1,
                  lines=200, spm_vocab=300),
}
DATA_VERSION = "1"  # bump when prepare() changes what it writes


# ------------------------------------------------------------------------------------------------------ inputs
def prepare(folder: Path, sizes: dict) -> Path:
    """The inputs both sides read, made once per size under `folder` (reused by later runs): wiki1m lines, a WordPiece
    tokenizer (bert), a SentencePiece Marian tokenizer, and the search's vectors with their exact top-k table."""
    data = folder / f"host-bench-data-v{DATA_VERSION}-{sizes['lines']}-{sizes['spm_vocab']}-{sizes['search_n']}"
    if (data / ".complete").is_file():
        return data
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    from bench.fixtures.shapes import sentences

    lines = sentences(sizes["lines"])
    (data / "lines.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    _bert_tokenizer(data / "bert", lines)
    _marian_tokenizer(data / "marian", lines, sizes["spm_vocab"])
    _search_table(data / "search.npz", sizes["search_n"])
    (data / ".complete").write_text("ok")
    return data


def _bert_tokenizer(out: Path, lines: list[str]) -> None:
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertTokenizerFast

    from bench.fixtures.shapes import BERT_BASE, SPECIAL

    out.mkdir(parents=True)
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator(lines, vocab_size=BERT_BASE["vocab_size"], min_frequency=1, special_tokens=SPECIAL,
                           show_progress=False)
    wp.save_model(str(out))
    BertTokenizerFast.from_pretrained(str(out), do_lower_case=True).save_pretrained(out)


def _marian_tokenizer(out: Path, lines: list[str], vocab_size: int) -> None:
    """Marian's own tokenizer (SentencePiece) with opus-mt's specials, pad at id 2 (< the hollow Marian's 64 ids)."""
    import sentencepiece as spm
    from transformers import MarianTokenizer

    out.mkdir(parents=True)
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=vocab_size,
                                   model_type="unigram", character_coverage=1.0, hard_vocab_limit=False,
                                   num_threads=1, minloglevel=2)
    for name in ("source.spm", "target.spm"):
        (out / name).write_bytes(buf.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    vocab = ["</s>", "<unk>", "<pad>", *(p for p in pieces if p not in ("<unk>", "<s>", "</s>", "<pad>"))]
    (out / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}, ensure_ascii=False))
    MarianTokenizer(source_spm=str(out / "source.spm"), target_spm=str(out / "target.spm"),
                    vocab=str(out / "vocab.json"), source_lang="en", target_lang="de",
                    model_max_length=512).save_pretrained(out)


def _search_table(path: Path, n: int) -> None:
    """n topic vectors (d 384) and each one's exact top-2k0 neighbours by TorchExact (k0: band_neighbours' first
    search width at the neighbours defaults): what the card would return."""
    import numpy as np
    import torch

    from bench.gpu.sections import topic_vectors
    from contramine.pipeline.config.mining import NeighboursCfg
    from contramine.pipeline.search.torch_exact import TorchExact

    c = NeighboursCfg()
    k0 = min(n, c.pool_size + c.slack + 1 + 16)  # band_neighbours' first k (skip_top 0)
    base = topic_vectors(n, 384, seed=3)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        D, I = TorchExact(base).search(base, min(n, 2 * k0))
    finally:
        torch.set_float32_matmul_precision(previous)
    np.savez(path, base=base, D=D, I=I)


def export_base(commit: str, folder: Path) -> Path:
    """`git archive` of `commit` (this repository's) unpacked into folder/base: today's code, no git metadata."""
    r = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit], capture_output=True)
    if r.returncode != 0:
        why = (r.stderr.decode(errors="replace").strip().splitlines() or ["git failed"])[-1]
        raise SystemExit(f"host bench: cannot export commit {commit!r} of {ROOT} ({why}); pass --base PATH or "
                         f"--base-commit REV")
    out = folder / "base"
    with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tar:
        tar.extractall(out, filter="data")
    return out


# ------------------------------------------------------------------------------------------------------ workers
def side_settings(settings: list[str], side: str) -> list[str]:
    """`--set [base:|new:]JOB.KEY=VALUE` items that apply to `side`, without the side."""
    out = []
    for item in settings:
        which, sep, rest = item.partition(":")
        if sep and which in ("base", "new") and "=" not in which:
            if which == side:
                out.append(rest)
        else:
            out.append(item)
    return out


def measure(base: Path, new: Path, data: Path, sizes: dict, jobs: list[str], settings: list[str]) -> dict:
    """{side: {job: its fastest round (wall), with the least CPU time of any round}}, the sides alternating (base
    first in even rounds); the op counts come from the first round (a dispatch mode is slow; counts do not vary)."""
    runs: dict[str, dict[str, list]] = {"base": {}, "new": {}}
    for rep in range(sizes["reps"]):
        order = [("base", base), ("new", new)][::1 if rep % 2 == 0 else -1]
        calls = [(checkout, data, sizes | {"count": rep == 0}, jobs, side_settings(settings, side))
                 for side, checkout in order]
        # one side at a time; at toy sizes (which check that both sides run, not their speed) both at once
        for (side, checkout), (got, seconds) in zip(order, run_workers(calls, together=smoke.on())):
            print(f"host bench: round {rep + 1}/{sizes['reps']} {side} ({checkout}): {seconds:.0f} s", flush=True)
            for job, m in got.items():
                runs[side].setdefault(job, []).append(m)
    best: dict[str, dict] = {"base": {}, "new": {}}
    for side, by_job in runs.items():
        for job, ms in by_job.items():
            b = dict(min(ms, key=lambda m: m["seconds"] / m["units"]))
            for key in ("cpu_s", "tokenise_s", "collate_s"):
                if key in b:
                    b[key] = min(m[key] for m in ms)
            b |= {k: ms[0][k] for k in ("ops", "syncs") if k in ms[0]}  # the first round counted
            b["per_unit_s"], b["per_unit_cpu_s"] = b["seconds"] / b["units"], b["cpu_s"] / b["units"]
            best[side][job] = b
    return best


# ------------------------------------------------------------------------------------------------------ rows
def ratio(a: float, b: float) -> float:
    return a / b if b else (1.0 if a == b else float("inf"))


def rows_for(best: dict) -> list[dict]:
    """bench/run.py's rows: ours = this checkout, peer = the base (today's code)."""
    rows = []
    for job in (j for j in JOBS if j in best["new"]):
        b, n = best["base"][job], best["new"][job]
        # a job's ceiling_s where it has one (encode: tokenising apart, on the GPU machine's other cores; generate:
        # the measured run at the GPU's batching), else its wall time
        cb, cn = (m["units"] / m["ceiling_s"] if m.get("ceiling_s") else 1 / m["per_unit_s"] for m in (b, n))
        unit = UNIT[job].replace("target token", "token")
        rows.append(dict(name=f"host_{job}_ceiling", ours=round(cn, 2), peer=round(cb, 2), unit=CEILING[job],
                         ratio=round(cn / cb, 3), goal=RATIO_GOAL if GOALS[job] else None))
        if GOALS[job]:
            rows.append(dict(name=f"host_{job}_vs_goal", ours=round(cn, 2), peer=GOALS[job], unit=CEILING[job],
                             ratio=round(cn / GOALS[job], 3), goal=1.0))
        rows.append(dict(name=f"host_{job}_us", ours=round(n["per_unit_s"] * 1e6, 3),
                         peer=round(b["per_unit_s"] * 1e6, 3), unit=f"us/{unit}",
                         ratio=round(n["per_unit_s"] / b["per_unit_s"], 3), goal=None, better="lower"))
        rows.append(dict(name=f"host_{job}_cpu_us", ours=round(n["per_unit_cpu_s"] * 1e6, 3),
                         peer=round(b["per_unit_cpu_s"] * 1e6, 3), unit=f"us/{unit}",
                         ratio=round(n["per_unit_cpu_s"] / b["per_unit_cpu_s"], 3), goal=None, better="lower"))
        if "untokenised_s" in n and "untokenised_s" in b:
            f = lambda m: m["untokenised_s"] / m["units"] * 1e6  # noqa: E731
            rows.append(dict(name=f"host_{job}_untokenised_us", ours=round(f(n), 3), peer=round(f(b), 3),
                             unit=f"us/{unit}", ratio=round(ratio(f(n), f(b)), 3), goal=None, better="lower"))
        extra = {"encode": ("tokenise_cpu_us", "us/sentence", lambda m: m["tokenise_s"] / m["units"] * 1e6),
                 "generate": ("host_us_per_step", "us/step", lambda m: m["seconds"] / max(1, m["steps"]) * 1e6),
                 "train": ("collate_ms", "ms/step", lambda m: m["collate_s"] * 1e3)}.get(job)
        if extra:
            name, u, f = extra
            rows.append(dict(name=f"host_{job}_{name}", ours=round(f(n), 3), peer=round(f(b), 3), unit=u,
                             ratio=round(ratio(f(n), f(b)), 3), goal=None, better="lower"))
        for what in ("ops", "syncs"):
            if what in n and what in b and (n[what] or b[what]):
                rows.append(dict(name=f"host_{job}_{what}", ours=round(n[what], 3), peer=round(b[what], 3),
                                 unit=f"per {unit}", ratio=round(ratio(n[what], b[what]), 3), goal=None,
                                 better="lower"))
    return rows


def details(best: dict, sizes: dict) -> list[str]:
    """One line per job saying what was measured, and where this box is the wall."""
    out = []
    for job in (j for j in JOBS if j in best["new"]):
        b, n = best["base"][job], best["new"][job]
        if job == "encode":
            tok = n["tokenise_s"] / n["units"]
            rest = max(n["per_unit_cpu_s"] - tok, 0.0)
            apart = n["untokenised_s"] / n["units"] if "untokenised_s" in n else rest
            out.append(f"encode: {n['units']} sentences, {n['call']}: {n['model_calls']} model calls (base "
                       f"{b['model_calls']}); CPU time a sentence {n['per_unit_cpu_s'] * 1e6:.1f} us, of which the "
                       f"tokenising alone, the way encode tokenises (its threads' token arrays; before: its "
                       f"tokenizer call), {tok * 1e6:.1f} us of CPU (a ceiling of {1 / tok:,.0f}/s on one core); with "
                       f"tokenising remembered (the threads' token arrays; before: the tokenizer call), {apart * 1e6:.1f} "
                       f"us a sentence: the ceiling row, "
                       f"tokenising on other cores (this box has two: <= {1 / max(apart, tok, 1e-12):,.0f} "
                       f"sentences/s here)")
        elif job == "generate":
            out.append(f"generate: {n['rows']} rows, {n['units']} target tokens, batch_size / batch_tokens "
                       f"{n['batch_size']} / {n.get('batch_tokens', 0)} (base {b['batch_size']} / "
                       f"{b.get('batch_tokens', 0)}): {n['steps']} decode steps (base {b['steps']}), "
                       f"{n['seconds'] / max(1, n['steps']) * 1e3:.2f} ms a step with the hollow model's CPU work "
                       f"(base {b['seconds'] / max(1, b['steps']) * 1e3:.2f}); decoder {n.get('decoder', '?')} (base "
                       f"{b.get('decoder', '?')}), first batches {n.get('batches')} rows (base {b.get('batches')}); "
                       f"the ceiling row: the tokens over that measured time")
        elif job == "search":
            out.append(f"search: the torch engine as on an 80 GB GPU against a 1M base: blocks of {n['block_rows']} "
                       f"queries (base {b['block_rows']}), {n['block_ms']:.2f} ms of host a block (base "
                       f"{b['block_ms']:.2f}; timed on blocks of {n['probe_rows']} queries (base {b['probe_rows']}) on "
                       f"a {n['base']}-row base of 8 coordinates: a 1M base's scores are a GPU's), plus "
                       f"{n['host_query_us']:.1f} us a query for {n['host_part']} (base {b['host_query_us']:.1f} "
                       f"us for {b['host_part']})")
        elif job == "resolve":
            out.append(f"resolve: an index with only search(x, k) (FAISS), {n['units']} queries x {n['base']} base x "
                       f"384, top-{n['k_table']} table: {n['pool_rows']} pool rows (base {b['pool_rows']}); the host "
                       f"resolves every block; per query, so the ceiling holds at 1M")
        else:
            out.append(f"train: {n['objective']}, {n['units']} steps after {sizes['train_warmup']}, {n['params']} "
                       f"parameter tensors; collate {n['collate_s'] * 1e3:.1f} ms a step in the DataLoader's workers "
                       f"(base {b['collate_s'] * 1e3:.1f})")
    return out


def plot(best: dict, path: Path) -> Path | None:
    """Host time per unit, base vs new, one panel per job."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    jobs = [j for j in JOBS if j in best["new"]]
    fig, axes = plt.subplots(1, len(jobs), figsize=(3.2 * len(jobs), 3.2), squeeze=False)
    for ax, job in zip(axes[0], jobs):
        vals = [best[s][job]["per_unit_s"] * 1e6 for s in ("base", "new")]
        ax.bar(["base", "new"], vals, color=["#999999", "#1f77b4"])
        if GOALS[job]:
            ax.axhline(1e6 / GOALS[job], color="#d62728", ls="--", lw=1, label="goal")
            ax.legend(fontsize=7)
        ax.set_title(f"{job}: {vals[0] / vals[1]:.2f}x")
        ax.set_ylabel(f"host us / {UNIT[job]}")
    fig.suptitle("host time per unit (bench/host/bench.py; lower is better)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------------ entry
def bench(base: str | None = None, base_commit: str = BASE_COMMIT, jobs: list[str] | None = None,
          reps: int | None = None, settings: list[str] | None = None, sizes: dict | None = None) -> list[dict]:
    sizes = dict(sizes or SIZES["smoke" if smoke.on() else "full"])
    if reps:
        sizes["reps"] = reps
    jobs = list(jobs or JOBS)
    work = smoke.work_dir()
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    data = prepare(work, sizes)
    print(f"host bench: inputs in {data} ({time.perf_counter() - t0:.0f} s)", flush=True)
    with tempfile.TemporaryDirectory(prefix="hostbench-") as tmp:
        base_dir = Path(base).resolve() if base else export_base(base_commit, Path(tmp))
        print(f"host bench: base = {base or base_commit} ({base_dir}), new = {ROOT}", flush=True)
        best = measure(base_dir, ROOT, data, sizes, jobs, settings or [])
    rows = rows_for(best)
    print(f"\nhost bench (base {base or base_commit} vs this checkout; ours = new, peer = base):")
    for line in details(best, sizes):
        print("  " + line)
    for job in (j for j in jobs if GOALS[j]):
        c = 1 / best["new"][job]["per_unit_s"]
        print(f"  goal {job}: {GOALS[job]:,} {CEILING[job]}: {'met' if c >= GOALS[job] else 'not met'} "
              f"({c:,.0f}, {c / GOALS[job]:.2f} of it; today's code {1 / best['base'][job]['per_unit_s']:,.0f})")
    (work / "host_bench.json").write_text(json.dumps({"sizes": sizes, "base": base or base_commit, "best": best,
                                                      "rows": rows}, indent=1))
    png = plot(best, work / "host_bench.png")
    print(f"  wrote {work / 'host_bench.json'}" + (f" and {png}" if png else ""), flush=True)
    return rows


def run() -> list[dict]:
    """`make bench`'s entry (bench/run.py)."""
    return bench()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False,
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default=None, help="checkout of today's code (default: a git export of --base-commit)")
    ap.add_argument("--base-commit", default=BASE_COMMIT, help=f"commit exported as the base (default {BASE_COMMIT})")
    ap.add_argument("--jobs", nargs="*", default=list(JOBS), choices=JOBS)
    ap.add_argument("--reps", type=int, default=None, help="rounds of base + new (default: SIZES' reps)")
    ap.add_argument("--set", nargs="*", default=[], metavar="[SIDE:]JOB.KEY=VALUE",
                    help="a setting of one job (an encode() keyword or Encoder attribute, a BacktranslateCfg / "
                         "TrainCfg field, a band_neighbours keyword), on one side (base: / new:) or both")
    args = ap.parse_args(argv)
    from bench.run import HEADER, line

    rows = bench(args.base, args.base_commit, args.jobs, args.reps, args.set)
    print("\n" + HEADER)
    for r in rows:
        print(line(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
