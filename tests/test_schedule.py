"""The schedule simulator (pipeline/engine/schedule.py) against schedules worked out by hand, the cores rule, and the
timeline picture."""
from __future__ import annotations

import pytest

from contramine.pipeline import cores
from contramine.pipeline.engine.schedule import JobCost, StageCost, simulate


def test_a_chain_waits_and_independent_stages_share_the_workers():
    # a (2 jobs of 1 s) -> b (1 job of 2 s); c (2 jobs of 1 s) is independent; 2 workers:
    # t=0: a0, a1 | t=1: b0 (till 3), c0 (till 2) | t=2: c1 (till 3) -> wall 3
    stages = {"a": StageCost((), [JobCost(1.0)] * 2), "b": StageCost(("a",), [JobCost(2.0)]),
              "c": StageCost((), [JobCost(1.0)] * 2)}
    t = simulate(stages, workers=2)
    spans = {(s.stage, s.job): (s.began, s.ended, s.worker) for s in t.spans}
    assert spans[("a", 0)][:2] == (0.0, 1.0) and spans[("a", 1)][:2] == (0.0, 1.0)
    assert spans[("b", 0)][:2] == (1.0, 3.0) and spans[("c", 0)][:2] == (1.0, 2.0) and spans[("c", 1)][:2] == (2.0, 3.0)
    assert t.wall == 3.0
    assert simulate(stages, workers=1).wall == 6.0  # one worker: the sum
    assert simulate(stages, workers=8).wall == 3.0  # the chain's length bounds it


def test_one_lease_serialises_the_device_jobs_and_the_cpu_jobs_fill_the_gaps():
    # two device stages of 2 jobs x (1 s host + 1 s device) each, one lease, 4 workers; a CPU stage of 4 x 1 s
    stages = {"gpu1": StageCost((), [JobCost(1.0, 1.0)] * 2), "gpu2": StageCost((), [JobCost(1.0, 1.0)] * 2),
              "cpu": StageCost((), [JobCost(1.0)] * 4)}
    t = simulate(stages, workers=4, leases=1)
    device = sorted((s.began, s.ended) for s in t.spans if s.device)
    assert device == [(0.0, 2.0), (2.0, 4.0), (4.0, 6.0), (6.0, 8.0)]  # never two at once, never idle
    assert t.device_busy == 8.0 and t.busy_share() == 1.0 and t.wall == 8.0
    cpu = sorted(s.began for s in t.spans if s.stage == "cpu")
    assert cpu == [0.0, 0.0, 0.0, 0.0]  # a device job takes no worker: the four CPU jobs start at once
    assert simulate(stages, workers=1, leases=1).wall == 8.0  # one worker: the CPU jobs run beside the card
    assert simulate(stages, workers=4, leases=2).wall == 4.0


def test_a_circle_or_an_unknown_stage_is_refused():
    with pytest.raises(ValueError, match="not in the schedule"):
        simulate({"a": StageCost(("x",), [JobCost(1.0)])}, workers=1)
    with pytest.raises(ValueError, match="never started"):
        simulate({"a": StageCost(("b",), [JobCost(1.0)]), "b": StageCost(("a",), [JobCost(1.0)])}, workers=1)


def test_workers_auto_is_the_cores_this_process_may_use(monkeypatch):
    from contramine.pipeline.config.mining import RunnerCfg

    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda _: {0, 1, 2, 3, 4, 5})
    monkeypatch.setattr(cores, "Path", lambda p: _Quota("200000 100000"))  # a cgroup quota of 2 CPUs
    assert cores.available_cores() == 2 and RunnerCfg().workers == 2 and RunnerCfg(workers=5).workers == 5
    monkeypatch.setattr(cores, "Path", lambda p: _Quota("max 100000"))
    assert cores.available_cores() == 6 and cores.threads_per_worker(4) == 1 and cores.threads_per_worker(3) == 2


class _Quota:
    def __init__(self, text):
        self.text = text

    def read_text(self):
        return self.text


def test_the_timeline_picture_is_drawn(tmp_path):
    from contramine.pipeline.report.timeline import draw_timeline

    t = simulate({"a": StageCost((), [JobCost(1.0, 0.5)] * 3), "b": StageCost(("a",), [JobCost(2.0)])}, workers=2)
    out = draw_timeline(t, tmp_path / "t.png", "a $\\undefinedmacro{x}$ title")  # no mathtext: drawn as text
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5_000


def test_a_job_outside_dask_names_its_process_without_importing_dask():
    """The timeline's worker of a job on threads: its process, found without importing distributed (~1.7 s of
    imports that would land inside the stage's wall)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; from contramine.pipeline.engine.resources import process_name; name = process_name(); "
            "print(name, 'distributed' in sys.modules, 'dask' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.stdout.startswith("process ") and out.stdout.split()[-2:] == ["False", "False"]


def test_a_library_half_imported_by_another_job_is_left_alone(monkeypatch):
    """share_cores beside a job whose thread is still importing faiss: sys.modules holds it without its functions
    yet; the job goes on (a test_docs mine failed here with AttributeError)."""
    import sys
    import types

    monkeypatch.setitem(sys.modules, "faiss", types.ModuleType("faiss"))  # as `import faiss` leaves it mid-way
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    cores.share_cores(2)
