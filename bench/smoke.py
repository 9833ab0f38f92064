"""Smoke mode for the bench modules: every module's `run()` at toy size (seconds each), for the test suite.

    python -m bench.run --smoke                  # every module at toy size; results go to a temporary folder
    BENCH_SMOKE=1 python -m bench.peers.mer      # one module at toy size

A module reads the mode through this one helper, never the environment itself:

    n = smoke.cap(n, 64)              # n, or at most 64 in smoke mode
    folder = smoke.work_dir()         # artifacts/bench/ (caches, models trained once), or the smoke folder

In smoke mode the rows are real rows of the same kinds and units as a full run (a name that carries a size
carries the toy one), measured on toy inputs: their numbers say that the code runs, not how fast it is. On a shared
2-core box run it with OMP_NUM_THREADS=1 (tests/test_bench_modules.py does): two-thread torch pools wait on each
other there. `bench.run --smoke` never writes
artifacts/bench/results.json or BENCHMARKS.md; it writes its results.json under $BENCH_SMOKE_DIR (a temporary
folder when unset, removed at exit), where the modules also keep what they would otherwise cache under
artifacts/bench/.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

ENV, DIR_ENV = "BENCH_SMOKE", "BENCH_SMOKE_DIR"


def on() -> bool:
    """Whether this process runs the benches at toy size ($BENCH_SMOKE=1)."""
    return os.environ.get(ENV, "") not in ("", "0")


def cap(full, toy):
    """`full` normally; in smoke mode the smaller of the two (a tuple: `toy` as it is)."""
    if not on():
        return full
    if isinstance(full, (tuple, list)):
        return type(full)(toy)
    return min(full, toy)


def work_dir() -> Path:
    """Where a module keeps its caches: artifacts/bench/ normally, $BENCH_SMOKE_DIR (made once per process when
    unset) in smoke mode, so a smoke run leaves the real results and caches alone."""
    if not on():
        from contramine.pipeline.config import ROOT

        return ROOT / "artifacts" / "bench"
    if not os.environ.get(DIR_ENV):  # made here: removed when this process exits (children inherit the path)
        os.environ[DIR_ENV] = tempfile.mkdtemp(prefix="bench-smoke-")
        atexit.register(shutil.rmtree, os.environ[DIR_ENV], True)
    path = Path(os.environ[DIR_ENV])
    path.mkdir(parents=True, exist_ok=True)
    return path


def freeze_heap() -> None:
    """In smoke mode, collect once and move every object alive now out of the collector's sight (`gc.freeze`): the
    stage runner collects after each stage that loaded a model and freezes once, at its first collection
    (pipeline/engine/resources.py), but one smoke process imports module after module after that, and each
    collection walked ~0.3 s of objects that outlive it anyway. A no-op otherwise, so a full run's timings keep
    their collections as a user's process pays them."""
    if on():
        import gc

        gc.collect()
        gc.freeze()


def enable(folder: str | Path | None = None) -> Path:
    """Turn smoke mode on for this process (and its children); returns the smoke folder."""
    os.environ[ENV] = "1"
    if folder is not None:
        os.environ[DIR_ENV] = str(folder)
    return work_dir()
