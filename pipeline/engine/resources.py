"""Models as declared resources: resolved once per run, loaded once per process for what they were loaded with,
released after their stage.

A stage names the resources it uses next to what it reads and writes (`@stage(resources=(ENCODER,))`, spec.py),
as Dagster stages name theirs; a resource is declared next to its model (pipeline/models/), never in a stage
module. Before any shard starts, the runner resolves each one in the process that runs the flow
(`Resource.resolve(cfg, store, n, plan) -> dict`; `plan` holds the resources the stage declared before it): whatever
decides its numbers — the model's fingerprint (its bytes), the device kind, the precision, the engine and its code
version, the index kind. That plan travels with every shard task, goes into every shard's key and into the manifest.

The plan is the law in every process: `load(cfg, store, n, plan)` loads exactly the plan's device kind, precision,
dtype, engine and index kind, never deciding again; where this process cannot (a shard on a worker without the GPU
the plan names), it stops with one line (`PlanError`) naming the worker and what the plan required.

A loaded object is kept under (resource, plan, the config sections its load reads — `reads`, all their settings):
a warm Dask worker that loaded the encoder for `pooler = "mean"` loads it again for `"cls"`, and one that loaded a
chain for 4 beams loads it again for 5. `load` sees those sections only (`SectionsView`: reading another one is an
error), so the key covers everything the load can read. One load per key per process, behind a lock (shard threads
that arrive together load once). What a stage loaded is released when a shard of another stage asks for its own
resources, and in the flow's process when the stage has finished (`release`).
"""
from __future__ import annotations

import gc
import json
import os
import socket
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from contramine.pipeline.engine.devices import dask_worker, worker_gpu
from contramine.pipeline.errors import StageError

if TYPE_CHECKING:
    from contramine.pipeline.config import Config
    from contramine.pipeline.storage.store import Store


@dataclass(frozen=True)
class Resource:
    """name; resolve(cfg, store, n, plan) -> JSON-able dict (decided once per run; `plan`: the stage's resources
    resolved before this one); load(cfg, store, n, plan) -> object (None: a decision only, e.g. which chains run,
    that a stage reads from its plan); reads: the config sections `load` reads (they key the loaded object)."""
    name: str
    resolve: Callable[..., dict] = field(compare=False)
    load: Callable[..., Any] | None = field(default=None, compare=False)  # (a SectionsView, store, n, plan), as resolve
    reads: tuple[str, ...] = ()


class PlanError(StageError):
    """This process cannot load what the run's plan says (e.g. the plan's GPU on a worker without one)."""


def plan_key(plan: dict) -> str:
    return json.dumps(plan, sort_keys=True, separators=(",", ":"))


def process_name() -> str:
    """Who is asking, for PlanError: the Dask worker's name and address, else host and pid."""
    w = dask_worker()
    if w is not None:
        return f"dask worker {w.name} ({w.address})"
    return f"process {os.getpid()} on {socket.gethostname()}"


def cuda_device(kind: str, what: str) -> str:
    """The torch device for the plan's device kind in this process: "cpu", or this process' own GPU of the kind
    ("cuda:<i>", a Dask worker per GPU: devices.py). PlanError when the plan says cuda and this process has none."""
    if kind == "cpu":
        return "cpu"
    import torch  # torch: only a stage that runs a model asks for a device; plans and the CLI do not

    if kind != "cuda" or not torch.cuda.is_available():
        raise PlanError(f"{process_name()} cannot run {what} as the run's plan says ({kind}): "
                        f"{'no CUDA device is visible here' if kind == 'cuda' else 'unknown device kind'}; "
                        f"run the flow on a machine of the workers' kind, or set the device explicitly (e.g. cpu)")
    gpu = worker_gpu(torch.cuda.device_count())
    return "cuda" if gpu is None else f"cuda:{gpu}"


class SectionsView:
    """The config as a resource's `load` sees it: the sections it declared (`reads`), nothing else."""

    def __init__(self, cfg: "Config", resource: Resource):
        self._cfg, self._resource = cfg, resource

    def __getattr__(self, name: str):
        if name.startswith("_") or name in self._resource.reads:
            return getattr(self._cfg, name)
        raise AttributeError(f"resource {self._resource.name!r} reads config section {name!r} without declaring it "
                             f"(Resource(reads=...)): a warm worker could serve an object loaded for other settings")


