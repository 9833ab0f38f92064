"""TorchExact (pipeline/search/torch_exact.py): exact k-NN in torch, the same neighbours as faiss.knn and the same band
search tables as the flat FAISS index, ties and k > n included."""
import faiss
import numpy as np
import pytest

from contramine.pipeline.search.band import band_neighbours, exact_band_neighbours
from contramine.pipeline.search.torch_exact import PAD_SCORE, TorchExact


def _unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _grid(rng, n, d=8):
    """Vectors on a coarse grid (multiples of 1/4 in [-1/2, 1/2]): every dot product is exact in float32 whatever
    the summation order, so ties are exact, and many (a few dozen distinct scores per query)."""
    return (rng.integers(-2, 3, size=(n, d)) * 0.25).astype(np.float32)


def _knn(x, base, k):
    return faiss.knn(x, base, k, metric=faiss.METRIC_INNER_PRODUCT)


def _ref(x, base, k):
    """The rule TorchExact follows: descending float64 score, ties by ascending base row; padded like FAISS."""
    s = x.astype(np.float64) @ base.astype(np.float64).T
    kk = min(k, len(base))
    ids = np.argsort(-s, axis=1, kind="stable")[:, :kk]
    D, I = np.full((len(x), k), PAD_SCORE, np.float32), np.full((len(x), k), -1, np.int64)
    D[:, :kk], I[:, :kk] = np.take_along_axis(s, ids, axis=1), ids
    return D, I


def _same_as_faiss_up_to_ties(x, base, D, I, Df, If, tol=1e-5):
    """Scores within tol place by place (the padding equal); ids equal wherever a score has no other within tol;
    each group of near-equal scores the same ids, except a last group cut by the k-th place (a tie straddling it,
    where FAISS keeps whichever its heap kept), whose ids must still score those scores."""
    np.testing.assert_allclose(D, Df, rtol=0, atol=tol)
    np.testing.assert_array_equal(I < 0, If < 0)
    for r in range(len(D)):
        valid = int((If[r] >= 0).sum())
        d, i, i_f = Df[r, :valid], I[r, :valid], If[r, :valid]
        assert len(set(i.tolist())) == valid
        starts = np.flatnonzero(np.r_[True, np.diff(d) < -tol])  # groups: consecutive scores within tol
        for a, b in zip(starts, np.r_[starts[1:], valid]):
            if b < valid or valid == len(base):
                assert set(i[a:b].tolist()) == set(i_f[a:b].tolist()), (r, a, b)
            else:
                exact = base[i[a:b]].astype(np.float64) @ x[r].astype(np.float64)
                np.testing.assert_allclose(exact, d[a:b], rtol=0, atol=2 * tol)
    return True


@pytest.mark.parametrize("k", [1, 10, 37, 200, 400, 450])
@pytest.mark.parametrize("block_rows", [None, 1, 7])
def test_exact_ties_follow_score_then_row_and_match_faiss(k, block_rows):
    """Grid vectors (exact ties) and exact duplicate rows: TorchExact orders by (-score, row) exactly, on the topk
    path (k < n/8) and the sort path alike, whatever the block; FAISS returns the same scores and, up to which of a
    tie it returns, the same ids."""
    rng = np.random.default_rng(k)
    base = _grid(rng, 400)
    base[300:340] = base[:40]  # duplicates
    x = np.vstack([_grid(rng, 30), base[:10]])
    D, I = TorchExact(base, block_rows=block_rows).search(x, k)
    Dr, Ir = _ref(x, base, k)
    np.testing.assert_array_equal(I, Ir)
    np.testing.assert_array_equal(D, Dr)
    assert _same_as_faiss_up_to_ties(x, base, D, I, *_knn(x, base, k))
    if k < 400:  # the check has teeth: ties straddle the k-th place, and FAISS's ids there are not the rule's
        kth = Dr[:, k - 1:k].astype(np.float64)
        s = x.astype(np.float64) @ base.astype(np.float64).T
        assert ((s == kth).sum(1) > (Dr == kth).sum(1)).any()
        assert k == 1 or not np.array_equal(_knn(x, base, k)[1], Ir)  # (FAISS's k = 1 keeps the first row too)


