"""Exact inner-product k-NN in torch: what `band_neighbours` searches with on a CUDA GPU when FAISS has no GPU
support (`neighbours.engine`), and a FAISS-free flat search anywhere. No FAISS import: the GPU machine this project
can use has torch but no faiss.

`TorchExact(base).search(x, k)` is `faiss.knn(x, base, k, METRIC_INNER_PRODUCT)`: queries in row blocks, each block's
scores one float32 matmul against the base (held once, on the device), then a top-k. The result is a function of
the scores alone, whatever the block sizes: descending score, equal scores by ascending base row (the total order
(-score, row)). FAISS has no such rule for ties: its heaps order equal scores by descending row and which of a tie
that straddles the k-th place is returned depends on the order rows reached the heap. Only tied entries can differ,
and band_neighbours' result does not depend on which of them come back (its stopping rules compare scores, not
rows; it ranks by exact cosine, then sid). Rows past the base (k > n) are padded as FAISS pads them: score
-FLT_MAX, id -1.

Scores must be full float32 dot products (the band search's error bound, `score_tolerance`): with TF32 or bf16
matmul passes switched on (`torch.set_float32_matmul_precision` not "highest") search refuses to run.
"""
from __future__ import annotations

import threading
import warnings
from contextlib import nullcontext

import numpy as np

PAD_SCORE = float(np.finfo(np.float32).min)  # what faiss.knn returns for the places past the base (-FLT_MAX)
BLOCK_ELEMS = {"cpu": 1 << 24, "cuda": 1 << 27}  # query block x base scores held at once (64 MiB / 512 MiB)
SORT_SHARE = 8  # k >= n / SORT_SHARE: one stable sort of each row instead of topk + the tie fix-up


def _check_float32() -> None:
    import torch

    try:
        loose = torch.get_float32_matmul_precision() != "highest" or torch.backends.cuda.matmul.allow_tf32
    except RuntimeError:  # set through torch >= 2.9's fp32_precision API only: the legacy getters refuse
        loose = True
    if loose:
        raise RuntimeError("TorchExact: float32 matmuls run with TF32 / bf16 passes (torch float32 matmul precision "
                           "is not 'highest'): the band search's error bound needs full float32 dot products; "
                           "call torch.set_float32_matmul_precision('highest') first")


def top_k(scores, k: int):
    """(values, rows) of the k largest entries of each row of `scores` (a 2-d float tensor, k <= its width), in
    the total order (-score, column): descending, ties by ascending column. torch.topk alone orders ties anyhow and
    may keep any of a tie at the k-th place; rows where such a tie straddles the cut keep its smallest columns."""
    import torch

    n = scores.shape[1]
    if k * SORT_SHARE >= n:
        vals, idx = torch.sort(scores, dim=1, descending=True, stable=True)  # stable: ties keep column order
        return vals[:, :k], idx[:, :k]
    vals, idx = torch.topk(scores, k, dim=1, largest=True, sorted=True)
    kth = vals[:, -1:]
    cut = torch.nonzero((scores == kth).sum(1) > (vals == kth).sum(1)).flatten()  # a tie left partly outside
    if len(cut):
        s, t = scores[cut], kth[cut]
        above, tied = s > t, s == t
        keep = above | (tied & (tied.cumsum(1) <= (k - above.sum(1, keepdim=True))))
        rows = torch.nonzero(keep)[:, 1].view(len(cut), k)  # exactly k a row, ascending column
        idx[cut], vals[cut] = rows, s.gather(1, rows)
    by_col = torch.argsort(idx, dim=1)  # then a stable sort by descending score: ties by column
    idx, vals = idx.gather(1, by_col), vals.gather(1, by_col)
    order = torch.sort(vals, dim=1, descending=True, stable=True).indices
    return vals.gather(1, order), idx.gather(1, order)


class TorchExact:
    """Exact inner-product search over `base` (float32 [n, d]) with torch: `search(x, k) -> (D float32 [m, k],
    I int64 [m, k])` like `faiss.knn` / IndexFlatIP (module docstring: ties and padding). The base is copied once to
    `device`; queries go in blocks of `block_rows` (default: as many as keep block x n scores within BLOCK_ELEMS),
    so memory is the base plus one block's scores and its top-k. On a GPU one search runs at a time (shard threads
    share the object; each would otherwise hold its own block)."""

    def __init__(self, base: np.ndarray, device: str = "cpu", block_rows: int | None = None):
        import torch

        if base.ndim != 2:
            raise ValueError(f"TorchExact: base must be 2-d, got shape {base.shape}")
        self.n, self.d = base.shape
        self.device = torch.device(device)
        host = np.ascontiguousarray(base, dtype=np.float32)
        if not np.isfinite(host).all():
            raise ValueError("TorchExact: the base has NaN or infinite values")
        with warnings.catch_warnings():  # a read-only (mapped) base: torch warns it could write; it never does
            warnings.simplefilter("ignore", UserWarning)
            self.base = torch.from_numpy(host).to(self.device)
        budget = BLOCK_ELEMS.get(self.device.type, BLOCK_ELEMS["cuda"])
        self.block_rows = block_rows or max(1, budget // max(self.n, 1))
        self.lock = threading.Lock() if self.device.type != "cpu" else None

    def search(self, x: np.ndarray, k: int):
        import torch

        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.d:
            raise ValueError(f"TorchExact: queries of shape {x.shape} against a base of dimension {self.d}")
        if k < 0:
            raise ValueError(f"TorchExact: k = {k} < 0")
        if not np.isfinite(x).all():
            raise ValueError("TorchExact: the queries have NaN or infinite values")
        m, kk = len(x), min(k, self.n)
        D = np.full((m, k), PAD_SCORE, dtype=np.float32)
        I = np.full((m, k), -1, dtype=np.int64)
        if kk == 0 or m == 0:
            return D, I
        _check_float32()
        with self.lock or nullcontext(), torch.inference_mode():
            for a in range(0, m, self.block_rows):
                q = torch.from_numpy(x[a:a + self.block_rows]).to(self.device)
                scores = q @ self.base.T
                scores.add_(0.0)  # -0.0 -> +0.0: a GPU radix sort would order them apart
                vals, idx = top_k(scores, kk)
                D[a:a + len(q), :kk] = vals.cpu().numpy()
                I[a:a + len(q), :kk] = idx.cpu().numpy()
                del scores, vals, idx
        return D, I

