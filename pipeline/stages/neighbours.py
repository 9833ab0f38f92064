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
measured on a sample against exact search) and GPU indexes are settings.
"""
from __future__ import annotations

import functools
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tqdm.auto import tqdm

from pipeline.engine.spec import Ctx, package_versions, stage
from pipeline.schema import SCHEMAS, table_vectors

EPS = 1e-5  # bound on |FAISS float32 score - exact cosine| for unit vectors
GPU_MAX_K = 2048  # FAISS GPU k-selection limit
log = logging.getLogger(__name__)


def gpu_count() -> int:
    return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0


def choose_index(n: int, cfg, n_gpus: int | None = None) -> str:
    """index = auto: exact flat search wherever FAISS sees a GPU it may use (1M x 1M is seconds there); on CPU,
    flat up to `ivf_threshold` sentences and IVF past it."""
    if cfg.index != "auto":
        return cfg.index
    if cfg.gpu != "never" and (gpu_count() if n_gpus is None else n_gpus) > 0:
        return "flat"
    return "flat" if n <= cfg.ivf_threshold else "ivf"


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


def build_index(vectors: np.ndarray, kind: str, cfg, seed: int = 0):
    """(search index, CPU index): a FAISS inner-product index over unit vectors, and its GPU copy when FAISS sees
    a GPU and cfg.gpu allows (HNSW has no GPU version)."""
    n, d = vectors.shape
    if kind == "flat":
        index = faiss.IndexFlatIP(d)
    elif kind == "ivf":
        nlist = cfg.nlist or max(1, min(n // 39, int(4 * np.sqrt(n))))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = seed  # k-means initialisation: deterministic
        rng = np.random.default_rng(seed)
        sample = vectors[np.sort(rng.choice(n, size=min(n, nlist * cfg.ivf_train_per_list), replace=False))]
        index.train(sample)
        index.nprobe = min(cfg.nprobe, nlist)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = max(64, 2 * (cfg.pool_size + cfg.slack))
    else:
        raise ValueError(f"neighbours.index {kind!r}: expected flat, ivf or hnsw")
    index.add(vectors)
    n_gpus = gpu_count()
    if cfg.gpu == "always" and n_gpus == 0:
        raise RuntimeError("neighbours.gpu = 'always' but faiss sees no GPU (install the faiss-gpu extra)")
    if cfg.gpu != "never" and n_gpus > 0 and kind != "hnsw":
        return GpuIndex(to_gpu(index, n_gpus)), index
    return index, index


def band_neighbours(q_vecs: np.ndarray, q_sids: np.ndarray, base_vecs: np.ndarray, base_sids: np.ndarray,
                    index, cpu_index, lo: float, hi: float, pool_size: int, slack: int = 8,
                    max_block_elems: int = 1 << 24, progress: bool = False, skip_top: int = 0) -> pa.Table:
    """Top `pool_size` in-band neighbours of each query, as a `neighbours` table sorted by (sid, rank), leaving out
    the query's `skip_top` most similar sentences (in band or not: sentence-transformers' `range_min`).
    Exact with a flat index; with IVF/HNSW the same widening runs until the index has nothing more to return."""
    n_base = len(base_sids)
    out_sid, out_cand, out_cos, out_rank = [], [], [], []
    if n_base == 0 or len(q_sids) == 0:
        return _table(out_sid, out_cand, out_cos, out_rank)
    k0 = min(n_base, pool_size + skip_top + slack + 1 + 16)
    pending = np.arange(len(q_sids))
    k = k0
    done: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    bar = tqdm(total=len(q_sids), desc="neighbours", unit="q", disable=not progress)
    while len(pending):
        search_index = index if k <= GPU_MAX_K else cpu_index
        block = max(1, max_block_elems // k)
        unfinished = []
        for start in range(0, len(pending), block):
            rows = pending[start:start + block]
            scores, ids = search_index.search(q_vecs[rows], k)
            finished, cands, coss = _resolve_block(q_vecs[rows], q_sids[rows], scores, ids, base_vecs, base_sids,
                                                   lo, hi, pool_size, k >= n_base, skip_top)
            for r, ok, cand, cos in zip(rows.tolist(), finished.tolist(), cands, coss):
                if ok:
                    done[r] = (cand, cos)
                else:
                    unfinished.append(r)
            bar.update(int(finished.sum()))
        pending = np.array(unfinished, dtype=np.int64)
        k = min(n_base, 2 * k)
    bar.close()
    for r in range(len(q_sids)):
        cand, cos = done[r]
        out_sid.append(np.full(len(cand), q_sids[r], dtype=np.int64))
        out_cand.append(cand)
        out_cos.append(cos)
        out_rank.append(np.arange(1, len(cand) + 1, dtype=np.int32))
    return _table(out_sid, out_cand, out_cos, out_rank)


def exact_cosines(q: np.ndarray, q_rows: np.ndarray, base_vecs: np.ndarray, ids: np.ndarray,
                  pairs_per_step: int = 1024) -> np.ndarray:
    """cos(q[q_rows[p]], base_vecs[ids[p]]) in float64 for each pair p. Per pair (float32 inputs, float64
    products and sums), so a value never depends on the batch. Chunks of a thousand pairs keep the gathered rows in
    cache; numpy releases the GIL in the gather and the einsum, so the chunks run on FAISS's threads' cores."""
    out = np.empty(len(ids), dtype=np.float64)

    def chunk(a: int) -> None:
        b = a + pairs_per_step
        out[a:b] = np.einsum("pd,pd->p", q[q_rows[a:b]], base_vecs[ids[a:b]], dtype=np.float64)
        np.clip(out[a:b], -1.0, 1.0, out=out[a:b])  # unit float32 rows: 1 ± 1e-7

    starts = range(0, len(ids), pairs_per_step)
    workers = max(1, min(len(starts), faiss.omp_get_max_threads()))
    if workers == 1:
        for a in starts:
            chunk(a)
    else:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(chunk, starts))
    return out


def _resolve_block(q, q_sids, scores, ids, base_vecs, base_sids, lo, hi, pool_size, seen_all, skip_top=0):
    """For a block of queries: (finished mask, per-query cand_sids, per-query exact cos) of each in-band top
    pool_size; a query is unfinished when k must widen (rule 3 of the module docstring).

    Exact cosines are recomputed only where the float32 FAISS score s (|s - cos| <= EPS) cannot decide: entries
    with s within EPS of the band, and, among those, only the ones with s >= t - 2 EPS, where t is the pool_size-th
    largest s of the entries surely in band (lo + EPS <= s <= hi - EPS). An entry below t - 2 EPS has
    cos < t - EPS, below each of those pool_size sure ones, so it cannot make the pool. With `skip_top` = r, the r
    most similar entries are left out: exact cosines also for every entry within 2 EPS of the r-th largest score
    (the only ones that can be among the r), t moves to the (pool_size + r)-th sure score, and a query is finished
    only when its r-th score is more than 2 EPS above the smallest returned one (nothing unseen is among the r)."""
    n_q, k = ids.shape
    valid = ids >= 0
    cand = np.where(valid, base_sids[np.maximum(ids, 0)], -1)
    other = valid & (cand != q_sids[:, None])
    s = scores.astype(np.float64)
    sure = other & (s >= lo + EPS) & (s <= hi - EPS)
    if k > pool_size + skip_top:
        t = -np.partition(-np.where(sure, s, -np.inf), pool_size + skip_top - 1, axis=1)[:, pool_size + skip_top - 1]
    else:
        t = np.full(n_q, -np.inf)
    need = other & (s >= lo - EPS) & (s <= hi + EPS) & (s >= t[:, None] - 2 * EPS)
    if skip_top:
        kr = min(skip_top, k)
        t_r = -np.partition(-np.where(other, s, -np.inf), kr - 1, axis=1)[:, kr - 1]
        near_top = other & (s >= t_r[:, None] - 2 * EPS)
        need |= near_top
    rows, cols = np.nonzero(need)
    cos = np.full(ids.shape, np.nan)
    cos[rows, cols] = exact_cosines(q, rows, base_vecs, ids[rows, cols])
    band = need & (cos >= lo) & (cos <= hi)
    if skip_top:  # the r most similar by exact cos (ties by sid) are not candidates
        top = np.lexsort((cand, np.where(near_top, -cos, np.inf)), axis=1)[:, :skip_top]
        skipped = np.zeros_like(band)
        np.put_along_axis(skipped, top, True, axis=1)
        band &= ~(skipped & near_top)
    # in-band first by descending exact cos, ties by sid; everything else last
    order = np.lexsort((cand, np.where(band, -cos, np.inf)), axis=1)[:, :pool_size]
    cand_sorted = np.take_along_axis(cand, order, axis=1)
    cos_sorted = np.take_along_axis(cos, order, axis=1)
    n_band = np.minimum(band.sum(axis=1), pool_size)
    n_valid = valid.sum(axis=1)
    # smallest returned FAISS score (approximate indexes pad with -1 ids once their reachable set is spent)
    s_min = np.where(n_valid > 0, s[np.arange(n_q), np.maximum(n_valid - 1, 0)], -np.inf)
    exhausted = seen_all | (n_valid < k)
    last = cos_sorted[np.arange(n_q), np.maximum(n_band - 1, 0)]
    top_ok = ((other.sum(axis=1) >= skip_top) & (t_r - EPS > s_min + EPS)) if skip_top else True
    finished = exhausted | (top_ok & ((s_min + EPS < lo) | ((n_band == pool_size) & (last > s_min + EPS))))
    n_list = n_band.tolist()
    return finished, [cand_sorted[i, :n] for i, n in enumerate(n_list)], [cos_sorted[i, :n] for i, n in enumerate(n_list)]


def exact_band_neighbours(q_vecs, q_sids, base_vecs, base_sids, lo, hi, pool_size, skip_top: int = 0) -> pa.Table:
    """Brute force (numpy, float64): the reference for tests and for the recall of approximate indexes."""
    sims = np.clip(q_vecs.astype(np.float64) @ base_vecs.astype(np.float64).T, -1.0, 1.0)  # as exact_cosines
    out = ([], [], [], [])
    for r, row in enumerate(sims):
        band = (row >= lo) & (row <= hi) & (base_sids != q_sids[r])
        if skip_top:
            others = np.flatnonzero(base_sids != q_sids[r])
            band[others[np.lexsort((base_sids[others], -row[others]))[:skip_top]]] = False
        cand, cos = base_sids[band], row[band]
        order = np.lexsort((cand, -cos))[:pool_size]
        out[0].append(np.full(len(order), q_sids[r], dtype=np.int64))
        out[1].append(cand[order])
        out[2].append(cos[order])
        out[3].append(np.arange(1, len(order) + 1, dtype=np.int32))
    return _table(*out)


def recall_at_pool(approx: pa.Table, exact: pa.Table) -> float:
    """Share of the exact (sid, cand_sid) pairs that the approximate search found."""
    a = set(zip(approx.column("sid").to_pylist(), approx.column("cand_sid").to_pylist()))
    e = set(zip(exact.column("sid").to_pylist(), exact.column("cand_sid").to_pylist()))
    return len(a & e) / len(e) if e else 1.0


def _table(sids, cands, coss, ranks) -> pa.Table:
    cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
    return pa.table({"sid": cat(sids, np.int64), "cand_sid": cat(cands, np.int64),
                     "cos": cat(coss, np.float32), "rank": cat(ranks, np.int32)}, schema=SCHEMAS["neighbours"])


# ---- the stage: each shard's queries against the whole table ------------------------------------------------------
def _facts_path(store, i: int, n: int) -> Path:
    """Index kind and sampled recall of neighbours shard i, beside the shard (kept when the shard is reused)."""
    return store.dir("neighbours") / f"facts-{i:05d}-of-{n:05d}.json"


def index_facts(cfg, store, n: int) -> dict:
    """For the manifest: the per-shard facts files, written where each shard ran (a Dask worker, too)."""
    out: dict = {}
    for i in range(n):
        if (facts := _facts_path(store, i, n)).is_file():
            out.update(json.loads(facts.read_text()))
    return out


_INDEX_LOCK = threading.Lock()


def _index_for(*key):
    """The process's one index: shard threads that arrive together wait for the first to build it."""
    with _INDEX_LOCK:
        return _build_index_for(*key)