def test_random_unit_vectors_with_duplicates_and_k_past_n():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(300, 24))
    base[200:260] = base[:60]  # exact duplicate rows: tied scores
    base = _unit(base)
    x = np.vstack([_unit(rng.normal(size=(50, 24))), base[:20], base[250:260]])
    for k in (1, 5, 64, 299, 300, 301, 512):
        D, I = TorchExact(base).search(x, k)
        Df, If = _knn(x, base, k)
        assert _same_as_faiss_up_to_ties(x, base, D, I, Df, If)
        if k > 300:
            assert (I[:, 300:] == -1).all() and (D[:, 300:] == Df[:, 300:]).all() and Df[0, -1] == PAD_SCORE
    D, I = TorchExact(base).search(base[:60], 2)  # a row and its duplicate: score 1 twice, the smaller row first
    np.testing.assert_array_equal(I, np.c_[np.arange(60), np.arange(200, 260)])


def test_degenerate_inputs():
    base = _unit(np.random.default_rng(1).normal(size=(5, 4)))
    D, I = TorchExact(base).search(base[:0], 3)
    assert D.shape == (0, 3) and I.shape == (0, 3)
    D, I = TorchExact(base[:0]).search(base, 3)
    assert (I == -1).all() and (D == PAD_SCORE).all()
    with pytest.raises(ValueError, match="dimension 4"):
        TorchExact(base).search(np.ones((2, 3), np.float32), 1)


def test_strict_float32_or_nothing(monkeypatch):
    import torch

    base = _unit(np.random.default_rng(1).normal(size=(5, 4)))
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    with pytest.raises(RuntimeError, match="full float32"):
        TorchExact(base).search(base, 2)


