"""`mine` as a graph: stages with no path between them run at the same time, each records when its jobs ran (the
manifest's timeline), a failed stage is named while its independent siblings keep their work, and a job whose plan
puts a model on a leased device holds one of the device's leases."""
from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from contramine.flows.mine import mine_flow
from contramine.pipeline.engine import leases
from contramine.pipeline.engine.discovery import load_stages
from contramine.pipeline.errors import StageError
from contramine.pipeline.storage.tables import RunTables
from mining_helpers import table_hashes

pytestmark = pytest.mark.usefixtures("prefect_harness")

STANDIN = ["encoder.model=standin:encoder-32", "neighbours.pool_size=8", "noise.n_variants=2", "run.shards=2",
           "backtranslate.chains=[]"]


def _corpus(small_corpus, tmp_path, n=60):
    corpus = tmp_path / f"c{n}.txt"
    corpus.write_text("".join(small_corpus.read_text(encoding="utf-8").splitlines(keepends=True)[:n]),
                      encoding="utf-8")
    return corpus


def _spans(run_dir) -> dict[str, tuple[float, float]]:
    tables = RunTables(run_dir)
    out = {}
    for name, stage in load_stages().items():
        timeline = tables.manifest(stage.writes[0])["timeline"]
        out[name] = (timeline["began"], timeline["ended"])
    return out


def test_independent_stages_overlap_and_the_tables_equal_a_run_one_stage_at_a_time(small_corpus, tmp_path,
                                                                                 monkeypatch):
    """negate and neighbours read only sentences / embeddings: their stage flows run at the same time. Each job of
    one waits (up to two minutes) until a job of the other has started, so a scheduler that ran them one after the
    other fails here; the tables equal those of the same mine with one stage at a time (a one-thread stage pool)."""
    corpus = _corpus(small_corpus, tmp_path)
    stages = load_stages()
    started = {"negate": threading.Event(), "neighbours": threading.Event()}
    for name, other in (("negate", "neighbours"), ("neighbours", "negate")):
        inner = stages[name].compute

        def meet(ctx, inner=inner, name=name, other=other):
            started[name].set()
            assert started[other].wait(120), f"{other} never ran beside {name}"
            return inner(ctx)

        monkeypatch.setitem(stages, name, dataclasses.replace(stages[name], compute=meet))
    # eight job slots: the two stages' four jobs never wait for a slot
    sets = STANDIN + [f"run.root={tmp_path}", "runner.workers=8"]
    mine_flow(profile="default", run="graph", corpus=str(corpus), overrides=sets)
    spans = _spans(tmp_path / "graph")
    (a0, a1), (b0, b1) = spans["negate"], spans["neighbours"]
    assert max(a0, b0) < min(a1, b1), spans  # the two intervals overlap in the recorded timeline
    assert spans["sentences"][1] <= min(a0, spans["embeddings"][0]) + 0.5  # nothing starts before what it reads
    monkeypatch.setitem(stages, "negate", dataclasses.replace(stages["negate"], compute=_inner(stages["negate"])))
    monkeypatch.setitem(stages, "neighbours", dataclasses.replace(stages["neighbours"],
                                                                  compute=_inner(stages["neighbours"])))

    import contramine.flows.mine as mine_module

    monkeypatch.setattr(mine_module, "STAGE_THREADS", 1)
    one = mine_module.mine_flow.with_options(task_runner=mine_module.ThreadPoolTaskRunner(max_workers=1))
    one(profile="default", run="line", corpus=str(corpus), overrides=sets)
    assert table_hashes(tmp_path / "graph") == table_hashes(tmp_path / "line")


def _inner(stage):
    return stage.compute.__defaults__[0]  # the compute `meet` wraps


def test_a_failed_stage_is_named_and_its_independent_siblings_finish(small_corpus, tmp_path, monkeypatch):
    corpus = _corpus(small_corpus, tmp_path, 30)
    stages = load_stages()

    def broken(ctx):
        raise StageError("negate broke on purpose")

    monkeypatch.setitem(stages, "negate", dataclasses.replace(stages["negate"], compute=broken))
    with pytest.raises(StageError, match="negate broke on purpose"):
        mine_flow(profile="default", run="fail", corpus=str(corpus), overrides=STANDIN + [f"run.root={tmp_path}"])
    tables = RunTables(tmp_path / "fail")
    have = set(tables.names())
    assert {"sentences", "embeddings", "neighbours", "variants"} <= have  # siblings of negate committed
    assert "negations" not in have and "triplets" not in have  # negate's table, and what reads it, never written


def test_a_device_lease_admits_as_many_jobs_as_it_has_slots(tmp_path, monkeypatch):
    """Three threads asking for a one-slot lease hold it one at a time; with two slots, two at once. An unleased
    device (the CPU by default) takes no lease at all."""
    monkeypatch.setattr(leases.tempfile, "gettempdir", lambda: str(tmp_path))

    def peak(slots: int) -> int:
        inside, most, lock = [0], [0], threading.Lock()

        def job():
            with leases.device_lease("cuda", slots):
                with lock:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                time.sleep(0.3)
                with lock:
                    inside[0] -= 1

        threads = [threading.Thread(target=job) for _ in range(3)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        return most[0]

    assert peak(1) == 1 and peak(2) == 2
    assert leases.leased_device({"encoder": {"device": "cuda"}}, ["cuda"]) == "cuda"
    assert leases.leased_device({"encoder": {"device": "cpu"}}, ["cuda"]) is None
    assert leases.leased_device({}, ["cuda", "cpu"]) is None  # a stage that declares no model
    assert (tmp_path / f"contramine-leases-{__import__('os').getuid()}").stat().st_mode & 0o777 == 0o700


def test_the_timeline_records_who_held_the_device(small_corpus, tmp_path, monkeypatch):
    """With the CPU leased (runner.leased_devices), every job of a stage with a model records when it held the
    lease; the stages without one record none; every job records the thread it ran on."""
    monkeypatch.setattr(leases.tempfile, "gettempdir", lambda: str(tmp_path))
    corpus = _corpus(small_corpus, tmp_path, 30)
    mine_flow(profile="default", run="lease", corpus=str(corpus),
              overrides=STANDIN + [f"run.root={tmp_path}", "runner.leased_devices=[\"cuda\",\"cpu\"]"])
    tables = RunTables(tmp_path / "lease")
    jobs = {name: tables.manifest(stage.writes[0])["timeline"]["jobs"] for name, stage in load_stages().items()}
    assert all(j["device_held"] for j in jobs["embeddings"]) and jobs["embeddings"]
    assert not any(j["device_held"] for j in jobs["sentences"])
    held = sorted(tuple(j["device_held"]) for js in jobs.values() for j in js if j["device_held"])
    assert all(a[1] <= b[0] + 1e-3 for a, b in zip(held, held[1:])), held  # one lease: never two at once
    # on threads each job names its thread, so the Gantt chart draws the workers apart
    workers = {j["worker"] for js in jobs.values() for j in js}
    assert all(", thread " in w for w in workers) and len(workers) >= 2, workers
