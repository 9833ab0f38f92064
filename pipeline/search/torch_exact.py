"""Exact inner-product search in torch: what `band_neighbours` searches with wherever torch sees a CUDA GPU
(`neighbours.engine` = auto, faiss-gpu installed or not), and a FAISS-free flat search anywhere. No FAISS import:
the GPU machine this project can use has torch but no faiss.

`TorchExact(base).band(...)` is the band search itself (pipeline/search/band.py calls it): for each block of queries
the scores against the whole base (held once, on the device; kept negated, as costs), their k largest per row
(torch_ops.smallest: group minima, no top-k over whole rows), `resolve` on the device, and the rows not settled
widened within the block, from the scores still in memory (scores that can be neither in band nor among the skipped
top masked out), so no query is searched twice. The float64 cosines of the
pairs the scores cannot decide are computed on the device too, by `tree_dot` (a fixed summation order: a pair's
value does not depend on its block); on a CPU with band.py's `exact_cosines`, as the FAISS path computes them, so the
torch and FAISS tables are the same byte for byte there. A GPU's table can differ from a CPU's only where the two
float64 sums of a pair differ in their last bits: a stored float32 `cos` one bit apart (~1e-9 of pairs), and in
membership or rank only for cosines within ~1e-16 of a band edge or of each other. Only the pools (padded
[B, pool_size] arrays and counts) come back to the host, once a block. A block is as many queries as fit: on a GPU
sized from its free memory (BAND_MEMORY_SHARE of it, at most BAND_MAX_ELEMS scores), on a CPU BAND_ELEMS_CPU scores
and at least BAND_MIN_ROWS_CPU queries (what measured best on the CPUs here). Without skip_top the scores above the
band (> hi + eps) are masked out before the first selection (one in-place threshold_ on the costs, no bool
matrix), so its k places go to scores that can be in band and rows under many near-copies need not widen. Queries
that are the base itself (the same rows and sids), on a CPU at float32, score each pair of blocks once
(pipeline/search/symmetric.py: half the GEMM; `symmetric=False` keeps the full rows); on a GPU they are still
scored against all of it (not measured on a GPU). On a GPU (`overlap`) the next
block's queries and GEMM are queued on a stream of their own before this block's selection, resolve and copy-back,
which read the host back: the card computes block i + 1's scores while block i is resolved (memory for both is in
the block size); on a CPU the plain order, block after block.

Scores (`precision`; `score_precision` resolves the setting: auto = bf16 on a GPU, float32 elsewhere): "float32"
(the class's default) is full float32 dot products, the band search's error bound
`score_tolerance(d)`; with TF32 / bf16 passes switched on in torch (`torch.set_float32_matmul_precision` not
"highest") it refuses to run. "tf32" (the matmul with TF32 passes, torch's cuBLAS flag set for it under the search
lock: the flag is process-wide, so another thread's float32 matmul launched meanwhile runs in TF32 too; torch has
no per-call or per-thread switch, which is why auto picks bf16) and "bf16" (bf16 copies of queries and base,
float32 accumulation and output: torch.mm's out_dtype) are faster on a GPU and round the inputs: `score_tolerance(d, precision=...)` bounds what that costs (~2e-3 / ~8e-3), every
pair within it of a band edge or the pool's cut-off gets its float64 cosine, so the pools stay exact, the same as at
float32. Before its first band search a TorchExact at tf32 / bf16 measures its scores against float64 on a sample of
the base (`check_bound`) and refuses to search if the device breaks the bound. On a CPU the rounding is simulated
(inputs rounded, then a float32 matmul): the test of the bound, no faster.

`TorchExact(base).search(x, k)` is `faiss.knn(x, base, k, METRIC_INNER_PRODUCT)` in float32, whatever `precision`:
queries in row blocks, each block's scores one float32 matmul against the base, then a top-k. The result is a
function of the scores alone, whatever the block sizes: descending score, equal scores by ascending base row (the
total order (-score, row)). FAISS has no such rule for ties: its heaps order equal scores by descending row and which
of a tie that straddles the k-th place is returned depends on the order rows reached the heap. Only tied entries can
differ, and band_neighbours' result does not depend on which of them come back (its stopping rules compare scores,
not rows; it ranks by exact cosine, then sid): `band` takes ties as its selection returns them. Rows past the base
(k > n) are padded as FAISS pads them: score -FLT_MAX, id -1.
"""
from __future__ import annotations

import threading
import warnings
from contextlib import nullcontext

import numpy as np
import torch

