"""How `run_stage` (runner.py) runs a stage's jobs without Prefect: on threads in this process, or on the Dask
cluster of `runner.address` (a local one for `runner.kind = "dask-local"`). Each map takes `jobs_of`' keyword dicts
and returns `call(**job)` of each, in order (`call`: the runner's `run_job_json`, handed in, so this module imports
no runner). The Prefect flows pass their own map (flows/mine.py).

On Dask the card is a worker resource (Dask's own admission, in the scheduler): a job whose plan puts a model on a
leased device kind asks for `{<kind>: 1}` (`job_resources`), so it waits in the scheduler, not on a worker's
thread. A local cluster adds one device worker that offers `runner.device_leases` of each leased kind, and its
CPU workers offer one `slot` each, which every other job asks for: a CPU job never takes the device worker's
thread, and a device job never takes a CPU worker's. On a cluster of one's own, the card's worker is started with
the resource (`dask worker tcp://scheduler:8786 --nthreads 1 --resources "cuda=1"`), and a stage whose jobs need a
resource no worker offers stops in one line (`require_resource`) instead of waiting forever.
"""
from __future__ import annotations

import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

from contramine.pipeline.engine.leases import leased_device
from contramine.pipeline.errors import ExpectedError

CPU_SLOT = "slot"  # the resource a local cluster's CPU workers offer one of, and each job off the device asks for
DEVICE_WORKER = "device"  # the local cluster's worker that offers the leased devices

# scheduler address -> the local cluster this process started there: its TLS certificates live in this process'
# memory only, so a client of this process finds them by address (runner.address is all a stage flow is handed)
_LOCAL_CLUSTERS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def cluster_security(address: str | None):
    """The `distributed.Security` of the local cluster this process started at `address`, or None (a cluster of
    the user's own, `runner.kind = "dask"`: its security comes from Dask's own config)."""
    cluster = _LOCAL_CLUSTERS.get(address) if address else None
    return cluster.security if cluster is not None else None


def _apply(call: Callable, job: dict):
    return call(**job)


def thread_map(workers: int, call: Callable) -> Callable[[list[dict]], list]:
    def run(jobs: list[dict]) -> list:
        if workers == 1 or len(jobs) == 1:
            return [call(**j) for j in jobs]
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(lambda j: call(**j), jobs))
    return run


class MissingResource(ExpectedError):
    """No worker of the Dask cluster offers the resource a stage's jobs ask for: they would wait forever."""


def job_resources(cfg, plan: dict, address: str | None = None) -> dict | None:
    """The Dask resources one job under `plan` asks for: {<device kind>: 1} on a leased device; else a CPU slot on
    a local cluster of this process (its CPU workers offer them), nothing on a cluster of one's own (its workers
    offer no slots)."""
    device = leased_device(plan, cfg.runner.leased_devices)
    if device is not None:
        return {device: 1}
    local = cfg.runner.kind == "dask-local" or (address is not None and address in _LOCAL_CLUSTERS)
    return {CPU_SLOT: 1} if local else None


def require_resource(stage: str, cfg, plan: dict) -> None:
    """On a Dask cluster of one's own, one line when no worker offers the device resource the stage's jobs ask for
    (the scheduler would hold them forever). A local cluster of this process always offers it."""
    device = leased_device(plan, cfg.runner.leased_devices)
    if cfg.runner.kind != "dask" or device is None or cfg.runner.address in _LOCAL_CLUSTERS:
        return
    from distributed import Client  # distributed: optional (the dask extra); runner.kind = dask only

    # never the process' default client: prefect-dask's runner of a stage flow starting beside this one (a graph's
    # stages start together) takes the default client when there is one, and this one closes under it ("No global
    # client found and no address provided", seen once in test_cluster); prefect-dask's own clients are not default
    with Client(cfg.runner.address, security=cluster_security(cfg.runner.address), set_as_default=False) as client:
        workers = client.scheduler_info(n_workers=-1)["workers"].values()
        if not any(w.get("resources", {}).get(device, 0) >= 1 for w in workers):
            raise MissingResource(
                f"stage {stage}: no worker of the Dask cluster at {cfg.runner.address} offers the resource "
                f"{device!r} its jobs ask for (the run's plan puts its model on {device}, a leased device: "
                f"runner.leased_devices); start the card's worker with `dask worker {cfg.runner.address} "
                f"--nthreads 1 --resources \"{device}=1\"` (docs/scale-and-clusters.md)")