@functools.lru_cache(maxsize=1)
def _build_index_for(run_dir: str, n: int, table: str, table_hash: str, settings: str, seed: int):
    from pipeline.config import NeighboursCfg
    from pipeline.engine.store import Store

    cfg = NeighboursCfg.model_validate_json(settings)
    base_sids, base = table_vectors(Store(Path(run_dir)).read(table, n))
    kind = choose_index(len(base_sids), cfg)
    index, cpu_index = build_index(base, kind, cfg, seed) if len(base_sids) else (None, None)
    return base_sids, base, kind, index, cpu_index


@stage(reads=("embeddings",), reads_whole=("embeddings", "pool_embeddings"), writes=("neighbours",),
       settings=("neighbours",),
       facts=lambda cfg: package_versions("faiss-cpu", "faiss-gpu"), manifest=index_facts)
def neighbours(ctx: Ctx) -> dict[str, pa.Table]:
    from pipeline.engine.atomic import atomic_write_json

    c = ctx.cfg.neighbours
    base_table = "pool_embeddings" if ctx.cfg.data.candidates is not None else "embeddings"  # data.candidates
    base_sids, base, kind, index, cpu_index = _index_for(
        str(ctx.store.root), ctx.n, base_table, ctx.store.table_hash(base_table, ctx.n), c.model_dump_json(),
        ctx.cfg.run.seed)
    q_sids, q = table_vectors(ctx.shard("embeddings"))
    exact = kind == "flat"
    table = band_neighbours(q, q_sids, base, base_sids, index, cpu_index, c.lo, c.hi, c.pool_size, c.slack,
                            c.max_block_elems, progress=ctx.progress, skip_top=c.skip_top)
    facts = {"index": kind, "exact": exact}
    if not exact and c.recall_sample and len(q_sids):
        pick = np.random.default_rng(ctx.cfg.run.seed).choice(len(q_sids), min(len(q_sids), c.recall_sample), False)
        ref = exact_band_neighbours(q[pick], q_sids[pick], base, base_sids, c.lo, c.hi, c.pool_size, c.skip_top)
        sub = table.filter(pc.is_in(table.column("sid"), pa.array(q_sids[pick])))
        recall = facts[f"recall_shard_{ctx.i}"] = recall_at_pool(sub, ref)
        if recall < c.min_recall:
            raise RuntimeError(f"neighbours: the {kind} index found {recall:.3f} of the exact pool on a sample of "
                               f"shard {ctx.i} (< neighbours.min_recall {c.min_recall}): raise neighbours.nprobe "
                               f"(now {c.nprobe}), or set neighbours.index = 'flat' (exact; fast on a GPU)")
    atomic_write_json(_facts_path(ctx.store, ctx.i, ctx.n), facts)
    return {"neighbours": table}
