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


def joined(encoder, groups: list[dict | None]) -> dict:
    """Several tokenised groups of one training step (two dropout views; anchors, positives, negatives; a prompt's
    two templates, paraphrases, negations) as ONE batch, so the step runs ONE encoder forward over all of them:
    {"enc.<key>": the groups stacked in order, each padded (on the tokenizer's side) to the longest row of all,
    "groups": (rows of each group, ...)}; a group that is None has 0 rows. `Objective.encode_groups` splits the
    pooled vectors back. Nothing changes in what a row's vector is: every row is encoded on its own (attention sees
    its own tokens only) and, with dropout on, draws its own dropout mask, as in a forward of its group alone.

    Where the encoder runs padding-free (train.unpad), the packed layout of the joint batch is made here, on the host
    in the DataLoader workers (pipeline/models/encode/unpad.py unpad_layout), so the extra pad columns cost no arithmetic
    in the linear layers and the forward reads nothing back from the device."""
    tok = encoder.tokenizer
    present = [g for g in groups if g is not None]
    length = max(g["input_ids"].shape[1] for g in present)
    left = getattr(tok, "padding_side", "right") == "left"
    fill = {"input_ids": tok.pad_token_id or 0, "attention_mask": 0, "token_type_ids": tok.pad_token_type_id}
    out = {}
    for key in present[0]:
        parts = []
        for g in present:
            v, extra = g[key], length - g["input_ids"].shape[1]
            if key == "mask_positions":  # a column index: moves with left padding only
                v = v + extra if left else v
            elif extra:
                v = F.pad(v, (extra, 0) if left else (0, extra), value=fill.get(key, 0))
            parts.append(v)
        out[key] = torch.cat(parts)
    if encoder.unpad:
        from contramine.pipeline.models.encode.unpad import unpad_layout

        out.update(unpad_layout(encoder.model, out["attention_mask"]) or {})
    return {**prefixed("enc", out), "groups": tuple(0 if g is None else len(g["input_ids"]) for g in groups)}


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
