"""Prefect flows: one flow per stage (each deployable on its own) and `mine`, which composes them.

The flows hold no logic: each stage flow maps `shard_task` over the shards and records the manifest; the work
and the caching (verified shard keys, see pipeline/store.py) live in pipeline/. Tasks pass paths and settings,
never tables, so they run the same on threads or on a Dask cluster.
"""
from __future__ import annotations

import json
import re
import time
from contextlib import ExitStack

from . import env  # noqa: F401  (Prefect settings before Prefect)
from prefect import flow, get_run_logger, task, unmapped
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner

from pipeline.config import Config, configure  # noqa: F401  (configure: what flow callers build a config with)
from pipeline.engine.runner import finish_stage, load_stages, resolve_plan, run_global, run_shard


@task(name="shard", cache_policy=NO_CACHE, task_run_name="{stage}[{i}]")
def shard_task(stage: str, cfg_json: str, i: int, force: bool, progress: bool, plan: dict) -> dict:
    return run_shard(stage, Config.model_validate_json(cfg_json), i, force, progress, plan)


@task(name="global", cache_policy=NO_CACHE, task_run_name="{stage}")
def global_task(stage: str, cfg_json: str, force: bool, progress: bool, plan: dict) -> list[dict]:
    return run_global(stage, Config.model_validate_json(cfg_json), force, progress, plan)


def task_runner(cfg: Config):
    if cfg.runner.kind == "threads":
        return ThreadPoolTaskRunner(max_workers=cfg.runner.workers)
    from prefect_dask import DaskTaskRunner

    if cfg.runner.kind == "dask":
        return DaskTaskRunner(address=cfg.runner.address)
    return DaskTaskRunner(cluster_class=local_cluster, cluster_kwargs={"workers": cfg.runner.workers})


def local_cluster(workers: int, **_):
    """A LocalCluster of one-thread worker processes that may start processes of their own: spaCy's
    `negate.n_process` pool, which a daemonic Dask worker could not start."""
    import dask
    from distributed import LocalCluster

    with dask.config.set({"distributed.worker.daemon": False}):
        return LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)


def execute_stage(stage: str, cfg: Config, force: bool = False, plan: dict | None = None) -> dict:
    """Resolve the stage's resources here, once (those in `plan` are the run's earlier decisions), run every shard
    under that plan (cached ones are verified and skipped), then write its manifest."""
    log = get_run_logger()
    cfg_json, progress = cfg.model_dump_json(), cfg.runner.workers == 1 and cfg.runner.kind == "threads"
    t0 = time.perf_counter()
    plan = resolve_plan(stage, cfg, plan)
    for name, facts in plan.items():  # what this run decided for the stage (in the key and the manifest too)
        log.info(f"{stage}: resource {name} = {json.dumps(facts, sort_keys=True)}")
    if load_stages()[stage].one_job:
        results = global_task(stage, cfg_json, force, progress, plan)
    else:
        futures = shard_task.map(stage, unmapped(cfg_json), list(range(cfg.run.shards)), unmapped(force),
                                 unmapped(progress), unmapped(plan))
        results = [f.result() for f in futures]
    manifest = finish_stage(stage, cfg, results, time.perf_counter() - t0, plan)
    publish_stage(stage, cfg, manifest)
    log.info(f"{stage}: {manifest['shards_computed']} shards computed, {manifest['shards_cached']} reused; "
             f"rows {manifest['rows']}; {time.perf_counter() - t0:.1f}s")
    return manifest


def artifact_key(run: str, what: str) -> str:
    """Prefect artifact keys allow lower-case letters, digits and dashes only."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", f"{run}-{what}".lower())).strip("-")


def publish_stage(stage: str, cfg: Config, manifest: dict) -> None:
    """A table artifact per stage run (Prefect UI > Artifacts, and on the flow run): what it wrote and reused."""
    create_table_artifact(
        key=artifact_key(cfg.run.name, stage),
        table=[{"table": t, "rows": n, "shards computed": manifest["shards_computed"],
                "shards reused": manifest["shards_cached"], "seconds": manifest["wall_seconds_last_run"]}
               for t, n in manifest["rows"].items()],
        description=f"stage `{stage}` of run `{cfg.run.name}` ({cfg.run.dir})")


def make_stage_flow(stage: str):
    @flow(name=stage, log_prints=True)
    def stage_flow(profile: str = "default", run: str | None = None, corpus: str | None = None,
                   overrides: list[str] | None = None, force: bool = False, plan: dict | None = None) -> dict:
        cfg = configure(profile, run, corpus, overrides)
        return execute_stage(stage, cfg, force, plan)

    stage_flow.__name__ = f"{stage}_flow"
    return stage_flow


STAGE_FLOWS = {s: make_stage_flow(s) for s in load_stages()}
# Module attributes so that deployments can name them (flows/mine.py:neighbours_flow); prefect.yaml is generated
# from the same stage list (python -m flows.deployments).
globals().update({f"{s}_flow": f for s, f in STAGE_FLOWS.items()})


def run_stage_flow(stage: str, cfg: Config, **params) -> dict:
    """A stage flow with the task runner the config asks for."""
    if stage not in STAGE_FLOWS:  # a stage added to the order after this module was imported
        STAGE_FLOWS[stage] = make_stage_flow(stage)
    return STAGE_FLOWS[stage].with_options(task_runner=task_runner(cfg))(**params)


@flow(name="mine", log_prints=True)
def mine_flow(profile: str = "default", run: str | None = None, corpus: str | None = None,
              overrides: list[str] | None = None, force: list[str] | None = None, plan: dict | None = None) -> dict:
    """Every stage in order; `force` names stages to recompute even when their shards are intact. `plan`: the
    run's resources as resolved so far (the CLI's preflight); each stage adds what it resolves, so every stage of
    the run sees one decision (e.g. which translation chains run)."""
    cfg = configure(profile, run, corpus, overrides)
    overrides, plan, rows = list(overrides or []), dict(plan or {}), {}
    with ExitStack() as stack:
        if cfg.runner.kind == "dask-local":  # one local cluster for all stages, not one per stage
            cluster = stack.enter_context(local_cluster(cfg.runner.workers))
            overrides += ["runner.kind=dask", f"runner.address={cluster.scheduler_address}"]
            cfg = configure(profile, run, corpus, overrides)
        for s in load_stages():
            manifest = run_stage_flow(s, cfg, profile=profile, run=run, corpus=corpus, overrides=overrides,
                                      force=s in (force or []), plan=plan)
            rows[s] = manifest["rows"]
            plan.update(manifest["resources"])
    from pipeline.report import headline  # matplotlib: imported when a whole mine ends, not by every stage flow

    create_markdown_artifact(key=artifact_key(cfg.run.name, "mine"), markdown=headline(cfg.run.dir),
                             description=f"what run `{cfg.run.name}` mined")
    return rows
