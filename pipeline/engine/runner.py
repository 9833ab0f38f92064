"""The shard runner: finds the stages, computes (or reuses) their shards, writes their manifests. It knows no stage
by name: every stage module declares what it reads and writes (spec.py), and `pipeline/stages/__init__.py` says in
which order they run. No Prefect here: flows/ wraps these functions in tasks and flows.

A shard's cache key covers everything its bytes depend on — the content hashes of the input shards it reads, the
config sections it declares (less their execution settings), the run seed, the shard layout (which follows the
corpus only), its code version (codeversion.py), the outside facts it declares and its resources as resolved for
the run (resources.py) — and `run_shard` skips the work when an intact shard with that key is already on disk.
The plan is resolved once, where the flow runs (`resolve_plan`), and handed to every shard task.
"""
from __future__ import annotations

import json
import time

from pipeline.config import Config
from pipeline.engine import resources
from pipeline.engine.codeversion import code_version
from pipeline.engine.discovery import load_stages, writer  # noqa: F401  (writer: re-exported for the CLI)
from pipeline.engine.spec import Ctx, Stage
from pipeline.engine.store import Store, combine, file_hash  # noqa: F401  (file_hash: stages' facts use it)


def shard_key(stage: Stage, cfg: Config, store: Store, i: int, n: int, facts: str = "") -> str:
    inputs = [f"{t}[{i}]={store.shard_hash(t, i, n)}" for t in stage.reads]
    inputs += [f"{t}[*]={store.table_hash(t, n)}" for t in stage.reads_whole]
    return combine(stage.name, code_version(stage.module), cfg.section_hash(*stage.settings),
                   f"seed={cfg.run.seed}", f"shards={n}", facts, *inputs)


def resolve_plan(name: str, cfg: Config, known: dict | None = None) -> dict:
    """The stage's resources resolved for this run ({resource: facts}); those already in `known` (resolved for an
    earlier stage of the same run) are taken as they are, so every stage of a run sees one decision."""
    stage, known = load_stages()[name], known or {}
    store, n = Store(cfg.run.dir), cfg.run.shards
    return {r.name: known[r.name] if r.name in known else r.resolve(cfg, store, n) for r in stage.resources}


def stage_facts(stage: Stage, cfg: Config, plan: dict | None = None) -> str:
    """The stage's declared facts and its resolved resources, as one string of its key."""
    facts = stage.facts(cfg) if stage.facts else ""
    return facts + (f";resources={resources.plan_key(plan)}" if plan else "")


def _plan(name: str, cfg: Config, plan: dict | None) -> dict:
    stage = load_stages()[name]
    if plan is None or any(r.name not in plan for r in stage.resources):
        plan = resolve_plan(name, cfg, plan)  # a shard run on its own (tests, `python -c`): resolved here
    return {r.name: plan[r.name] for r in stage.resources}


def run_shard(name: str, cfg: Config, i: int, force: bool = False, progress: bool = False,
              plan: dict | None = None) -> dict:
    """Compute (or reuse) shard i of a stage's outputs under the run's `plan`. Returns a small JSON-able summary."""
    stage, store, n = load_stages()[name], Store(cfg.run.dir), cfg.run.shards
    plan = _plan(name, cfg, plan)
    key = shard_key(stage, cfg, store, i, n, stage_facts(stage, cfg, plan))
    cached = [store.cached_shard(t, i, n, key) for t in stage.writes]
    if not force and all(cached):
        return {"stage": name, "shard": i, "cached": True, "rows": {c.table: c.rows for c in cached}, "seconds": 0.0}
    resources.enter(name)
    t0 = time.perf_counter()
    tables = stage(Ctx(cfg, store, i, n, progress, stage, plan))
    seconds = time.perf_counter() - t0
    infos = [store.write_shard(t, i, n, tables[t], key, seconds) for t in stage.writes]
    return {"stage": name, "shard": i, "cached": False, "rows": {x.table: x.rows for x in infos}, "seconds": seconds}


def run_global(name: str, cfg: Config, force: bool = False, progress: bool = False,
               plan: dict | None = None) -> list[dict]:
    """A stage whose one job writes every shard (`one_job`)."""
    stage, store, n = load_stages()[name], Store(cfg.run.dir), cfg.run.shards
    plan = _plan(name, cfg, plan)
    key = shard_key(stage, cfg, store, 0, n, stage_facts(stage, cfg, plan))
    cached = [store.cached_shard(t, i, n, key) for t in stage.writes for i in range(n)]
    if not force and all(cached):
        return [{"stage": name, "shard": c.index, "table": c.table, "cached": True, "rows": c.rows} for c in cached]
    resources.enter(name)
    t0 = time.perf_counter()
    tables = stage(Ctx(cfg, store, 0, n, progress, stage, plan))
    seconds = time.perf_counter() - t0
    out = []
    for t, parts in tables.items():
        for i, part in enumerate(parts):
            info = store.write_shard(t, i, n, part, key, seconds / n)
            out.append({"stage": name, "shard": i, "table": t, "cached": False, "rows": info.rows})
    return out


def finish_stage(name: str, cfg: Config, results: list[dict], wall: float, plan: dict | None = None) -> dict:
    """Release what the stage loaded in this process; write each output table's manifest: config, inputs, rows,
    seconds, the stage's own facts and resolved resources. Returns it."""
    resources.release(name)
    stage, store, n = load_stages()[name], Store(cfg.run.dir), cfg.run.shards
    plan = _plan(name, cfg, plan)
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
    }
    if stage.manifest:
        manifest.update(stage.manifest(cfg, store, n, plan))
    for t in stage.writes:
        store.finish(t, n, manifest)
    return manifest
