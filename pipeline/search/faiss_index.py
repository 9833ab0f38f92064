"""FAISS for the band search: the module imported on first use, which engine and device search
(`search_engine`, `choose_index`), building a flat / IVF / HNSW index (`build_index`), its GPU copy (`GpuIndex`,
`to_gpu`) and exact blocked search without an index (`BruteForce`). Settings in, indexes out: no store, no plan
files (pipeline/search/index.py), no stage (pipeline/stages/neighbours.py).
"""
from __future__ import annotations

import threading

import numpy as np
import torch

from contramine.pipeline.engine.devices import worker_gpu
from contramine.pipeline.engine.resources import PlanError, process_name
from contramine.pipeline.search.band import GPU_MAX_K


class _LazyFaiss:
    """The `faiss` module, imported on first use: the torch engine (pipeline/search/torch_exact.py) runs where FAISS is not
    installed, so importing this stage must not import it. Attributes set on it (a test's monkeypatch) win."""

    def __getattr__(self, name: str):
        import faiss as module  # faiss: optional (the cpu / gpu extras); engine = torch runs without it

        return getattr(module, name)


faiss = _LazyFaiss()


def gpu_count() -> int:
    try:
        return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    except ImportError:  # no FAISS here: no FAISS GPU either
        return 0


def search_engine(c) -> tuple[str, bool]:
    """(engine, on a GPU) for the neighbours settings `c`: engine = auto is torch wherever torch sees a CUDA GPU it
    may use (exact flat search with the pools resolved on the device: faster than FAISS's GPU k-NN followed by the
    host's resolve, so also with faiss-gpu installed), FAISS for ivf / hnsw (on a GPU where FAISS sees one), FAISS
    on a CPU (torch when FAISS is not installed, flat index only); the torch engine is the flat index only (the
    config refuses ivf / hnsw with it). engine = torch never imports FAISS."""
    if c.engine == "faiss" or (c.engine == "auto" and c.index in ("ivf", "hnsw")):
        return "faiss", c.gpu != "never" and gpu_count() > 0
    cuda = c.gpu != "never" and torch.cuda.is_available()
    if c.engine == "auto" and not cuda:
        if c.gpu != "never" and gpu_count() > 0:  # FAISS sees a GPU that torch does not (a CPU build of torch)
            return "faiss", True
        try:
            import faiss as _  # noqa: F401  (faiss: optional; is it installed?)
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
    """HNSW's first efSearch for auto: the first power of two at or above band_neighbours' first k."""
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
        raise PlanError(f"{process_name()} cannot search neighbours on a GPU as the run's plan says: FAISS sees no "
                        f"GPU here (faiss-gpu and a CUDA device are needed on every worker)")
    return n_gpus


class BruteForce:
    """Exact k-NN over the vectors in float32 blocks (faiss.knn): no index and no copy of the base, so the recall
    check's memory grows with sample x k, not with N (the band search settles what float32 cannot in float64)."""

    def __init__(self, base: np.ndarray):
        self.base = base

    def search(self, x: np.ndarray, k: int):
        return faiss.knn(np.ascontiguousarray(x, dtype=np.float32), self.base, k, metric=faiss.METRIC_INNER_PRODUCT)
