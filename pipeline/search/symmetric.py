"""The torch band search when the queries are the base itself (every vector a query against all of them, on a CPU):
each pair of blocks is scored once. Block i's queries are scored against the base from block i on (one GEMM: the
strip of columns j >= i, half the tiles in all); the strip's k best per row are merged into block i's running best,
and its columns past the block (block j's queries, as seen from block i: the strip transposed) into those rows'
running best. Once its own strip is done, block i has seen its whole row (earlier blocks' strips held its columns),
so its running k best are the k best of the row and go to `resolve`, as TorchExact.band's first round does; the rows
resolve leaves unsettled are searched the existing way (their full rows, TorchExact._band_block) at k doubled.

Exact as the full-row path is: resolve needs, per row, the k largest of scores each within the bound eps of the
exact cosine, and the pair (i, j) scored as x_i . x_j from block i's strip rather than x_j . x_i from block j's is
such a score (a float32 dot product of the same two vectors, summed in another order). Each pair has one score per
row, so the running k best are a true top k of that row. The float64 cosines come from band.exact_cosines with the
query's own row first, the values the full-row path computes, so the tables are the same byte for byte.

Each row's running k best grow by merges: a strip's costs below a row's running k-th (and, in the first block,
below a bound on the tile column's own k-th) are the only ones merged, and after the first blocks few are. Blocks
are larger than the full-row path's (MIN_BLOCK_PER_K x k rows, so fewer merges), their strip at most STRIP_ELEMS
costs (512 MiB; the full-row path's CPU block: 128 MiB), plus the running k best of every row ([n, k] costs and
columns). The GPU path is unchanged (not measured on a GPU: none was lent).
"""
from __future__ import annotations

import numpy as np
import torch

from contramine.pipeline.search.band import resolve
from contramine.pipeline.search.torch_ops import smallest

COLUMN_CHUNK = 4096  # strip columns merged at a time into their rows' running best
DENSE_SHARE = 8  # a tile where more than 1 / DENSE_SHARE of the costs are below the running k-th: bounded as well
MIN_BLOCK_PER_K = 32  # blocks of k x this many rows where memory allows: fewer merges into each row's running best
STRIP_ELEMS = 1 << 27  # ... a block's strip at most this many costs (512 MiB: 2,684 rows at 50k)


def is_self_search(ix, x: np.ndarray, q_sids: np.ndarray, base_sids: np.ndarray) -> bool:
    """Whether band()'s queries are the base itself (the same rows, bit for bit, and the same sids) and the search
    can take this path (a CPU, float32 scores)."""
    if ix.device.type != "cpu" or ix.precision != "float32" or len(x) != ix.n or ix.n == 0:
        return False
    same = np.ascontiguousarray(x, dtype=np.float32)
    return bool(np.array_equal(np.asarray(q_sids), np.asarray(base_sids))
                and np.array_equal(same.view(np.int32), ix.host.view(np.int32)))


# The strip's compares and the positions of what they let through are numpy's, on views of the same memory: on a
# CPU numpy compares a float32 matrix with a row or column vector ~3x as fast as torch, counts the true bytes ~3x
# and finds them ~7x (torch.nonzero takes ~3.6 ns an entry whatever the share; numpy's flatnonzero ~1 ns on a
# sparse mask). The same bools and the same row-major order as torch's: the merges see the same entries.
def _below(costs, limit) -> np.ndarray:
    """costs < limit (a broadcast CPU tensor), as a numpy bool matrix."""
    return np.less(costs.numpy(), limit.numpy())


def _dense(mask: np.ndarray) -> bool:
    """More than 1 / DENSE_SHARE of the mask is true: the rows are selected whole, not merged entry by entry."""
    return int(np.count_nonzero(mask)) * DENSE_SHARE > mask.size


def _nonzero(mask: np.ndarray):
    """(rows, columns) of a 2-d bool matrix's true entries, in row-major order, as torch tensors."""
    row, col = np.divmod(np.flatnonzero(mask), mask.shape[1])
    return torch.from_numpy(row), torch.from_numpy(col)


def _merge(vals, cols, new_vals, new_cols, k: int):
    """The k smallest of two candidate sets per row (costs, columns), ascending."""
    v, pick = smallest(torch.cat([vals, new_vals], 1), k)
    return v, torch.cat([cols, new_cols], 1).gather(1, pick.clamp(max=vals.shape[1] + new_vals.shape[1] - 1))


def _merge_columns(best, best_cols, tile, a: int, k: int) -> None:
    """Merge a tile's columns (tile[r, c]: the cost of row a + r for the running row c) into the running k best
    (best, best_cols: [C, k], ascending; updated in place; the tile has at least k rows). Only costs below a row's
    running k-th and at most the tile column's bound on its own k-th can enter, and few do (the first block's
    columns: a few times k; later blocks' fewer, as the running k-th falls): compares over the tile, then a selection
    over the running k and those few, not over the tile's height."""
    enter = _below(tile, best[:, k - 1])  # along the tile's rows (its memory order)
    if _dense(enter):  # the first block: no running k-th yet
        # a bound on each tile column's own k-th smallest: the k-th smallest of the minima of 4k groups of rows (k
        # distinct costs are at or below it), each minimum elementwise along the tile's memory order
        groups = min(len(tile), 4 * k)
        per_group = len(tile) // groups
        minima = tile[:groups * per_group].unflatten(0, (groups, per_group)).amin(1).T.contiguous()
        enter &= np.less_equal(tile.numpy(), torch.kthvalue(minima, k, dim=1).values.numpy())
    row, col = _nonzero(enter)
    order = torch.sort(col, stable=True).indices  # by running row
    row, col = row[order], col[order]
    _merge_entries(best, best_cols, col, tile[row, col], row + a, k)


