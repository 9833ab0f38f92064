"""A run's timeline: when each stage's jobs ran, on which worker, and when the device was held, read from the
manifests (the runner records every job: pipeline/engine/runner.py), and drawn as a Gantt chart (`make report`,
bench/rehearsal.py). The same picture draws a simulated timeline (pipeline/engine/schedule.py)."""
from __future__ import annotations

import math
from pathlib import Path

from contramine.pipeline.engine.schedule import Span, Timeline
from contramine.pipeline.storage.tables import RunTables


def _job_record(j) -> bool:
    """Whether `j` is a job's record as the runner writes it (a hand-edited one with a string `began`, or none, is
    left out of the picture, never a traceback in `report`)."""
    def real(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return isinstance(j, dict) and real(j.get("began")) and real(j.get("ended")) and isinstance(j.get("job"), int)


def run_timeline(run_dir: Path) -> Timeline:
    """The last run of every stage of the run folder as one timeline (seconds from the first job's start). A stage
    whose jobs were all reused has no span; a manifest from before timelines has none either."""
    tables, jobs = RunTables(run_dir), []  # (stage, its job's record)
    seen: set[str] = set()
    for table in tables.names():
        man = tables.manifest(table) or {}
        stage, timeline = man.get("stage"), man.get("timeline")
        if not isinstance(timeline, dict) or not isinstance(stage, str) or stage in seen:
            continue
        seen.add(stage)
        listed = timeline.get("jobs")
        jobs += [(stage, j) for j in (listed if isinstance(listed, list) else []) if _job_record(j)]
    if not jobs:
        return Timeline()
    t0 = min(j["began"] for _, j in jobs)
    workers: dict[str, int] = {}
    spans = []
    for stage, j in jobs:
        worker = workers.setdefault(str(j.get("worker")), len(workers))
        spans.append(Span(stage, int(j["job"]), worker, j["began"] - t0, j["ended"] - t0, bool(j.get("device_held"))))
    return Timeline(sorted(spans, key=lambda s: (s.began, s.stage, s.job)))


def draw_gantt(ax, timeline: Timeline) -> None:
    """A Gantt chart on `ax`: a row per stage, a bar per job (its colour the worker; hatched where it held the
    device)."""
    import matplotlib.pyplot as plt  # matplotlib: only where a picture is drawn

    stages = list(dict.fromkeys(s.stage for s in timeline.spans))
    colours = plt.get_cmap("tab20")
    for s in timeline.spans:
        y = stages.index(s.stage)
        ax.barh(y, s.ended - s.began, left=s.began, height=0.8, color=colours(s.worker % 20),
                edgecolor="black" if s.device else "none", hatch="//" if s.device else None, linewidth=0.5)
    ax.set_yticks(range(len(stages)), labels=stages)
    ax.invert_yaxis()


def caption(timeline: Timeline) -> str:
    busy = timeline.busy_share()
    return (f"wall {timeline.wall:,.1f} s, device busy {timeline.device_busy:,.1f} s"
            + (f" ({busy:.0%} of the window from its first job to its last)" if busy else ""))


def draw_timeline(timeline: Timeline, out: Path, title: str) -> Path:
    """The Gantt chart as a PNG, its caption in the title."""
    import matplotlib  # matplotlib: only where a picture is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len({s.stage for s in timeline.spans})
    with matplotlib.rc_context({"text.parse_math": False}):  # stage names as written, never TeX
        fig, ax = plt.subplots(figsize=(10, 0.45 * n + 1.5))
        draw_gantt(ax, timeline)
        ax.set_xlabel("seconds from the first job (bar colour: worker; hatched: the job held the device)")
        ax.set_title(f"{title}\n{caption(timeline)}", fontsize=10)
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
        plt.close(fig)
    return out
