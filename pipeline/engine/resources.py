"""Models as declared resources: resolved once per run, loaded once per process, released after their stage.

A stage names the resources it uses next to what it reads and writes (`@stage(resources=(ENCODER,))`, spec.py),
as Dagster stages name theirs. Before any shard starts, the runner resolves each one in the process that runs the
flow (`Resource.resolve(cfg, store, n) -> dict`): whatever decides its numbers — the model's fingerprint (its
bytes), the device kind, the precision, the engine, the index kind and its parameters, which translation chains
can run. That plan travels with every shard task (a Dask worker decides nothing on its own), goes into every
shard's key and into the manifest.

A shard gets the loaded object with `ctx.resource(name)`. One load per process per resolved plan, behind a lock
(shard threads that arrive together load it once), kept under the plan, not the model's name: weights saved again
at the same path have a new fingerprint, so a long-lived worker loads them anew. What a stage loaded is released
when a shard of another stage asks for its own resources, and in the flow's process when the stage has finished
(`release`), so a one-process `make mine` holds one stage's models at a time.
"""
from __future__ import annotations

import gc
import json
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from pipeline.config import Config
    from pipeline.engine.store import Store


@dataclass(frozen=True)
class Resource:
    """name; resolve(cfg, store, n) -> JSON-able dict (decided once per run); load(cfg, store, n, plan) -> object
    (None: a decision only, e.g. which chains run, that a stage reads from its plan)."""
    name: str
    resolve: Callable[["Config", "Store", int], dict] = field(compare=False)
    load: Callable[["Config", "Store", int, dict], Any] | None = field(default=None, compare=False)


def plan_key(plan: dict) -> str:
    return json.dumps(plan, sort_keys=True, separators=(",", ":"))


_lock = threading.Lock()
_loaded: dict[tuple[str, str], tuple[str, Any]] = {}  # (resource, plan) -> (stage that holds it, object)
_loading: dict[tuple[str, str], threading.Lock] = {}


def acquire(stage: str, resource: Resource, cfg: "Config", store: "Store", n: int, plan: dict) -> Any:
    """The loaded resource for this plan: loaded at most once in this process while its stage runs."""
    if resource.load is None:
        raise ValueError(f"resource {resource.name!r} is a decision, not a loadable object: read ctx.plan")
    key = (resource.name, plan_key(plan))
    with _lock:
        slot = _loading.setdefault(key, threading.Lock())
    with slot:
        with _lock:
            if key in _loaded:
                _loaded[key] = (stage, _loaded[key][1])
                return _loaded[key][1]
        obj = resource.load(cfg, store, n, plan)
        with _lock:
            _loaded[key] = (stage, obj)
        return obj


def enter(stage: str) -> None:
    """A shard of `stage` starts in this process (the runner calls this): what other stages loaded here goes (their
    shards are over: the runner starts a stage after the one before it has finished)."""
    with _lock:
        stale = [k for k, (holder, _) in _loaded.items() if holder != stage]
        for k in stale:
            del _loaded[k]
            _loading.pop(k, None)
    if stale:
        _collect()


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
    gc.collect()
    import sys

    torch = sys.modules.get("torch")  # only when a stage already imported it
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
