"""Rerunning one stage on a real cluster gives what a fresh process computes: a Dask scheduler and two workers started
with the `dask` CLI on 127.0.0.1 (their own process groups, stopped by id at teardown), `runner.kind = "dask"`.

- a warm worker that embedded with `pooler = "mean"` embeds with `"cls"` when the stage is rerun with it (loaded
  objects are keyed by the settings their load reads, not by the plan alone);
- a chain's generation setting changed between two runs of `backtranslate` reaches the warm workers too;
- a whole `make mine` there gives the threads runner's tables, also when one worker is killed with SIGKILL while it
  runs a shard (the scheduler gives the shard to the other worker; shards are written atomically).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from contramine.flows.mine import configure, mine_flow, run_stage_flow
from contramine.pipeline.engine.runner import load_stages, run_stage
from contramine.pipeline.storage.store import Store
from contramine.pipeline.storage.tables import RunTables
from processes import free_port, stop_group
from child_env import CHILD_PYTHONPATH

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

ROOT = Path(__file__).resolve().parent.parent
WIKI = ROOT.parent / "shared" / "data" / "wiki1m_head.txt"
SMALL = ["encoder.max_length=32", "neighbours.pool_size=8", "noise.n_variants=2", "run.shards=3",
         "backtranslate.chains=[]"]


class Cluster:
    """`dask scheduler` + `dask worker` processes on 127.0.0.1, each in its own process group."""

    def __init__(self, tmp: Path, n_workers: int = 2):
        self.dask = str(Path(sys.executable).with_name("dask"))
        self.port, self.tmp, self.workers = free_port(), tmp, []
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([CHILD_PYTHONPATH, str(ROOT / "tests")]),
                    "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.scheduler = self._start("scheduler", [self.dask, "scheduler", "--host", "127.0.0.1", "--port",
                                                   str(self.port), "--no-dashboard", "--no-show"])
        for i in range(n_workers):
            self.add_worker(f"w{i}")

    def _start(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "wb")
        return subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def add_worker(self, name: str) -> None:
        self.workers.append(self._start(name, [self.dask, "worker", self.address, "--name", name, "--nthreads", "1",
                                               "--nworkers", "1", "--no-dashboard", "--host", "127.0.0.1",
                                               "--death-timeout", "60"]))
        self.wait_for(len(self.workers))

    def wait_for(self, n: int, timeout: float = 120) -> None:
        from distributed import Client

        t0 = time.monotonic()
        while True:
            try:
                with Client(self.address, timeout=10) as client:
                    client.wait_for_workers(n, timeout=max(1.0, timeout - (time.monotonic() - t0)))
                    return
            except OSError:
                if time.monotonic() - t0 > timeout:
                    raise
                time.sleep(1)

    def client(self):
        from distributed import Client

        if getattr(self, "_client", None) is None:
            self._client = Client(self.address, timeout=10)
        return self._client

    def worker_pids(self) -> dict[str, int]:
        """{worker address: its pid} (the `dask worker` CLI runs each worker in a child of its nanny)."""
        return self.client().run(os.getpid)

    def processing(self) -> dict[str, list]:
        return {w: list(keys) for w, keys in self.client().processing().items()}

    def close(self) -> None:
        if getattr(self, "_client", None) is not None:
            self._client.close()
        for p in [*self.workers, self.scheduler]:
            stop_group(p)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("dask"))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def corpus30(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("corpus") / "c30.txt"
    p.write_text("\n".join(WIKI.read_text(encoding="utf-8").splitlines()[:30]) + "\n", encoding="utf-8")
    return p


def _vectors(table) -> np.ndarray:
    return np.stack(table.column("emb").to_numpy(zero_copy_only=False))


def test_a_warm_worker_embeds_with_the_rerun_pooler(cluster, corpus30, tmp_path):
    """The issue's case: `make stage STAGE=embeddings` with pooler mean, then with pooler cls, on warm workers."""
    from tiny_bert import build_tiny_bert

    from contramine.pipeline.models.encode.encoder import Encoder

    enc = build_tiny_bert(tmp_path / "enc", seed=3)
    sets = SMALL + [f"run.root={tmp_path}", f"encoder.model={enc}", "runner.kind=dask",
                    f"runner.address={cluster.address}"]
    kw = dict(profile="default", run="p", corpus=str(corpus30))
    cfg = configure("default", "p", str(corpus30), sets)
    run_stage_flow("sentences", cfg, overrides=sets, **kw)
    run_stage_flow("embeddings", cfg, overrides=sets, **kw)
    texts = RunTables(cfg.run.dir).read("sentences").column("text").to_pylist()
    mean = _vectors(RunTables(cfg.run.dir).read("embeddings"))
    cls_sets = sets + ["encoder.pooler=cls"]
    manifest = run_stage_flow("embeddings", configure("default", "p", str(corpus30), cls_sets), overrides=cls_sets,
                              **kw)
    got = _vectors(RunTables(cfg.run.dir).read("embeddings"))
    fresh = Encoder.load(str(enc), pooler="cls", max_length=32, device="cpu").encode(texts, batch_size=128)
    assert manifest["shards_computed"] == 3 and manifest["config"]["encoder"]["pooler"] == "cls"
    assert not np.allclose(got, mean, atol=1e-4)  # the old pooler's vectors would pass the rest
    assert np.array_equal(got, fresh)


