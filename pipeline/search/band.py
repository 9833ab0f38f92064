"""Band search: each query's top `pool_size` neighbours among those with lo <= cos <= hi, exact by construction
on a flat index, against any FAISS index (or anything with `search(x, k) -> (scores, ids)`: pipeline/search/torch_exact.py's
TorchExact). The rules are in pipeline/stages/neighbours.py's docstring, which is the stage that runs it; this module
has no stage, no GPU code, no settings and no FAISS import, so a recall check or a bench can run it against any
index, and the torch engine where FAISS is not installed.
"""
from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
from tqdm.auto import tqdm

from pipeline.schema import SCHEMAS

GPU_MAX_K = 2048  # FAISS GPU k-selection limit: wider searches go to the CPU copy of the index
EPS = 1e-5  # the floor of score_tolerance (what the stage assumed for every d before it followed d)


def score_tolerance(d: int, dtype=np.float32) -> float:
    """A bound on |FAISS score - exact cosine| for unit vectors of dimension d stored as `dtype`: a dot product of d
    terms accumulated in that precision is off by at most d·u·Σ|x_i y_i| ≤ d·u (u: the unit roundoff, 2^-24 for
    float32; Σ|x_i y_i| ≤ 1 by Cauchy-Schwarz), ~4.6e-5 at d = 768. Worst case, not typical (~√d·u), which is the
    point: near band edges and rank cut-offs "exact" must not rest on luck. Never below the old fixed EPS."""
    u = float(np.finfo(dtype).eps) / 2
    return max(EPS, 1.01 * d * u / (1 - d * u))
def band_neighbours(q_vecs: np.ndarray, q_sids: np.ndarray, base_vecs: np.ndarray, base_sids: np.ndarray,
                    index, cpu_index, lo: float, hi: float, pool_size: int, slack: int = 8,
                    max_block_elems: int = 1 << 24, progress: bool = False, skip_top: int = 0,
                    eps: float | None = None) -> pa.Table:
    """Top `pool_size` in-band neighbours of each query, as a `neighbours` table sorted by (sid, rank), leaving out
    the query's `skip_top` most similar sentences (in band or not: sentence-transformers' `range_min`).
    Exact with a flat index; with IVF/HNSW the same widening runs until the index has nothing more to return."""
    n_base = len(base_sids)
    eps = score_tolerance(base_vecs.shape[1], base_vecs.dtype) if eps is None else eps
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
                                                   lo, hi, pool_size, k >= n_base, skip_top, eps)
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
    workers = max(1, min(len(starts), _threads()))
    if workers == 1:
        for a in starts:
            chunk(a)
    else:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(chunk, starts))
    return out


def _threads() -> int:
    """FAISS's thread count where FAISS is loaded, else OMP_NUM_THREADS or the CPUs this process may use: this module
    never imports FAISS itself (the torch engine runs where there is none)."""
    if sys.modules.get("faiss") is not None:
        return sys.modules["faiss"].omp_get_max_threads()
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _resolve_block(q, q_sids, scores, ids, base_vecs, base_sids, lo, hi, pool_size, seen_all, skip_top=0,
                   eps: float = EPS):
    """For a block of queries: (finished mask, per-query cand_sids, per-query exact cos) of each in-band top
    pool_size; a query is unfinished when k must widen (rule 3 of the module docstring).

    Exact cosines are recomputed only where the float32 FAISS score s (|s - cos| <= EPS, the `score_tolerance` of
    the vectors' d and dtype, passed as `eps`) cannot decide: entries with s within EPS of the band, and, among
    those, only the ones with s >= t - 2 EPS, where t is the pool_size-th largest s of the entries surely in band
    (lo + EPS <= s <= hi - EPS). An entry below t - 2 EPS has
    cos < t - EPS, below each of those pool_size sure ones, so it cannot make the pool. With `skip_top` = r, the r
    most similar entries are left out: exact cosines also for every entry within 2 EPS of the r-th largest score
    (the only ones that can be among the r), t moves to the (pool_size + r)-th sure score, and a query is finished
    only when its r-th score is more than 2 EPS above the smallest returned one (nothing unseen is among the r)."""
    n_q, k = ids.shape
    valid = ids >= 0
    cand = np.where(valid, base_sids[np.maximum(ids, 0)], -1)
    other = valid & (cand != q_sids[:, None])
    s = scores.astype(np.float64)
    sure = other & (s >= lo + eps) & (s <= hi - eps)
    if k > pool_size + skip_top:
        t = -np.partition(-np.where(sure, s, -np.inf), pool_size + skip_top - 1, axis=1)[:, pool_size + skip_top - 1]
    else:
        t = np.full(n_q, -np.inf)
    need = other & (s >= lo - eps) & (s <= hi + eps) & (s >= t[:, None] - 2 * eps)
    if skip_top:
        kr = min(skip_top, k)
        t_r = -np.partition(-np.where(other, s, -np.inf), kr - 1, axis=1)[:, kr - 1]
        near_top = other & (s >= t_r[:, None] - 2 * eps)
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
    top_ok = ((other.sum(axis=1) >= skip_top) & (t_r - eps > s_min + eps)) if skip_top else True
    finished = exhausted | (top_ok & ((s_min + eps < lo) | ((n_band == pool_size) & (last > s_min + eps))))
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
