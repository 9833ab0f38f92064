"""The scale path (issue "A million sentences"): stand-in models behind the real interfaces, the shard count that
follows the corpus, the GPU paths of `neighbours` on a fake GPU index (k capped at 2048, one index per process,
one device per Dask worker), the recall floor of approximate indexes, float32 logits under autocast."""
from __future__ import annotations

import threading
import time
import types

import faiss
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from contramine.pipeline.search import band, faiss_index as fx, index as ix
from contramine.pipeline.config import BacktranslateCfg, ConfigError, NeighboursCfg, configure, load_config, shards_for
from contramine.pipeline.engine import devices, resources
from contramine.pipeline.engine.runner import finish_stage, run_job, run_shard
from contramine.pipeline.storage.store import Store
from contramine.pipeline.models.encode.encoder import Encoder
from contramine.pipeline.models.translate.chains import load_translator
from contramine.pipeline.schema import vectors_table
from contramine.trainer.objectives.common import cos_matrix, cos_rows


# ---- stand-in models -----------------------------------------------------------------------------------------------
def test_standin_encoder_is_deterministic_unit_and_batch_free():
    enc = Encoder.load("standin:encoder-64")
    texts = ["the cat sat on the mat", "the cat sat on a chair", "markets fell in asia", "the cat sat on the mat"]
    v = enc.encode(texts, batch_size=2)
    assert v.shape == (4, 64) and v.dtype == np.float32 and enc.dim == 64
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1, atol=1e-6)
    np.testing.assert_array_equal(v, Encoder.load("standin:encoder-64").encode(texts[::-1], batch_size=3)[::-1])
    cos = v @ v.T
    assert cos[0, 3] == pytest.approx(1) and cos[0, 1] > 0.5 > cos[0, 2]  # shared words, shared direction


def test_standin_translator_shuffles_words_deterministically():
    tr = load_translator("standin:shuffle-de", BacktranslateCfg(chains=[]))
    text = "one two three four five six seven"
    out = tr.translate([text, text], seeds=[1, 2], num_return_sequences=2)
    assert all(sorted(h.split()) == sorted(text.split()) for hyps in out for h in hyps)
    assert out == tr.translate([text, text], seeds=[1, 2], num_return_sequences=2) and out[0] != out[1]


# ---- the shard count follows the corpus -------------------------------------------------------------------------------
def test_shard_count_follows_the_corpus_size(tmp_path):
    text = tmp_path / "c.txt"
    text.write_text("\n".join(f"line {i} of the corpus" for i in range(250)))  # no newline after the last line
    assert shards_for(text, 100) == 3 and shards_for(text, 250) == 1 and shards_for(text, 0) == 0
    cfg = configure("default", "x", str(text), ["run.max_shard_rows=60"])
    assert cfg.run.shards == 5  # ceil(250 / 60); run.shards = 4 is the floor
    assert configure("default", "x", str(text), ["run.max_shard_rows=1000"]).run.shards == 4
    # never the worker count: the count is part of every key, and a rerun with other workers reuses every shard
    for workers in (2, 3, 5):
        for kind in ("threads", "dask-local"):
            assert configure("default", "x", str(text), ["run.max_shard_rows=60", f"runner.workers={workers}",
                                                         f"runner.kind={kind}"]).run.shards == 5
    table = vectors_table(np.arange(7), np.zeros((7, 2), np.float32)).rename_columns(["text", "v"])
    pq.write_table(table.select(["text"]), tmp_path / "c.parquet")
    assert shards_for(tmp_path / "c.parquet", 2) == 4


# ---- neighbours: the GPU paths on a fake GPU ---------------------------------------------------------------------------
class FakeGpuFaiss:
    """What faiss-gpu's index does that matters here: k-selection capped at 2048 (GPU_MAX_K)."""

    def __init__(self, cpu_index):
        self.cpu, self.ks, self.active, self.overlap = cpu_index, [], 0, False

    def search(self, x, k):
        assert k <= band.GPU_MAX_K, f"GPU search with k = {k}"
        self.active += 1
        self.overlap |= self.active > 1
        time.sleep(0.001)
        self.ks.append(k)
        try:
            return self.cpu.search(x, k)
        finally:
            self.active -= 1


