"""Scale-out: the mine flow on a 2-worker local Dask cluster equals the threads runner; the stage flows deploy to a
Prefect server (prefect.yaml, process work pool, worker subprocess); the neighbours index switches, records its
recall where the shard ran, uses a GPU when FAISS has one, and bounds its search memory."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from contramine.flows.mine import configure, mine_flow, run_stage_flow
from contramine.pipeline.search import band, faiss_index as fx
from contramine.pipeline.config import NeighboursCfg
from contramine.pipeline.engine.runner import load_stages, run_stage
from contramine.pipeline.storage.store import Store
from contramine.pipeline.storage.tables import RunTables
from processes import free_port, stop_group
from child_env import CHILD_PYTHONPATH

ROOT = Path(__file__).resolve().parent.parent
WIKI = ROOT.parent / "shared" / "data" / "wiki1m_head.txt"
SMALL = ["encoder.max_length=32", "neighbours.pool_size=8", "noise.n_variants=2", "run.shards=3",
         "backtranslate.chains=[]"]
APPROX = ["neighbours.exact_threshold=20", "neighbours.recall_sample=10"]  # 50-odd sentences: auto picks HNSW
# the stand-in encoder (a vector per text, cosines like a real encoder's, no weights): what must reach the workers
# here is the mapped index and its recall, not a model; each Dask worker process would load MiniLM otherwise
STANDIN = ["encoder.model=standin:encoder-32"]


@pytest.fixture(scope="module")
def corpus60(tmp_path_factory) -> Path:
    lines = WIKI.read_text(encoding="utf-8").splitlines()[:60]
    lines[7], lines[12] = "", lines[11]  # one empty line, one duplicate
    p = tmp_path_factory.mktemp("corpus") / "c60.txt"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def _tables(cfg) -> dict:
    tables = RunTables(cfg.run.dir)
    return {t: tables.read(t) for s in load_stages().values() for t in s.writes}


def _mine(corpus, root, name, *extra, flow=True):
    """A mine through the flow, or (flow=False) every stage in order through the runner's own driver (what the flow
    maps, without a Prefect flow run a stage): the threads reference."""
    sets = SMALL + [f"run.root={root}", *extra]
    cfg = configure("default", name, str(corpus), sets)
    if flow:
        mine_flow(profile="default", run=name, corpus=str(corpus), overrides=sets)
    else:
        for stage in load_stages():
            run_stage(stage, cfg, log=lambda line: None)
    return cfg


@pytest.fixture(scope="module")
def mined(prefect_harness, corpus60, tmp_path_factory):
    """The same small run on 2 threads and on a 2-worker local Dask cluster, neighbours through HNSW (index auto
    past a tiny exact_threshold) so that the mapped index and its measured recall have to reach the workers."""
    root = tmp_path_factory.mktemp("runs")
    threads = _mine(corpus60, root, "threads", *STANDIN, *APPROX, "runner.workers=2", flow=False)
    dask = _mine(corpus60, root, "dask", *STANDIN, *APPROX, "runner.kind=dask-local", "runner.workers=2")
    return corpus60, root, threads, dask


@pytest.mark.slow
def test_dask_local_two_workers_equals_threads(mined):
    _, _, threads, dask = mined
    a, b = _tables(threads), _tables(dask)
    assert a["sentences"].num_rows > 40 and a["neighbours"].num_rows > 0 and a["candidates"].num_rows > 0
    for table, data in a.items():
        assert b[table].equals(data), f"table {table}: dask-local differs from threads"


@pytest.mark.slow
def test_approximate_recall_reaches_manifest_from_dask_workers_and_survives_reuse(mined):
    corpus, root, threads, dask = mined
    facts = {}
    for cfg in (threads, dask):
        man = Store(cfg.run.dir).manifest("neighbours")
        assert man["index"] == "hnsw" and man["exact"] is False
        facts[cfg.run.name] = (man["ef_search"], man["recall"], man["resources"]["index"]["file"])
        assert man["recall"] == 1.0  # 50-odd nodes, efSearch 64: the graph is searched whole, as exact as flat
    assert facts["dask"][:2] == facts["threads"][:2]
    sets = SMALL + [f"run.root={root}", *STANDIN, *APPROX, "runner.workers=2"]
    again = run_stage_flow("neighbours", configure("default", "dask", str(corpus), sets), profile="default",
                           run="dask", corpus=str(corpus), overrides=sets)
    assert again["shards_cached"] == 3 and (again["ef_search"], again["recall"]) == facts["dask"][:2]


# ---- Prefect server + process work pool + worker + deployment from prefect.yaml ----

def _wait(predicate, timeout: float, what: str, procs=()):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"{what}: a subprocess exited early with {p.returncode}")
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.25)  # a local HTTP check: cheap to ask often
    raise AssertionError(f"{what}: not ready after {timeout:.0f}s")


@pytest.mark.slow
def test_sentences_deployment_runs_on_a_process_worker(tmp_path, corpus60):
    prefect = str(Path(sys.executable).with_name("prefect"))
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_API_URL": api,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1", "PREFECT_UI_ENABLED": "false",
           "PREFECT_CLI_PROMPT": "false", "PREFECT_WORKER_QUERY_SECONDS": "2", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": CHILD_PYTHONPATH}
    env.pop("PREFECT_PROFILES_PATH", None)
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: list[subprocess.Popen] = []

    def start(name, *args):
        out = open(logs / f"{name}.log", "wb")
        procs.append(subprocess.Popen([prefect, *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True))
        return procs[-1]

    def cli(*args, timeout=180):
        r = subprocess.run([prefect, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, f"prefect {' '.join(args)}: {r.stdout[-2000:]}{r.stderr[-2000:]}"
        return r.stdout

    def tail():
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(logs.iterdir()))

    run_root = tmp_path / "runs"
    try:
        server = start("server", "server", "start", "--host", "127.0.0.1", "--port", str(port))
        _wait(lambda: urllib.request.urlopen(f"{api}/health", timeout=5).status == 200, 180, "prefect server",
              [server])
        cli("work-pool", "create", "contramine-process", "--type", "process")
        # the worker starts (imports, first poll) while `prefect deploy` runs: the two need nothing of each other
        worker = start("worker", "worker", "start", "--pool", "contramine-process", "--limit", "1")
        cli("deploy", "--no-prompt", "--name", "sentences-default", "--prefect-file", str(ROOT / "prefect.yaml"))
        params = ["-p", "run=deployed", "-p", f"corpus={corpus60}",
                  "--params", json.dumps({"overrides": [f"run.root={run_root}", "run.shards=2"]})]
        out = cli("deployment", "run", "sentences/sentences-default", *params)
        run_id = next(w for line in out.splitlines() if "UUID" in line for w in line.split() if w.count("-") == 4)

        def finished():
            with urllib.request.urlopen(f"{api}/flow_runs/{run_id}", timeout=5) as r:
                state = json.load(r)["state"]["type"]
            assert state not in ("FAILED", "CRASHED", "CANCELLED"), f"flow run {state}\n{tail()}"
            return state == "COMPLETED"

        _wait(finished, 240, f"flow run {run_id}", [server, worker])
        tables = RunTables(run_root / "deployed")
        assert tables.manifest("sentences")["shards"] == 2
        assert tables.read("sentences").num_rows + tables.read("rejected").num_rows == 60
    except AssertionError as e:
        raise AssertionError(f"{e}\n{tail()}") from None
    finally:
        for p in reversed(procs):
            stop_group(p)


def test_prefect_yaml_has_one_deployment_per_stage_flow():
    import yaml

    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    entry = {d["entrypoint"] for d in spec["deployments"]}
    assert entry == {f"flows/mine.py:{s}_flow" for s in load_stages()} | {"flows/mine.py:mine_flow"}
    for d in spec["deployments"]:
        assert {"profile", "run", "overrides"} <= set(d["parameters"])
        assert d["work_pool"]["name"] == "contramine-process"
    import contramine.flows.mine as mine
    assert all(hasattr(mine, e.split(":")[1]) for e in entry)


# ---- neighbours at scale: index choice, GPU path, memory bound (fast, no Prefect) ----

def test_auto_index_switches_to_hnsw_past_threshold():
    cfg = NeighboursCfg(exact_threshold=1000)
    assert fx.choose_index(1000, cfg) == "flat" and fx.choose_index(1001, cfg) == "hnsw"
    assert fx.choose_index(1001, NeighboursCfg(exact_threshold=1000, approximate="ivf")) == "ivf"
    assert NeighboursCfg(ivf_threshold=7).exact_threshold == 7  # the old name still sets it
    assert fx.choose_index(10, NeighboursCfg(index="hnsw")) == "hnsw"


def _unit(n, d=32, seed=0):
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32) + 0.6  # clustered-ish: cos ~0.2-0.7
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_gpu_index_used_when_faiss_sees_a_gpu(monkeypatch):
    moved = []

    class FakeGpuIndex:
        def __init__(self, cpu):
            self.cpu = cpu

        def search(self, q, k):
            moved.append(k)
            return self.cpu.search(q, k)

    monkeypatch.setattr(fx.faiss, "get_num_gpus", lambda: 1)
    monkeypatch.setattr(fx.faiss, "index_cpu_to_all_gpus", lambda index: FakeGpuIndex(index))
    x = _unit(300)
    index, cpu = fx.build_index(x, "flat", NeighboursCfg(), 0)
    assert isinstance(index, fx.GpuIndex) and index.index.cpu is cpu  # one locked GPU index per process
    sids = np.arange(300, dtype=np.int64)
    got = band.band_neighbours(x, sids, x, sids, index, cpu, 0.25, 0.75, 8)
    assert moved and got.equals(band.exact_band_neighbours(x, sids, x, sids, 0.25, 0.75, 8))
    index, cpu = fx.build_index(x, "flat", NeighboursCfg(gpu="never"), 0)
    assert index is cpu
    monkeypatch.setattr(fx.faiss, "get_num_gpus", lambda: 0)
    with pytest.raises(RuntimeError, match="no GPU"):
        fx.build_index(x, "flat", NeighboursCfg(gpu="always"), 0)


def test_search_blocks_bounded_by_max_block_elems_and_exact():
    x = _unit(2000, seed=1)
    sids = np.arange(2000, dtype=np.int64)
    index, cpu = fx.build_index(x, "flat", NeighboursCfg(), 0)
    seen = []

    class Spy:
        def search(self, q, k):
            seen.append(len(q) * k)
            return index.search(q, k)

    cap = 4096
    got = band.band_neighbours(x, sids, x, sids, Spy(), Spy(), 0.25, 0.75, 64, max_block_elems=cap)
    assert seen and max(seen) <= cap
    assert got.equals(band.exact_band_neighbours(x, sids, x, sids, 0.25, 0.75, 64))


def test_ivf_index_recall_against_exact_is_high():
    rng = np.random.default_rng(2)
    centres = rng.standard_normal((20, 32))  # topics: IVF lists follow them, as with real sentence embeddings
    x = (centres[rng.integers(20, size=3000)] + 0.5 * rng.standard_normal((3000, 32))).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    sids = np.arange(3000, dtype=np.int64)
    recall = {}
    for nprobe in (4, 32):
        index, cpu = fx.build_index(x, "ivf", NeighboursCfg(index="ivf", nprobe=nprobe), 0)
        got = band.band_neighbours(x[:200], sids[:200], x, sids, index, cpu, 0.25, 0.75, 16)
        recall[nprobe] = band.recall_at_pool(got, band.exact_band_neighbours(x[:200], sids[:200], x, sids, 0.25, 0.75, 16))
    assert recall[4] < recall[32] and recall[32] > 0.99
