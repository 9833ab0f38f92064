"""The 1M path's timeline (issue 61): the mine's graph (every stage, its host work included) and one epoch of DebCSE
training, simulated on the GPU machine's W workers and one card (pipeline/engine/schedule.py), from the card's
measured rates and the host work measured on a CPU.

The host work per stage at 1M is `make scale N=1000000`'s (docs/benchmarks-history.md, "Scale simulation with the
defaults": 2 Dask workers on 2 cores, stand-in models; core-seconds = 2 x its wall seconds), unless a rehearsal's
measurement is given. The device work: the 1M path's sentences and candidates encoded, its target tokens
translated and its band search at the card's measured rates; training after the mine. A stage's work is spread over
the run's shards (`SHARDS_1M` jobs; one for the stages that write every shard in one job).
"""
from __future__ import annotations

# core-seconds of each stage's own work at 1M sentences (make scale, 2026-11-25/26: wall x 2 workers)
HOST_CORE_S_1M = {"sentences": 14.5, "pool_sentences": 0.1, "embeddings": 2 * 53.7, "pool_embeddings": 2 * 13.5,
                  "neighbours": 0.0, "noise": 2 * 158.5, "backtranslate": 2 * 750.9, "negate": 2 * 941.5,
                  "scores": 2 * 237.6, "ipw": 2 * 334.8, "pairs": 2 * 43.3, "paraphrases": 2 * 25.3,
                  "triplets": 2 * 18.6}
ONE_JOB = {"sentences", "pool_sentences", "pool_embeddings"}  # stages whose one job writes every shard
SHARDS_1M = 64


def stage_graph() -> dict[str, tuple[str, ...]]:
    """stage -> the stages that write what it reads, in run order (the pipeline's own declarations)."""
    from contramine.pipeline.engine.discovery import load_stages, upstream

    return upstream(load_stages())


def project(device_s: dict[str, float], train_s: float, workers: int, host_core_s: dict[str, float] | None = None,
            shards: int = SHARDS_1M):
    """(timeline, facts) of the 1M path: `device_s` per stage (seconds on the card), `train_s` the epoch's."""
    from contramine.pipeline.engine.schedule import JobCost, StageCost, simulate

    host = HOST_CORE_S_1M | (host_core_s or {})
    graph, stages = stage_graph(), {}
    for stage, after in graph.items():
        jobs = 1 if stage in ONE_JOB else shards
        stages[stage] = StageCost(after, [JobCost(host.get(stage, 0.0) / jobs, device_s.get(stage, 0.0) / jobs)] * jobs)
    stages["train"] = StageCost(tuple(graph), [JobCost(0.0, train_s)])
    timeline = simulate(stages, workers=max(1, workers), leases=1)
    spans = timeline.stage_spans()
    facts = {"wall_s": timeline.wall, "device_busy_s": timeline.device_busy,
             "wall_over_device_busy": timeline.wall / timeline.device_busy if timeline.device_busy else None,
             "stages": {s: [round(a, 1), round(b, 1)] for s, (a, b) in spans.items()}}
    return timeline, facts