def _crowded(seed=0, d=16, n_above=2600, n_band=40, n_far=400):
    """A query with 2,600 near-duplicates above the band: its in-band pool lies past rank 2048."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(d)
    q /= np.linalg.norm(q)

    def at(cos, n):
        noise = rng.standard_normal((n, d))
        noise -= np.outer(noise @ q, q)
        noise /= np.linalg.norm(noise, axis=1, keepdims=True)
        return cos[:, None] * q + np.sqrt(1 - cos[:, None] ** 2) * noise

    base = np.vstack([q[None], at(rng.uniform(0.8, 0.95, n_above), n_above), at(rng.uniform(0.3, 0.7, n_band), n_band),
                      at(rng.uniform(-0.2, 0.1, n_far), n_far)]).astype(np.float32)
    return base, np.arange(len(base), dtype=np.int64) * 7 + 3


def test_gpu_search_past_2048_stays_exact(monkeypatch):
    base, sids = _crowded()
    fakes = []
    monkeypatch.setattr(fx, "gpu_count", lambda: 1)
    monkeypatch.setattr(fx, "to_gpu", lambda index, n: fakes.append(FakeGpuFaiss(index)) or fakes[-1])
    cfg = NeighboursCfg(pool_size=8, lo=0.25, hi=0.75)
    assert fx.choose_index(len(sids), NeighboursCfg(exact_threshold=10)) == "flat"  # auto: exact on a GPU
    index, cpu_index = fx.build_index(base, "flat", cfg)
    assert isinstance(index, fx.GpuIndex)
    got = band.band_neighbours(base[:5], sids[:5], base, sids, index, cpu_index, cfg.lo, cfg.hi, cfg.pool_size)
    want = band.exact_band_neighbours(base[:5], sids[:5], base, sids, cfg.lo, cfg.hi, cfg.pool_size)
    assert got.column("cand_sid").equals(want.column("cand_sid")) and len(got) == 5 * 8
    assert max(fakes[0].ks) <= band.GPU_MAX_K < 2600  # widening past 2048 went to the exact CPU index
    with pytest.raises(ValueError, match="k = 4096"):
        index.search(base[:1], 4096)


def test_gpu_index_one_per_process_and_one_search_at_a_time(tmp_path, monkeypatch):
    base, sids = _crowded(n_above=50)
    store = Store(tmp_path)
    store.write_table("embeddings", [vectors_table(sids, base)], "k")
    built, fakes = [], []
    real_build = fx.build_index

    def slow_build(*a, **k):
        built.append(1)
        time.sleep(0.2)  # threads that arrive meanwhile must wait, not build a second GPU index
        return real_build(*a, **k)

    monkeypatch.setattr(fx, "build_index", slow_build)
    monkeypatch.setattr(fx, "gpu_count", lambda: 1)
    monkeypatch.setattr(fx, "to_gpu", lambda index, n: fakes.append(FakeGpuFaiss(index)) or fakes[-1])
    cfg = load_config("default", [f"run.root={tmp_path.parent}", f"run.name={tmp_path.name}", "run.shards=1",
                                  "neighbours.pool_size=4", "backtranslate.chains=[]"])
    store.write_table("pool_embeddings", [vectors_table(sids[:0], base[:0])], "k")
    plan = ix.index_plan(cfg, store, 1)
    assert plan["kind"] == "flat" and plan["device"] == "gpu"
    got = []
    threads = [threading.Thread(target=lambda: got.append(resources.acquire("neighbours", ix.INDEX, cfg, store, 1,
                                                                            plan))) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(built) == 1 and len({id(g[2]) for g in got}) == 1
    index = got[0][2]
    searchers = [threading.Thread(target=index.search, args=(base[:8], 16)) for _ in range(6)]
    [t.start() for t in searchers]
    [t.join() for t in searchers]
    assert len(fakes[0].ks) == 6 and not fakes[0].overlap
    assert resources.release("neighbours") == 1 and resources.held() == []


def test_each_dask_worker_takes_its_own_gpu(monkeypatch):
    import distributed

    assert devices.worker_index() is None and devices.worker_gpu(2) is None  # not in a worker
    monkeypatch.setattr(distributed, "get_worker", lambda: types.SimpleNamespace(name=3))
    assert devices.worker_gpu(2) == 1 and devices.worker_gpu(4) == 3 and devices.worker_gpu(0) is None
    calls = []
    monkeypatch.setattr(fx.faiss, "StandardGpuResources", lambda: "res", raising=False)
    monkeypatch.setattr(fx.faiss, "index_cpu_to_gpu", lambda res, dev, index: calls.append(dev) or index,
                        raising=False)
    fx.to_gpu("index", 2)
    assert calls == [1]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    from contramine.pipeline.models.hub import pick_device

    assert pick_device("auto") == "cuda:1" and pick_device("cpu") == "cpu"


def test_worker_gpu_never_hashes_a_name_and_honours_its_own_visible_devices(monkeypatch):
    """Workers named by dask-cuda or a scheduler's CLI (not 0, 1, ...) take their rank among the cluster's names;
    a worker with its own CUDA_VISIBLE_DEVICES takes device 0 of what it sees."""
    import distributed

    names = ["gpu-b", "gpu-a", "gpu-c", "gpu-d"]
    info = {"workers": {f"tcp://w{i}": {"name": n} for i, n in enumerate(names)}}
    monkeypatch.setattr(distributed, "get_client", lambda: types.SimpleNamespace(scheduler_info=lambda **k: info))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    got = {}
    for n in names:
        monkeypatch.setattr(distributed, "get_worker", lambda n=n: types.SimpleNamespace(name=n, address=n))
        got[n] = devices.worker_gpu(4)
    assert sorted(got.values()) == [0, 1, 2, 3] and got["gpu-a"] == 0  # one GPU each, whatever the names hash to
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert devices.worker_gpu(1) == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # exported for the machine: the rank decides
    assert devices.worker_gpu(4) == got["gpu-d"]


def test_gpu_always_with_hnsw_is_refused():
    with pytest.raises(ConfigError, match="no GPU HNSW"):
        load_config("default", ["neighbours.index=hnsw", "neighbours.gpu=always"])


def test_approximate_index_below_min_recall_fails_before_any_shard_and_auto_reaches_it(tmp_path):
    """The recall is measured first, on a seeded sample, against exact search: a fixed nprobe below min_recall stops
    the run in one line before any shard is searched; nprobe = "auto" (the default) rises until it reaches it, and
    the chosen nprobe and recall are in the manifest's facts."""
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((40, 16))
    x = (centres[rng.integers(40, size=1500)] + 0.9 * rng.standard_normal((1500, 16))).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    sids = np.arange(1500, dtype=np.int64)
    sets = [f"run.root={tmp_path}", "run.name=r", "run.shards=1", "neighbours.index=ivf", "neighbours.nlist=64",
            "neighbours.nprobe=1", "neighbours.pool_size=16", "neighbours.recall_sample=100"]
    Store(tmp_path / "r").write_table("embeddings", [vectors_table(sids, x)], "k")
    Store(tmp_path / "r").write_table("pool_embeddings", [vectors_table(sids[:0], x[:0])], "k")  # no candidates
    from contramine.pipeline.errors import StageError

    with pytest.raises(StageError, match=r"nprobe 1\) finds 0\.\d+ of the exact pool on 100 sampled queries "
                                         r"\(< neighbours.min_recall 0.99\): set neighbours.nprobe = 'auto'"):
        run_shard("neighbours", load_config("default", [*sets, "neighbours.min_recall=0.99"]), 0)
    assert not Store(tmp_path / "r").intact("neighbours", 0, 1)  # nothing searched, nothing written
    assert run_shard("neighbours", load_config("default", [*sets, "neighbours.min_recall=0"]), 0)["rows"]
    auto = load_config("default", [*(x for x in sets if "nprobe" not in x), "neighbours.min_recall=0.99"])
    plan = ix.index_plan(auto, Store(tmp_path / "r"), 1)
    assert plan["recall"] >= 0.99 and 8 <= plan["nprobe"] <= 64 and plan["recall_by_nprobe"][str(plan["nprobe"])] \
        == plan["recall"] and min(plan["recall_by_nprobe"].values()) < 0.99  # it had to rise
    assert run_shard("neighbours", auto, 0, plan={"index": plan})["rows"]


