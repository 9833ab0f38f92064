"""The shard runner: finds the stages, computes (or reuses) their shards, writes their manifests. It knows no stage
by name: every stage module declares what it reads and writes (spec.py), and `pipeline/stages/__init__.py` says in
which order they run. No Prefect here: flows/ wraps these functions in tasks and flows.

A shard's cache key covers everything its bytes depend on — the content hashes of the input shards it reads, the
config sections it declares, the run seed, the shard layout, its code version (codeversion.py) and the outside
facts it declares — and `run_shard` skips the work when an intact shard with that key is already on disk.
"""
from __future__ import annotations

import functools
import importlib
import time

from pipeline.config import Config
from pipeline.engine.codeversion import code_version
from pipeline.engine.spec import Ctx, Stage
from pipeline.engine.store import Store, combine, file_hash  # noqa: F401  (file_hash: stages' facts use it)
from pipeline.schema import SCHEMAS


@functools.cache
def _load(order: tuple[str, ...]) -> dict[str, Stage]:
    stages: dict[str, Stage] = {}
    for entry in order:
        module = importlib.import_module(entry if "." in entry else f"pipeline.stages.{entry}")
        found = [v for v in vars(module).values() if isinstance(v, Stage) and v.module == module.__name__]
        if len(found) != 1:
            raise ImportError(f"stage module {module.__name__} declares {len(found)} stages (@stage): expected one")
        stage = found[0]
        for table in stage.writes:  # a new stage's own tables join the contract (pipeline/schema.py) here
            if table in stage.schemas:
                SCHEMAS.setdefault(table, stage.schemas[table])
            elif table not in SCHEMAS:
                raise ImportError(f"stage {stage.name} ({module.__name__}) writes `{table}` with no schema: add it "
                                  f"to pipeline/schema.py or declare it with @stage(schemas=...)")
        stages[stage.name] = stage
    return stages


def load_stages() -> dict[str, Stage]:
    """Every stage, in run order (pipeline/stages/__init__.py: ORDER)."""
    from pipeline import stages

    return _load(tuple(stages.ORDER))


def writer(table: str) -> str | None:
    """The stage that writes `table`."""
    return next((s.name for s in load_stages().values() if table in s.writes), None)


def shard_key(stage: Stage, cfg: Config, store: Store, i: int, n: int, facts: str = "") -> str:
    inputs = [f"{t}[{i}]={store.shard_hash(t, i, n)}" for t in stage.reads]
    inputs += [f"{t}[*]={store.table_hash(t, n)}" for t in stage.reads_whole]
    return combine(stage.name, code_version(stage.module), cfg.section_hash(*stage.settings),
                   f"seed={cfg.run.seed}", f"shards={n}", facts, *inputs)


def stage_facts(stage: Stage, cfg: Config) -> str:
    return stage.facts(cfg) if stage.facts else ""


def run_shard(name: str, cfg: Config, i: int, force: bool = False, progress: bool = False) -> dict:
    """Compute (or reuse) shard i of a stage's outputs. Returns a small JSON-able summary."""
    stage, store, n = load_stages()[name], Store(cfg.run.dir), cfg.run.shards
    key = shard_key(stage, cfg, store, i, n, stage_facts(stage, cfg))
    cached = [store.cached_shard(t, i, n, key) for t in stage.writes]
    if not force and all(cached):
        return {"stage": name, "shard": i, "cached": True, "rows": {c.table: c.rows for c in cached}, "seconds": 0.0}
    t0 = time.perf_counter()
    tables = stage(Ctx(cfg, store, i, n, progress))
    seconds = time.perf_counter() - t0
    infos = [store.write_shard(t, i, n, tables[t], key, seconds) for t in stage.writes]
    return {"stage": name, "shard": i, "cached": False, "rows": {x.table: x.rows for x in infos}, "seconds": seconds}


def run_global(name: str, cfg: Config, force: bool = False, progress: bool = False) -> list[dict]:
    """A stage whose one job writes every shard (`one_job`)."""
    stage, store, n = load_stages()[name], Store(cfg.run.dir), cfg.run.shards
    key = shard_key(stage, cfg, store, 0, n, stage_facts(stage, cfg))
    cached = [store.cached_shard(t, i, n, key) for t in stage.writes for i in range(n)]
    if not force and all(cached):
        return [{"stage": name, "shard": c.index, "table": c.table, "cached": True, "rows": c.rows} for c in cached]
    t0 = time.perf_counter()
    tables = stage(Ctx(cfg, store, 0, n, progress))
    seconds = time.perf_counter() - t0
    out = []
    for t, parts in tables.items():
        for i, part in enumerate(parts):
            info = store.write_shard(t, i, n, part, key, seconds / n)
            out.append({"stage": name, "shard": i, "table": t, "cached": False, "rows": info.rows})
    return out


def finish_stage(name: str, cfg: Config, results: list[dict], wall: float) -> dict:
    """Write each output table's manifest: config, inputs, rows, seconds, the stage's own facts. Returns it."""
    stage, store, n = load_stages()[name], Store(cfg.run.dir), cfg.run.shards
    manifest = {
        "stage": name, "config": {s: getattr(cfg, s).model_dump(mode="json") for s in stage.settings},
        "config_hash": cfg.section_hash(*stage.settings), "seed": cfg.run.seed, "code": code_version(stage.module),
        "inputs": {t: store.table_hash(t, n) for t in stage.inputs},
        "rows": {t: sum(store.cached_rows(t, i, n) for i in range(n)) for t in stage.writes},
        "seconds": round(sum(store.shard_seconds(stage.writes[0], i, n) for i in range(n)), 3),
        "wall_seconds_last_run": round(wall, 3),
        "shards_computed": len({r["shard"] for r in results if not r["cached"]}),
        "shards_cached": len({r["shard"] for r in results if r["cached"]}),
        "extra": stage_facts(stage, cfg),
    }
    if stage.manifest:
        manifest.update(stage.manifest(cfg, store, n))
    for t in stage.writes:
        store.finish(t, n, manifest)
    return manifest