def load_settings(resource: Resource, cfg: "Config") -> str:
    """Every setting of the sections the resource's load reads (execution settings too: the object keeps them)."""
    return json.dumps({s: getattr(cfg, s).model_dump(mode="json") for s in resource.reads}, sort_keys=True)


_lock = threading.Lock()
_loaded: dict[tuple[str, str, str], tuple[str, Any]] = {}  # (resource, plan, load settings) -> (holder stage, object)
_loading: dict[tuple[str, str, str], threading.Lock] = {}
_frozen = False  # gc.freeze() has run in this process (_collect)
_running: dict[str, int] = {}  # stage -> its jobs running in this process now (stages of a graph overlap)
# Loads take turns in a process. transformers' `from_pretrained` is not thread-safe: while it builds a model it swaps
# `PreTrainedModel.tie_weights` for a no-op and sets torch's default dtype, for the whole process (transformers'
# `initialization.no_tie_weights` and `modeling_utils.local_torch_dtype`). A model loading on another
# thread meanwhile (a graph-scheduled mine: backtranslate's Marian beside an encoder) kept its tied head on the meta
# device ("Cannot copy out of meta tensor"), and two loads that overlap can leave the no-op in place for good.
_one_load = threading.RLock()


def acquire(stage: str, resource: Resource, cfg: "Config", store: "Store", n: int, plan: dict) -> Any:
    """The loaded resource for this plan and these settings: loaded at most once in this process while its stage
    runs."""
    if resource.load is None:
        raise ValueError(f"resource {resource.name!r} is a decision, not a loadable object: read ctx.plan")
    key = (resource.name, plan_key(plan), load_settings(resource, cfg))
    with _lock:
        slot = _loading.setdefault(key, threading.Lock())
    with slot:
        with _lock:
            if key in _loaded:
                _loaded[key] = (stage, _loaded[key][1])
                return _loaded[key][1]
        with _one_load:
            obj = resource.load(SectionsView(cfg, resource), store, n, plan)
        with _lock:  # what this stage loaded for other settings or another plan is not asked for again
            for old in [k for k, (holder, _) in _loaded.items() if k[0] == resource.name and holder == stage]:
                del _loaded[old]
            _loaded[key] = (stage, obj)
        return obj


def enter(stage: str) -> None:
    """A job of `stage` starts in this process: what stages with no job running here loaded goes (a stage that runs
    beside this one, in a graph-scheduled mine, keeps its models)."""
    with _lock:
        stale = [k for k, (holder, _) in _loaded.items() if holder != stage and not _running.get(holder)]
        for k in stale:
            del _loaded[k]
            _loading.pop(k, None)
    if stale:
        _collect()


@contextmanager
def running(stage: str):
    """A job of `stage` runs in this process while inside (the runner's run_job): `enter`, and counted, so that no
    other stage's job takes this stage's models away."""
    enter(stage)
    with _lock:
        _running[stage] = _running.get(stage, 0) + 1
    try:
        yield
    finally:
        with _lock:
            _running[stage] -= 1
            if not _running[stage]:
                del _running[stage]


def running_stages() -> set[str]:
    """The stages with a job running in this process now."""
    with _lock:
        return set(_running)


def release(stage: str | None = None) -> int:
    """Drop what `stage` (every stage when None) loaded in this process; returns how many objects went."""
    with _lock:
        gone = [k for k, (holder, _) in _loaded.items() if stage is None or holder == stage]
        for k in gone:
            del _loaded[k]
            _loading.pop(k, None)
    if gone:
        _collect()
    return len(gone)


def held() -> list[tuple[str, str]]:
    """(stage, resource) of every object loaded in this process now."""
    with _lock:
        return sorted((holder, k[0]) for k, (holder, _) in _loaded.items())


def _collect() -> None:
    """Free what was just released now (a model's reference cycles too: its memory, a GPU's included, before the
    next stage loads its own). A full collection walks every object the process tracks: ~0.29 s after the
    pipeline's imports here (~0.5 s in a long-lived process), four times a mine. So the first collection that finds
    nothing loaded freezes what is alive then (gc.freeze: the imported modules, classes and settings, which live as
    long as the process), and later ones walk what came after, the models (~30 ms). Objects alive at that moment
    that become cyclic garbage later are not collected: the one freeze bounds that to what one moment held."""
    global _frozen
    gc.collect()
    if not _frozen:
        with _lock:
            if not _loaded and not _frozen:
                gc.freeze()
                _frozen = True
    torch = sys.modules.get("torch")  # only when a stage already imported it
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
