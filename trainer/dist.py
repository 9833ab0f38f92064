"""Distributed helpers for contrastive objectives: the same numbers on 1 process and on W processes.

Why `gather_with_grad` + `global_mean` give the single-process gradient
---------------------------------------------------------------------
A global batch of B rows is split over W ranks; rank r holds rows R_r (|R_r| = B_r, Σ_r B_r = B). The
single-process loss is the mean of per-anchor terms over the global batch, L = (1/B) Σ_i ℓ_i, where each ℓ_i
may depend on the representations x of EVERY row (in-batch negatives, batch statistics).

1. Every rank gathers the representations with `gather_with_grad` (torch.distributed.nn.functional.all_gather),
   so it sees the global X = [x_R1; …; x_RW] and each slice keeps its autograd path. Its backward is a
   reduce-scatter with SUM: the gradient that reaches rank r's local x_Rr is Σ_{r'} ∂L_{r'}/∂x_Rr, i.e. the
   contributions of the losses computed on all ranks (the local slice is the only part with a path to local θ).
2. Rank r computes only its own anchors' terms, scaled as  L_r = (W/B) Σ_{i∈R_r} ℓ_i   (`global_mean`).
   Then Σ_r L_r = W·L, and the mean of L_r over ranks is the global loss L (what the loop logs).
3. Rank r's backward therefore gives g_r = ∂(Σ_{r'} L_{r'})/∂θ restricted to the paths through x_Rr
   = W · ∂L/∂θ|through x_Rr. DistributedDataParallel AVERAGES gradients over ranks:
   (1/W) Σ_r g_r = Σ_r ∂L/∂θ|through x_Rr = ∂L/∂θ, because every path from θ to L passes through exactly one
   slice x_Rr (the encoder is applied row-wise). This is exactly the single-process gradient of the same
   global batch — also for uneven shards (B_r may differ; the scale uses the global B, not B_r).
4. Terms that do not go through gathered tensors but are replicated on every rank (OssCSE's weight recall
   γ/2‖θ−θ*‖²) are added unscaled: DDP's average of W identical gradients is that gradient.

`gather_with_grad` / `gather_many` are the identity when torch.distributed is not initialised, and
`global_mean` is then the plain mean, so objectives are written once. Shards of different sizes are padded to
the largest for the collective and cut back afterwards.

Collectives must run in the same order on every rank, the backward ones included. So an objective gathers
everything it needs with ONE `gather_many` call per forward (its backward is one collective whatever the
graph), and at least one gathered tensor always reaches the loss. Randomness every rank must share (permutations,
noise vectors) is drawn on rank 0 and broadcast (`broadcast`).
"""
from __future__ import annotations

import warnings

import torch
import torch.distributed as dist


def is_dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_dist() else 0


def world_size() -> int:
    return dist.get_world_size() if is_dist() else 1


def gather_sizes(n: int, device: torch.device | str = "cpu") -> list[int]:
    """Every rank's local count (a collective); [n] when not distributed."""
    if not is_dist():
        return [int(n)]
    t = torch.tensor([int(n)], dtype=torch.long, device=device)
    out = [torch.zeros_like(t) for _ in range(world_size())]
    dist.all_gather(out, t)
    return [int(s.item()) for s in out]


