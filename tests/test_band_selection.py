"""The torch band search's selection (pipeline/search/torch_ops.py `smallest`, used by TorchExact.band): the k best
of each row without a top-k over whole rows, exact (the same values as a full sort, ties and masked entries
included), and the pools it gives equal FAISS's and the float64 brute force's on dense SimCSE-like bands (most
pairs in band, tight clusters above it: rows widen) and on sparse ones."""
import faiss
import numpy as np
import pytest
import torch

import contramine.pipeline.search.torch_exact as te
from contramine.pipeline.search.band import band_neighbours, exact_band_neighbours
from contramine.pipeline.search.torch_ops import smallest


@pytest.mark.parametrize("kind", ["random", "ties", "mostly_masked"])
def test_smallest_is_a_full_sorts_head_without_a_top_k_over_whole_rows(kind, monkeypatch):
    """Values equal to the head of a full sort, row by row; the columns distinct and holding those values (+inf,
    a masked entry, may carry any column); no torch.topk / torch.sort ever sees a row of the full width."""
    rng = np.random.default_rng(len(kind))
    widths = []
    topk, sort = torch.topk, torch.sort
    monkeypatch.setattr(torch, "topk", lambda x, k, **kw: (widths.append(x.shape[-1]), topk(x, k, **kw))[1])
    monkeypatch.setattr(torch, "sort", lambda x, **kw: (widths.append(x.shape[-1]), sort(x, **kw))[1])
    for n, k in ((50_000, 89), (7_919, 41), (3_001, 150), (700, 40)):
        x = torch.from_numpy(rng.normal(size=(6, n)).astype(np.float32))
        if kind == "ties":  # a few dozen distinct values: ties straddle every cut
            x = torch.round(x * 8) / 8
        if kind == "mostly_masked":  # fewer than k finite entries in some rows
            x[torch.from_numpy(rng.random((6, n)) < np.r_[0.999, 0.99, 0.9, 0.5, 0.0, 1.0][:, None])] = float("inf")
        widths.clear()
        vals, cols = smallest(x, k)
        np.testing.assert_array_equal(vals.numpy(), np.sort(x.numpy(), axis=1)[:, :k])
        finite = vals < float("inf")
        assert (cols[finite] < n).all()
        assert torch.equal(x.gather(1, cols.clamp(max=n - 1))[finite], vals[finite])
        for r in range(len(x)):
            assert len(set(cols[r][finite[r]].tolist())) == int(finite[r].sum())
        assert max(widths) <= max(k * 8 * 2, n // 8 + 1) < n, (n, widths)


def _simcse_like(seed, n, d=48, centres=6, spread=0.25):
    """Anisotropic vectors like SimCSE's: a shared direction (most cosines 0.3-0.8, so most pairs are in a
    0.25-0.75 band: dense), a few centres with members tightly around them (many neighbours above 0.75: rows widen
    when the top is kept), and exact duplicate rows (ties in band); distinct sids."""
    rng = np.random.default_rng(seed)
    common = rng.normal(size=d)
    common /= np.linalg.norm(common)
    mids = rng.normal(size=(centres, d)) / np.sqrt(d)
    x = 1.1 * common + mids[rng.integers(centres, size=n)] + spread * rng.uniform(0.3, 1.5, (n, 1)) * \
        rng.normal(size=(n, d)) / np.sqrt(d)
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    x[n // 2:n // 2 + 40] = x[:40]
    return x, rng.permutation(10 * n)[:n].astype(np.int64)


def _sparse(seed, n, d=128):
    """Isotropic vectors: cosines ~N(0, 1/d), a handful of each row's in a 0.25-0.75 band (sparse)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    x[n // 2:n // 2 + 40] = x[:40]
    return x, rng.permutation(10 * n)[:n].astype(np.int64)


@pytest.mark.parametrize("kind", ["dense", "sparse"])
@pytest.mark.parametrize("lo, hi, pool, skip_top", [(0.25, 0.75, 16, 0), (0.25, 0.75, 64, 4), (0.5, 0.9, 24, 0)])
def test_pools_on_dense_and_sparse_bands_equal_faiss_and_float64(kind, lo, hi, pool, skip_top, monkeypatch):
    """Dense SimCSE-like bands (most pairs in band; tight clusters above it) and sparse ones: the torch engine's
    pools (several blocks, the grouped selection, widening from the block's costs) equal flat FAISS's and the
    float64 brute force's, row for row. Dense bands fill every pool; with skip_top their rows widen, the sparse
    band leaves pools short."""
    x, sids = _simcse_like(1, 3000) if kind == "dense" else _sparse(2, 3000)
    cos = x[:200].astype(np.float64) @ x.T.astype(np.float64)
    in_band = ((cos >= lo) & (cos <= hi)).mean()
    assert in_band > 0.4 if kind == "dense" else in_band < 0.01
    widths = []
    select = te.smallest
    monkeypatch.setattr(te, "smallest", lambda s, k: (widths.append((len(s), k)), select(s, k))[1])
    q, q_sids = x[::6], sids[::6]
    exact = te.TorchExact(x, block_rows=128)
    got = band_neighbours(q, q_sids, x, sids, exact, exact, lo, hi, pool, 8, skip_top=skip_top)
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    assert got.equals(band_neighbours(q, q_sids, x, sids, index, index, lo, hi, pool, 8, 1 << 14, skip_top=skip_top))
    assert got.equals(exact_band_neighbours(q, q_sids, x, sids, lo, hi, pool, skip_top))
    counts = np.bincount(np.searchsorted(np.sort(q_sids), got.column("sid").to_numpy()), minlength=len(q))
    k0 = pool + skip_top + 8 + 17
    if kind == "dense":
        assert (counts == pool).all()
        assert any(k > k0 for _, k in widths) == bool(skip_top), widths
    else:
        assert (counts < pool).any()


@pytest.mark.parametrize("kind, n, lo, hi, pool, skip_top", [
    ("dense", 1777, 0.25, 0.75, 16, 0), ("dense", 1777, 0.25, 0.75, 64, 4), ("dense", 1501, 0.3, 0.95, 8, 12),
    ("dense", 1501, 0.25, 0.75, 300, 0), ("sparse", 1603, 0.25, 0.75, 24, 3), ("sparse", 1603, 0.5, 0.9, 40, 0)])
def test_queries_that_are_the_base_score_half_the_tiles_and_give_the_same_pools(kind, n, lo, hi, pool, skip_top,
                                                                                monkeypatch):
    """Every vector a query against all of them (the stage on one shard, the benches): the symmetric path
    (symmetric.py: each pair of blocks scored once, several blocks and an uneven last one, rows merged from the
    strips' columns, rows left unsettled widened the full-row way) gives the same table as the full-row path, flat
    FAISS and the float64 brute force, on dense SimCSE-like bands where rows widen and on sparse ones; queries that
    are not the base take the full-row path."""
    import contramine.pipeline.search.symmetric as sym

    x, sids = _simcse_like(3, n) if kind == "dense" else _sparse(4, n)
    monkeypatch.setattr(sym, "MIN_BLOCK_PER_K", 3)  # blocks of 3k rows (at least 128): 2-14 blocks, the last shorter
    strips, widened = [], []
    mm, widen = torch.mm, sym._widen
    monkeypatch.setattr(sym.torch, "mm", lambda a, b, **kw: (strips.append(tuple(b.shape)), mm(a, b, **kw))[1])
    monkeypatch.setattr(sym, "_widen", lambda *a: (widened.append(len(a[4])), widen(*a))[1])
    symmetric_runs = []
    self_band = te.self_band
    monkeypatch.setattr(te, "self_band", lambda *a: (symmetric_runs.append(1), self_band(*a))[1])
    got = band_neighbours(x, sids, x, sids, te.TorchExact(x, block_rows=128), None, lo, hi, pool, 8,
                          skip_top=skip_top)
    k = min(n, pool + skip_top + 8 + 17)
    assert len(strips) >= 2 and n % min(n, max(128, 3 * k)) and widened
    widths = [cols for _, cols in strips]  # block i against the base from block i on: about half the tiles, then
    blocks = list(range(n, 0, widths[1] - n))  # the unsettled rows' full rows
    assert widths[:len(blocks)] == blocks and sum(blocks) <= n * (len(blocks) + 1) / 2
    assert set(widths[len(blocks):]) <= {n}
    full = band_neighbours(x, sids, x, sids, te.TorchExact(x, block_rows=128, symmetric=False), None, lo, hi, pool, 8,
                           skip_top=skip_top)
    assert got.equals(full)
    assert got.equals(exact_band_neighbours(x, sids, x, sids, lo, hi, pool, skip_top))
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    assert got.equals(band_neighbours(x, sids, x, sids, index, index, lo, hi, pool, 8, 1 << 14, skip_top=skip_top))
    if kind == "dense" and skip_top:
        assert widened[0] > 0  # rows the first round left unsettled, searched again
    assert len(symmetric_runs) == 1
    band_neighbours(x[:-1], sids[:-1], x, sids, te.TorchExact(x, block_rows=128), None, lo, hi, pool, 8,
                    skip_top=skip_top)
    assert len(symmetric_runs) == 1  # not the base: the full-row path


def test_the_strips_numpy_compares_and_positions_are_torchs():
    """symmetric.py compares a strip (and a column slice of it) with its rows' or columns' limits, and finds what
    passes, in numpy on the same memory: the same bools, counts and row-major positions as torch's ops, +inf and
    ties at the limit included."""
    from contramine.pipeline.search import symmetric as sym

    rng = np.random.default_rng(7)
    strip = torch.from_numpy(np.round(rng.normal(size=(300, 1000)) * 4).astype(np.float32) / 4)
    strip[torch.from_numpy(rng.random((300, 1000)) < 0.3)] = float("inf")
    rows, cols = torch.from_numpy(rng.normal(size=(300, 1)).astype(np.float32)), strip[17]  # ties: the strip's own
    for costs, limit in ((strip, rows), (strip[:, 100:612], cols[:512]), (strip, torch.full((300, 1), -9.0))):
        want = costs < limit
        got = sym._below(costs, limit)
        np.testing.assert_array_equal(got, want.numpy())
        assert sym._dense(got) == (int(want.sum()) * sym.DENSE_SHARE > want.numel())
        r, c = sym._nonzero(got)
        tr, tc = want.nonzero(as_tuple=True)
        assert torch.equal(r, tr) and torch.equal(c, tc)