def dask_map(address: str, call: Callable, cfg=None) -> Callable[[list[dict]], list]:
    """`call(**job)` of each job on the cluster at `address`; with the run's `cfg`, each job asks for its worker
    resources (`job_resources`: a stage's jobs share one plan)."""
    def run(jobs: list[dict]) -> list:
        from distributed import Client  # distributed: optional (the dask extra); runner.kind = dask only

        resources = job_resources(cfg, jobs[0]["plan"], address) if cfg is not None and jobs else None
        with Client(address, security=cluster_security(address), set_as_default=False) as client:
            return client.gather(client.map(_apply, [call] * len(jobs), jobs, pure=False, resources=resources))
    return run


async def _stop_http(server) -> None:
    server.http_server.stop()  # on the cluster's loop, where tornado's server lives


def local_cluster(workers: int, leased: Sequence[str] = (), leases: int = 1, **_):
    """A LocalCluster of one-thread worker processes that may start processes of their own: spaCy's
    `negate.n_process` pool, which a daemonic Dask worker could not start. It speaks TLS only, with a certificate
    made for it (`Security.temporary()`, held in this process' memory and passed to its workers) that every peer
    must present: another account of this host can reach 127.0.0.1's ports, and a Dask client runs code on the
    workers as the miner.

    Its `workers` CPU workers offer one CPU slot each; with `leased` device kinds, one more worker (named
    "device") offers `leases` of each, with as many threads: the card's jobs run there, one process that loads
    the model once, and never on a CPU worker's slot."""
    import dask  # dask, distributed: optional (the dask extra); runner.kind = dask-local only
    from distributed import LocalCluster
    from distributed.security import Security

    # no HTTP routes on the scheduler or the workers: distributed starts their HTTP servers whatever the dashboard
    # setting, plain http on 127.0.0.1 beside the TLS ports, where another account read the workers' logs and call
    # stacks (the scheduler's own, in this process, is also stopped once it runs)
    with dask.config.set({"distributed.worker.daemon": False, "distributed.scheduler.http.routes": [],
                          "distributed.worker.http.routes": []}):
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                               host="127.0.0.1", security=Security.temporary(), resources={CPU_SLOT: 1})
        if cluster.scheduler.http_server is not None:
            cluster.sync(_stop_http, cluster.scheduler)
        if leased:
            options = {**cluster.new_spec["options"], "nthreads": leases * len(leased),
                       "resources": {kind: leases for kind in leased}}
            cluster.worker_spec[DEVICE_WORKER] = {"cls": cluster.new_spec["cls"], "options": options}
            cluster.scale(len(cluster.worker_spec))  # starts the workers of the spec that are not running
            cluster.wait_for_workers(len(cluster.worker_spec))
    _LOCAL_CLUSTERS[cluster.scheduler_address] = cluster
    return cluster


def runner_cluster(runner):
    """The local cluster `runner` (a config's runner section) asks for."""
    return local_cluster(runner.workers, runner.leased_devices, runner.device_leases)


def default_map(cfg, call: Callable) -> Callable[[list[dict]], list]:
    """The map `runner.kind` asks for: threads, the cluster at runner.address, or a local cluster for the call."""
    if cfg.runner.kind == "threads":
        return thread_map(cfg.runner.workers, call)
    if cfg.runner.kind == "dask":
        return dask_map(cfg.runner.address, call, cfg)

    def run(jobs: list[dict]) -> list:
        with runner_cluster(cfg.runner) as cluster:
            return dask_map(cluster.scheduler_address, call, cfg)(jobs)
    return run
