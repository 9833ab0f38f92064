"""How many cores this process may use, and the threads each of a runner's workers gets.

`runner.workers = "auto"` is the cores here: the CPUs this process may run on (its affinity), capped by the
cgroup's CPU quota where one is set (a container's `--cpus`). Each of W workers in one process then gets
cores // W threads for torch's and FAISS' own pools (at least one), so W jobs at once do not oversubscribe the cores.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


def available_cores() -> int:
    """The CPUs this process may use: its affinity, capped by the cgroup v2 (cpu.max) or v1 (cfs quota) quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota: float | None = None
    try:
        v2_limit, v2_period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        quota = None if v2_limit == "max" else int(v2_limit) / int(v2_period)
    except (OSError, ValueError):
        try:
            limit = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
            period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
            quota = limit / period if limit > 0 else None
        except (OSError, ValueError):
            quota = None
    if quota is not None:
        cores = min(cores, max(1, int(quota)))
    return max(1, cores)


def threads_per_worker(workers: int) -> int:
    return max(1, available_cores() // max(1, workers))


_SET: list[int] = []


def share_cores(workers: int) -> None:
    """Torch's and FAISS' thread pools in this process sized for `workers` jobs at once (once per process and
    count; a library not imported yet is left alone: it is sized when a job of its stage calls this again)."""
    n = threads_per_worker(workers)
    # a module another job's thread is still importing is in sys.modules half-built (no set_num_threads yet): it
    # is left alone like one not imported (seen: negate's share_cores beside neighbours' `import faiss`)
    torch, faiss = sys.modules.get("torch"), sys.modules.get("faiss")
    torch = torch if hasattr(torch, "set_num_threads") else None
    faiss = faiss if hasattr(faiss, "omp_set_num_threads") else None
    if torch is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)
    if faiss is not None and ("faiss", n) not in _SET:
        faiss.omp_set_num_threads(n)
        _SET.append(("faiss", n))  # type: ignore[arg-type]
