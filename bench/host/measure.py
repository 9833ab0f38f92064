"""How the host bench's worker measures a job (bench/host/jobs.py): the best wall and CPU time of a few passes, the
torch ops (~ kernel launches on a GPU) and host reads counted under a dispatch mode, a job's settings, its lines.
"""
from __future__ import annotations

import time
from pathlib import Path

# ops after which a GPU's host waits for the device (a value read back, or an output whose size depends on values)
SYNC_OPS = {"_local_scalar_dense", "nonzero", "equal", "is_nonzero", "masked_select", "_unique2", "unique_dim",
            "unique_consecutive", "repeat_interleave", "allclose", "item"}


def op_counter():
    """A dispatch mode counting every torch op (`ops`) and the ops in SYNC_OPS (`syncs`) run under it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops, self.syncs = 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            if func._overloadpacket.__name__ in SYNC_OPS:
                self.syncs += 1
            return func(*args, **(kwargs or {}))

    return Count()


def count_ops(fn, units: int, sizes: dict) -> dict:
    """{"ops", "syncs"} per unit of one more, untimed pass of `fn` under `op_counter` (only where sizes["count"]:
    the first round; a dispatch mode is slow)."""
    if not sizes.get("count"):
        return {}
    with op_counter() as count:
        fn()
    return {"ops": count.ops / units, "syncs": count.syncs / units}


def from_config(cfg, fn) -> dict:
    """The keywords of `fn` (those with a default) that the config section `cfg` has a field of the same name for,
    at the section's defaults: what a stage passes from its settings (batch_size, slack, ...), a new one included."""
    import inspect

    return {name: getattr(cfg, name) for name, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty and name in type(cfg).model_fields}


def best_of(fn, repeats: int) -> dict:
    """{"seconds": the fastest wall time of `repeats` passes of fn, "cpu_s": the least CPU time this process spent
    in one (every thread; beside other work on a shared box it moves less than the wall time)}."""
    wall = cpu = float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    return {"seconds": wall, "cpu_s": cpu}


def apply_settings(obj, fn, settings: dict) -> dict:
    """bench/gpu/sections.py's rule for a job's settings (a keyword of `fn` goes to the call, any other key must be
    an attribute of `obj`); a misspelt key stops the bench in one line."""
    from bench.gpu.sections import apply_settings as apply

    try:
        return apply(obj, fn, settings)
    except ValueError as e:
        raise SystemExit(f"host bench: {e}") from None


def lines(data: Path, n: int) -> list[str]:
    base = (data / "lines.txt").read_text(encoding="utf-8").splitlines()
    return [base[i % len(base)] for i in range(n)]
