"""Peak memory of `make mine` in ONE process, and of each stage inside it, with the stand-in models.

    python -m bench.mine_memory --n 100000      # -> artifacts/scale/mine_memory.json, and the table on stdout

`make scale` measures each stage as its own process; `make mine` runs every stage in one. There, a stage's models
and indexes are released when it ends (pipeline/engine/resources.py), so the process' peak should be close to the
largest stage's, not their sum. This runs the real mine flow (threads runner, 1 worker, the default profile with
the stand-in encoder and translators of bench/scale.py) and samples the process' resident memory every 50 ms,
attributing each sample to the stage that is running; the process' own `ru_maxrss` is the overall peak. Its corpus
is bench/scale.py's (wiki1m lines, then half-and-half recombinations), cached under artifacts/scale/.
"""
from __future__ import annotations

import argparse
import json
import resource
import threading
import time
from pathlib import Path

from bench.scale import OUT, STANDIN_SETTINGS, synthetic_corpus


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def measure(n: int, out: Path, keep_models: bool = False) -> dict:
    import contramine.flows.mine as mine
    from contramine.pipeline.engine import resources

    if keep_models:  # what a process that never releases does (before resources.py): for comparison only
        resources.release = lambda stage=None: 0
        resources.enter = lambda stage: None

    corpus = out / f"corpus-{n}.txt"
    if not corpus.is_file():
        synthetic_corpus(n, corpus)
    run, root = f"memory-{n}", out / "mine-memory-runs"
    peaks: dict[str, float] = {}
    current = ["(start)"]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            stage = current[0]
            peaks[stage] = max(peaks.get(stage, 0.0), rss_mb())
            time.sleep(0.05)

    real = mine.execute_stage

    def tracked(stage, cfg, force=False, plan=None):
        current[0] = stage
        try:
            return real(stage, cfg, force, plan)
        finally:
            peaks[stage] = max(peaks.get(stage, 0.0), rss_mb())
            current[0] = f"(after {stage})"

    mine.execute_stage = tracked
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    mine.mine_flow(profile="default", run=run, corpus=str(corpus),
                   overrides=[*STANDIN_SETTINGS, f"run.root={root}"], force=[])
    seconds = time.perf_counter() - t0
    stop.set()
    sampler.join()
    mine.execute_stage = real
    stages = {s: round(v) for s, v in peaks.items() if not s.startswith("(")}
    return {"n": n, "seconds": round(seconds, 1), "process_peak_mb": round(resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss / 1024), "stage_peak_mb": stages, "largest_stage": max(stages, key=stages.get),
        "held_after": resources.held(), "keep_models": keep_models, "date": time.strftime("%Y-%m-%d %H:%M")}


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False,
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--keep-models", action="store_true", help="never release a stage's models (the comparison)")
    args = ap.parse_args()
    result = measure(args.n, args.out, args.keep_models)
    name = "mine_memory_keep_models.json" if args.keep_models else "mine_memory.json"
    (args.out / name).write_text(json.dumps(result, indent=1))
    print("| stage | peak RSS MB (one process) |\n|---|---|")
    for stage, mb in result["stage_peak_mb"].items():
        print(f"| {stage} | {mb:,} |")
    print(f"process peak (ru_maxrss): {result['process_peak_mb']:,} MB; largest stage: {result['largest_stage']} "
          f"{result['stage_peak_mb'][result['largest_stage']]:,} MB; {result['seconds']} s; held after: "
          f"{result['held_after']}")


if __name__ == "__main__":
    main()
