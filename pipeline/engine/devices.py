"""Which GPU a process uses. With a Dask cluster of one worker per GPU on one machine, each worker takes its own
device (the encoder, the translator and the FAISS index alike):

- a worker started with its own CUDA_VISIBLE_DEVICES uses device 0 of what it sees: dask-cuda sets one per
  worker with that worker's GPU listed first, and a worker that sees a single GPU has no other. (A list of several
  GPUs outside dask-cuda is what a user exported for the whole machine: then the rule below applies.)
- otherwise worker w uses device w mod n_gpus, w being the worker's number (LocalCluster names workers 0, 1, ...)
  or, for other names, its rank among the cluster's workers sorted by name: never a hash, which can give two
  workers one GPU.

Outside a Dask worker a process uses device 0 for models and every GPU for FAISS (`index_cpu_to_all_gpus`)."""
from __future__ import annotations

import functools
import os
import sys


def dask_worker():
    """The Dask worker this code runs in, else None. A Dask worker has imported distributed (optional: the dask
    extra); a process that has not is none, and is not made to import it (~1.7 s of dask and distributed, inside
    the wall of every stage that asks)."""
    distributed = sys.modules.get("distributed")
    try:
        return None if distributed is None else distributed.get_worker()
    except ValueError:  # imported, but not inside a Dask worker
        return None


@functools.lru_cache(maxsize=8)
def _rank(name: str, address: str | None) -> int:
    """This worker's rank among the cluster's workers, sorted by name (asked of the scheduler once per process)."""
    from distributed import get_client  # distributed: optional (the dask extra); only a Dask worker asks

    names = sorted(str(w.get("name")) for w in get_client().scheduler_info(n_workers=-1)["workers"].values())
    return names.index(name) if name in names else 0


def worker_index() -> int | None:
    """This Dask worker's number, else None (outside a worker)."""
    worker = dask_worker()
    if worker is None:
        return None
    name = worker.name
    if isinstance(name, int) or (isinstance(name, str) and name.isdigit()):
        return int(name)
    return _rank(str(name), getattr(worker, "address", None))


def worker_gpu(n_gpus: int) -> int | None:
    """The GPU this Dask worker owns (None outside a worker or without GPUs)."""
    if n_gpus <= 0 or dask_worker() is None:
        return None
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if len(visible) == 1 or (visible and "dask_cuda" in sys.modules):
        return 0  # the worker's own GPU, listed first
    return worker_index() % n_gpus  # type: ignore[operator]  # inside a worker: an int