def _corpus(seed=0, n=360, d=16):
    """A few hundred unit vectors: clusters (neighbours above the band, so k must widen) and exact duplicate rows
    (cos 1, and ties in the band among the duplicates' neighbours); distinct sids."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    x[60:140] = x[:80] + 0.4 * rng.normal(size=(80, d))
    x[300:340] = x[100:140]
    x = _unit(x)
    x[340:] = x[200:220]  # exact float32 duplicates of rows that are themselves near others
    return x, rng.permutation(100_000)[:n].astype(np.int64) - 50_000


@pytest.mark.parametrize("lo, hi, pool, skip_top", [(0.25, 0.75, 8, 0), (0.25, 0.75, 40, 0), (0.0, 1.0, 5, 0),
                                                    (0.3, 1.0, 12, 3), (0.1, 0.9, 3, 25), (-1.0, 1.0, 400, 0)])
@pytest.mark.parametrize("max_block_elems", [1 << 24, 1 << 10])
def test_band_neighbours_with_torch_equals_flat_faiss(lo, hi, pool, skip_top, max_block_elems):
    x, sids = _corpus()
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    q, q_sids = x[::3], sids[::3]  # queries: a third of the base, duplicates among them
    args = (lo, hi, pool, 8, max_block_elems)
    want = band_neighbours(q, q_sids, x, sids, index, index, *args, skip_top=skip_top)
    exact = TorchExact(x, block_rows=17)
    got = band_neighbours(q, q_sids, x, sids, exact, exact, *args, skip_top=skip_top)
    assert got.equals(want)
    assert got.equals(exact_band_neighbours(q, q_sids, x, sids, lo, hi, pool, skip_top))
    assert got.num_rows > 0


def test_neighbours_stage_with_the_torch_engine_equals_faiss_and_never_imports_it(tmp_path, monkeypatch):
    """A whole `neighbours` stage run (2 shards) with neighbours.engine = torch: the same table as engine = faiss,
    row for row, with FAISS made unimportable while it plans, loads and searches."""
    import sys

    from contramine.pipeline.search import index as ix
    from contramine.pipeline.config import load_config
    from contramine.pipeline.engine.runner import finish_stage, run_job
    from contramine.pipeline.storage.store import Store
    from contramine.pipeline.schema import vectors_table

    x, sids = _corpus(seed=2)
    tables = {}
    for engine in ("faiss", "torch"):
        root = tmp_path / engine
        halves = (slice(0, 170), slice(170, None))
        Store(root / "r").write_table("embeddings", [vectors_table(sids[h], x[h]) for h in halves], "k")
        Store(root / "r").write_table("pool_embeddings", [vectors_table(sids[:0], x[:0])] * 2, "k")
        cfg = load_config("default", [f"run.root={root}", "run.name=r", "run.shards=2", "neighbours.pool_size=12",
                                      "neighbours.hi=1.0", f"neighbours.engine={engine}"])
        with monkeypatch.context() as m:
            if engine == "torch":
                m.setitem(sys.modules, "faiss", None)  # `import faiss` raises ImportError
            plan = ix.index_plan(cfg, Store(root / "r"), 2)
            assert plan["engine"] == engine and plan["kind"] == "flat" and plan["device"] == "cpu"
            results = [r for i in range(2) for r in run_job("neighbours", cfg, i, plan={"index": plan})]
            assert all(r["rows"] for r in results)
            finish_stage("neighbours", cfg, results, 0.0, {"index": plan})  # the commit
        tables[engine] = Store(root / "r").read("neighbours")
    assert tables["torch"].num_rows > 0 and tables["torch"].equals(tables["faiss"])
    assert tables["torch"].equals(exact_band_neighbours(x, sids, x, sids, 0.25, 1.0, 12))


def test_torch_engine_is_flat_only():
    from contramine.pipeline.config import ConfigError, load_config

    for index in ("ivf", "hnsw"):
        with pytest.raises(ConfigError, match=f"neighbours.engine = 'torch' with index = '{index}'"):
            load_config("default", ["neighbours.engine=torch", f"neighbours.index={index}"])
    assert load_config("default", ["neighbours.engine=torch"]).neighbours.engine == "torch"


def test_engine_setting_is_not_in_the_section_hashes():
    """The plan records the resolved engine (it is in the key there), the setting would only add a needless one."""
    from contramine.pipeline.config import load_config
    from contramine.pipeline.engine.runner import load_stages

    base = load_config("default")
    for engine in ("faiss", "torch"):
        other = load_config("default", [f"neighbours.engine={engine}"])
        assert all(base.section_hash(*st.settings) == other.section_hash(*st.settings) for st in load_stages().values())


def _tight_clusters(seed=0, n=1200, d=16, size=40):
    """Clusters of `size` near-copies (each member has ~size - 1 neighbours above hi = 0.75: the first k = pool +
    slack + 17 cannot reach the band, so queries widen), exact duplicate rows (ties in band), loose vectors, and
    12 far ones, mostly in 8 dimensions of their own (a few sentences in their band: fewer than a pool)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n // size, d))
    x = np.repeat(centres, size, axis=0)[:n] + rng.uniform(0.05, 0.6, size=(n, 1)) * rng.normal(size=(n, d))
    x[-240:] = rng.normal(size=(240, d))
    x = np.hstack([x, np.zeros((n, 8))])
    x[-12:] = np.hstack([0.1 * rng.normal(size=(12, d)), rng.normal(size=(12, 8))])
    x = _unit(x)
    x[100:130] = x[400:430]  # exact float32 duplicates
    return x, rng.permutation(10 * n)[:n].astype(np.int64)


@pytest.mark.parametrize("block_rows", [None, 7])
@pytest.mark.parametrize("lo, hi, pool, skip_top", [(0.25, 0.75, 8, 0), (0.25, 0.75, 30, 5), (0.5, 0.9, 50, 0),
                                                    (0.0, 0.6, 600, 2)])
