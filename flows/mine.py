"""Prefect flows: one flow per stage (each deployable on its own) and `mine`, which composes them.

The flows hold no logic: each stage flow hands the engine's stage driver (`contramine.pipeline.engine.runner.run_stage`) its
task map (`prefect_map`); the work, the plan and the caching (verified shard keys, pipeline/storage/store.py) live in
pipeline/. Tasks pass paths and settings, never tables, so they run the same on threads or on a Dask cluster.
"""
from __future__ import annotations

import re
from contextlib import ExitStack, nullcontext
from typing import Annotated, Any

from . import env  # Prefect settings before Prefect
from prefect import Flow, get_run_logger, task, unmapped
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner

from pydantic import Field

from contramine.pipeline.config import Config, configure  # noqa: F401  (configure: what flow callers build a config with)
from contramine.pipeline.config import refuse_secrets, secret_pattern
from contramine.pipeline.config.loading import secret_settings, secrets_given
from contramine.pipeline.storage.lock import run_lock
from contramine.pipeline.engine.discovery import stages_for, upstream
from contramine.pipeline.engine.maps import cluster_security, job_resources, local_cluster, runner_cluster
from contramine.pipeline.engine.runner import load_stages, run_job_json, run_stage
from contramine.pipeline.hints import command

env.prompt_local_retries()  # a locked SQLite server on this machine is asked again in ms, not seconds (env.py)


# A flow's overrides are its run's parameters: Prefect keeps them in its database, shows them in its UI and sends
# them to its API server. So a secret setting (runner.memo_key) in them is refused, each way in: the parameter's
# schema makes Prefect's server refuse a deployment's run before it is stored (Prefect enforces deployments'
# parameter schemas by default); SecretsStayOut refuses a deployment and masks a call's before Prefect records
# them; the flow's body refuses the run in one line (and clears the record of a run that came another way: a
# deployment that does not enforce its schema). The secret travels in the environment of the process that runs the
# flow (pipeline/config/loading.py: secrets_to_environment).
SECRET_ADVICE = (f"a secret setting: set {', '.join('$' + v for v in secret_settings().values())} in the "
                 f"environment of the worker that runs the flow instead")
Override = Annotated[str, Field(json_schema_extra={"not": {"pattern": secret_pattern(), "description": SECRET_ADVICE}})]


class SecretsStayOut(Flow):
    """A flow whose `overrides` never carry a secret setting into Prefect: the run the engine starts for a call (or
    a copy's call) is recorded with the secret's value masked, before its body refuses it; a deployment
    (`to_deployment`, and `serve` and `deploy` through it) refuses one in one line."""

    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        overrides = parameters.get("overrides")
        if isinstance(overrides, list) and secrets_given(overrides):  # the body refuses it: the record never holds it
            masked = [o.partition("=")[0] + "=**********" if secrets_given([o]) else o for o in overrides]
            parameters = {**parameters, "overrides": masked}
        return super().serialize_parameters(parameters)

    def with_options(self, **options):  # type: ignore[override]  # Prefect's own options, passed on as they are
        copy = super().with_options(**options)
        copy.__class__ = SecretsStayOut  # Prefect builds a plain Flow: the copy refuses as this one does
        return copy

    def to_deployment(self, *args, **kwargs):  # type: ignore[override]
        refuse_secrets((kwargs.get("parameters") or {}).get("overrides"), "the deployment's parameters")
        return super().to_deployment(*args, **kwargs)

    async def ato_deployment(self, *args, **kwargs):  # type: ignore[override]
        refuse_secrets((kwargs.get("parameters") or {}).get("overrides"), "the deployment's parameters")
        return await super().ato_deployment(*args, **kwargs)


def secrets_stay_out(**options: Any):
    """`@flow(**options)`, as a SecretsStayOut."""
    return lambda fn: SecretsStayOut(fn, **options)


def refuse_secrets_in_run(overrides: list[str] | None) -> None:
    """The flow body's check: a run whose parameters carry a secret setting stops in one line, never naming its
    value, and its record keeps its parameters without it (what Prefect's API and UI show from then on)."""
    if secrets_given(overrides):
        from prefect.client.orchestration import get_client
        from prefect.context import FlowRunContext

        context = FlowRunContext.get()
        if context is not None and context.flow_run is not None:
            kept = [o for o in overrides or [] if not secrets_given([o])]
            with get_client(sync_client=True) as client:
                client.update_flow_run(context.flow_run.id, parameters={**context.flow_run.parameters,
                                                                        "overrides": kept})
    refuse_secrets(overrides, "the flow run's parameters")


