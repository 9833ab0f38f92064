"""Band search: each query's top `pool_size` neighbours among those with lo <= cos <= hi, exact by construction
on a flat index. The rules are in pipeline/stages/neighbours.py's docstring (the stage that runs it); `resolve`
applies them to a block of queries at once, in torch, on whatever device the block's scores are:

- any index with `search(x, k) -> (scores, ids)` (FAISS flat / IVF / HNSW, a FAISS GPU index): k-NN in blocks of
  max_block_elems // k queries, resolved on the host, k doubled for the queries not settled;
- `TorchExact` (pipeline/search/torch_exact.py), which has a `band` method: each block's full score rows are
  computed, cut to their k largest, resolved and widened on its device (a widened query's scores are still in
  memory: it is never searched twice), and only the pools come back.

Either way the result is whole-block arrays: a [queries, pool_size] array of candidates and one of exact cosines,
plus a count per query, flattened once into the table. This module has no stage, no settings and no FAISS import,
so a recall check or a bench can run it against any index, and the torch engine where FAISS is not installed.
"""
from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import torch
from tqdm.auto import tqdm

from contramine.pipeline.schema import SCHEMAS

GPU_MAX_K = 2048  # FAISS GPU k-selection limit: wider searches go to the CPU copy of the index
EPS = 1e-5  # the floor of score_tolerance (what the stage assumed for every d before it followed d)
# relative error of each input vector's entries as the score matmul rounds them: none in float32; TF32 keeps 10
# mantissa bits (one ulp, 2^-10: the tensor cores may truncate rather than round); bf16 keeps 7 and the cast
# (torch's, before the matmul) rounds to nearest: half an ulp, 2^-8
INPUT_ROUNDING = {"float32": 0.0, "tf32": 2.0 ** -10, "bf16": 2.0 ** -8}


def score_tolerance(d: int, dtype=np.float32, precision: str = "float32") -> float:
    """A bound on |score - exact cosine| for unit vectors of dimension d stored as `dtype`, scored by a matmul at
    `precision`. Inputs rounded with relative error v make each product off by at most (2v + v²)|x_i y_i|; a dot
    product of d terms accumulated in `dtype` is off by at most d·u·Σ|x_i y_i| more (u: the unit roundoff, 2^-24
    for float32); Σ|x_i y_i| ≤ 1 by Cauchy-Schwarz. Together (2v + v²) + d·u(1 + v)², ~4.6e-5 at d = 768 in float32,
    ~7.8e-3 for bf16 inputs. Tensor cores' float32 adders may truncate: the accumulation term doubles for TF32 and
    bf16. Worst case, not typical (~√d·u), which is the point: near band edges and rank cut-offs "exact" must not
    rest on luck. Never below the old fixed EPS."""
    u, v = float(np.finfo(dtype).eps) / 2, INPUT_ROUNDING[precision]
    accumulate = (1 if v == 0 else 2) * d * u * (1 + v) ** 2 / (1 - d * u)
    return max(EPS, 1.01 * (2 * v + v * v + accumulate))


def first_k(n_base: int, pool_size: int, skip_top: int, slack: int) -> int:
    """The first k-NN width: the pool, the skipped top, `slack` for near-ties, the query and 16 above the band."""
    return min(n_base, pool_size + skip_top + slack + 1 + 16)


class Pools:
    """The result being built: per query its in-band candidates (sids, in rank order) and their exact cosines,
    padded to pool_size, and how many there are. `table` flattens them once into the stage's table."""

    def __init__(self, n_queries: int, pool_size: int):
        self.cand: np.ndarray = np.full((n_queries, pool_size), -1, dtype=np.int64)
        self.cos: np.ndarray = np.zeros((n_queries, pool_size), dtype=np.float64)
        self.count: np.ndarray = np.zeros(n_queries, dtype=np.int64)

    def put(self, rows, cand, cos, count) -> None:
        self.cand[rows], self.cos[rows], self.count[rows] = cand, cos, count

    def table(self, q_sids: np.ndarray) -> pa.Table:
        """The `neighbours` table, sorted by (query, rank) in query order."""
        keep = np.arange(self.cand.shape[1]) < self.count[:, None]
        rank = np.broadcast_to(np.arange(1, self.cand.shape[1] + 1, dtype=np.int32), keep.shape)
        return pa.table({"sid": np.repeat(np.asarray(q_sids, dtype=np.int64), self.count),
                         "cand_sid": self.cand[keep], "cos": self.cos[keep].astype(np.float32), "rank": rank[keep]},
                        schema=SCHEMAS["neighbours"])