def test_band_on_the_device_widens_within_the_block_and_equals_faiss_and_brute_force(block_rows, lo, hi, pool,
                                                                                     skip_top, monkeypatch):
    """TorchExact.band (the device path: top-k, resolve and widening from the block's scores in memory) at its
    default block (every query in one block here) and 7 queries a block: the pools of flat FAISS (the host
    path) and of the float64 brute force, row for row, with ties, skip_top, queries with fewer than pool_size in
    band, and queries that widen, each widened from the block's scores with what cannot matter masked out."""
    import contramine.pipeline.search.torch_exact as te

    x, sids = _tight_clusters()
    rows = np.r_[0:len(x) - 12:4, len(x) - 12:len(x)]  # a quarter, and the far ones
    q, q_sids = x[rows], sids[rows]
    widths = []
    smallest = te.smallest
    monkeypatch.setattr(te, "smallest", lambda s, k: (widths.append((len(s), k)), smallest(s, k))[1])
    exact = TorchExact(x, block_rows=block_rows)
    got = band_neighbours(q, q_sids, x, sids, exact, exact, lo, hi, pool, 8, skip_top=skip_top)
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    assert got.equals(band_neighbours(q, q_sids, x, sids, index, index, lo, hi, pool, 8, 1 << 12, skip_top=skip_top))
    assert got.equals(exact_band_neighbours(q, q_sids, x, sids, lo, hi, pool, skip_top))
    counts = np.bincount(np.searchsorted(np.sort(q_sids), got.column("sid").to_numpy()), minlength=len(q))
    assert (counts < pool).any() and (pool > len(x) or (counts == pool).any())  # short pools and full ones
    k0 = min(len(x), pool + skip_top + 8 + 17)
    widened = [n for n, k in widths if k > k0]
    if pool < 100 and skip_top:  # the first k cannot reach past the clusters: some rows widen, not all of a block
        assert widened and sum(widened) < len(q), widths
    elif pool < 100:  # without skip_top what is above the band is masked out before the first top-k: it reaches it
        assert not widened, widths


def test_resolve_orders_exact_ties_by_sid():
    """Equal exact cosines in band (duplicate rows under different sids): ranked by ascending sid, on the fast path
    (columns already in key order) and the sorted one alike."""
    import torch

    from contramine.pipeline.search.band import resolve

    scores = torch.tensor([[0.9, 0.6, 0.6, 0.6, 0.5, 0.4], [0.9, 0.6, 0.6, 0.5, 0.5, 0.3]], dtype=torch.float32)
    ids = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 4, 3, 2, 1, 5]])
    base_sids = torch.tensor([7, 30, 10, 20, 5, 9])
    cos = {1: 0.6, 2: 0.6, 3: 0.6, 4: 0.5, 5: 0.4, 0: 0.9}
    out = resolve(scores, ids, torch.tensor([7, 7]), base_sids, 0.25, 0.75, 4, True, 0, 1e-5,
                  lambda r, i: torch.tensor([cos[int(j)] for j in i], dtype=torch.float64))
    assert out.finished.all() and out.count.tolist() == [4, 4]
    assert out.cand.tolist() == [[10, 20, 30, 5], [10, 20, 30, 5]]


