"""Tensor helpers of the torch band search (pipeline/search/torch_exact.py): TF32 matmuls for one call, the CPU's
simulation of TF32 / bf16 inputs (`rounded`), top-k in the total order (-score, column) (`top_k`), the band search's
k smallest per row without a top-k over the whole row (`smallest`) and the batch-independent float64 dot product
(`tree_dot`). torch only; no FAISS.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

SORT_SHARE = 8  # k >= n / SORT_SHARE: one stable sort of each row instead of topk + the tie fix-up
FANOUT = 8  # smallest(): columns a group (its minimum stands for it one level up)


@contextmanager
def _tf32_matmuls():
    """cuBLAS float32 matmuls with TF32 passes, for the duration. torch's flag is process-wide (torch 2.13 has no
    per-thread or per-call TF32): a float32 matmul another thread launches meanwhile runs in TF32 too. Only the
    opt-in score_precision = "tf32" uses it; the GPU default (bf16) names its dtype per call instead."""
    matmul = torch.backends.cuda.matmul
    try:
        name, value, old = "allow_tf32", True, matmul.allow_tf32
    except RuntimeError:  # set through torch >= 2.9's fp32_precision API: the legacy getter refuses; use that API
        name, value, old = "fp32_precision", "tf32", matmul.fp32_precision
    setattr(matmul, name, value)
    try:
        yield
    finally:
        setattr(matmul, name, old)


def rounded(x, precision: str):
    """x (float32 tensor) with each entry as a `precision` matmul reads it, as float32: bf16 rounded to nearest (torch's
    cast); TF32 truncated to 10 mantissa bits (the worst a tensor core may do): the CPU's simulation of those
    matmuls."""
    if precision == "bf16":
        return x.to(torch.bfloat16).to(torch.float32)
    if precision == "tf32":
        return (x.contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)
    return x


def top_k(scores, k: int):
    """(values, rows) of the k largest entries of each row of `scores` (a 2-d float tensor, k <= its width), in
    the total order (-score, column): descending, ties by ascending column. torch.topk alone orders ties anyhow and
    may keep any of a tie at the k-th place; rows where such a tie straddles the cut keep its smallest columns."""
    n = scores.shape[1]
    if k * SORT_SHARE >= n:
        vals, idx = torch.sort(scores, dim=1, descending=True, stable=True)  # stable: ties keep column order
        return vals[:, :k], idx[:, :k]
    # k + 1: a tie straddles the k-th place exactly where the (k+1)-th largest equals the k-th (no pass over the
    # whole row to count ties: on a GPU's block of 2,000 x 1M scores that pass read 8 GB)
    vals, idx = torch.topk(scores, k + 1, dim=1, largest=True, sorted=True)
    kth = vals[:, k - 1:k]
    cut = torch.nonzero(vals[:, k] == kth[:, 0]).flatten()  # a tie left partly outside
    vals, idx = vals[:, :k], idx[:, :k]
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


def smallest(costs, k: int):
    """(values, columns) of the k smallest entries of each row of `costs` (2-d float, k <= its width), ascending,
    ties in any order, without a top-k over whole rows: column c belongs to group c % G (G = ceil(width / FANOUT),
    so a group's FANOUT members are G apart and its minimum is FANOUT - 1 elementwise minimums of contiguous
    slices: one pass over the row, vectorised on a CPU, coalesced on a GPU), the k groups with the smallest minima
    are found the same way one level up (recursively, until a row is short enough for one top-k), and the k
    smallest of their k x FANOUT members are the answer. Exact: the k chosen groups hold k entries no larger than
    the k-th smallest group minimum m, and every entry outside them is >= its group's minimum >= m, so the k
    smallest values (as a multiset) are among the chosen groups' members. An entry of +inf may come back with a
    column past the row (where fewer than k entries are finite): the caller treats +inf as none."""
    import torch

    n = costs.shape[1]
    if k * SORT_SHARE >= n:  # short rows (and wide k): one sort beats topk
        vals, idx = torch.sort(costs, dim=1)
        return vals[:, :k], idx[:, :k]
    if 2 * k * FANOUT > n:
        return torch.topk(costs, k, dim=1, largest=False, sorted=True)
    groups = -(-n // FANOUT)
    minima = costs[:, :groups].clone()
    for j in range(1, FANOUT):  # the last slice is shorter where FANOUT does not divide n
        width = min(groups, n - j * groups)
        torch.minimum(minima[:, :width], costs[:, j * groups:j * groups + width], out=minima[:, :width])
    chosen = smallest(minima, k)[1]
    chosen = chosen.masked_fill_(chosen >= groups, n)  # a place past the row one level up: members past this row
    cols = (chosen[:, :, None] + groups * torch.arange(FANOUT, device=costs.device)).flatten(1)
    members = costs.gather(1, cols.clamp(max=n - 1)).masked_fill_(cols >= n, float("inf"))  # past the row: never
    vals, pick = torch.topk(members, k, dim=1, largest=False, sorted=True)
    return vals, cols.gather(1, pick)


def tree_dot(a, b):
    """Row-wise dot products of float32 [P, d] tensors in float64, summed in one fixed pairwise tree: the products
    are exact in float64 (24-bit x 24-bit significands), and each level of the tree is an elementwise add, which
    IEEE 754 rounds the same on every device; so a pair's value depends on neither its batch nor the kernel's
    reduction order (torch.sum's does, on a GPU). It can differ from numpy's einsum (the CPU's exact_cosines, other
    order) in the last bits of the float64, hence, in rare pairs (~1e-9), in the last bit of the float32 `cos`."""
    x = a.to(torch.float64) * b.to(torch.float64)
    width = 1 << max(0, x.shape[1] - 1).bit_length()
    if width != x.shape[1]:
        x = torch.nn.functional.pad(x, (0, width - x.shape[1]))
    while x.shape[1] > 1:
        x = x[:, :x.shape[1] // 2] + x[:, x.shape[1] // 2:]
    return x[:, 0]