def test_hnsw_ef_search_auto_rises_to_min_recall_and_its_graph_is_the_same_every_build(tmp_path):
    """index = auto's approximate index on a CPU is HNSW: a fixed ef_search below min_recall stops the run before
    any shard; ef_search = "auto" doubles until the sample reaches it. The graph is built on one thread, so two
    builds of the same vectors are byte-identical, and the mapped copy the shards search returns what the built
    index returns."""
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((40, 16))
    x = (centres[rng.integers(40, size=1500)] + 0.9 * rng.standard_normal((1500, 16))).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    sids = np.arange(1500, dtype=np.int64)
    sets = [f"run.root={tmp_path}", "run.name=r", "run.shards=1", "neighbours.exact_threshold=1000",
            "neighbours.hnsw_m=4", "neighbours.pool_size=16", "neighbours.recall_sample=100"]
    Store(tmp_path / "r").write_table("embeddings", [vectors_table(sids, x)], "k")
    Store(tmp_path / "r").write_table("pool_embeddings", [vectors_table(sids[:0], x[:0])], "k")
    from contramine.pipeline.errors import StageError

    with pytest.raises(StageError, match=r"hnsw index \(ef_search 16\) finds 0\.\d+ of the exact pool on 100 "
                                         r"sampled queries \(< neighbours.min_recall 0.99\): set neighbours.ef_search"):
        run_shard("neighbours", load_config("default", [*sets, "neighbours.ef_search=16",
                                                        "neighbours.min_recall=0.99"]), 0)
    assert not Store(tmp_path / "r").intact("neighbours", 0, 1)
    auto = load_config("default", [*sets, "neighbours.min_recall=0.995"])
    plan = ix.index_plan(auto, Store(tmp_path / "r"), 1)
    assert plan["kind"] == "hnsw" and plan["recall"] >= 0.995 and plan["ef_search"] > fx.ef_search_start(
        auto.neighbours) and min(plan["recall_by_ef_search"].values()) < 0.995  # it had to rise
    c = auto.neighbours
    one, two = (fx.build_index(x, "hnsw", c, gpu=False)[0] for _ in range(2))
    assert np.array_equal(faiss.serialize_index(one), faiss.serialize_index(two))
    _, _, mapped, _ = ix.load_index(auto, Store(tmp_path / "r"), 1, plan)
    one.hnsw.efSearch = plan["ef_search"]
    for got, want in zip(mapped.search(x[:200], 41), one.search(x[:200], 41)):
        assert np.array_equal(got, want)
    assert run_shard("neighbours", auto, 0, plan={"index": plan})["rows"]


