"""The shard runner: finds the stages, computes (or reuses) their shards, writes their manifests. It knows no stage
by name: every stage module declares what it reads and writes (spec.py), and `pipeline/stages/__init__.py` says in
which order they run. No Prefect here: flows/ wraps these functions in tasks and flows.

A shard's cache key covers everything its bytes depend on — the content hashes of the input shards it reads, the
config sections it declares (less their execution settings), the run seed, the shard layout (which follows the
corpus only), its code version (codeversion.py), the outside facts it declares and its resources as resolved for
the run (resources.py) — and `run_shard` skips the work when an intact shard with that key is already on disk.
The plan is resolved once, where the flow runs (`resolve_plan`), and handed to every shard task.

`run_stage` drives a whole stage (resolve, map the jobs, finish): the library runs its steps, and an orchestrator
(the Prefect flows in flows/mine.py, or none: tests, benches, a GPU machine without Prefect) only maps them.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from contextlib import nullcontext
from typing import Callable

import pyarrow

from contramine.pipeline.config import Config
from contramine.pipeline.engine import resources
from contramine.pipeline.codeversion import code_version
from contramine.pipeline.engine.discovery import load_stages
from contramine.pipeline.storage.lock import run_lock
from contramine.pipeline.engine.maps import default_map, require_resource
from contramine.pipeline.cores import share_cores
from contramine.pipeline.engine.leases import device_lease, leased_device
from contramine.pipeline.memo.index import release_indexes
from contramine.pipeline.memo.run import memo_manifest
from contramine.pipeline.engine.spec import Ctx, Stage
from contramine.pipeline.storage.store import Store, combine


PYARROW = pyarrow.__version__  # the Parquet writer shapes every shard's bytes: another version recomputes them


def shard_key(stage: Stage, cfg: Config, store: Store, i: int, n: int, facts: str = "") -> str:
    inputs = [f"{t}[{i}]={store.shard_hash(t, i, n)}" for t in stage.reads]
    inputs += [f"{t}[*]={store.table_hash(t, n)}" for t in stage.reads_whole]
    return combine(stage.name, code_version(stage.module), cfg.section_hash(*stage.settings),
                   f"seed={cfg.run.seed}", f"shards={n}", facts, f"pyarrow={PYARROW}", *inputs)


def resolve_plan(name: str, cfg: Config, known: dict | None = None) -> dict:
    """The stage's resources resolved for this run ({resource: facts}), in the order the stage declares them; those
    already in `known` (resolved for an earlier stage of the same run) are taken as they are, and each resolve sees
    the run's decisions so far (`known` and the stage's earlier resources): every stage of a run sees one decision
    (e.g. `scores`' positives read the `chains` decision `backtranslate` took)."""
    stage, known = load_stages()[name], known or {}
    store, n = Store(cfg.run.dir), cfg.run.shards
    plan: dict = {}
    for r in stage.resources:
        plan[r.name] = known[r.name] if r.name in known else r.resolve(cfg, store, n, {**known, **plan})
    return plan


def stage_facts(stage: Stage, cfg: Config, plan: dict | None = None) -> str:
    """The stage's declared facts and its resolved resources, as one string of its key."""
    facts = stage.facts(cfg) if stage.facts else ""
    return facts + (f";resources={resources.plan_key(plan)}" if plan else "")


def _plan(name: str, cfg: Config, plan: dict | None) -> dict:
    stage = load_stages()[name]
    if plan is None or any(r.name not in plan for r in stage.resources):
        plan = resolve_plan(name, cfg, plan)  # a shard run on its own (tests, `python -c`): resolved here
    return {r.name: plan[r.name] for r in stage.resources}


def run_job(name: str, cfg: Config, i: int = 0, force: bool = False, progress: bool = False,
            plan: dict | None = None) -> list[dict]:
    """One job of a stage under the run's `plan`: shard i, or every shard for a `one_job` stage. Reuses what is on
    disk under the same key, else computes and writes it. Returns one small JSON-able row per table shard."""
    stage, store, n = load_stages()[name], Store(cfg.run.dir), cfg.run.shards
    plan = _plan(name, cfg, plan)
    key = shard_key(stage, cfg, store, i, n, stage_facts(stage, cfg, plan))
    shards = range(n) if stage.one_job else (i,)
    cached = [store.cached_shard(t, j, n, key) for t in stage.writes for j in shards]
    if not force and all(cached):
        return [{"stage": name, "shard": c.index, "table": c.table, "cached": True, "rows": c.rows, "seconds": 0.0,
                 "entry": c.entry()} for c in cached if c is not None]  # all are (all(cached))
    # a job on a leased device holds the device's lease and no worker slot (it waits on the card; the slots stay with
    # the CPU stages, so the card is never idle for want of a slot); any other job holds one of the slots. On Dask
    # the scheduler admits the device's jobs by its worker resource (maps.py) before they get here; the flock is
    # kept there too, as the one rule across processes the scheduler does not see: two runs (two clusters, or a
    # cluster and a threads run) on one machine, or several workers of one machine offering its one card. Where the
    # scheduler is the only user of the card it never waits (lease_wait_s ~ 0 in the timeline).
    device = leased_device(plan, cfg.runner.leased_devices)
    with device_lease(device, cfg.runner.device_leases) as (waited, held_since), \
            (job_slot(cfg) if device is None else nullcontext()), resources.running(name):
        began = time.time()  # the job runs from here: its lease and its slot are held (what it waited: lease_wait_s)
        share_cores(cfg.runner.workers)  # torch's and FAISS' threads: the cores shared by the jobs running at once
        release_indexes(keep=resources.running_stages())  # other stages' memo lookup indexes: not needed here now
        t0 = time.perf_counter()
        ctx = Ctx(cfg, store, i, n, progress, stage, plan, force=force)
        tables = stage(ctx)
        seconds = time.perf_counter() - t0
        held = [round(held_since, 3), round(time.time(), 3)] if held_since is not None else None
    memo = {m: (c.counts.computed, c.counts.reused, c.counts.audited)  # on the job's first row only
            for m, c in ctx.memos.items()}
    # when the job ran, where, and when it held the device: the manifest's timeline (`make report` draws it)
    timeline = {"job": i, "began": round(began, 3), "ended": round(time.time(), 3), "worker": job_worker(cfg),
                "lease_wait_s": round(waited, 3), "device_held": held}
    out: list[dict] = []
    # a one_job stage killed between its shards' writes left some of them whole under this key: they are what this
    # computation writes (same key, same bytes), so they are kept, not rewritten (a shard once whole stays untouched)
    kept = {} if force else {(c.table, c.index): c for c in cached if c is not None}
    for t in stage.writes:
        for j, part in zip(shards, tables[t] if stage.one_job else [tables[t]]):
            info = kept.get((t, j)) or store.write_shard(t, j, n, part, key, seconds / len(shards))
            out.append({"stage": name, "shard": j, "table": t, "cached": False, "rows": info.rows, "seconds": seconds,
                        "entry": info.entry(), "memo": {} if out else memo, "timeline": {} if out else timeline})
    timeline["ended"] = round(time.time(), 3)  # the shards are written too
    return out


def job_worker(cfg: Config) -> str:
    """Where a job ran, for the timeline: the Dask worker, or on threads the process and the thread (the Gantt chart
    draws each apart)."""
    where = resources.process_name()
    return f"{where}, thread {threading.current_thread().name}" if cfg.runner.kind == "threads" else where


_SLOTS: dict[int, threading.BoundedSemaphore] = {}
_SLOTS_LOCK = threading.Lock()


def job_slot(cfg: Config):
    """One of the process' `runner.workers` job slots on threads: the stages of a graph-scheduled mine each run
    their jobs on a pool of their own, and together they run at most `runner.workers` jobs at once. A Dask
    cluster's workers bound it there (nullcontext)."""
    if cfg.runner.kind != "threads":
        return nullcontext()
    with _SLOTS_LOCK:
        return _SLOTS.setdefault(cfg.runner.workers, threading.BoundedSemaphore(cfg.runner.workers))


def run_shard(name: str, cfg: Config, i: int, force: bool = False, progress: bool = False,
              plan: dict | None = None) -> dict:
    """Compute (or reuse) shard i of a stage's outputs under the run's `plan`: {stage, shard, cached, rows: {table:
    rows}, seconds}."""
    rows = run_job(name, cfg, i, force, progress, plan)
    return {"stage": name, "shard": i, "cached": rows[0]["cached"], "rows": {r["table"]: r["rows"] for r in rows},
            "seconds": rows[0]["seconds"]}


def run_global(name: str, cfg: Config, force: bool = False, progress: bool = False,
               plan: dict | None = None) -> list[dict]:
    """A stage whose one job writes every shard (`one_job`)."""
    return run_job(name, cfg, 0, force, progress, plan)


def jobs_of(name: str, cfg: Config, force: bool, plan: dict) -> list[dict]:
    """The stage's jobs as keyword arguments of `run_job`, the config as JSON (what a task or worker is sent)."""
    stage, cfg_json = load_stages()[name], cfg.model_dump_json()
    progress = cfg.runner.kind == "threads"  # a bar per job, labelled with its shard: several at once on threads
    return [dict(name=name, cfg_json=cfg_json, i=i, force=force, progress=progress, plan=plan)
            for i in range(1 if stage.one_job else cfg.run.shards)]


def run_job_json(name: str, cfg_json: str, i: int, force: bool, progress: bool, plan: dict) -> list[dict]:
    """`run_job` with the config as JSON: what every map (threads, Dask, Prefect tasks) calls."""
    return run_job(name, Config.model_validate_json(cfg_json), i, force, progress, plan)


def run_stage(name: str, cfg: Config, force: bool = False, plan: dict | None = None,
              map: Callable[[list[dict]], list[list[dict]]] | None = None,
              log: Callable[[str], None] | None = None) -> dict:
    """A whole stage: resolve its resources here, once (those in `plan` are the run's earlier decisions), run
    every job under that plan with `map` (default: `maps.default_map`: threads, or the Dask cluster of
    runner.address, with no Prefect), then write its manifest. `map(jobs) -> results` takes `jobs_of`'s keyword
    dicts and returns `run_job_json(**job)` of each, in order: the Prefect flows pass their task map
    (flows/mine.py), as datatrove's executors run the steps and an orchestrator only maps them. Returns the
    manifest."""
    log = log or logging.getLogger("contramine.runner").info
    t0 = time.perf_counter()
    with run_lock(cfg.run.dir, f"stage {name}"):  # one writer per run folder (its flow may hold it already)
        plan = resolve_plan(name, cfg, plan)
        require_resource(name, cfg, plan)  # on a cluster of one's own: one line, not jobs waiting forever
        for resource, facts in plan.items():  # what this run decided for the stage (in the key and the manifest too)
            log(f"{name}: resource {resource} = {json.dumps(facts, sort_keys=True)}")
        jobs = jobs_of(name, cfg, force, plan)
        results = [r for rows in (map or default_map(cfg, run_job_json))(jobs) for r in rows]
        manifest = finish_stage(name, cfg, results, time.perf_counter() - t0, plan)
    log(f"{name}: {manifest['shards_computed']} shards computed, {manifest['shards_cached']} reused; "
        f"rows {manifest['rows']}{memo_line(manifest)}; {time.perf_counter() - t0:.1f}s")
    return manifest


def memo_line(manifest: dict) -> str:
    """"; encode: 16 rows computed, 1,984 from the memo" for each memo of the stage (its state when off)."""
    return "".join(f"; {m}: {e['rows_computed']:,} rows computed, {e['rows_reused']:,} from the memo"
                   + (f" ({e['rows_audited']:,} of them audited)" if e.get("rows_audited") else "")
                   + ("" if e["state"] == "on" else f" (memo {e['state']})")
                   for m, e in (manifest.get("memo") or {}).items())


def staged_files(stage: Stage, n: int, results: list[dict]) -> dict[str, list[dict]]:
    """{table: the shard files its jobs wrote or reused, in shard order}: what the commit will list."""
    files: dict[str, list] = {t: [None] * n for t in stage.writes}
    for r in results:
        files[r["table"]][r["shard"]] = r["entry"]
    gaps = {t: [i for i, e in enumerate(f) if e is None] for t, f in files.items()}
    if any(gaps.values()):
        raise RuntimeError(f"stage {stage.name}: no result for shards {gaps}: nothing committed")
    return files


def finish_stage(name: str, cfg: Config, results: list[dict], wall: float, plan: dict | None = None) -> dict:
    """Release what the stage loaded in this process; commit each output table: its manifest (config, inputs,
    rows, seconds, the stage's own facts and resolved resources, and the file list) replaces the last one. Returns
    the manifest."""
    resources.release(name)
    release_indexes(keep=resources.running_stages())  # the stage's memo lookup indexes here (16 bytes a row): freed
    stage, store, n = load_stages()[name], Store(cfg.run.dir, cfg.runner.keep_replaced_s), cfg.run.shards
    plan = _plan(name, cfg, plan)
    store.staged.update(staged_files(stage, n, results))  # the stage's own manifest functions see the new shards
    manifest = {
        "stage": name, "config": {s: getattr(cfg, s).model_dump(mode="json") for s in stage.settings},
        "config_hash": cfg.section_hash(*stage.settings), "seed": cfg.run.seed, "code": code_version(stage.module),
        "inputs": {t: store.table_hash(t, n) for t in stage.inputs},
        "rows": {t: sum(store.cached_rows(t, i, n) for i in range(n)) for t in stage.writes},
        "seconds": round(sum(store.shard_seconds(stage.writes[0], i, n) for i in range(n)), 3),
        "wall_seconds_last_run": round(wall, 3),
        "shards_computed": len({r["shard"] for r in results if not r["cached"]}),
        "shards_cached": len({r["shard"] for r in results if r["cached"]}),
        "extra": stage.facts(cfg) if stage.facts else "",
        "resources": json.loads(resources.plan_key(plan)),
        "timeline": {"began": round(time.time() - wall, 3), "ended": round(time.time(), 3),
                     "jobs": sorted((r["timeline"] for r in results if r.get("timeline")), key=lambda j: j["job"])},
    }
    if stage.memos:
        manifest["memo"] = memo_manifest(stage, cfg, plan, results)
    if stage.manifest:
        manifest.update(stage.manifest(cfg, store, n, plan))
    for t in stage.writes:
        store.finish(t, n, manifest, store.staged[t])
    return manifest
