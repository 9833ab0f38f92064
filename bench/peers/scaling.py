"""Scaling of `make mine` (default profile): wall seconds per stage and peak memory at growing corpus sizes.

    SCALE_MAX=12000 python -m bench.peers.scaling        # sizes 3000, 6000, 12000 (default for `make bench`)
    SCALE_MAX=100000 python -m bench.peers.scaling       # adds 25000, 50000, 100000 (hours on 2 cores)
    SCALE_RESUME=1 SCALE_MAX=100000 python -m bench.run --only scaling   # keep the sizes a killed run finished

Each size runs `python -m contramine.flows.cli mine --run scale-<N> --corpus <file> --set run.root=<tmp>` as a child process
(fresh run folder: nothing cached; Prefect's ephemeral server start is included in the total), and reads
the per-stage wall seconds from the tables' manifests and the child's peak RSS from `os.wait4` (ru_maxrss, which
covers the child and the processes it waited for). Corpora: the first N lines of the shared wiki1m head (12000 =
all 11,914 lines); beyond that, the 11,914 lines plus new sentences made by joining the first half of one line's
words with the second half of another line's (seeded, two different lines, duplicates skipped).

In smoke mode (bench/smoke.py) the sizes are 40 and 80 lines with the stand-in encoder, their two children run at
once, and each runs the stages with `contramine.pipeline.engine.runner.run_stage` (no Prefect): it checks this
module, not the numbers.

Translation is left out (`backtranslate.chains=[]`): the default chain's cost is per row and sized apart by
`bench/peers/bergamot.py` (sentences/s of the stage against the bare engine); with it, 100k lines would take hours
here, and the ratios measure the pipeline around the models.

Ratio per doubling: time(2N) / time(N) of the whole mine, lower is better, goal <= 2.2 (linear would be 2.0).
Where two sizes are not exactly 2x apart (11,914 kept sentences vs 25,000), the ratio is scaled to one doubling:
(t2 / t1) ** (1 / log2(n2 / n1)) over the sentence counts the runs kept. Details: artifacts/bench/scaling.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from contramine.pipeline.config import ROOT, SHARED_DATA
from contramine.pipeline.engine.runner import load_stages
from contramine.pipeline.storage.store import Store

GOAL = 2.2
SIZES = (3000, 6000, 12000, 25000, 50000, 100000)
SMOKE_SIZES = (40, 80)  # bench/smoke.py: two toy mines (run_stage, no Prefect) ...
SMOKE_SETTINGS = ("encoder.model=standin:encoder-384",)  # ... with the stand-in encoder (pipeline/models/standin.py)
OUT = ROOT / "artifacts" / "bench"


def corpus(n: int, dst: Path, seed: int = 0) -> Path:
    lines = [x for x in (SHARED_DATA / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines() if x.strip()]
    if n <= 12000:
        out = lines[:n]
    else:
        rng, seen, out = np.random.default_rng(seed), set(lines), list(lines)
        while len(out) < n:
            i, j = rng.integers(len(lines), size=2)
            a, b = lines[i].split(), lines[j].split()
            if i == j or len(a) < 2 or len(b) < 2:
                continue
            s = " ".join(a[: len(a) // 2] + b[len(b) // 2:])
            if s not in seen:
                seen.add(s)
                out.append(s)
    dst.write_text("\n".join(out) + "\n", encoding="utf-8")
    return dst


NO_TRANSLATION = ["backtranslate.chains=[]"]


def mine(n: int, work: Path) -> dict:
    return finish_mine(start_mine(n, work))


def start_mine(n: int, work: Path) -> tuple:
    """The mine at n lines, started in its child process (finish_mine waits for it and reads its tables)."""
    run = f"scale-{n}"
    shutil.rmtree(work / run, ignore_errors=True)
    path = corpus(n, work / f"corpus-{n}.txt")
    from bench import smoke

    memo = work / f".memo-{n}"  # each size computes its rows: the sizes' corpora share lines, a shared memo would not
    shutil.rmtree(memo, ignore_errors=True)
    settings = [f"run.root={work}", f"runner.memo_dir={memo}", *NO_TRANSLATION, *smoke.cap([], SMOKE_SETTINGS)]
    if smoke.on():  # the same stages through the runner's own driver, in one child, without Prefect's start-up
        cmd = [sys.executable, "-m", "bench.peers.scaling", "--child", run, str(path), *settings]
    else:
        cmd = [sys.executable, "-m", "contramine.flows.cli", "mine", "--run", run, "--corpus", str(path), "--set", *settings]
    log = open(work / f"{run}.log", "wb")
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    return n, work, run, child, t0


def finish_mine(started: tuple) -> dict:
    n, work, run, child, t0 = started
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - t0
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise RuntimeError(f"mine at {n} failed (exit {child.returncode}); see {work / f'{run}.log'}")
    store = Store(work / run)
    stages = {s: store.manifest(spec.writes[0])["wall_seconds_last_run"] for s, spec in load_stages().items()}
    sentences = store.manifest("sentences")["rows"]["sentences"]
    res = {"n": n, "sentences": sentences, "wall_s": round(wall, 1), "stages_s": stages,
           "peak_rss_mb": round(usage.ru_maxrss / 1024), "load_avg": os.getloadavg()[0]}
    print(f"scaling n={n}: {sentences} sentences, {wall:.0f}s, peak RSS {res['peak_rss_mb']} MB, "
          + ", ".join(f"{s} {t:.0f}s" for s, t in stages.items()), flush=True)
    shutil.rmtree(work / run, ignore_errors=True)
    return res


def run(max_n: int | None = None, resume: bool | None = None) -> list[dict]:
    """Sizes up to max_n ($SCALE_MAX, default 12000). resume ($SCALE_RESUME=1): keep the sizes an interrupted run
    already wrote to artifacts/bench/scaling.json (same code and machine assumed) and measure only the others."""
    from bench import smoke

    max_n = max_n or int(os.environ.get("SCALE_MAX", "12000"))
    resume = os.environ.get("SCALE_RESUME", "") == "1" if resume is None else resume
    out = smoke.work_dir()  # artifacts/bench/, or the smoke folder
    work = out / "scale"
    work.mkdir(parents=True, exist_ok=True)
    saved = out / "scaling.json"
    kept = {r["n"]: r for r in json.loads(saved.read_text())} if resume and saved.is_file() else {}
    results, sizes = [], smoke.cap([n for n in SIZES if n <= max_n], SMOKE_SIZES)
    if smoke.on():  # toy sizes check that the mines run, not how they scale: their children at once
        results, sizes = [finish_mine(m) for m in [start_mine(n, work) for n in sizes]], []
        saved.write_text(json.dumps(results, indent=1))
    for n in sizes:
        if n in kept:
            print(f"scaling n={n}: kept from {saved} ({kept[n]['wall_s']} s)", flush=True)
        results.append(kept.get(n) or mine(n, work))
        saved.write_text(json.dumps(results, indent=1))  # after each size: long runs keep partials
    rows = []
    for a, b in zip(results, results[1:]):
        per_doubling = (b["wall_s"] / a["wall_s"]) ** (1 / math.log2(b["sentences"] / a["sentences"]))
        rows.append({"name": f"scaling_mine_{a['n'] // 1000}k_to_{b['n'] // 1000}k", "ours": b["wall_s"],
                     "peer": a["wall_s"], "unit": "s", "ratio": round(per_doubling, 3), "goal": GOAL,
                     "better": "lower"})
    return rows


def mine_without_prefect(run: str, corpus_path: str, settings: list[str]) -> None:
    """Smoke mode's child: every stage of the default profile in order with `run_stage` (no Prefect)."""
    from contramine.pipeline.config import load_config
    from contramine.pipeline.engine.runner import run_stage

    from bench import smoke

    cfg = load_config("default", [f"run.name={run}", f"data.corpus={corpus_path}", *settings])
    stages = load_stages()
    smoke.freeze_heap()  # the imports out of the collections the runner makes after a stage that loaded a model
    for stage in stages:
        run_stage(stage, cfg)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--max", type=int, default=None, help="largest size (default: $SCALE_MAX or 12000)")
    ap.add_argument("--child", nargs="+", default=None, metavar="RUN CORPUS [KEY=VALUE ...]", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        mine_without_prefect(a.child[0], a.child[1], a.child[2:])
    else:
        print(json.dumps(run(a.max), indent=1))