def test_a_chain_generation_setting_reaches_warm_workers(cluster, corpus30, tmp_path):
    """backtranslate with 1 beam, then with 3 and 2 returns, on the warm cluster = each computed in this process."""
    from bench.fixtures.tiny_mt import build_tiny_marian

    chain = [build_tiny_marian(tmp_path / "en-xx", seed=1), build_tiny_marian(tmp_path / "xx-en", seed=2)]
    base = SMALL[:-1] + [f"backtranslate.chains=[[{chain[0]}, {chain[1]}]]", "backtranslate.max_new_tokens_min=4",
                         "backtranslate.max_new_tokens_factor=1.0", "backtranslate.max_length=24",
                         f"run.root={tmp_path}"]
    on_cluster = ["runner.kind=dask", f"runner.address={cluster.address}"]
    tables = {}
    for beams in ("backtranslate.num_beams=1", "backtranslate.num_beams=3 backtranslate.num_return_sequences=2"):
        extra = beams.split()
        for where, runner in (("cluster", on_cluster), ("here", [])):
            sets = base + extra + runner
            cfg = configure("default", where, str(corpus30), sets)
            for s in ("sentences", "noise", "backtranslate"):
                run_stage(s, cfg)
            tables[where, beams] = RunTables(cfg.run.dir).read("backtranslations")
    for beams in ("backtranslate.num_beams=1", "backtranslate.num_beams=3 backtranslate.num_return_sequences=2"):
        assert tables["cluster", beams].equals(tables["here", beams]), beams
    two = tables["cluster", "backtranslate.num_beams=3 backtranslate.num_return_sequences=2"]
    assert two.num_rows == 2 * tables["cluster", "backtranslate.num_beams=1"].num_rows > 0


def _all_tables(cfg) -> dict:
    tables = RunTables(cfg.run.dir)
    return {t: tables.read(t) for s in load_stages().values() for t in s.writes}


def _run_stages(cfg) -> None:
    """Every stage in order through the runner's own driver (what the mine flow maps, without a Prefect flow run a
    stage): the threads references the cluster's runs are compared with."""
    for stage in load_stages():
        run_stage(stage, cfg, log=lambda line: None)


@pytest.fixture(scope="module")
def threads_root(corpus30, tmp_path_factory) -> Path:
    """The run root of a threads mine on corpus30 (run "t"); its row memo is <root>/.memo."""
    root = tmp_path_factory.mktemp("threads")
    _run_stages(configure("default", "t", str(corpus30), SMALL + [f"run.root={root}", "runner.workers=2"]))
    return root


@pytest.fixture(scope="module")
def threads_run(corpus30, threads_root):
    return _all_tables(configure("default", "t", str(corpus30), SMALL + [f"run.root={threads_root}", "runner.workers=2"]))


def test_a_grown_corpus_on_the_cluster_sends_only_its_new_line_to_the_models(cluster, corpus30, threads_root,
                                                                              tmp_path):
    """The threads run's row memo, shared as a team's would be (runner.memo_dir), serves the cluster's workers: the
    corpus grown by one line embeds and negates one sentence, and the tables equal a fresh run's (memo off)."""
    grown = tmp_path / "c31.txt"
    grown.write_text(corpus30.read_text(encoding="utf-8") + WIKI.read_text(encoding="utf-8").splitlines()[30] + "\n",
                     encoding="utf-8")
    shared = SMALL + [f"runner.memo_dir={threads_root / '.memo'}"]
    sets = shared + [f"run.root={tmp_path}", "runner.kind=dask", f"runner.address={cluster.address}"]
    mine_flow(profile="default", run="g", corpus=str(grown), overrides=sets)
    store = Store(tmp_path / "g")
    for stage, table in (("embeddings", "embeddings"), ("negate", "negations")):
        memo = next(iter(store.manifest(table)["memo"].values()))
        assert (memo["rows_computed"], memo["state"]) == (1, "on"), (stage, memo)
        assert memo["rows_reused"] == store.manifest("sentences")["rows"]["sentences"] - 1
    fresh = SMALL + [f"run.root={tmp_path}", "runner.memo=off"]
    _run_stages(configure("default", "fresh", str(grown), fresh))
    want = _all_tables(configure("default", "fresh", str(grown), fresh))
    got = _all_tables(configure("default", "g", str(grown), sets))
    for table, data in want.items():
        assert got[table].equals(data), table


