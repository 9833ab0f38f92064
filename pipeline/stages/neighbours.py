"""Stage `neighbours`: DebCSE's negative pool (METHODS §2).

For each sentence: the top `pool_size` sentences by cosine among those with lo ≤ cos ≤ hi (itself excluded;
identical texts share a sid, so they are excluded too). Exact by construction with a flat index:

  1. k-NN with k = pool_size + slack + a margin for neighbours above the band.
  2. Recompute in float64 from the stored vectors the cosine of every returned candidate that could be in the
     band and in the pool (FAISS scores are float32 with ~1e-6 error; ranking, band edges and the stored `cos` use
     the exact values; `_resolve_block` says which candidates the float32 score already rules out).
  3. A query is finished when (a) every sentence was returned, or (b) the smallest returned FAISS score + eps is
     below lo (nothing unseen can be in the band), or (c) it has pool_size in-band candidates and the
     pool_size-th exact cosine is above the smallest returned score + eps (nothing unseen can outrank it).
     Unfinished queries are searched again with k doubled.

This is the "k-NN, widened where too few survive the band" of METHODS §2; it avoids a range search at the
floor, which at 1M sentences returns a large share of all pairs. IVF / HNSW indexes (approximate: recall is
measured on a sample against exact search) and GPU indexes are settings, and so is what searches
(`neighbours.engine`): FAISS, or exact flat search in torch (pipeline/torch_search.py) on a GPU FAISS cannot use.
"""
from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.band_search import (EPS, GPU_MAX_K, band_neighbours, exact_band_neighbours,  # noqa: F401
                                   exact_cosines, recall_at_pool, score_tolerance)
from pipeline.engine.resources import Resource
from pipeline.engine.spec import Ctx, package_versions, stage
from pipeline.config.base import section_constants
from pipeline.schema import read_vectors, table_vectors

log = logging.getLogger(__name__)


class _LazyFaiss:
    """The `faiss` module, imported on first use: the torch engine (pipeline/torch_search.py) runs where FAISS is not
    installed, so importing this stage must not import it. Attributes set on it (a test's monkeypatch) win."""

    def __getattr__(self, name: str):
        import faiss as module

        return getattr(module, name)


faiss = _LazyFaiss()


def gpu_count() -> int:
    try:
        return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    except ImportError:  # no FAISS here: no FAISS GPU either
        return 0


def search_engine(c) -> tuple[str, bool]:
    """(engine, on a GPU) for the neighbours settings `c`: engine = auto is FAISS wherever FAISS sees a GPU it may
    use, torch on a CUDA GPU FAISS cannot use (faiss-cpu, or no FAISS), FAISS on a CPU (torch when FAISS is not
    installed, flat index only); the torch engine is the flat index only (the config refuses ivf / hnsw with it).
    engine = torch never imports FAISS."""
    if c.engine == "faiss" or (c.engine == "auto" and c.index in ("ivf", "hnsw")):
        return "faiss", c.gpu != "never" and gpu_count() > 0
    if c.engine == "auto" and c.gpu != "never" and gpu_count() > 0:
        return "faiss", True
    import torch

    cuda = c.gpu != "never" and torch.cuda.is_available()
    if c.engine == "auto" and not cuda:
        try:
            import faiss as _  # noqa: F401
            return "faiss", False
        except ImportError:
            pass
    if c.gpu == "always" and not cuda:
        raise RuntimeError("neighbours.gpu = 'always' with engine = 'torch' but torch sees no CUDA GPU")
    return "torch", cuda


def choose_index(n: int, cfg, n_gpus: int | None = None) -> str:
    """index = auto: exact flat search wherever FAISS sees a GPU it may use (1M x 1M is seconds there); on CPU,
    flat up to `exact_threshold` sentences and `approximate` (HNSW unless set) past it."""
    if cfg.index != "auto":
        return cfg.index
    if cfg.gpu != "never" and (gpu_count() if n_gpus is None else n_gpus) > 0:
        return "flat"
    return "flat" if n <= cfg.exact_threshold else cfg.approximate


