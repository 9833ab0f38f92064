"""Stage `neighbours`: exactly the top pool_size in-band neighbours, checked against brute force."""
import numpy as np
import pytest

from contramine.pipeline.config import NeighboursCfg
from contramine.pipeline.search.band import band_neighbours, exact_band_neighbours, recall_at_pool
from contramine.pipeline.search.faiss_index import build_index


def _unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _search(x, sids, lo, hi, pool, kind="flat", **kw):
    cfg = NeighboursCfg(lo=lo, hi=hi, pool_size=pool, index=kind, **kw)
    index, cpu = build_index(x, kind, cfg)
    return band_neighbours(x, sids, x, sids, index, cpu, lo, hi, pool, cfg.slack, cfg.max_block_elems)


def _brute(x, sids, lo, hi, pool):
    """Independent reference: full float64 similarity matrix, sort every row."""
    sims = x.astype(np.float64) @ x.astype(np.float64).T
    rows = []
    for i in range(len(x)):
        cands = [(-sims[i, j], sids[j]) for j in range(len(x)) if j != i and lo <= sims[i, j] <= hi]
        rows += [(sids[i], s, r + 1) for r, (_, s) in enumerate(sorted(cands)[:pool])]
    return rows


@pytest.mark.parametrize("pool", [1, 5, 40])
def test_matches_brute_force_with_near_duplicates(pool):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 16))
    x[50:120] = x[:70] + 0.05 * rng.normal(size=(70, 16))  # many neighbours above the band: k must widen
    x = _unit(x)
    sids = rng.permutation(10_000)[:400].astype(np.int64) - 5000
    got = _search(x, sids, 0.25, 0.75, pool)
    assert list(zip(*(got.column(c).to_pylist() for c in ("sid", "cand_sid", "rank")))) == _brute(x, sids, 0.25, 0.75, pool)


def test_band_edges_are_inclusive():
    # 2-d unit vectors with exact cosines 0.25 and 0.75 (in float32 and float64) to the first one
    def at(c):
        return [c, np.sqrt(1 - c * c)]
    x = np.array([[1.0, 0.0], at(0.25), at(0.75), at(0.2), at(0.8)], dtype=np.float32)
    sids = np.arange(5, dtype=np.int64)
    got = _search(x, sids, 0.25, 0.75, 10)
    first = got.filter(got.column("sid").to_numpy() == 0)
    assert sorted(first.column("cand_sid").to_pylist()) == [1, 2]
    assert first.column("cos").to_pylist() == pytest.approx([0.75, 0.25], abs=1e-7)


def test_fewer_than_pool_in_band_and_none_in_band():
    x = np.array([[1, 0], [0.6, 0.8], [0, 1]], dtype=np.float32)  # cos: 0.6, 0, 0.8
    got = _search(x, np.arange(3, dtype=np.int64), 0.25, 0.75, 64)
    assert got.num_rows == 2 and set(zip(got.column("sid").to_pylist(), got.column("cand_sid").to_pylist())) == {(0, 1), (1, 0)}
    same = np.ones((6, 4), dtype=np.float32) / 2  # identical embeddings: every cosine is 1 > hi
    assert _search(same, np.arange(6, dtype=np.int64), 0.25, 0.75, 3).num_rows == 0


def test_single_sentence_and_empty():
    assert _search(np.ones((1, 4), np.float32) / 2, np.array([7]), 0.25, 0.75, 8).num_rows == 0


def test_ivf_recall_against_exact():
    rng = np.random.default_rng(1)
    x = _unit(rng.normal(size=(3000, 16)) + 0.8 * rng.normal(size=(1, 16)))
    sids = np.arange(3000, dtype=np.int64)
    approx = _search(x, sids, 0.25, 0.75, 10, kind="ivf", nlist=16, nprobe=8)
    exact = exact_band_neighbours(x, sids, x, sids, 0.25, 0.75, 10)
    assert recall_at_pool(approx, exact) > 0.9
    assert recall_at_pool(exact, exact) == 1.0


