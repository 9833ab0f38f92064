"""The mine's schedule, simulated: the graph `mine` runs (flows/mine.py: a stage starts once the stages it reads
from have committed; its jobs run on the runner's W workers; a job whose model is on a leased device holds one of
its leases, pipeline/engine/leases.py), replayed over job costs instead of run.

    stages = {"sentences": StageCost(after=(), jobs=[JobCost(host_s=3.0)]),
              "embeddings": StageCost(after=("sentences",), jobs=[JobCost(host_s=0.4, device_s=2.1)] * 8), ...}
    timeline = simulate(stages, workers=16, leases=1)
    timeline.wall, timeline.device_busy, timeline.busy_share()

What it is for: the 1M path's timeline on a machine we do not have (16 cores, one card), fed with per-job costs
measured here (the host work, from a rehearsal's manifests) and the card's measured rates (the device work); the
rehearsal (bench/rehearsal.py) runs the same schedule for real on this machine and checks the simulation against it.
The rule it replays is list scheduling, as the runner's pools do: whenever a worker is free, the first job (stage
in run order, then job number) whose stage is ready starts; a job on the device needs a free lease and no worker
slot (the runner's rule: a job that holds the card is mostly waiting on it). A job holds its lease for its whole
duration, host work included, as the runner's lease does.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field


DEVICE_LANE = -1  # the worker number of a job that holds the device (it takes no worker slot)


@dataclass(frozen=True)
class JobCost:
    host_s: float = 0.0     # the job's work on its worker's core: the stage's own code, reading, writing
    device_s: float = 0.0   # its work on the device (0: a job that takes no lease)

    @property
    def seconds(self) -> float:
        return self.host_s + self.device_s


@dataclass(frozen=True)
class StageCost:
    after: tuple[str, ...]          # the stages that write what this one reads
    jobs: list[JobCost]
    start_s: float = 0.0            # what the stage's flow pays before its first job (resolving its plan)


@dataclass
class Span:
    stage: str
    job: int
    worker: int
    began: float
    ended: float
    device: bool


@dataclass
class Timeline:
    spans: list[Span] = field(default_factory=list)

    @property
    def wall(self) -> float:
        return max((s.ended for s in self.spans), default=0.0)

    @property
    def device_busy(self) -> float:
        """Seconds the device was leased (the union of the device jobs' spans)."""
        return _union([(s.began, s.ended) for s in self.spans if s.device])

    def busy_share(self) -> float:
        """The device's busy share from the first device job's start to the last one's end."""
        device = [s for s in self.spans if s.device]
        if not device:
            return 0.0
        window = max(s.ended for s in device) - min(s.began for s in device)
        return self.device_busy / window if window > 0 else 1.0

    def stage_spans(self) -> dict[str, tuple[float, float]]:
        out: dict[str, tuple[float, float]] = {}
        for s in self.spans:
            a, b = out.get(s.stage, (s.began, s.ended))
            out[s.stage] = (min(a, s.began), max(b, s.ended))
        return out


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def simulate(stages: dict[str, StageCost], workers: int, leases: int = 1) -> Timeline:
    """The timeline of `stages` (in run order: every stage after those in its `after`) on `workers` workers and a
    device with `leases` leases."""
    if workers < 1 or leases < 1:
        raise ValueError(f"workers and leases must be at least 1 (got {workers}, {leases})")
    order = list(stages)
    for name, stage in stages.items():
        unknown = [a for a in stage.after if a not in stages]
        if unknown:
            raise ValueError(f"stage {name} waits for {unknown}, which are not in the schedule")
    timeline = Timeline()
    done_jobs = {name: 0 for name in order}
    ready_at: dict[str, float] = {}   # stage -> when its inputs were committed (and its flow had started)
    next_job = {name: 0 for name in order}
    free_workers = list(range(workers))
    free_leases = leases
    running: list[tuple[float, int, str, int, bool]] = []  # (ends, worker, stage, job, device) heap
    now = 0.0

    def release_ready(t: float) -> None:
        for name in order:
            if name not in ready_at and all(done_jobs[a] == len(stages[a].jobs) and a in ready_at
                                            for a in stages[name].after):
                ready_at[name] = t + stages[name].start_s
                if not stages[name].jobs:
                    done_jobs[name] = 0  # a stage with no job is committed when it starts

    release_ready(0.0)
    while True:
        started = True
        while started:  # start the first startable job, again and again
            started = False
            for name in order:
                if name not in ready_at or ready_at[name] > now or next_job[name] >= len(stages[name].jobs):
                    continue
                job = stages[name].jobs[next_job[name]]
                device = job.device_s > 0
                # a device job needs a lease, and no worker slot (the runner's rule: it waits on the card, and the
                # slots stay with the CPU stages); any other job needs a worker
                if (device and free_leases == 0) or (not device and not free_workers):
                    continue
                worker = DEVICE_LANE if device else free_workers.pop(0)
                free_leases -= device
                heapq.heappush(running, (now + job.seconds, worker, name, next_job[name], device))
                timeline.spans.append(Span(name, next_job[name], worker, now, now + job.seconds, device))
                next_job[name] += 1
                started = True
                break
        pending = [ready_at[n] for n in order if n in ready_at and ready_at[n] > now
                   and next_job[n] < len(stages[n].jobs)]
        if not running and not pending:
            break
        if running and (not pending or running[0][0] <= min(pending)):
            ends, worker, name, job_i, device = heapq.heappop(running)
            now = ends
            if worker != DEVICE_LANE:
                free_workers.append(worker)
                free_workers.sort()
            free_leases += device
            done_jobs[name] += 1
            release_ready(now)
        else:
            now = min(pending)
    unfinished = [n for n in order if done_jobs[n] < len(stages[n].jobs)]
    if unfinished:
        raise ValueError(f"stages never started (a circle in `after`?): {unfinished}")
    return timeline
