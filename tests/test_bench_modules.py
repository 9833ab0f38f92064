"""Every bench module imports (a broken import fails the suite, not only `make bench`), cheaply (no measuring or
model building at import time), and `make bench` runs every `*_bench` module there is."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
MODULES = sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", MODULES)
def test_bench_module_imports(name):
    mod = importlib.import_module(f"bench.{name}")
    if name.endswith("_bench"):
        assert callable(getattr(mod, "run", None)), f"bench/{name}.py has no run() for `make bench`"


def test_make_bench_runs_every_bench_module():
    from bench.run import MODULES as RUN

    assert sorted(f"{m}_bench" for m in RUN) == [m for m in MODULES if m.endswith("_bench")]