class GpuIndex:
    """A FAISS GPU index shared by the shard threads of one process: one search at a time (FAISS GPU resources
    are not safe for concurrent calls), and k within the GPU k-selection limit (band_neighbours sends wider
    searches to the CPU copy, so they stay exact)."""

    def __init__(self, index):
        self.index, self.lock = index, threading.Lock()

    def search(self, x: np.ndarray, k: int):
        if k > GPU_MAX_K:
            raise ValueError(f"FAISS GPU search with k = {k} > {GPU_MAX_K}: search the CPU index instead")
        with self.lock:
            return self.index.search(x, k)


def to_gpu(index, n_gpus: int):
    """One GPU index per process: the Dask worker's own device, or every GPU outside a worker."""
    from pipeline.engine.devices import worker_gpu

    device = worker_gpu(n_gpus)
    if device is None:
        return faiss.index_cpu_to_all_gpus(index)
    return faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), device, index)


def stored_vectors(index) -> np.ndarray:
    """The vectors an HNSW index stores, as a read-only numpy view (no copy): valid while `index` lives, so the
    two travel together (the `index` resource returns both)."""
    flat = faiss.downcast_index(index.storage)
    view = faiss.rev_swig_ptr(flat.get_xb(), flat.ntotal * flat.d).reshape(flat.ntotal, flat.d)
    view.flags.writeable = False
    return view


def ef_search_start(cfg) -> int:
    """HNSW's first efSearch for auto: the first power of two at or above band_search's first k."""
    k0 = cfg.pool_size + cfg.skip_top + cfg.slack + 1 + 16
    return 1 << int(np.ceil(np.log2(max(k0, 64))))