def _placed(target, d, seed):
    """A query (row 0) and one base row per target cosine to it, in a random rotation of R^d (float32)."""
    rng = np.random.default_rng(seed)
    base = np.zeros((len(target) + 1, d))
    base[0, 0] = 1.0
    base[1:, 0] = target
    base[1:, 2:] = _unit(rng.normal(size=(len(target), d - 2))) * np.sqrt(1 - target ** 2)[:, None]
    return (base @ np.linalg.qr(rng.normal(size=(d, d)))[0]).astype(np.float32)


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_loose_scores_send_what_they_cannot_decide_to_the_exact_path(precision):
    """TF32 / bf16 scores, simulated on the CPU (inputs rounded as those matmuls round them, float32 sums): cosines
    1e-5 apart (far closer than those scores' error) around the pool cut-off and both band edges. With the bound
    score_tolerance(d, precision) the pools equal the float64 brute force; with float32's bound they do not (the
    loose scores misorder and misplace them)."""
    from contramine.pipeline.search.band import score_tolerance

    d = 384
    rng = np.random.default_rng(7)
    target = np.concatenate([0.5 + 1e-5 * rng.permutation(60), 0.25 + 1e-5 * (np.arange(30) - 15),
                             0.75 + 1e-5 * (np.arange(30) - 15), 0.9 + 1e-5 * np.arange(10)])
    wrong = 0
    for seed in range(3):
        x = _placed(target, d, seed)
        sids = np.arange(len(x), dtype=np.int64)
        exact = TorchExact(x, precision=precision)
        for pool, skip in ((5, 0), (30, 3), (70, 12), (200, 0)):
            want = exact_band_neighbours(x[:1], sids[:1], x, sids, 0.25, 0.75, pool, skip)
            got = band_neighbours(x[:1], sids[:1], x, sids, exact, exact, 0.25, 0.75, pool, skip_top=skip)
            assert got.equals(want), (seed, pool, skip)
            wrong += not band_neighbours(x[:1], sids[:1], x, sids, exact, exact, 0.25, 0.75, pool, skip_top=skip,
                                         eps=score_tolerance(d)).equals(want)
        assert 0 < exact.observed_error <= score_tolerance(d, precision=precision)  # check_bound ran, and held
    assert wrong >= 6  # float32's bound gets most of them wrong