def _merge_entries(best, best_cols, target, costs, cols, k: int) -> None:
    """Merge entries (target: the running row each enters, ascending; its cost and column) into the running k best
    (best, best_cols: [R, k], ascending; updated in place): one selection over the running k and the entries of
    each row, padded to the most any row has."""
    if not len(target):
        return
    counts = torch.bincount(target, minlength=len(best))
    width = int(counts.max())
    place = torch.arange(len(target)) - (torch.cumsum(counts, 0) - counts)[target]
    new = torch.full((len(best), width), float("inf"))
    new_cols = torch.zeros((len(best), width), dtype=torch.int64)
    new[target, place], new_cols[target, place] = costs, cols
    vals, pick = smallest(torch.cat([best, new], 1), k)
    best_cols[:] = torch.where(pick < k, best_cols.gather(1, pick.clamp(max=k - 1)),
                               new_cols.gather(1, (pick - k).clamp(0, width - 1)))
    best[:] = vals


def self_band(ix, x: np.ndarray, q_sids: np.ndarray, sids, lo: float, hi: float, pool_size: int, k: int,
              skip_top: int, eps: float, keep_above: float, mask_above: bool, pools, progress=None) -> None:
    """TorchExact.band for queries that are its base (is_self_search): the pools written into `pools`, a block at a
    time; progress(queries) as rows are settled."""
    n = ix.n
    block = min(n, max(ix.band_rows(), k, min(MIN_BLOCK_PER_K * k, STRIP_ELEMS // n)))
    inf = float("inf")
    best = torch.full((n, k), inf)  # running k smallest costs of each row, and their columns
    best_cols = torch.full((n, k), -1, dtype=torch.int64)
    strip_buffer = torch.empty(block * n)
    unsettled: list[np.ndarray] = []
    for a in range(0, n, block):
        b = min(n, a + block)
        q = ix.base[a:b]
        strip = torch.mm(q.neg(), ix.base[a:].T, out=strip_buffer[:(b - a) * (n - a)].view(b - a, n - a))
        if mask_above:
            torch.nn.functional.threshold_(strip, keep_above, inf)
        enter = _below(strip, best[a:b, k - 1, None])  # the block's rows have seen the columns before a
        if _dense(enter):  # the first blocks: select the strip
            v, c = smallest(strip, min(k, n - a))
            best[a:b], best_cols[a:b] = _merge(best[a:b], best_cols[a:b], v, c + a, k)
        else:  # few costs below the running k-th: merge only those (nonzero's order: by row)
            row, col = _nonzero(enter)
            _merge_entries(best[a:b], best_cols[a:b], row, strip[row, col], col + a, k)
        del enter
        for c0 in range(b, n, COLUMN_CHUNK):  # later blocks' rows: their columns a..b, the strip read down
            c1 = min(n, c0 + COLUMN_CHUNK)
            _merge_columns(best[c0:c1], best_cols[c0:c1], strip[:, c0 - a:c1 - a], a, k)
        del strip
        vals = best[a:b].neg()  # scores, descending
        ids = best_cols[a:b].masked_fill(vals == -inf, -1)
        rows = torch.arange(b - a)
        out = resolve(vals, ids, torch.from_numpy(q_sids[a:b]), sids, lo, hi, pool_size, k >= n, skip_top, eps,
                      lambda r, i: ix.exact(q, rows[r], i))
        fin = out.finished.numpy()
        done = np.flatnonzero(fin)
        pools.put(a + done, out.cand.numpy()[done], out.cos.numpy()[done], out.count.numpy()[done])
        unsettled.append(a + np.flatnonzero(~fin))
        if progress is not None:
            progress(len(done))
    del best, best_cols, strip_buffer
    _widen(ix, x, q_sids, sids, np.concatenate(unsettled), lo, hi, pool_size, min(n, 2 * k), skip_top, eps,
           keep_above, mask_above, pools, progress)


def _widen(ix, x, q_sids, sids, pending: np.ndarray, lo, hi, pool_size, k, skip_top, eps, keep_above, mask_above,
           pools, progress) -> None:
    """The rows the first round left unsettled, searched as TorchExact.band searches a block (their full rows, k
    from the doubled width)."""
    rows = ix.band_rows()
    for a in range(0, len(pending), rows):
        pick = pending[a:a + rows]
        q = torch.from_numpy(np.ascontiguousarray(x[pick], dtype=np.float32))
        costs = ix.scores(q.neg())
        if mask_above:
            torch.nn.functional.threshold_(costs, keep_above, float("inf"))
        cand, cos, count = ix._band_block(q, costs, torch.from_numpy(q_sids[pick]), sids, lo, hi, pool_size, k,
                                          skip_top, eps)
        del costs
        pools.put(pick, cand.numpy(), cos.numpy(), count.numpy())
        if progress is not None:
            progress(len(pick))