from contramine.pipeline.search.band import exact_cosines, first_k, resolve, score_tolerance
from contramine.pipeline.search.symmetric import is_self_search, self_band
from contramine.pipeline.search.torch_ops import _tf32_matmuls, rounded, smallest, top_k, tree_dot  # noqa: F401

PAD_SCORE = float(np.finfo(np.float32).min)  # what faiss.knn returns for the places past the base (-FLT_MAX)
BLOCK_ELEMS = {"cpu": 1 << 24, "cuda": 1 << 27}  # search(): query block x base scores held at once (64 MiB / 512 MiB)
BAND_ELEMS_CPU = 1 << 25  # band(): query block x base scores on a CPU (128 MiB: ~670 queries at 50k) ...
BAND_MIN_ROWS_CPU = 128  # ... but at least this many queries (the matmul reads the base once per block: ~65 GFLOP/s
# of float32 at 83 queries a block on this 2-core EPYC, ~90 at 512; and fewer, larger ops per query)
BAND_MAX_ELEMS = 1 << 31  # band(): at most this many scores a GPU block (8 GiB; past it some kernels index in int32)
BAND_MEMORY_SHARE = 0.6  # band(): of the device's free memory, for a block's scores and twice that (widening, top-k)
CHECK_QUERIES = 256  # check_bound: base rows scored against the whole base in float64
EXACT_PAIRS = 1 << 16  # float64 cosines on the device: pairs a step (a step's rows: 2 x 64k x d x 8 bytes)
PRECISIONS = ("float32", "tf32", "bf16")


def score_precision(setting: str, device: str) -> str:
    """The band search's score precision for `neighbours.score_precision` on `device`: "auto" is bf16 on a CUDA GPU
    (bf16 inputs, float32 sums: the dtype chosen per call, no process-wide switch) and float32 elsewhere; a set
    precision holds on a GPU; a CPU always scores in float32 (its tf32 / bf16 would only simulate the rounding)."""
    if not str(device).startswith("cuda"):
        return "float32"
    return "bf16" if setting == "auto" else setting


def _check_float32() -> None:
    try:
        loose = torch.get_float32_matmul_precision() != "highest" or torch.backends.cuda.matmul.allow_tf32
    except RuntimeError:  # set through torch >= 2.9's fp32_precision API only: the legacy getters refuse
        loose = True
    if loose:
        raise RuntimeError("TorchExact: float32 matmuls run with TF32 / bf16 passes (torch float32 matmul precision "
                           "is not 'highest'): the band search's error bound needs full float32 dot products; "
                           "call torch.set_float32_matmul_precision('highest') first, or search at "
                           "neighbours.score_precision = 'tf32' / 'bf16' (bounded, exact pools)")


class _Streams:
    """band()'s two CUDA streams: the scores' GEMMs on a side stream, everything else on the current one, ordered by
    events; on a CPU (or without overlap) one stream and no events: the plain order."""

    def __init__(self, device, overlap: bool):
        self.on = overlap and device.type == "cuda"
        self.main = torch.cuda.current_stream(device) if self.on else None
        self.side = torch.cuda.Stream(device) if self.on else None

    def gemm(self):
        if not self.on:
            return nullcontext()
        self.side.wait_stream(self.main)  # the base and the last block's frees are the main stream's
        return torch.cuda.stream(self.side)

    def done(self):
        """An event after the work queued on the GEMM stream so far (None without a side stream)."""
        return self.side.record_event() if self.on else None

    def wait(self, event, *tensors) -> None:
        """The main stream waits for `event`; `tensors` (made on the side stream) are marked as used on it, so the
        allocator does not hand their memory to the side stream while the main stream still reads them."""
        if self.on:
            self.main.wait_event(event)  # type: ignore[union-attr]  # self.on: __init__ made it
            for t in tensors:
                t.record_stream(self.main)


def _to_host(*tensors) -> list[np.ndarray]:
    """Device tensors as numpy arrays: on a GPU copied into pinned memory without blocking, then one wait (not one
    per tensor)."""
    if not tensors or tensors[0].device.type == "cpu":
        return [t.numpy() for t in tensors]
    out = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
    for o, t in zip(out, tensors):
        o.copy_(t, non_blocking=True)
    torch.cuda.current_stream(tensors[0].device).synchronize()
    return [o.numpy() for o in out]