def test_make_mine_on_the_cluster_equals_threads(cluster, corpus30, threads_run, tmp_path):
    sets = SMALL + [f"run.root={tmp_path}", "runner.kind=dask", f"runner.address={cluster.address}"]
    mine_flow(profile="default", run="d", corpus=str(corpus30), overrides=sets)
    got = _all_tables(configure("default", "d", str(corpus30), sets))
    assert got["sentences"].num_rows > 20 and got["negations"].num_rows > 0
    for table, data in threads_run.items():
        assert got[table].equals(data), table


def test_a_worker_killed_mid_stage_leaves_the_tables_whole(cluster, corpus30, threads_run, tmp_path):
    """SIGKILL to a worker while it runs a shard, before `negate` has committed (the graph runs negate beside
    embeddings and noise: the shard may be any of theirs): the scheduler gives the shard to another worker (the
    other one, or the one the killed worker's nanny starts), the run completes and its tables equal the threads
    run's."""
    sets = SMALL + [f"run.root={tmp_path}", "runner.kind=dask", f"runner.address={cluster.address}"]
    cfg = configure("default", "k", str(corpus30), sets)
    done: dict = {}
    run = threading.Thread(target=lambda: done.update(rows=mine_flow(profile="default", run="k", corpus=str(corpus30),
                                                                     overrides=sets)), daemon=True)
    run.start()
    store, killed, t0 = Store(cfg.run.dir), None, time.monotonic()
    while killed is None and run.is_alive() and time.monotonic() - t0 < 300:
        if store.exists("sentences") and not store.exists("negations"):  # negate and its siblings are running
            busy = [w for w, keys in cluster.processing().items() if keys]
            if busy:
                pid = cluster.worker_pids()[busy[0]]
                os.kill(pid, signal.SIGKILL)
                killed = busy[0]
                break
        time.sleep(0.05)
    run.join(600)
    assert killed is not None, "no worker was seen running a shard to kill"
    assert not run.is_alive() and "rows" in done
    assert killed not in cluster.worker_pids()  # that worker is gone (its nanny started a new one elsewhere)
    assert store.manifest("negations")["shards_computed"] == 3
    got = _all_tables(cfg)
    for table, data in threads_run.items():
        assert got[table].equals(data), table


def test_a_rerun_killed_on_the_cluster_leaves_the_old_table_whole_then_finishes(cluster, corpus30, tmp_path):
    """`make stage STAGE=embeddings` with pooler cls on the cluster, its flow's process killed with SIGKILL once the
    first cls shard is on disk: readers still get the mean table whole (the manifest and its files), whatever the
    orphaned workers go on writing; the next run on the cluster commits cls, reusing the shards already written."""
    import json

    from mining_helpers import _cli_env

    sets = [*SMALL, "run.shards=6", f"run.root={tmp_path}", "runner.kind=dask", f"runner.address={cluster.address}"]
    for stage in ("sentences", "embeddings"):
        run_stage_flow(stage, configure("default", "r", str(corpus30), sets), profile="default", run="r",
                       corpus=str(corpus30), overrides=sets)
    run_dir = tmp_path / "r"
    mean, old = RunTables(run_dir).read("embeddings"), Store(run_dir).manifest("embeddings")
    listed = {e["file"] for e in old["files"]}
    cmd = [sys.executable, "-m", "contramine.flows.cli", "stage", "embeddings", "--run", "r", "--corpus", str(corpus30),
           "--set", *sets, "encoder.pooler=cls"]
    with open(tmp_path / "killed.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=_cli_env(), stdout=log, stderr=subprocess.STDOUT)
        t0 = time.monotonic()
        while not {p.name for p in (run_dir / "embeddings").glob("part-*.parquet")} - listed:
            assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
            assert time.monotonic() - t0 < 300, "no cls shard appeared"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    time.sleep(2)  # orphaned shard tasks may still finish and write: none of it is listed
    assert json.loads((run_dir / "embeddings" / "_manifest.json").read_text()) == old
    assert RunTables(run_dir).read("embeddings").equals(mean)
    cfg = configure("default", "r", str(corpus30), [*sets, "encoder.pooler=cls"])
    man = run_stage("embeddings", cfg)
    assert man["shards_cached"] >= 1 and man["shards_computed"] + man["shards_cached"] == 6
    cls = RunTables(run_dir).read("embeddings")
    assert cls.num_rows == mean.num_rows and not cls.equals(mean)
