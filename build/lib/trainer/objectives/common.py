"""What the objectives share: the collate helpers, cosine matrices, per-anchor InfoNCE and SimCSE's MLP head.

Each objective file (simcse, debcse, osscse, whitenedcse, dclr) holds one objective: its formula in the docstring,
its own settings ([train.<name>]), collate and forward; what more than one of them uses lives here.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def prefixed(prefix: str, tokens: dict) -> dict:
    """Flatten a tokenizer output under `prefix.` so collate returns one flat dict of tensors."""
    return {f"{prefix}.{k}": v for k, v in tokens.items()}


def sub_batch(batch: dict, prefix: str) -> dict:
    """The tokenizer dict stored under `prefix.` by `prefixed`."""
    p = prefix + "."
    return {k[len(p):]: v for k, v in batch.items() if k.startswith(p)}


def two_views(tokens: dict) -> dict:
    """The batch stacked twice: one forward gives two dropout views (each row draws its own mask), and one
    2B-row matmul is ~1.4x faster on CPU than two B-row ones."""
    return {k: torch.cat([v, v]) for k, v in tokens.items()}


def cos_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of every row of a with every row of b, in float32 whatever the autocast: bf16 keeps ~3
    significant digits, and a logit cos/τ at τ = 0.05 would carry an error of ~0.1 (noise in the softmax)."""
    with torch.autocast(a.device.type, enabled=False):
        return F.normalize(_at_least_float32(a), dim=-1) @ F.normalize(_at_least_float32(b), dim=-1).T


def cos_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine of row i of a with row i of b, in float32 whatever the autocast (see cos_matrix)."""
    with torch.autocast(a.device.type, enabled=False):
        return (F.normalize(_at_least_float32(a), dim=-1) * F.normalize(_at_least_float32(b), dim=-1)).sum(-1)


def _at_least_float32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))  # float64 (the tests' reference runs) stays float64


def info_nce_terms(anchors: torch.Tensor, candidates: torch.Tensor, targets: torch.Tensor, tau: float,
                   keep: torch.Tensor | None = None, extra_logits: torch.Tensor | None = None,
                   extra_keep: torch.Tensor | None = None) -> torch.Tensor:
    """Per-anchor InfoNCE: −log e^{s_{i,t_i}} / Σ_{kept j} e^{s_ij} with s = cos/τ over `candidates`, plus
    optional extra logits (already divided by τ) in the denominator. `keep`/`extra_keep` (bool) drop entries
    from the denominator; the target is always kept."""
    logits = cos_matrix(anchors, candidates) / tau
    rows = torch.arange(len(anchors), device=logits.device)
    pos = logits[rows, targets]
    if keep is not None:
        keep = keep.clone()
        keep[rows, targets] = True
        logits = logits.masked_fill(~keep, float("-inf"))
    if extra_logits is not None:
        if extra_keep is not None:
            extra_logits = extra_logits.masked_fill(~extra_keep, float("-inf"))
        logits = torch.cat([logits, extra_logits], dim=1)
    return torch.logsumexp(logits, dim=1) - pos


class MLPHead(torch.nn.Module):
    """SimCSE's training-only head: Linear(d, d) + Tanh."""

    def __init__(self, dim: int):
        super().__init__()
        self.dense = torch.nn.Linear(dim, dim)
        self.act = torch.nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))