def _aligned(v, d=384, support=254):
    """Unit vectors whose every entry the `v` rounding moves by as much as it can, all the same way: ±a on
    `support` coordinates with a = 2^-4 (1 + 0.999 v) (bf16 rounds it, TF32 truncates it, to 2^-4: relative error
    ~v), plus a filler coordinate for the unit norm. Row 0 is the query (all +a); each other row agrees with it in
    sign on m coordinates: cosine (2 m - support) a², score (2 m - support) 2^-8, off by ~2 v cos. Returns (rows,
    their cosines to row 0)."""
    a = np.float32(2.0 ** -4 * (1 + 0.999 * v))
    fill = np.sqrt(1 - support * float(a) ** 2)
    agree = np.arange(support, support // 2, -3)  # m = support, support - 3, ...: cosines 1 down to ~0
    x = np.zeros((len(agree), d), dtype=np.float32)
    for row, m in enumerate(agree):
        x[row, :support] = np.where(np.arange(support) < m, a, -a)
        x[row, support + (row > 0)] = fill  # the query's filler and the others' on different coordinates
    return x, (2 * agree - support) * float(a) ** 2


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_the_loose_bound_holds_where_rounding_errors_all_align_and_is_near_tight_there(precision):
    """The worst case the bound is for: every entry rounded by ~v the same way, so a score is off by ~2 v cos (at
    cos ~1: ~2v, most of the bound). The error stays within score_tolerance(d, precision) and reaches over half of
    it. The band's low edge set between such a pair's score and its exact cosine: the pair is in band, the score
    says it is well out (more than float32's bound below lo); the search with the loose bound still finds it, with
    float32's it does not."""
    import torch

    from contramine.pipeline.search.band import INPUT_ROUNDING, score_tolerance

    x, cos = _aligned(INPUT_ROUNDING[precision])
    d, bound = x.shape[1], score_tolerance(x.shape[1], precision=precision)
    exact = TorchExact(x, precision=precision)
    with torch.inference_mode():
        scores = exact.scores(torch.from_numpy(x[:1]))[0].double().numpy()
    truth = x[:1].astype(np.float64) @ x.astype(np.float64).T
    np.testing.assert_allclose(truth[0, 1:], cos[1:], atol=1e-6)
    err = np.abs(scores - truth[0])
    assert err.max() <= bound and err.max() > 0.5 * bound
    sids = np.arange(len(x), dtype=np.int64)
    edge = int(np.argmin(np.abs(cos - 0.3)))  # the pair that sits on the low edge
    assert truth[0, edge] - scores[edge] > 4 * score_tolerance(d)
    lo = float((truth[0, edge] + scores[edge]) / 2)
    want = exact_band_neighbours(x[:1], sids[:1], x, sids, lo, 0.75, 64)
    assert edge in want.column("cand_sid").to_pylist()
    assert band_neighbours(x[:1], sids[:1], x, sids, exact, exact, lo, 0.75, 64).equals(want)
    assert not band_neighbours(x[:1], sids[:1], x, sids, exact, exact, lo, 0.75, 64,
                               eps=score_tolerance(d)).equals(want)


def test_a_device_that_breaks_the_bound_is_refused(monkeypatch):
    """check_bound measures the scores against float64 before the first band search: a matmul looser than the bound
    (here: the bf16 scores with 1e-2 added) stops the search in one line, before any pool is written."""
    from contramine.pipeline.search.band import Pools

    x, sids = _corpus()
    exact = TorchExact(x, precision="bf16")
    scores = TorchExact.scores
    monkeypatch.setattr(TorchExact, "scores", lambda self, q: scores(self, q) + 1e-2)
    with pytest.raises(RuntimeError, match="bf16 scores on cpu are off by up to .* more than the band search's bound"):
        exact.band(x, sids, sids, 0.25, 0.75, 8, 8, 0, exact.score_tolerance(), Pools(len(x), 8))
    with pytest.raises(ValueError, match="precision 'fp16'"):
        TorchExact(x, precision="fp16")


def test_tf32_scores_set_torchs_flag_only_for_their_matmul():
    import torch

    from contramine.pipeline.search.torch_exact import _tf32_matmuls

    before = torch.backends.cuda.matmul.allow_tf32
    with _tf32_matmuls():
        assert torch.backends.cuda.matmul.allow_tf32
    assert torch.backends.cuda.matmul.allow_tf32 == before


def test_tree_dot_is_the_float64_dot_whatever_the_batch_and_the_device_path_with_it_is_exact(monkeypatch):
    """tree_dot (the GPU's float64 cosines): within 1e-15 of the float64 matmul, the same bits for a pair alone, in
    any batch and at any d (padded to a power of two); and band() with it in place of numpy's exact_cosines (the
    GPU's code path, run on the CPU) gives the brute force's pools."""
    import torch

    from contramine.pipeline.search.torch_exact import tree_dot

    rng = np.random.default_rng(3)
    for d in (384, 7, 1):
        a, b = _unit(rng.normal(size=(300, d))), _unit(rng.normal(size=(300, d)))
        whole = tree_dot(torch.from_numpy(a), torch.from_numpy(b)).numpy()
        np.testing.assert_allclose(whole, np.einsum("pd,pd->p", a.astype(np.float64), b.astype(np.float64)),
                                   rtol=0, atol=1e-15)
        alone = [tree_dot(torch.from_numpy(a[i:i + 1]), torch.from_numpy(b[i:i + 1])).item() for i in range(0, 300, 37)]
        np.testing.assert_array_equal(whole[::37], alone)
    monkeypatch.setattr(TorchExact, "exact", lambda self, q, rows, ids: tree_dot(q[rows], self.base[ids]).clamp(-1, 1))
    x, sids = _tight_clusters()
    exact = TorchExact(x, block_rows=100)
    got = band_neighbours(x[::5], sids[::5], x, sids, exact, exact, 0.25, 0.75, 20, skip_top=2)
    assert got.num_rows and got.equals(exact_band_neighbours(x[::5], sids[::5], x, sids, 0.25, 0.75, 20, 2))