class _NoisyFlatIndex:
    """A flat inner-product index whose scores carry errors up to 0.9 EPS (the bound the stage assumes for FAISS's
    float32 scores): it ranks by the noisy scores, as a float32 index ranks by its rounded ones."""

    def __init__(self, x, seed=0, bound=None):
        from contramine.pipeline.search.band import score_tolerance

        self.x, self.rng = x.astype(np.float64), np.random.default_rng(seed)
        self.bound = 0.9 * (score_tolerance(x.shape[1]) if bound is None else bound)

    def search(self, q, k):
        s = q.astype(np.float64) @ self.x.T + self.rng.uniform(-self.bound, self.bound, (len(q), len(self.x)))
        ids = np.argsort(-s, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(s, ids, axis=1).astype(np.float32), ids


@pytest.mark.parametrize("edges", [False, True])
def test_near_ties_at_the_pool_cutoff_and_band_edges_follow_exact_cosines(edges):
    """Cosines 1e-6 apart, closer than the float32 scores' error, around the pool cutoff (and both band edges): the
    index's order may be wrong there, the stage's must not (it recomputes exactly where the score cannot decide)."""
    rng = np.random.default_rng(3)
    target = [0.5 + 1e-6 * rng.permutation(60), 0.9 + 1e-6 * np.arange(10)]
    if edges:
        target += [0.25 + 1e-6 * (np.arange(20) - 10), 0.75 + 1e-6 * (np.arange(20) - 10)]
    target = np.concatenate(target)
    d = 64
    base = np.zeros((len(target) + 1, d))
    base[0, 0] = 1.0  # the query
    noise = _unit(rng.normal(size=(len(target), d - 2))).astype(np.float64)
    base[1:, 0] = target
    base[1:, 2:] = noise * np.sqrt(1 - target ** 2)[:, None]
    rotation, _ = np.linalg.qr(rng.normal(size=(d, d)))
    x = (base @ rotation).astype(np.float32)
    sids = np.arange(len(x), dtype=np.int64)
    for pool in (5, 10, 30, 70):
        for seed in range(5):
            for skip in (0, 3, 12):  # 3: inside the near-tied group above the band; 12: past it, into the band
                index = _NoisyFlatIndex(x, seed)
                got = band_neighbours(x[:1], sids[:1], x, sids, index, index, 0.25, 0.75, pool, skip_top=skip)
                want = exact_band_neighbours(x[:1], sids[:1], x, sids, 0.25, 0.75, pool, skip)
                assert got.equals(want), (pool, seed, skip)


def test_tolerance_follows_d_where_a_fixed_1e5_orders_pairs_wrongly():
    """At d = 768 a float32 dot product of unit vectors may be off by up to d·2^-24 ≈ 4.6e-5, more than the fixed
    1e-5 the stage used to assume. Scores carrying such errors, around the band edges and the pool cut-off: the
    tolerance derived from d gives the exact pool every time; a fixed 1e-5 leaves out or misorders pairs."""
    from contramine.pipeline.search.band import score_tolerance

    assert 4.5e-5 < score_tolerance(768) < 5e-5 and score_tolerance(64) == 1e-5
    rng = np.random.default_rng(5)
    d = 768
    target = np.concatenate([0.5 + 8e-6 * rng.permutation(40), 0.25 + 8e-6 * (np.arange(20) - 10),
                             0.75 + 8e-6 * (np.arange(20) - 10)])
    base = np.zeros((len(target) + 1, d))
    base[0, 0] = 1.0
    base[1:, 0] = target
    base[1:, 2:] = _unit(rng.normal(size=(len(target), d - 2))) * np.sqrt(1 - target ** 2)[:, None]
    x = (base @ np.linalg.qr(rng.normal(size=(d, d)))[0]).astype(np.float32)
    sids = np.arange(len(x), dtype=np.int64)
    wrong = 0
    for seed in range(8):
        want = exact_band_neighbours(x[:1], sids[:1], x, sids, 0.25, 0.75, 30)
        index = _NoisyFlatIndex(x, seed)
        assert band_neighbours(x[:1], sids[:1], x, sids, index, index, 0.25, 0.75, 30).equals(want), seed
        index = _NoisyFlatIndex(x, seed)
        wrong += not band_neighbours(x[:1], sids[:1], x, sids, index, index, 0.25, 0.75, 30, eps=1e-5).equals(want)
    assert wrong >= 4  # the fixed tolerance fails on most draws


@pytest.mark.parametrize("skip_top, pool", [(1, 5), (3, 5), (10, 40), (25, 3)])
def test_skip_top_leaves_out_the_most_similar_exactly_as_brute_force(skip_top, pool):
    """sentence-transformers' range_min: the r most similar sentences (in band or not) are never candidates."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 16))
    x[40:100] = x[:60] + 0.3 * rng.normal(size=(60, 16))  # close neighbours inside and above the band
    x = _unit(x)
    sids = rng.permutation(5000)[:300].astype(np.int64)
    sims = x.astype(np.float64) @ x.astype(np.float64).T
    want = []
    for i in range(len(x)):
        others = sorted((-sims[i, j], sids[j]) for j in range(len(x)) if j != i)[skip_top:]
        kept = [(c, s) for c, s in others if 0.25 <= -c <= 0.75][:pool]
        want += [(sids[i], s, r + 1) for r, (_, s) in enumerate(kept)]
    cfg = NeighboursCfg(lo=0.25, hi=0.75, pool_size=pool, index="flat", skip_top=skip_top)
    index, cpu = build_index(x, "flat", cfg)
    got = band_neighbours(x, sids, x, sids, index, cpu, 0.25, 0.75, pool, cfg.slack, cfg.max_block_elems,
                          skip_top=skip_top)
    assert list(zip(*(got.column(c).to_pylist() for c in ("sid", "cand_sid", "rank")))) == want
    assert got.equals(exact_band_neighbours(x, sids, x, sids, 0.25, 0.75, pool, skip_top))
    assert not got.equals(band_neighbours(x, sids, x, sids, index, cpu, 0.25, 0.75, pool))  # it did change pools