def ivf_lists(n: int, cfg) -> int:
    """IVF lists for n vectors: neighbours.nlist, or 4 sqrt(n) (at least 39 training vectors a list)."""
    return cfg.nlist or max(1, min(n // 39, int(4 * np.sqrt(n))))


def build_index(vectors: np.ndarray, kind: str, cfg, seed: int = 0, gpu: bool = True):
    """(search index, CPU index): a FAISS inner-product index over unit vectors, and its GPU copy when `gpu`, FAISS
    sees a GPU and cfg.gpu allows (HNSW has no GPU version). nprobe = "auto" before tuning: every list (exact).
    The HNSW graph is built on one thread: FAISS adds nodes in parallel under locks, so a parallel build may link
    them differently from one run to the next; on one thread the same vectors give the same graph."""
    n, d = vectors.shape
    if kind == "flat":
        index = faiss.IndexFlatIP(d)
    elif kind == "ivf":
        nlist = ivf_lists(n, cfg)
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = seed  # k-means initialisation: deterministic
        rng = np.random.default_rng(seed)
        sample = vectors[np.sort(rng.choice(n, size=min(n, nlist * cfg.ivf_train_per_list), replace=False))]
        index.train(sample)
        index.nprobe = nlist if cfg.nprobe == "auto" else min(cfg.nprobe, nlist)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = cfg.hnsw_ef_construction
        index.hnsw.efSearch = ef_search_start(cfg) if cfg.ef_search == "auto" else cfg.ef_search
    else:
        raise ValueError(f"neighbours.index {kind!r}: expected flat, ivf or hnsw")
    if kind == "hnsw":
        threads = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)
        try:
            index.add(vectors)
        finally:
            faiss.omp_set_num_threads(threads)
    else:
        index.add(vectors)
    if not gpu:
        return index, index
    n_gpus = gpu_count()
    if cfg.gpu == "always" and n_gpus == 0:
        raise RuntimeError("neighbours.gpu = 'always' but faiss sees no GPU (install the faiss-gpu extra)")
    if cfg.gpu != "never" and n_gpus > 0 and kind != "hnsw":
        return GpuIndex(to_gpu(index, n_gpus)), index
    return index, index


def faiss_gpus_for_plan(plan: dict) -> int:
    """FAISS' GPUs in this process when the run's plan searches on a GPU (PlanError, one line, where there are
    none: never a silent search on the CPU under a key that says GPU); 0 when the plan says CPU."""
    if plan["device"] != "gpu":
        return 0
    n_gpus = gpu_count()
    if n_gpus == 0:
        from pipeline.engine.resources import PlanError, process_name

        raise PlanError(f"{process_name()} cannot search neighbours on a GPU as the run's plan says: FAISS sees no "
                        f"GPU here (faiss-gpu and a CUDA device are needed on every worker)")
    return n_gpus


# ---- the stage: each shard's queries against the whole table ------------------------------------------------------
def index_facts(cfg, store, n: int, plan: dict | None = None) -> dict:
    """For the manifest: the index the run searched, its parameters and its measured recall (the plan)."""
    p = (plan or {}).get("index", {})
    return {"index": p.get("kind"), "exact": p.get("kind") == "flat", "engine": p.get("engine"),
            **{k: p[k] for k in ("nlist", "nprobe", "hnsw_m", "ef_search", "recall", "recall_sample",
                                 "recall_by_nprobe", "recall_by_ef_search", "fallback") if k in p}}


def base_table(cfg) -> str:
    """What the queries are searched against: the `data.candidates` corpus' vectors, else the anchors' own."""
    return "pool_embeddings" if cfg.data.candidates is not None else "embeddings"


class BruteForce:
    """Exact k-NN over the vectors in float32 blocks (faiss.knn): no index and no copy of the base, so the recall
    check's memory grows with sample x k, not with N (band_search settles what float32 cannot in float64)."""

    def __init__(self, base: np.ndarray):
        self.base = base

    def search(self, x: np.ndarray, k: int):
        return faiss.knn(np.ascontiguousarray(x, dtype=np.float32), self.base, k, metric=faiss.METRIC_INNER_PRODUCT)


def index_plan(cfg, store, n: int, plan: dict | None = None) -> dict:
    """The run's search index, decided before any shard: its kind (index = auto: flat or IVF by the base's size,
    flat on a GPU), where it searches, FAISS' version; for an approximate index also the file it is built into once
    per run (every shard thread and worker maps it read-only) and its recall, measured first (`tune_index`)."""
    c, table = cfg.neighbours, base_table(cfg)
    rows = sum(store.cached_rows(table, i, n) for i in range(n))
    engine, gpu = search_engine(c)
    kind = "flat" if engine == "torch" else choose_index(rows, c, 1 if gpu else 0)
    plan = {"base": table, "base_hash": store.table_hash(table, n), "rows": rows, "kind": kind, "engine": engine,
            "device": "gpu" if gpu and kind != "hnsw" else "cpu",
            "versions": package_versions(*(("torch",) if engine == "torch" else ("faiss-cpu", "faiss-gpu")))}
    if kind != "flat" and rows:
        plan.update(tune_index(cfg, store, n, plan))
    return plan


KNOB = {"ivf": "nprobe", "hnsw": "ef_search"}  # the setting each approximate index is tuned by (measure_recall)


def _index_dir(store) -> Path:
    return store.dir("neighbours") / "_index"


def tune_index(cfg, store, n: int, plan: dict) -> dict:
    """Build the approximate index once, into the run folder (IVF with the base vectors as .npy; HNSW's graph holds
    them), mapped read-only by whoever searches, and measure its recall of the exact pool on a seeded sample of
    queries before any shard is searched. nprobe / ef_search = "auto": raised until the sample's recall reaches
    min_recall (`measure_recall`); a fixed value below min_recall stops the run here, in one line. Reused while
    the base, the settings and the seed are the same (a rerun neither trains k-means nor builds the graph again)."""
    from pipeline.engine.atomic import atomic_file, atomic_write_json
    from pipeline.engine.store import combine
    from pipeline.errors import StageError

    from pipeline.engine.codeversion import code_version

    c, kind = cfg.neighbours, plan["kind"]
    # every setting that can shape the file (execution settings and the device aside: it is built on the CPU), the
    # section's class constants (MAX_EF_SEARCH: model_dump leaves ClassVars out) and the code that builds it
    settings = {**c.model_dump(mode="json", exclude={*c.EXECUTION, *c.RESOLVED}), **section_constants(c)}
    key = combine(plan["base_hash"], kind, json.dumps(settings, sort_keys=True), str(cfg.run.seed), plan["versions"],
                  code_version(__name__))
    folder = _index_dir(store)
    done = folder / f"{kind}-{key}.json"
    if done.is_file():
        out = json.loads(done.read_text())
        if all((folder / out[f]).is_file() for f in ("file", "vectors", "sids") if f in out):
            return out
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():  # another base or other settings: that index is no longer this run's
        old.unlink(missing_ok=True)
    base_sids, base = read_vectors(store, plan["base"], n)
    index, _ = build_index(base, kind, c, cfg.run.seed, gpu=False)
    if kind == "hnsw":  # the graph holds the vectors: search against its copy, and let the table's go
        base = stored_vectors(index)
    q_sids, q = read_vectors(store, "embeddings", n) if plan["base"] != "embeddings" else (base_sids, base)
    out = measure_recall(index, kind, base, base_sids, q, q_sids, c, cfg.run.seed)
    knob = KNOB[kind]
    if out["recall"] < c.min_recall and c.index == "auto" and getattr(c, knob) == "auto":
        # auto's approximate index cannot reach min_recall on these vectors: search exactly instead (slower, never
        # wrong), from the vectors mapped read-only like an index, and say so
        log.warning(f"neighbours: {kind} finds {out['recall']:.3f} of the exact pool at {knob} {out[knob]} (its "
                    f"largest; < min_recall {c.min_recall}): index = auto searches exactly (flat) instead")
        out = {"kind": "flat", "recall": 1.0, "fallback": {"kind": kind, **out}}
    elif out["recall"] < c.min_recall:
        how = f"set neighbours.{knob} = 'auto' (or raise it)" if getattr(c, knob) != "auto" else \
            f"{knob} 'auto' stopped at its largest value"
        raise StageError(f"neighbours: the {kind} index ({knob} {out[knob]}) finds {out['recall']:.3f} of the exact "
                         f"pool on {out['recall_sample']} sampled queries (< neighbours.min_recall {c.min_recall}): "
                         f"{how}, or neighbours.index = 'flat' (exact; fast on a GPU)")
    out["sids"] = f"sids-{key}.npy"
    if out.get("kind", kind) != "hnsw":  # HNSW's graph holds the vectors; IVF's lists hold them in list order,
        out["vectors"] = f"vectors-{key}.npy"  # so the band search (and exact search) reads them by row from here
    if "fallback" not in out:
        out["file"] = f"{kind}-{key}.faiss"
    for name, arr in ((out.get("vectors"), base), (out["sids"], base_sids)):
        if name:
            with atomic_file(folder / name) as tmp, open(tmp, "wb") as f:
                np.save(f, arr)
    if "file" in out:
        with atomic_file(folder / out["file"]) as tmp:
            faiss.write_index(index, str(tmp))
    atomic_write_json(done, out)
    return out


def measure_recall(index, kind: str, base, base_sids, q, q_sids, c, seed: int) -> dict:
    """The approximate index's recall of the exact pool on a seeded sample of the queries (exact: `BruteForce` in
    float32 blocks, settled in float64 by band_search). IVF with nprobe = "auto": nprobe doubled from 8 until the
    recall reaches c.min_recall (at nlist IVF is exhaustive); HNSW with ef_search = "auto": efSearch doubled from
    `ef_search_start` up to MAX_EF_SEARCH. The value chosen is left set on `index`."""
    pick = np.sort(np.random.default_rng(seed).choice(len(q_sids), min(len(q_sids), c.recall_sample), replace=False))
    search = lambda ix: band_neighbours(q[pick], q_sids[pick], base, base_sids, ix, ix, c.lo, c.hi,  # noqa: E731
                                        c.pool_size, c.slack, c.max_block_elems, skip_top=c.skip_top)
    exact = search(BruteForce(base))
    out: dict = {"recall_sample": int(len(pick))}
    knob = KNOB[kind]
    setting = getattr(c, knob)  # "auto" or the value asked for
    if kind == "ivf":
        nlist, what = index.nlist, f"IVF, nlist {index.nlist}"
        values = sorted({min(nlist, 8 << i) for i in range(int(np.log2(max(nlist, 8) / 8)) + 2)})
        out["nlist"] = nlist
    else:
        what = f"HNSW, M {c.hnsw_m}"
        start = ef_search_start(c)
        values = [start << i for i in range(int(np.log2(max(c.MAX_EF_SEARCH, start) // start)) + 1)]
        out["hnsw_m"] = c.hnsw_m
    if setting != "auto":
        values = [min(setting, nlist) if kind == "ivf" else setting]
    history: dict[str, float] = {}
    for value in values:
        if kind == "ivf":
            index.nprobe = value
        else:
            index.hnsw.efSearch = value
        history[str(value)] = round(recall_at_pool(search(index), exact), 4)
        if history[str(value)] >= c.min_recall:
            break
    log.info(f"neighbours: {what}: {knob} {value} finds {history[str(value)]:.3f} of the exact pool on {len(pick)} "
             f"sampled queries (min_recall {c.min_recall}; tried {history})")
    return {**out, knob: value, "recall": history[str(value)], f"recall_by_{knob}": history}


def load_index(cfg, store, n: int, plan: dict):
    """(base sids, base vectors, search index, CPU index) for the run's plan, once per process: a flat index is
    built from the table (exact; cheap); an approximate one is mapped read-only from the file the plan built, with
    its vectors, so shard threads and the workers of a machine share one copy in the page cache."""
    if plan.get("engine") == "torch":  # exact, in torch matmuls on this process' device; no FAISS
        from pipeline.engine.resources import cuda_device
        from pipeline.torch_search import TorchExact

        base_sids, base = read_vectors(store, plan["base"], n)
        device = cuda_device("cpu" if plan["device"] == "cpu" else "cuda", "the neighbours torch search")
        exact = TorchExact(base, device) if len(base_sids) else None
        return base_sids, base, exact, exact
    folder = _index_dir(store)
    if plan["kind"] == "flat" and "vectors" in plan:  # exact past exact_threshold: over the mapped vectors
        base = np.load(folder / plan["vectors"], mmap_mode="r")
        exact = BruteForce(base)  # faiss.knn: the kernel IndexFlatIP.search runs, without a copy of the base
        return np.load(folder / plan["sids"]), base, exact, exact
    if plan["kind"] == "flat" or not plan["rows"]:
        base_sids, base = read_vectors(store, plan["base"], n)
        index, cpu_index = build_index(base, plan["kind"], cfg.neighbours, cfg.run.seed,
                                       gpu=faiss_gpus_for_plan(plan) > 0) if len(base_sids) else (None, None)
        return base_sids, base, index, cpu_index
    # IVF's lists and HNSW's stored vectors are mapped, not read: one copy per machine, in the page cache
    mapped = faiss.IO_FLAG_MMAP if plan["kind"] == "ivf" else faiss.IO_FLAG_MMAP_IFC  # (FAISS takes one or other)
    index = faiss.read_index(str(folder / plan["file"]), mapped)
    if plan["kind"] == "ivf":
        index.nprobe = plan["nprobe"]
        base = np.load(folder / plan["vectors"], mmap_mode="r")
    else:
        index.hnsw.efSearch = plan["ef_search"]
        base = stored_vectors(index)  # a view of the mapped graph's vectors: no second copy
    sids = np.load(folder / plan["sids"])
    if plan["device"] == "gpu":  # IVF on a GPU (index = "ivf" there): this process' device holds its own copy
        return sids, base, GpuIndex(to_gpu(index, faiss_gpus_for_plan(plan))), index
    return sids, base, index, index


INDEX = Resource("index", index_plan, load_index, reads=("neighbours", "run"))


@stage(reads=("embeddings",), reads_whole=("embeddings", "pool_embeddings"), writes=("neighbours",),
       settings=("neighbours",), resources=(INDEX,), manifest=index_facts)
def neighbours(ctx: Ctx) -> dict[str, pa.Table]:
    c = ctx.cfg.neighbours
    base_sids, base, index, cpu_index = ctx.resource("index")
    q_sids, q = table_vectors(ctx.shard("embeddings"))
    return {"neighbours": band_neighbours(q, q_sids, base, base_sids, index, cpu_index, c.lo, c.hi, c.pool_size,
                                          c.slack, c.max_block_elems, progress=ctx.progress, skip_top=c.skip_top)}
