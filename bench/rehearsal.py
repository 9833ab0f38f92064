"""A rehearsal of the GPU machine on this CPU, the schedule simulator checked against it, and the 1M path's
timeline projected from both (issue 61).

    python -m bench.rehearsal --n 100000                 # -> artifacts/rehearsal/{results.json, *.png}
    python -m bench.rehearsal --n 20000 --rates docs/gpu/h200-2026-11-28.json --project-workers 16

1. host run: N synthetic sentences (bench/scale.py's corpus) through every real stage with stand-in models that take
   no device time: each job's host seconds, from the manifests' timelines.
2. rehearsal: the same mine with stand-ins that also wait, per batch, the time the lent card measured for their job
   (`standin:encoder-384@<sentences/s>`, `standin:shuffle-xx@<target tokens/s>`: pipeline/models/standin.py), and
   that hold the device lease while their job runs (runner.leased_devices = cpu, so the CPU plays the card). Every
   CPU stage is real. Reported: its wall and the device's busy share from the first device job's start to the last
   one's end (goal >= 90%).
3. simulation (pipeline/engine/schedule.py) of the rehearsal: each job's host seconds from (1), its device seconds
   what (2) took beyond them; simulated and real walls should agree within 15%.
4. the 1M path: every stage's host seconds scaled from (1) to 1M sentences and spread over the 1M run's shards, the
   device's seconds from the card's rates at the 1M path's work (bench/gpu/limits.py PATH_1M), one epoch of training
   after the mine, on `--project-workers` workers and one card. Goal: wall <= 1.1x the device's busy time.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from bench.gpu.limits import PATH_1M
from bench.gpu.projection import stage_graph
from bench.scale import STANDIN_SETTINGS, synthetic_corpus
from contramine.pipeline.config import ROOT
from contramine.pipeline.engine.schedule import JobCost, StageCost, Timeline, simulate
from contramine.pipeline.report.timeline import draw_timeline, run_timeline

OUT = ROOT / "artifacts" / "rehearsal"
RATES = ROOT / "docs" / "gpu" / "h200-2026-11-28.json"
ENCODE_ROW, TRANSLATE_ROWS = "encode_bf16_tokens65536", ("generate_ours_tokens_per_s", "generate_static_tokens_per_s")
DEVICE_STAGES = {"embeddings", "pool_embeddings", "scores", "backtranslate"}
TRAIN_ROW = "train_debcse_steps_per_s"


def card_rates(path: Path) -> dict[str, float]:
    """The lent card's measured rates: sentences/s encoded, target tokens/s translated (the best of our loop and
    the static cache), DebCSE steps/s."""
    rows = {r["name"]: r for r in json.loads(Path(path).read_text())["rows"]}
    translate = max((rows[n]["value"] for n in TRANSLATE_ROWS if (rows.get(n) or {}).get("value")), default=None)
    search = rows.get("band_search_d768_bf16_seconds") or rows["band_search_d768_seconds"]
    search_1m = search["value"] * 1_000_000 * 1_000_000 / (search["queries"] * search["base"])
    return {"encode": rows[ENCODE_ROW]["value"], "translate": translate, "train": rows[TRAIN_ROW]["value"],
            "search_1m": search_1m,
            "card": str(json.loads(Path(path).read_text())["machine"].get("gpu") or Path(path).stem)}


def with_rates(settings: list[str], rates: dict[str, float]) -> list[str]:
    """The stand-in settings with the card's rates after each model name."""
    out = []
    for s in settings:
        s = s.replace("standin:encoder-384", f"standin:encoder-384@{rates['encode']:.0f}")
        for lang in ("zh", "de", "en"):
            s = s.replace(f'"standin:shuffle-{lang}"', f'"standin:shuffle-{lang}@{rates["translate"]:.0f}"')
        out.append(s)
    return out


def mine(run: str, corpus: Path, root: Path, sets: list[str]) -> float:
    from contramine.flows.mine import mine_flow

    t0 = time.perf_counter()
    mine_flow(profile="default", run=run, corpus=str(corpus), overrides=sets + [f"run.root={root}"])
    return time.perf_counter() - t0


def job_costs(timeline: Timeline, host: Timeline | None = None) -> dict[str, StageCost]:
    """Per stage, its jobs' costs from a measured timeline; with `host` (the same mine without device time), each
    job's device seconds are what it took beyond its host seconds there."""
    graph, out = stage_graph(), {}
    host_s = {(s.stage, s.job): s.ended - s.began for s in (host.spans if host else [])}
    for stage, after in graph.items():
        jobs = sorted((s for s in timeline.spans if s.stage == stage), key=lambda s: s.job)
        costs = []
        for s in jobs:
            took = s.ended - s.began
            h = host_s.get((stage, s.job), took) if host else took
            costs.append(JobCost(host_s=min(h, took), device_s=max(0.0, took - h) if s.device else 0.0))
        out[stage] = StageCost(after=after, jobs=costs)
    return out