def test_auto_searches_exactly_when_its_approximate_index_cannot_reach_min_recall(tmp_path, monkeypatch):
    """index = auto: when HNSW at its largest efSearch still misses min_recall, the run searches exactly (flat,
    over the vectors mapped from the run folder) and says so in the plan; the pools equal brute force. With
    index = "hnsw" set by hand the same miss stops the run instead."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1200, 16)).astype(np.float32)  # no clusters: the hard case for a graph
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    sids = np.arange(1200, dtype=np.int64) * 3
    sets = [f"run.root={tmp_path}", "run.name=r", "run.shards=1", "neighbours.exact_threshold=100",
            "neighbours.hnsw_m=4", "neighbours.pool_size=16", "neighbours.recall_sample=100",
            "neighbours.min_recall=1.0"]
    Store(tmp_path / "r").write_table("embeddings", [vectors_table(sids, x)], "k")
    Store(tmp_path / "r").write_table("pool_embeddings", [vectors_table(sids[:0], x[:0])], "k")
    monkeypatch.setattr(NeighboursCfg, "MAX_EF_SEARCH", 64)  # one try: efSearch 64
    cfg = load_config("default", sets)
    plan = ix.index_plan(cfg, Store(tmp_path / "r"), 1)
    assert plan["kind"] == "flat" and plan["recall"] == 1.0 and plan["fallback"]["kind"] == "hnsw"
    assert plan["fallback"]["recall"] < 1.0 and list(plan["fallback"]["recall_by_ef_search"]) == ["64"]
    _, base, search, _ = ix.load_index(cfg, Store(tmp_path / "r"), 1, plan)
    assert isinstance(base, np.memmap) and isinstance(search, fx.BruteForce)
    finish_stage("neighbours", cfg, run_job("neighbours", cfg, 0, plan={"index": plan}), 0.0, {"index": plan})
    got = Store(tmp_path / "r").read("neighbours")
    assert got.equals(band.exact_band_neighbours(x, sids, x, sids, 0.25, 0.75, 16))
    from contramine.pipeline.errors import StageError

    with pytest.raises(StageError, match=r"hnsw index \(ef_search 64\) finds .* ef_search 'auto' stopped"):
        ix.index_plan(load_config("default", [*sets, "neighbours.index=hnsw"]), Store(tmp_path / "r"), 1)


# ---- float32 logits under autocast ------------------------------------------------------------------------------
def test_logits_stay_float32_under_bf16_autocast():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 32, generator=g), torch.randn(6, 32, generator=g)
    ref = torch.nn.functional.normalize(a.double(), dim=-1) @ torch.nn.functional.normalize(b.double(), dim=-1).T
    with torch.autocast("cpu", dtype=torch.bfloat16):
        m, r = cos_matrix(a, b), cos_rows(a[:6], b)
    assert m.dtype == torch.float32 and r.dtype == torch.float32
    torch.testing.assert_close(m.double(), ref, atol=1e-6, rtol=0)  # bf16 would be off by ~1e-2
    torch.testing.assert_close(r.double(), ref.diagonal(), atol=1e-6, rtol=0)


def test_scale_corpus_is_the_real_sentences_then_their_recombinations(tmp_path):
    from bench.scale import synthetic_corpus
    from contramine.pipeline.config import SHARED_DATA

    wiki = (SHARED_DATA / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()
    tatoeba = set((SHARED_DATA / "tatoeba_en.txt").read_text(encoding="utf-8").splitlines())
    mixed = synthetic_corpus(15_000, tmp_path / "a.txt").read_text(encoding="utf-8").splitlines()
    assert len(set(mixed)) == len(mixed) == 15_000 and mixed[:50] == wiki[:50]
    assert set(mixed[-2_000:]) <= tatoeba  # past wiki1m's lines come Tatoeba's, real, before any recombination
    assert synthetic_corpus(15_000, tmp_path / "b.txt").read_text(encoding="utf-8").splitlines() == mixed
    old = synthetic_corpus(15_000, tmp_path / "c.txt", corpus="wiki1m").read_text(encoding="utf-8").splitlines()
    made = old[len(set(wiki)):]  # recombinations of wiki1m lines alone: each starts with the first half of one
    assert len(set(old)) == 15_000 and made and not set(made) & (set(wiki) | tatoeba)
    starts = {" ".join(w.split()[: len(w.split()) // 2]) for w in wiki}
    assert all(any(s.startswith(h + " ") for h in starts if h) for s in made[:20])


def test_scale_report_growth_per_doubling():
    from bench.scale import growth, markdown_table

    rows = [{"n": n, "stage": st, "seconds": s, "peak_rss_mb": m}
            for n, st, s, m in [(1000, "a", 2.0, 100), (2000, "a", 4.2, 120), (4000, "a", 8.0, 150),
                                (1000, "b", 1.0, 90), (2000, "b", 4.0, 95), (4000, "b", 16.0, 99)]]
    # a stage with nothing to do (the pool stages without data.candidates): its start-up times are not a growth
    rows += [{"n": n, "stage": "idle", "seconds": s, "peak_rss_mb": 80, "rows": {"pool_sentences": 0}}
             for n, s in [(1000, 0.05), (2000, 0.15), (4000, 0.07)]]
    g = growth(rows)
    assert g["idle"]["per_doubling"] == [] and g["idle"]["idle"] and not g["a"]["idle"]
    assert g["a"]["per_doubling"] == [2.1, 1.9] and g["a"]["worst"] == 2.1 and g["a"]["peak_rss_mb"] == 150
    assert g["b"]["per_doubling"] == [4.0, 4.0]
    table = markdown_table(rows)
    assert "| a | 2.0 | 4.2 | 8.0 | 100 / 120 / 150 | 2.10, 1.90 |" in table and "| b |" in table
    assert "| idle | 0.1 | 0.1 | 0.1 | 80 / 80 / 80 | — (wrote no rows at any size" in table