def _tensor(x: np.ndarray):
    """torch.from_numpy, also of a read-only (mapped) array: torch warns it could write to it; it never does."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(x)


def _float32_below(x: float) -> float:
    """The largest float32 < x, for x a float32: a float32 above it is >= x."""
    return float(np.nextafter(np.float32(x), np.float32(-np.inf)))


def _float32_at_least(x: float) -> float:
    """The smallest float32 >= x: a float32 score above it is above x (torch compares a float32 tensor with a Python
    float in float32, rounding the float to nearest, which could be below x)."""
    f = np.float32(x)
    return float(np.nextafter(f, np.float32(np.inf)) if f < x else f)


class TorchExact:
    """Exact inner-product search over `base` (float32 [n, d]) with torch: `band(...)` for band_neighbours, and
    `search(x, k) -> (D float32 [m, k], I int64 [m, k])` like `faiss.knn` / IndexFlatIP (module docstring: ties,
    padding, precision). The base is copied once to `device`; `block_rows` fixes the queries a block (default: as many
    as fit, module docstring), so memory is the base plus one block's scores. On a GPU one search runs at a time
    (shard threads share the object; each would otherwise hold its own block)."""

    def __init__(self, base: np.ndarray, device: str = "cpu", block_rows: int | None = None,
                 precision: str = "float32", overlap: bool | None = None, symmetric: bool = True):
        if base.ndim != 2:
            raise ValueError(f"TorchExact: base must be 2-d, got shape {base.shape}")
        if precision not in PRECISIONS:
            raise ValueError(f"TorchExact: precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
        self.n, self.d = base.shape
        self.device, self.precision = torch.device(device), precision
        self.host = np.ascontiguousarray(base, dtype=np.float32)
        if not np.isfinite(self.host).all():
            raise ValueError("TorchExact: the base has NaN or infinite values")
        self.base = _tensor(self.host).to(self.device)
        self.rows_asked = block_rows
        budget = BLOCK_ELEMS.get(self.device.type, BLOCK_ELEMS["cuda"])
        self.block_rows = block_rows or max(1, budget // max(self.n, 1))
        self.lock = threading.Lock() if self.device.type != "cpu" else None
        # band(): the next block's GEMM queued before this block's resolve (on a GPU, on a stream of its own)
        self.overlap = self.device.type == "cuda" if overlap is None else overlap
        self.symmetric = symmetric  # band(): queries that are the base score each pair of blocks once (a CPU's)
        self.base_scored = None  # the base as a tf32 / bf16 matmul reads it (made on first use)
        self.observed_error: float | None = None  # check_bound's largest |score - float64 cosine| on its sample

    def score_tolerance(self) -> float:
        """The bound band_neighbours assumes on |score - exact cosine| for this precision (band.score_tolerance)."""
        return score_tolerance(self.d, np.float32, self.precision)

    def _queries(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.d:
            raise ValueError(f"TorchExact: queries of shape {x.shape} against a base of dimension {self.d}")
        if not np.isfinite(x).all():
            raise ValueError("TorchExact: the queries have NaN or infinite values")
        return x

    def search(self, x: np.ndarray, k: int):
        x = self._queries(x)
        if k < 0:
            raise ValueError(f"TorchExact: k = {k} < 0")
        m, kk = len(x), min(k, self.n)
        D: np.ndarray = np.full((m, k), PAD_SCORE, dtype=np.float32)
        I: np.ndarray = np.full((m, k), -1, dtype=np.int64)
        if kk == 0 or m == 0:
            return D, I
        _check_float32()
        with self.lock or nullcontext(), torch.inference_mode():
            for a in range(0, m, self.block_rows):
                q = _tensor(x[a:a + self.block_rows]).to(self.device)
                scores = q @ self.base.T
                scores.add_(0.0)  # -0.0 -> +0.0: a GPU radix sort would order them apart
                vals, idx = top_k(scores, kk)
                D[a:a + len(q), :kk] = vals.cpu().numpy()
                I[a:a + len(q), :kk] = idx.cpu().numpy()
                del scores, vals, idx
        return D, I

    def scores(self, q, out=None):
        """q (float32 [B, d], on the device) against the whole base at this precision: float32 [B, n], written into
        `out` where given (a CPU's band search reuses one buffer: a fresh one a block is paged in anew each time),
        except by the GPU's bf16 matmul, whose result is a new tensor (the caching allocator reuses its memory)."""
        if self.precision == "float32":
            _check_float32()
            return torch.mm(q, self.base.T, out=out)
        if self.device.type == "cuda":
            if self.precision == "tf32":
                with _tf32_matmuls():
                    return torch.mm(q, self.base.T, out=out)
            if self.base_scored is None:
                self.base_scored = self.base.to(torch.bfloat16)
            try:
                return torch.mm(q.to(torch.bfloat16), self.base_scored.T, out_dtype=torch.float32)
            except TypeError as e:  # float32 sums and output are what the bound assumes: nothing less will do
                raise RuntimeError(f"TorchExact: bf16 scores need torch.mm's out_dtype (torch >= 2.8; this is "
                                   f"{torch.__version__}): {e}") from e
        _check_float32()  # the simulation's matmul must itself be float32
        if self.base_scored is None:
            self.base_scored = rounded(self.base, self.precision)
        return torch.mm(rounded(q, self.precision), self.base_scored.T, out=out)

    def check_bound(self) -> float:
        """The largest |score - float64 cosine| over CHECK_QUERIES base rows (evenly spaced) against the whole base;
        RuntimeError where it passes score_tolerance (a device whose tf32 / bf16 matmul is looser than the bound
        assumes: the pools could be wrong, so nothing is searched). Kept in observed_error."""
        picks = torch.from_numpy(np.unique(np.linspace(0, self.n - 1, min(self.n, CHECK_QUERIES)).astype(np.int64)))
        worst = 0.0
        for a in range(0, len(picks), 16):
            q = self.base[picks[a:a + 16].to(self.device)]
            exact = q.to(torch.float64) @ self.base.to(torch.float64).T if self.n * self.d <= 1 << 26 else \
                torch.cat([q.to(torch.float64) @ self.base[b:b + 65536].to(torch.float64).T
                           for b in range(0, self.n, 65536)], dim=1)
            worst = max(worst, float((self.scores(q).to(torch.float64) - exact).abs().max()))
        self.observed_error = worst
        if worst > self.score_tolerance():
            raise RuntimeError(f"TorchExact: {self.precision} scores on {self.device} are off by up to {worst:.2e}, "
                               f"more than the band search's bound {self.score_tolerance():.2e}: search at "
                               f"neighbours.score_precision = 'float32'")
        return worst

    def band_rows(self) -> int:
        """Queries a band() block: block_rows where given; on a GPU BAND_MEMORY_SHARE of the free memory over the
        block's scores and twice that again (the widened rows' copies, top-k's workspace), at most BAND_MAX_ELEMS
        scores; on a CPU BAND_ELEMS_CPU scores, at least BAND_MIN_ROWS_CPU queries."""
        if self.rows_asked:
            return self.rows_asked
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)  # + what torch's allocator holds unused (a past block's)
            free += torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
            # a block's scores, twice that while it widens, and the next block's scores while this one resolves
            elems = min(BAND_MAX_ELEMS, int(free * BAND_MEMORY_SHARE) // ((3 + self.overlap) * 4))
        else:
            return max(BAND_MIN_ROWS_CPU, BAND_ELEMS_CPU // max(self.n, 1))
        return max(1, elems // max(self.n, 1))

    def band(self, x, q_sids, base_sids, lo: float, hi: float, pool_size: int, slack: int, skip_top: int,
             eps: float, pools, progress=None) -> None:
        """band_neighbours with this index (module docstring): the pools of queries x (sids q_sids; the base's sids
        base_sids) written into `pools` (band.Pools), a block at a time; progress(queries) after each block."""
        x = self._queries(x)
        if len(base_sids) != self.n:
            raise ValueError(f"TorchExact: {len(base_sids)} base sids for a base of {self.n} rows")
        k0 = first_k(self.n, pool_size, skip_top, slack)
        q_sids = np.asarray(q_sids, dtype=np.int64)
        mask_above = skip_top == 0  # nothing above the band can matter: masked before the first selection too
        # a cost (-score) is kept where it is > this, i.e. >= -ceiling: where the score is <= ceiling
        keep_above = _float32_below(-_float32_at_least(hi + eps))
        with self.lock or nullcontext(), torch.inference_mode():
            if self.precision != "float32" and self.observed_error is None:
                self.check_bound()
            sids = torch.from_numpy(np.require(base_sids, np.int64, ["C", "W"])).to(self.device)
            if self.symmetric and is_self_search(self, x, q_sids, base_sids):  # half the tiles (symmetric.py)
                _check_float32()
                self_band(self, x, q_sids, sids, lo, hi, pool_size, k0, skip_top, eps, keep_above, mask_above,
                          pools, progress)
                return
            rows = self.band_rows()
            streams = _Streams(self.device, self.overlap)
            # on a CPU one block's scores at a time: one buffer for all (a new one would be paged in anew each
            # block); on a GPU the caching allocator reuses a block's memory, and with overlap two blocks are alive
            buffer = torch.empty((min(rows, len(x)), self.n)) if self.device.type == "cpu" and not self.overlap \
                else None

            def launch(a: int):  # block a's queries to the device and their costs, on the GEMM stream
                with streams.gemm():
                    q = _tensor(x[a:a + rows]).to(self.device)
                    # costs = -scores, from the negated queries (exact: rounding is symmetric), so the mask above
                    # the band is one in-place pass with no bool matrix: threshold_ sets costs <= keep_above to +inf
                    costs = self.scores(q.neg(), out=None if buffer is None else buffer[:len(q)])
                    if mask_above:  # the selection then reaches into the band at once (fewer rows widen)
                        torch.nn.functional.threshold_(costs, keep_above, float("inf"))
                    return a, q, costs, streams.done()

            starts = list(range(0, len(x), rows))
            nxt = launch(starts[0]) if starts else None
            for i in range(len(starts)):
                a, q, costs, ready = nxt  # type: ignore[misc]  # block i, launched before this round
                streams.wait(ready, q, costs)
                # block i + 1's GEMM is queued before block i's resolve (which reads the host back): on a GPU it
                # runs on its own stream while this block is resolved and copied back; on a CPU: the plain order
                nxt = launch(starts[i + 1]) if self.overlap and i + 1 < len(starts) else None
                qs = torch.from_numpy(q_sids[a:a + len(q)]).to(self.device)
                cand, cos, count = self._band_block(q, costs, qs, sids, lo, hi, pool_size, k0, skip_top, eps)
                del costs
                pools.put(slice(a, a + len(q)), *_to_host(cand, cos, count))
                if progress is not None:
                    progress(len(q))
                if not self.overlap and i + 1 < len(starts):
                    nxt = launch(starts[i + 1])

    def _band_block(self, q, costs, q_sids, sids, lo, hi, pool_size, k, skip_top, eps):
        """One block's pools: (cand sids [B, pool_size], exact cos [B, pool_size], count [B]) on the device, from
        its costs (-scores: `scores(-q)`; without skip_top those of scores above hi + eps already +inf). The first
        round takes the k largest scores of every row (`smallest` costs: no top-k over whole rows); a row not
        settled (band.resolve) is widened from its costs (k doubled), with the scores in (hi + eps, t_r - 2 eps)
        masked out, in chunks of a quarter block."""
        n_q, dev = len(q), q.device
        cand = torch.full((n_q, pool_size), -1, dtype=torch.int64, device=dev)
        cos = torch.full((n_q, pool_size), float("nan"), dtype=torch.float64, device=dev)
        count = torch.zeros(n_q, dtype=torch.int64, device=dev)
        t_r = torch.empty(n_q, dtype=torch.float64, device=dev)
        ceiling = _float32_at_least(hi + eps)  # scores above it are above the band (compared in float32)
        pending, first = torch.arange(n_q, device=dev), True
        while len(pending):
            left = []
            step = n_q if first else max(1, n_q // 4)
            for c in range(0, len(pending), step):
                rows = pending[c:c + step]
                if first:
                    sub = costs
                else:  # -cost > ceiling and -cost < t_r - 2 eps (both exact: negation is)
                    sub = costs.index_select(0, rows)
                    sub.masked_fill_((sub < -ceiling) & (sub > -(t_r[rows, None] - 2 * eps)), float("inf"))
                vals, idx = smallest(sub, k)
                del sub
                vals = vals.neg_()  # scores, descending
                ids = idx.masked_fill(vals == float("-inf"), -1)  # masked out: not returned
                out = resolve(vals, ids, q_sids[rows], sids, lo, hi, pool_size, k >= self.n, skip_top, eps,
                              lambda r, i, rows=rows: self.exact(q, rows[r], i))
                fin = out.finished  # settled rows take their pools (no host read: where, not a mask index)
                cand[rows] = torch.where(fin[:, None], out.cand, cand[rows])
                cos[rows] = torch.where(fin[:, None], out.cos, cos[rows])
                count[rows] = torch.where(fin, out.count, count[rows])
                t_r[rows] = out.t_r
                left.append(rows[~fin])
            pending, first, k = torch.cat(left), False, min(self.n, 2 * k)
        return cand, cos, count

    def exact(self, q, q_rows, ids):
        """float64 cos(q[q_rows[p]], base[ids[p]]) for each pair p. On a CPU band.exact_cosines (numpy), the FAISS
        path's values to the bit; on a GPU `tree_dot`, on the device, EXACT_PAIRS pairs a step."""
        if self.device.type == "cpu":
            return torch.from_numpy(exact_cosines(q.numpy(), q_rows.numpy(), self.host, ids.numpy()))
        out = torch.empty(len(ids), dtype=torch.float64, device=q.device)
        for a in range(0, len(ids), EXACT_PAIRS):
            out[a:a + EXACT_PAIRS] = tree_dot(q[q_rows[a:a + EXACT_PAIRS]], self.base[ids[a:a + EXACT_PAIRS]])
        return out.clamp_(-1.0, 1.0)
