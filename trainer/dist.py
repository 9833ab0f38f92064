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

`gather_with_grad` is the identity when torch.distributed is not initialised, and `global_mean` is then the
plain mean, so objectives are written once. Shards of different sizes are padded to the largest for the
collective and cut back afterwards.

A collective must run on every rank: a gathered tensor that requires grad must reach the loss on every rank
(else its backward, a collective too, runs on some ranks only and they hang) — objectives add `0 * g.sum()` where
the use is conditional (`touch`).
"""
from __future__ import annotations

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


def gather_with_grad(x: torch.Tensor, sizes: list[int] | None = None) -> torch.Tensor:
    """Concatenate every rank's `x` along dim 0 (rank order), keeping the gradient path of every slice; the
    backward sums the gradients of all ranks into each rank's own slice. Identity when not distributed.
    `sizes` (from `gather_sizes`) saves one collective when the caller already has them."""
    if not is_dist():
        return x
    sizes = sizes if sizes is not None else gather_sizes(x.shape[0], x.device)
    m = max(sizes)
    if m == 0:
        return x
    if x.shape[0] < m:
        x = torch.cat([x, x.new_zeros((m - x.shape[0],) + tuple(x.shape[1:]))])
    from torch.distributed.nn.functional import all_gather

    parts = all_gather(x.contiguous())
    return torch.cat([p[:s] for p, s in zip(parts, sizes)])


def local_slice(sizes: list[int]) -> slice:
    """Where this rank's rows sit in a gathered tensor."""
    r = rank()
    start = sum(sizes[:r])
    return slice(start, start + sizes[r])


def all_sum(value: float | int | torch.Tensor, device: torch.device | str = "cpu") -> float:
    """Sum of a number over ranks (no gradient)."""
    t = torch.as_tensor(value, dtype=torch.float64, device=device).detach().clone()
    if is_dist():
        dist.all_reduce(t)
    return float(t.item())


def all_max(value: int, device: torch.device | str = "cpu") -> int:
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
    docstring); the plain mean on one process. 0 (with a graph) when no rank has an item."""
    device = device if device is not None else per_item.device
    n = all_sum(per_item.numel(), device)
    if n == 0:
        return per_item.sum() * 0.0
    return per_item.sum() * (world_size() / n)


def touch(loss: torch.Tensor, *tensors: torch.Tensor) -> torch.Tensor:
    """Add 0·Σ t so that every gathered tensor is part of the graph on every rank (see the module docstring)."""
    for t in tensors:
        if t is not None and t.requires_grad:
            loss = loss + 0.0 * t.sum()
    return loss