@task(name="shard", cache_policy=NO_CACHE, task_run_name="{name}[{i}]")
def shard_task(name: str, cfg_json: str, i: int, force: bool, progress: bool, plan: dict) -> list[dict]:
    return run_job_json(name, cfg_json, i, force, progress, plan)


def prefect_map(jobs: list[dict]) -> list[list[dict]]:
    """The stage's jobs as Prefect task runs, on the flow's task runner (threads or Dask). On Dask each asks for its
    worker resources (maps.job_resources: the card's, or a local cluster's CPU slot), by Dask's annotation, which
    prefect-dask's runner passes on (a context variable: the stage flows that run at once on other threads keep
    their own)."""
    keys = ("name", "cfg_json", "force", "progress", "plan")
    cfg = Config.model_validate_json(jobs[0]["cfg_json"])
    annotations = nullcontext()
    if cfg.runner.kind != "threads" and (resources := job_resources(cfg, jobs[0]["plan"], cfg.runner.address)):
        import dask  # dask: optional (the dask extra); a Dask runner only

        annotations = dask.annotate(resources=resources)
    with annotations:
        futures = shard_task.map(**{k: unmapped(jobs[0][k]) for k in keys}, i=[j["i"] for j in jobs])
    return [f.result() for f in futures]


def task_runner(cfg: Config):
    if cfg.runner.kind == "threads":
        return ThreadPoolTaskRunner(max_workers=cfg.runner.workers)
    from prefect_dask import DaskTaskRunner

    if cfg.runner.kind == "dask":  # the local cluster mine_flow started (TLS, its certificate in memory), or the user's
        security = cluster_security(cfg.runner.address)
        return DaskTaskRunner(address=cfg.runner.address, client_kwargs={"security": security} if security else None)
    return DaskTaskRunner(cluster_class=local_cluster, cluster_kwargs={
        "workers": cfg.runner.workers, "leased": cfg.runner.leased_devices, "leases": cfg.runner.device_leases})


def execute_stage(stage: str, cfg: Config, force: bool = False, plan: dict | None = None) -> dict:
    """The engine's stage driver (`run_stage`) with Prefect's task map and logger; the manifest as an artifact."""
    manifest = run_stage(stage, cfg, force, plan, map=prefect_map, log=get_run_logger().info)
    publish_stage(stage, cfg, manifest)
    return manifest


