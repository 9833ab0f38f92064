"""Device leases: a job whose plan puts a model on a device kind that is leased (`runner.leased_devices`, default
the GPU: "cuda") runs only while it holds one of the device's `runner.device_leases` leases (default 1: one job of
one stage on one card at a time; more where the card's memory holds more).

A lease is an exclusive `flock` on one of the device's slot files, in a folder of this user's under the machine's
temporary folder. So one rule covers every runner: threads of one process, the processes of a dask-local cluster,
and each machine of a Dask cluster (its cards are its own), with no scheduler of ours and nothing to clean up: the
kernel drops a lock when its holder dies (kill -9 included). A stage that declares no model, or a plan on an
unleased device (the CPU by default), takes no lease.
"""
from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

POLL_S = 0.05  # how often a waiting job tries the slots again


def leased_device(plan: dict, leased: Sequence[str]) -> str | None:
    """The device kind the job's plan puts a model on, when that kind is leased; else None (no lease)."""
    kinds = {p.get("device") for p in plan.values() if isinstance(p, dict)}
    return next((k for k in sorted(k for k in kinds if isinstance(k, str)) if k in leased), None)


def lease_folder() -> Path:
    """This user's lease files (0700: another account cannot hold or block them)."""
    folder = Path(tempfile.gettempdir()) / f"contramine-leases-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


@contextmanager
def device_lease(device: str | None, slots: int):
    """Hold one of `slots` leases of `device` while inside; yields (waited seconds, held since: time.time()), or
    (0.0, None) when `device` is None (nothing leased)."""
    if device is None:
        yield 0.0, None
        return
    folder, t0 = lease_folder(), time.perf_counter()
    files = [os.open(folder / f"{device}.{i}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
             for i in range(slots)]
    held = None
    try:
        while held is None:
            for fd in files:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held = fd
                    break
                except BlockingIOError:
                    continue
            else:
                time.sleep(POLL_S)
        yield time.perf_counter() - t0, time.time()
    finally:
        for fd in files:
            os.close(fd)  # closing the held descriptor releases its lock