def project_1m(host: Timeline, n: int, rates: dict, workers: int) -> tuple[Timeline, dict]:
    """The 1M path (bench/gpu/projection.py) with each stage's host seconds from this rehearsal's host run, scaled
    by 1M / n; the device's from the card's rates at PATH_1M's work (the search: the card's measured 1M x 1M)."""
    from bench.gpu.projection import project

    measured = {}
    for s in host.spans:
        measured[s.stage] = measured.get(s.stage, 0.0) + (s.ended - s.began) * 1_000_000 / n
    device_s = {"embeddings": PATH_1M["embedded"] / rates["encode"], "scores": PATH_1M["scored"] / rates["encode"],
                "backtranslate": PATH_1M["target_tokens"] / rates["translate"], "neighbours": rates["search_1m"]}
    measured.pop("neighbours", None)  # the search is the card's (its host work here is a CPU search)
    return project(device_s, PATH_1M["train_steps"] / rates["train"], workers, measured)


def project_only(rates: dict, workers: int) -> dict:
    """The 1M projection from make scale's host work at 1M and the card's rates; its picture beside the results."""
    from bench.gpu.projection import project

    device_s = {"embeddings": PATH_1M["embedded"] / rates["encode"], "scores": PATH_1M["scored"] / rates["encode"],
                "backtranslate": PATH_1M["target_tokens"] / rates["translate"], "neighbours": rates["search_1m"]}
    timeline, facts = project(device_s, PATH_1M["train_steps"] / rates["train"], workers)
    draw_timeline(timeline, OUT / f"projection-1m-{workers}-workers.png",
                  f"1M DebCSE path simulated: {workers} workers, one card at {rates['card']}'s rates")
    return {"workers": workers, "card": rates["card"], "hours": round(timeline.wall / 3600, 3),
            "device_busy_hours": round(timeline.device_busy / 3600, 3),
            "wall_over_device_busy": round(facts["wall_over_device_busy"], 3), "device_s": device_s}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--n", type=int, default=100_000, help="sentences (default 100,000)")
    ap.add_argument("--rates", type=Path, default=RATES, help="the lent card's check results (docs/gpu/*.json)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="runner.workers of the two mines")
    ap.add_argument("--project-workers", type=int, default=16, help="workers of the 1M projection (default 16)")
    ap.add_argument("--project-only", action="store_true", help="only the 1M projection, with make scale's host "
                    "work at 1M (bench/gpu/projection.py): no mine")
    args = ap.parse_args(argv)
    rates = card_rates(args.rates)
    OUT.mkdir(parents=True, exist_ok=True)
    if args.project_only:
        print(json.dumps(project_only(rates, args.project_workers), indent=1))
        return
    corpus = synthetic_corpus(args.n, OUT / f"corpus-{args.n}.txt")
    common = ["runner.memo=off", f"runner.workers={args.workers}", "runner.leased_devices=[\"cuda\",\"cpu\"]"]
    root = OUT / "runs"
    mine("warm-up", synthetic_corpus(200, OUT / "corpus-200.txt"), root, STANDIN_SETTINGS + common)  # imports, servers
    host_wall = mine(f"host-{args.n}", corpus, root, STANDIN_SETTINGS + common + ["run.max_shard_rows=0",
                                                                               f"run.shards={2 * args.workers}"])
    real_wall = mine(f"card-{args.n}", corpus, root, with_rates(STANDIN_SETTINGS, rates) + common
                     + ["run.max_shard_rows=0", f"run.shards={2 * args.workers}"])
    host, real = run_timeline(root / f"host-{args.n}"), run_timeline(root / f"card-{args.n}")
    simulated = simulate(job_costs(real, host), workers=args.workers, leases=1)
    projected, facts = project_1m(host, args.n, rates=rates, workers=args.project_workers)
    result = {"date": time.strftime("%Y-%m-%d"), "n": args.n, "workers": args.workers, "card": rates["card"],
              "rates": rates, "host_mine_s": round(host_wall, 1), "rehearsal_mine_s": round(real_wall, 1),
              "rehearsal_wall_s": round(real.wall, 1), "rehearsal_busy_share": round(real.busy_share(), 3),
              "simulated_wall_s": round(simulated.wall, 1),
              "simulated_vs_real": round(simulated.wall / real.wall, 3) if real.wall else None,
              "projection_1m": {k: (round(v, 1) if isinstance(v, float) else v) for k, v in facts.items()
                                if k != "stages"} | {"workers": args.project_workers,
                                                             "hours": round(projected.wall / 3600, 3)}}
    for name, timeline in (("rehearsal", real), ("simulated", simulated), ("projection-1m", projected)):
        draw_timeline(timeline, OUT / f"{name}.png", f"{name} ({args.n:,} sentences)" if name != "projection-1m"
                      else f"1M path, {args.project_workers} workers, one card ({rates['card']})")
    (OUT / "results.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