def artifact_key(run: str, what: str) -> str:
    """Prefect artifact keys allow lower-case letters, digits and dashes only."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", f"{run}-{what}".lower())).strip("-")


def publish_stage(stage: str, cfg: Config, manifest: dict) -> None:
    """A table artifact per stage run (Prefect UI > Artifacts, and on the flow run): what it wrote and reused."""
    create_table_artifact(
        key=artifact_key(cfg.run.name, stage),
        table=[{"table": t, "rows": n, "shards computed": manifest["shards_computed"],
                "shards reused": manifest["shards_cached"], "seconds": manifest["wall_seconds_last_run"],
                **{f"{m}: rows {k}": e[f"rows_{k}"] for m, e in (manifest.get("memo") or {}).items()
                   for k in ("computed", "reused")}}
               for t, n in manifest["rows"].items()],
        description=f"stage `{stage}` of run `{cfg.run.name}` ({cfg.run.dir})")


def make_stage_flow(stage: str):
    @secrets_stay_out(name=stage, log_prints=True)
    def stage_flow(profile: str = "default", run: str | None = None, corpus: str | None = None,
                   overrides: list[Override] | None = None, force: bool = False, plan: dict | None = None) -> dict:
        refuse_secrets_in_run(overrides)
        cfg = configure(profile, run, corpus, overrides)
        return execute_stage(stage, cfg, force, plan)

    stage_flow.__name__ = f"{stage}_flow"
    return stage_flow


STAGE_FLOWS = {s: make_stage_flow(s) for s in load_stages()}
# Module attributes so that deployments can name them (flows/mine.py:neighbours_flow); prefect.yaml is generated
# from the same stage list (python -m contramine.flows.deployments).
globals().update({f"{s}_flow": f for s, f in STAGE_FLOWS.items()})


# A stage flow's copy with a runner's task runner, made once per (stage, runner): `with_options` builds a new Flow,
# whose parameter schema pydantic generates again (~15 ms of CPU, 14 times a mine); each run duplicates the copy's
# task runner (Prefect's flow engine), so one copy serves every run with those settings.
_RUNNER_FLOWS: dict[tuple, Flow] = {}


def runner_key(cfg: Config) -> tuple:
    """What `task_runner(cfg)` is built from; a local cluster's by its Security object itself (held by the key, so a
    later cluster at the same address, with its own certificate, never matches)."""
    r = cfg.runner
    security = cluster_security(r.address) if r.kind == "dask" else None
    return r.kind, r.workers, r.address, tuple(r.leased_devices), r.device_leases, security


def stage_flow_for(stage: str, cfg: Config) -> Flow:
    """The stage flow with the task runner the config asks for."""
    if stage not in STAGE_FLOWS:  # a stage added to the order after this module was imported
        STAGE_FLOWS[stage] = make_stage_flow(stage)
    key = (stage, STAGE_FLOWS[stage], runner_key(cfg))
    if (flow := _RUNNER_FLOWS.get(key)) is None:
        flow = _RUNNER_FLOWS[key] = STAGE_FLOWS[stage].with_options(task_runner=task_runner(cfg))
    return flow


def run_stage_flow(stage: str, cfg: Config, **params) -> dict:
    """A stage flow, run with the task runner the config asks for."""
    return stage_flow_for(stage, cfg)(**params)


STAGE_THREADS = 32  # more than there are stages: every stage whose inputs are committed can start


def stages_to_mine(cfg: Config) -> list[str]:
    """Every stage; with mine.for (`mine --for <objective> ...`), those that write what the objectives train on and
    export, with the stages those read from."""
    if cfg.mine.for_objective is None:
        return list(load_stages())
    from contramine.trainer.objectives import get_objective  # the trainer's objectives: only for `--for`

    return stages_for([t for name in cfg.mine.for_objective for t in get_objective(name).mined_tables()])


@task(name="stage", cache_policy=NO_CACHE, task_run_name="{stage}")
def stage_task(stage: str, cfg: Config, params: dict, plan: dict, writers: list[dict]) -> dict:
    """One stage flow (a subflow of `mine`), started once the stages it reads from have committed: `writers` are
    their results, whose plans it inherits (so every stage of the run sees one decision, e.g. which chains run)."""
    for done in writers:
        plan = {**plan, **done["plan"]}
    manifest = run_stage_flow(stage, cfg, **params, plan=plan)
    return {"rows": manifest["rows"], "plan": {**plan, **manifest["resources"]}}


@secrets_stay_out(name="mine", log_prints=True, task_runner=ThreadPoolTaskRunner(max_workers=STAGE_THREADS))
def mine_flow(profile: str = "default", run: str | None = None, corpus: str | None = None,
              overrides: list[Override] | None = None, force: list[str] | None = None, plan: dict | None = None,
              only: list[str] | None = None) -> dict:
    """The stages (`only` those, else `stages_to_mine`) as a graph: a stage starts as soon as the stages that write
    what it reads have committed, and stages with no path between them run at the same time (Prefect task futures
    with `wait_for`, on the flow's thread pool; each stage flow runs its shards on the runner the config asks for).
    `force` names stages to recompute even when their shards are intact. `plan`: the run's resources as resolved
    so far (the CLI's preflight). A failed stage is one error naming it; the stages that do not depend on it finish
    and keep their work."""
    refuse_secrets_in_run(overrides)
    cfg = configure(profile, run, corpus, overrides)
    only = stages_to_mine(cfg) if only is None else only
    overrides, plan, rows = list(overrides or []), dict(plan or {}), {}
    stages = load_stages()
    after = upstream(stages)  # stage -> the stages that write what it reads
    with ExitStack() as stack:
        stack.enter_context(run_lock(cfg.run.dir, command("mine")))  # one writer per run folder, the whole run long
        if cfg.runner.kind == "dask-local":  # one local cluster for all stages, not one per stage
            cluster = stack.enter_context(runner_cluster(cfg.runner))
            overrides += ["runner.kind=dask", f"runner.address={cluster.scheduler_address}"]
            cfg = configure(profile, run, corpus, overrides)
        params = dict(profile=profile, run=run, corpus=corpus, overrides=overrides)
        futures: dict = {}
        for s in [s for s in stages if s in only]:  # run order: every writer of what `s` reads comes before it
            writers = [futures[w] for w in after[s] if w in futures]
            futures[s] = stage_task.with_options(task_run_name=s).submit(
                s, cfg, {**params, "force": s in (force or [])}, plan, writers, wait_for=writers)
        failed, not_done = [], set[str]()
        for s, future in futures.items():
            future.wait()
            if future.state.is_completed():
                rows[s] = future.result()["rows"]
                continue
            if not not_done & set(after[s]):  # the root cause, not a stage that waited on it
                failed.append(s)
            not_done.add(s)
        if failed:
            first = futures[failed[0]]
            first.result()  # raises the stage's own error (one line at the CLI)
    from contramine.pipeline.report import headline  # DuckDB: imported when a whole mine ends, not by every stage flow

    create_markdown_artifact(key=artifact_key(cfg.run.name, "mine"), markdown=headline(cfg.run.dir),
                             description=f"what run `{cfg.run.name}` mined")
    return rows
