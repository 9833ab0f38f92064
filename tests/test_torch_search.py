"""TorchExact (pipeline/search/torch_exact.py): exact k-NN in torch, the same neighbours as faiss.knn and the same band
search tables as the flat FAISS index, ties and k > n included."""
import faiss
import numpy as np
import pytest

from pipeline.search.band import band_neighbours, exact_band_neighbours
from pipeline.search.torch_exact import PAD_SCORE, TorchExact


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

    from pipeline.search import index as ix
    from pipeline.config import load_config
    from pipeline.engine.runner import finish_stage, run_job
    from pipeline.engine.store import Store
    from pipeline.schema import vectors_table

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
    from pipeline.config import ConfigError, load_config

    for index in ("ivf", "hnsw"):
        with pytest.raises(ConfigError, match=f"neighbours.engine = 'torch' with index = '{index}'"):
            load_config("default", ["neighbours.engine=torch", f"neighbours.index={index}"])
    assert load_config("default", ["neighbours.engine=torch"]).neighbours.engine == "torch"


def test_engine_setting_is_not_in_the_section_hashes():
    """The plan records the resolved engine (it is in the key there), the setting would only add a needless one."""
    from pipeline.config import load_config
    from pipeline.engine.runner import load_stages

    base = load_config("default")
    for engine in ("faiss", "torch"):
        other = load_config("default", [f"neighbours.engine={engine}"])
        assert all(base.section_hash(*st.settings) == other.section_hash(*st.settings) for st in load_stages().values())
