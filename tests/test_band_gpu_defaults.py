"""The band search's defaults on a GPU, tested on the CPU where the code lets the device paths be forced: engine =
auto takes the torch engine (pools resolved on the device) wherever torch sees CUDA, faiss-gpu installed or not;
score_precision = auto is bf16 there (no process-wide TF32 switch); the next block's GEMM is queued before the last
block's resolve, and the pools are the same in either order."""
import numpy as np
import pytest
import torch

from contramine.pipeline.config.mining import NeighboursCfg
from contramine.pipeline.search import faiss_index as fx
from contramine.pipeline.search import torch_exact as te
from contramine.pipeline.search.band import band_neighbours, exact_band_neighbours


def test_auto_searches_with_torch_wherever_torch_sees_cuda_even_with_faiss_gpu(monkeypatch):
    monkeypatch.setattr(fx, "gpu_count", lambda: 1)  # faiss-gpu installed, a GPU it sees
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert fx.search_engine(NeighboursCfg()) == ("torch", True)
    assert fx.search_engine(NeighboursCfg(index="flat")) == ("torch", True)
    # FAISS where only it can: approximate indexes, engine = faiss, or a GPU torch cannot see
    assert fx.search_engine(NeighboursCfg(index="ivf")) == ("faiss", True)
    assert fx.search_engine(NeighboursCfg(engine="faiss")) == ("faiss", True)
    assert fx.search_engine(NeighboursCfg(gpu="never")) == ("faiss", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert fx.search_engine(NeighboursCfg()) == ("faiss", True)
    monkeypatch.setattr(fx, "gpu_count", lambda: 0)
    assert fx.search_engine(NeighboursCfg()) == ("faiss", False)  # a CPU: FAISS, as before


def test_score_precision_auto_is_bf16_on_a_gpu_only():
    assert NeighboursCfg().score_precision == "auto"
    assert "score_precision" in NeighboursCfg.EXECUTION  # how fast, not what: the pools are the same
    assert te.score_precision("auto", "cuda") == te.score_precision("auto", "cuda:1") == "bf16"
    assert te.score_precision("tf32", "cuda:0") == "tf32" and te.score_precision("float32", "cuda") == "float32"
    for setting in ("auto", "tf32", "bf16", "float32"):
        assert te.score_precision(setting, "cpu") == "float32"


def test_bf16_scores_never_touch_torchs_process_wide_tf32_switch(monkeypatch):
    """bf16 names its dtype per call: the flag another thread's float32 matmuls read is never set (the CPU's
    simulation runs the same code path up to the device branch; the flag is watched through the whole search)."""
    x, sids = _corpus()
    seen = []
    real = te.TorchExact.scores
    monkeypatch.setattr(te.TorchExact, "scores", lambda self, q, **kw: (
        seen.append(torch.backends.cuda.matmul.allow_tf32), real(self, q, **kw))[1])
    before = torch.backends.cuda.matmul.allow_tf32
    exact = te.TorchExact(x, precision="bf16", block_rows=50)
    got = band_neighbours(x, sids, x, sids, exact, exact, 0.3, 0.8, 10)
    assert got.equals(exact_band_neighbours(x, sids, x, sids, 0.3, 0.8, 10))
    assert seen and not any(seen) and torch.backends.cuda.matmul.allow_tf32 == before


def _corpus(seed=0, n=400, d=24):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) + np.repeat(rng.normal(size=(n // 20, d)) * 2, 20, axis=0)
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    x[10:20] = x[50:60]  # exact duplicates: ties in band
    return x, rng.permutation(10 * n)[:n].astype(np.int64)


@pytest.mark.parametrize("skip_top", [0, 3])
def test_the_next_blocks_gemm_is_queued_before_this_blocks_resolve_and_the_pools_are_the_same(monkeypatch, skip_top):
    x, sids = _corpus()
    order = []
    scores, block = te.TorchExact.scores, te.TorchExact._band_block
    monkeypatch.setattr(te.TorchExact, "scores",
                        lambda self, q, **kw: (order.append(("gemm", len(q))), scores(self, q, **kw))[1])
    monkeypatch.setattr(te.TorchExact, "_band_block",
                        lambda self, q, *a: (order.append(("resolve", len(q))), block(self, q, *a))[1])
    tables = {}
    for overlap in (False, True):
        order.clear()
        exact = te.TorchExact(x, block_rows=150, overlap=overlap, symmetric=False)  # the full-row path's order
        tables[overlap] = band_neighbours(x, sids, x, sids, exact, exact, 0.2, 0.7, 12, skip_top=skip_top)
        steps = [what for what, _ in order]
        if overlap:  # gemm 0, gemm 1, resolve 0, gemm 2, resolve 1, resolve 2
            assert steps == ["gemm", "gemm", "resolve", "gemm", "resolve", "resolve"], order
        else:  # the plain order: block after block
            assert steps == ["gemm", "resolve"] * 3, order
        assert [n for what, n in order if what == "resolve"] == [150, 150, 100]
    assert tables[True].num_rows > 0 and tables[True].equals(tables[False])
    assert tables[True].equals(exact_band_neighbours(x, sids, x, sids, 0.2, 0.7, 12, skip_top))


def test_overlap_is_the_gpus_default_and_leaves_room_for_two_blocks(monkeypatch):
    x, _ = _corpus()
    assert te.TorchExact(x).overlap is False  # a CPU: the plain order
    assert te.TorchExact(x, overlap=True).overlap is True
    # the GPU's block size: memory for this block's scores, twice that while it widens, and the next block's
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (16 << 30, 80 << 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    exact = te.TorchExact(x)
    exact.device = torch.device("cuda")  # band_rows reads the device kind only
    rows = {}
    for overlap in (False, True):
        exact.overlap = overlap
        rows[overlap] = exact.band_rows()
    assert rows[False] == int((16 << 30) * te.BAND_MEMORY_SHARE) // 12 // len(x)
    assert rows[True] == int((16 << 30) * te.BAND_MEMORY_SHARE) // 16 // len(x) < rows[False]