def gather_many(tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[list[int]]]:
    """Gather several tensors (same trailing shape, any first dim, possibly 0) from every rank with ONE
    all_gather: returns each one concatenated over ranks in rank order, with the gradient path of every slice
    kept, and each one's per-rank sizes. Identity when not distributed.

    One collective, not one per tensor, on purpose: the backward of an all_gather is a collective too, and the
    autograd engine orders backward nodes by the graph, which may differ between ranks (one rank has no
    negatives, another has) — several gathers could then run their backward collectives in different orders on
    different ranks and deadlock or mix up. With one gather per forward every rank runs exactly one backward
    collective."""
    if not is_dist():
        return list(tensors), [[int(t.shape[0])] for t in tensors]
    device = tensors[0].device
    local = torch.tensor([int(t.shape[0]) for t in tensors], dtype=torch.long, device=device)
    every = [torch.zeros_like(local) for _ in range(world_size())]
    dist.all_gather(every, local)
    every = torch.stack(every).tolist()  # one host read of every rank's sizes: the slicing below needs them
    sizes = [[int(e[k]) for e in every] for k in range(len(tensors))]  # sizes[k][r]
    maxes = [max(s) for s in sizes]
    padded = []
    for t, m in zip(tensors, maxes):
        if t.shape[0] < m:
            t = torch.cat([t, t.new_zeros((m - t.shape[0],) + tuple(t.shape[1:]))])
        padded.append(t)
    packed = torch.cat(padded).contiguous()
    from torch.distributed.nn.functional import all_gather

    with warnings.catch_warnings():  # deprecated in favour of a private API; it is the documented autograd gather
        warnings.simplefilter("ignore", FutureWarning)
        parts = all_gather(packed)
    out = []
    start = 0
    for k, m in enumerate(maxes):
        out.append(torch.cat([p[start:start + s] for p, s in zip(parts, sizes[k])]))
        start += m
    return out, sizes


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's `x` along dim 0 (rank order), keeping the gradient path of every slice; the
    backward sums the gradients of all ranks into each rank's own slice. Identity when not distributed.
    (Use `gather_many` when one forward needs several gathered tensors.)"""
    return gather_many([x])[0][0]


def gather_nograd(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's `x` along dim 0, without gradient (lookups such as mined embeddings)."""
    if not is_dist():
        return x
    sizes = gather_sizes(x.shape[0], x.device)
    m = max(sizes)
    x = x.detach()
    if x.shape[0] < m:
        x = torch.cat([x, x.new_zeros((m - x.shape[0],) + tuple(x.shape[1:]))])
    parts = [torch.empty_like(x) for _ in sizes]
    dist.all_gather(parts, x.contiguous())
    return torch.cat([p[:s] for p, s in zip(parts, sizes)])


def local_slice(sizes: list[int]) -> slice:
    """Where this rank's rows sit in a gathered tensor."""
    r = rank()
    start = sum(sizes[:r])
    return slice(start, start + sizes[r])


def all_sum(value: float | int | torch.Tensor, device: torch.device | str = "cpu") -> float:
    """Sum of a number over ranks (no gradient); the number itself when not distributed (no device round trip)."""
    if not is_dist():
        return float(value)
    t = torch.as_tensor(value, dtype=torch.float64, device=device).detach().clone()
    if is_dist():
        dist.all_reduce(t)
    return float(t.item())


def all_max(value: int, device: torch.device | str = "cpu") -> int:
    """Maximum of a host number over ranks; the number itself when not distributed (no device round trip)."""
    if not is_dist():
        return int(value)
    t = torch.tensor([int(value)], dtype=torch.long, device=device)
    if is_dist():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def broadcast(x: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Rank `src`'s tensor on every rank (so randomness drawn once is shared); identity when not distributed."""
    if is_dist():
        x = x.contiguous()
        dist.broadcast(x, src)
    return x


def global_mean(per_item: torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
    """This rank's share of the mean over the global batch: (W / N_global) · Σ_local per_item (see the module
    docstring); the plain mean on one process. 0 (with a graph) when no rank has an item. No host read: the local
    count is a shape, and across ranks it is summed on the device and divided there."""
    device = device if device is not None else per_item.device
    if not is_dist():
        n = per_item.numel()
        return per_item.sum() * (1.0 / n) if n else per_item.sum() * 0.0
    n = torch.tensor(float(per_item.numel()), dtype=torch.float64, device=device)
    dist.all_reduce(n)
    # n = 0 on every rank: the sum is 0 and so is the share (clamp: no 0/0)
    return per_item.sum() * (world_size() / n.clamp(min=1)).to(per_item.dtype)
