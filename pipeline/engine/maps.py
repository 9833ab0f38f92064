"""How `run_stage` (runner.py) runs a stage's jobs without Prefect: on threads in this process, or on the Dask
cluster of `runner.address` (a local one for `runner.kind = "dask-local"`). Each map takes `jobs_of`' keyword dicts
and returns `call(**job)` of each, in order (`call`: the runner's `run_job_json`, handed in, so this module imports
no runner). The Prefect flows pass their own map (flows/mine.py)."""
from __future__ import annotations

import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

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


def dask_map(address: str, call: Callable) -> Callable[[list[dict]], list]:
    def run(jobs: list[dict]) -> list:
        from distributed import Client  # distributed: optional (the dask extra); runner.kind = dask only

        with Client(address, security=cluster_security(address)) as client:
            return client.gather(client.map(_apply, [call] * len(jobs), jobs, pure=False))
    return run


def local_cluster(workers: int, **_):
    """A LocalCluster of one-thread worker processes that may start processes of their own: spaCy's
    `negate.n_process` pool, which a daemonic Dask worker could not start. It speaks TLS only, with a certificate
    made for it (`Security.temporary()`, held in this process' memory and passed to its workers) that every peer
    must present: another account of this host can reach 127.0.0.1's ports, and a Dask client runs code on the
    workers as the miner."""
    import dask  # dask, distributed: optional (the dask extra); runner.kind = dask-local only
    from distributed import LocalCluster
    from distributed.security import Security

    with dask.config.set({"distributed.worker.daemon": False}):
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                               host="127.0.0.1", security=Security.temporary())
    _LOCAL_CLUSTERS[cluster.scheduler_address] = cluster
    return cluster


def default_map(cfg, call: Callable) -> Callable[[list[dict]], list]:
    """The map `runner.kind` asks for: threads, the cluster at runner.address, or a local cluster for the call."""
    if cfg.runner.kind == "threads":
        return thread_map(cfg.runner.workers, call)
    if cfg.runner.kind == "dask":
        return dask_map(cfg.runner.address, call)

    def run(jobs: list[dict]) -> list:
        with local_cluster(cfg.runner.workers) as cluster:
            return dask_map(cluster.scheduler_address, call)(jobs)
    return run
