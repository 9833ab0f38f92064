"""Every bench module imports (a broken import fails the suite, not only `make bench`), cheaply (no measuring or
model building at import time), `make bench` runs every `*_bench` module there is, and every one of them RUNS:
`python -m bench.run --smoke` (bench/smoke.py: toy sizes, seconds each) in one child process, as `make bench`
runs them, must give each module's rows with their names, units and numbers. Their speed is not checked here
(toy inputs, a shared machine), and the smoke run must leave artifacts/bench/results.json and BENCHMARKS.md as
they were."""
from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
# every module under bench/, dotted below it ("peers.mer", "gpu.check"); the peer benches `make bench` runs are
# bench/peers/*.py, and the host bench (bench/host/bench.py) is one of them
MODULES = sorted(".".join(p.relative_to(BENCH).with_suffix("").parts) for p in BENCH.rglob("*.py")
                 if p.name != "__init__.py")
PEERS = sorted(p.stem for p in (BENCH / "peers").glob("*.py") if p.stem != "__init__")
SMOKE_LIMIT_S = 300  # well under 3 minutes on a 2-core box (97 s measured beside other work, 2026-11-26)


@pytest.mark.parametrize("name", MODULES)
def test_bench_module_imports(name):
    mod = importlib.import_module(f"bench.{name}")
    if name.startswith("peers.") or name == "host.bench":
        assert callable(getattr(mod, "run", None)), f"bench.{name} has no run() for `make bench`"


def test_make_bench_runs_every_bench_module():
    from bench.run import MODULES as RUN

    assert sorted(RUN) == sorted([*PEERS, "host"])


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """`python -m bench.run --smoke` once for the whole module: (exit code, output, results by module, seconds)."""
    out = tmp_path_factory.mktemp("bench-smoke")
    real = [ROOT / "artifacts" / "bench" / "results.json", ROOT / "BENCHMARKS.md"]
    before = {p: _digest(p) for p in real}
    # one thread per torch / OpenMP pool: on a shared 2-core box two-thread pools wait on each other's wake-ups
    # (an encoder batch took 16 s instead of 1 s under load 7)
    env = {**os.environ, "BENCH_SMOKE_DIR": str(out), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    env.pop("BENCH_SMOKE", None)  # --smoke turns it on
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "bench.run", "--smoke"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=2 * SMOKE_LIMIT_S)
    seconds = time.perf_counter() - t0
    results = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else []
    by_module: dict[str, list[dict]] = {}
    for r in results:
        by_module.setdefault(r["module"], []).append(r)
    return {"rc": proc.returncode, "output": proc.stdout + proc.stderr, "by_module": by_module, "seconds": seconds,
            "unchanged": {str(p): before[p] == _digest(p) for p in real}}


def test_smoke_run_finishes_and_leaves_real_results_alone(smoke_run):
    assert smoke_run["rc"] == 0, smoke_run["output"][-4000:]
    assert "FAILED" not in smoke_run["output"], smoke_run["output"][-4000:]
    assert all(smoke_run["unchanged"].values()), smoke_run["unchanged"]
    assert smoke_run["seconds"] < SMOKE_LIMIT_S, f"smoke run took {smoke_run['seconds']:.0f} s"


@pytest.mark.parametrize("module", importlib.import_module("bench.run").MODULES)
def test_bench_module_runs_in_smoke_mode(smoke_run, module):
    rows = smoke_run["by_module"].get(module)
    if not rows:
        failed = [line for line in smoke_run["output"].splitlines() if line.startswith(f"{module}_bench")]
        pytest.fail(f"{module}_bench returned no rows: {failed or smoke_run['output'][-2000:]}")
    for r in rows:
        assert isinstance(r["name"], str) and r["name"], r
        assert isinstance(r["unit"], str) and r["unit"], r
        for key in ("ours", "peer", "ratio"):
            assert isinstance(r[key], (int, float)) and r[key] == r[key], (key, r)  # a number, not NaN
        assert r["ours"] >= 0 and r["peer"] >= 0, r
        assert r["goal"] is None or isinstance(r["goal"], (int, float)), r