def band_neighbours(q_vecs: np.ndarray, q_sids: np.ndarray, base_vecs: np.ndarray, base_sids: np.ndarray,
                    index, cpu_index, lo: float, hi: float, pool_size: int, slack: int = 8,
                    max_block_elems: int = 1 << 24, progress: bool = False, skip_top: int = 0,
                    eps: float | None = None) -> pa.Table:
    """Top `pool_size` in-band neighbours of each query, as a `neighbours` table sorted by (sid, rank), leaving out
    the query's `skip_top` most similar sentences (in band or not: sentence-transformers' `range_min`).
    Exact with a flat index; with IVF/HNSW the same widening runs until the index has nothing more to return.
    `eps` bounds |score - exact cosine| (default: `score_tolerance` of the vectors, or the index's own
    `score_tolerance()` where it has one: TorchExact's scores at TF32 / bf16)."""
    n_base, n_q = len(base_sids), len(q_sids)
    if eps is None:
        eps = index.score_tolerance() if hasattr(index, "score_tolerance") else \
            score_tolerance(base_vecs.shape[1], base_vecs.dtype)
    pools = Pools(n_q, pool_size)
    if n_base == 0 or n_q == 0:
        return pools.table(q_sids)
    bar = tqdm(total=n_q, desc="neighbours", unit="q", disable=not progress)
    if hasattr(index, "band"):  # TorchExact: scores, top-k and the resolve on its device
        index.band(q_vecs, q_sids, base_sids, lo, hi, pool_size, slack, skip_top, eps, pools, bar.update)
        bar.close()
        return pools.table(q_sids)
    sids_t = torch.from_numpy(np.require(base_sids, np.int64, ["C", "W"]))
    pending, k = np.arange(n_q), first_k(n_base, pool_size, skip_top, slack)
    while len(pending):
        search_index = index if k <= GPU_MAX_K else cpu_index
        block = max(1, max_block_elems // k)
        unfinished = []
        for start in range(0, len(pending), block):
            rows = pending[start:start + block]
            q = np.ascontiguousarray(q_vecs[rows], dtype=np.float32)
            scores, ids = search_index.search(q, k)
            exact = lambda r, i: torch.from_numpy(exact_cosines(q, r.numpy(), base_vecs, i.numpy()))  # noqa: E731
            out = resolve(torch.from_numpy(scores), torch.from_numpy(ids), torch.from_numpy(q_sids[rows]), sids_t,
                          lo, hi, pool_size, k >= n_base, skip_top, eps, exact)
            finished = out.finished.numpy()
            pools.put(rows[finished], out.cand.numpy()[finished], out.cos.numpy()[finished],
                      out.count.numpy()[finished])
            unfinished.append(rows[~finished])
            bar.update(int(finished.sum()))
        pending = np.concatenate(unfinished)
        k = min(n_base, 2 * k)
    bar.close()
    return pools.table(q_sids)


class Resolved:
    """`resolve`'s answer for a block: which queries are settled, their pools (padded [B, pool_size]: sids and
    exact cosines in rank order, -1 / NaN past `count`), and t_r, the skip_top-th largest score of each query
    (+inf without skip_top): a widened search may leave out every score in (hi + eps, t_r - 2 eps), which can be
    neither in band nor among the r left out."""

    def __init__(self, finished, cand, cos, count, t_r):
        self.finished, self.cand, self.cos, self.count, self.t_r = finished, cand, cos, count, t_r


def resolve(scores, ids, q_sids, base_sids, lo: float, hi: float, pool_size: int, seen_all: bool,
            skip_top: int, eps: float, exact) -> Resolved:
    """The in-band top pool_size of a block of queries from their k-NN (torch tensors on one device: scores
    float32 [B, k] descending per row, ids int64 [B, k] base rows, -1 for none after the valid ones, as FAISS
    returns them; q_sids [B]; base_sids [n]), with `exact(rows, ids)` the float64 cosines of (block row, base row)
    pairs. A query is unfinished when k must widen (rule 3 of the stage's docstring).

    Exact cosines are computed only where the score s (|s - cos| <= eps: `score_tolerance`) cannot decide: entries
    with s within eps of the band, and, among those, only the ones with s >= t - 2 eps, where t is the
    pool_size-th largest s of the entries surely in band (lo + eps <= s <= hi - eps). An entry below t - 2 eps has
    cos < t - eps, below each of those pool_size sure ones, so it cannot make the pool. With `skip_top` = r, the r
    most similar entries are left out: exact cosines also for every entry within 2 eps of the r-th largest score
    (the only ones that can be among the r), t moves to the (pool_size + r)-th sure score, and a query is finished
    only when its r-th score is more than 2 eps above the smallest returned one (nothing unseen is among the r).
    No exact cosine is computed for a query that the scores alone show cannot finish this round (it would be
    computed again after widening): fewer than pool_size entries near the band, or the pool_size-th of them no
    higher than the smallest returned score, with nothing else to settle it."""
    n_q, k = ids.shape
    inf = torch.tensor(float("inf"), dtype=torch.float64, device=ids.device)
    valid = ids >= 0
    cand = torch.where(valid, base_sids[ids.clamp(min=0)], -1)
    other = valid & (cand != q_sids[:, None])
    s = scores.to(torch.float64)
    sure = other & (s >= lo + eps) & (s <= hi - eps)
    near_band = other & (s >= lo - eps) & (s <= hi + eps)
    t = _kth_marked(s, sure, pool_size + skip_top) if k > pool_size + skip_top else \
        torch.full_like(s[:, 0], float("-inf"))
    need = near_band & (s >= t[:, None] - 2 * eps)
    t_r = torch.full((n_q,), inf, dtype=torch.float64, device=ids.device)
    if skip_top:
        t_r = _kth_marked(s, other, min(skip_top, k))
        near_top = other & (s >= t_r[:, None] - 2 * eps)
        need |= near_top
    n_valid = valid.sum(1)
    s_min = torch.where(n_valid > 0, s.gather(1, (n_valid - 1).clamp(min=0)[:, None])[:, 0], -inf)
    exhausted = (n_valid < k) | seen_all
    top_ok = (other.sum(1) >= skip_top) & (t_r - eps > s_min + eps) if skip_top else torch.ones_like(exhausted)
    # the pool_size-th exact in-band cosine is at most the pool_size-th near-band score + eps: if that is no more
    # than s_min + eps, rule 3c cannot hold, whatever the exact cosines
    u = _kth_marked(s, near_band, pool_size)
    can_finish = exhausted | (top_ok & ((s_min + eps < lo) | (u > s_min)))
    need &= can_finish[:, None]
    rows, cols = need.nonzero(as_tuple=True)
    cos = torch.full(s.shape, float("nan"), dtype=torch.float64, device=ids.device)
    if len(rows):
        cos[rows, cols] = exact(rows, ids[rows, cols])
    band = need & (cos >= lo) & (cos <= hi)
    if skip_top:  # the r most similar by exact cos (ties by sid) are not candidates
        top = _rank_order(torch.where(near_top, -cos, inf), cand)[:, :skip_top]
        skipped = torch.zeros_like(band).scatter_(1, top, True)
        band &= ~(skipped & near_top)
    # in-band first by descending exact cos, ties by sid; everything else last
    order = _rank_order(torch.where(band, -cos, inf), cand)[:, :pool_size]
    cand_sorted, cos_sorted = cand.gather(1, order), cos.gather(1, order)
    count = band.sum(1).clamp(max=pool_size)
    last = cos_sorted.gather(1, (count - 1).clamp(min=0)[:, None])[:, 0]
    finished = exhausted | (top_ok & ((s_min + eps < lo) | ((count == pool_size) & (last > s_min + eps))))
    if k < pool_size:  # fewer returned than a pool holds: pad
        pad = pool_size - k
        cand_sorted = torch.nn.functional.pad(cand_sorted, (0, pad), value=-1)
        cos_sorted = torch.nn.functional.pad(cos_sorted, (0, pad), value=float("nan"))
    return Resolved(finished, cand_sorted, cos_sorted, count, t_r)


def _kth_marked(s, mark, kth: int):
    """Per row, the kth largest of the scores s where `mark` is set (-inf where fewer are): with s descending
    along each row (as every index returns its scores), the score of the kth marked column."""
    before = (mark.cumsum(1) < kth).sum(1)  # columns before the kth marked one
    found = before < s.shape[1]
    return torch.where(found, s.gather(1, before.clamp(max=s.shape[1] - 1)[:, None])[:, 0], float("-inf"))


def _rank_order(key, cand):
    """Each row's column order by (key, cand) ascending, where only the finite keys' order matters (+inf: the
    columns that are not ranked, last in any order): np.lexsort((cand, key), axis=1) on those. The columns come in
    descending score order and a key is -exact cosine, within eps of -score, so a row's finite keys are almost
    always ascending already: those go first in column order (a cumulative sum, no sort), and only rows where that
    is not the (key, cand) order are sorted, by two stable sorts."""
    n_q, k = key.shape
    ranked = key < float("inf")
    n_ranked = ranked.sum(1, keepdim=True)
    place = torch.where(ranked, ranked.cumsum(1) - 1, n_ranked + (~ranked).cumsum(1) - 1)
    order = torch.empty_like(place).scatter_(1, place, torch.arange(k, device=key.device).expand(n_q, k))
    ks, cs = key.gather(1, order), cand.gather(1, order)
    ascending = (ks[:, 1:] > ks[:, :-1]) | ((ks[:, 1:] == ks[:, :-1]) & (cs[:, 1:] > cs[:, :-1])) | \
        (ks[:, 1:] == float("inf"))
    bad = (~ascending.all(1)).nonzero()[:, 0]
    if len(bad):
        by_cand = torch.sort(cand[bad], dim=1, stable=True).indices
        order[bad] = by_cand.gather(1, torch.sort(key[bad].gather(1, by_cand), dim=1, stable=True).indices)
    return order


def exact_cosines(q: np.ndarray, q_rows: np.ndarray, base_vecs: np.ndarray, ids: np.ndarray,
                  pairs_per_step: int = 1024) -> np.ndarray:
    """cos(q[q_rows[p]], base_vecs[ids[p]]) in float64 for each pair p. Per pair (float32 inputs, float64
    products and sums), so a value never depends on the batch. Chunks of a thousand pairs keep the gathered rows in
    cache; numpy releases the GIL in the gather and the einsum, so the chunks run on FAISS's threads' cores."""
    out: np.ndarray = np.empty(len(ids), dtype=np.float64)

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


def exact_band_neighbours(q_vecs, q_sids, base_vecs, base_sids, lo, hi, pool_size, skip_top: int = 0) -> pa.Table:
    """Brute force (numpy, float64): the reference for tests and for the recall of approximate indexes."""
    sims = np.clip(q_vecs.astype(np.float64) @ base_vecs.astype(np.float64).T, -1.0, 1.0)  # as exact_cosines
    out: tuple[list, list, list, list] = ([], [], [], [])  # query sids, candidates, cosines, ranks
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
