"""DebCSE (Miao et al., "DebCSE: Rethinking Unsupervised Contrastive Sentence Embedding Learning in the Debiasing
Perspective", CIKM 2023, §4.3, Eq. 8).

Inputs: rows of the `pairs` table: `text` (x_i), `positives` (mined x_i⁺: the FIRST one is used) and `negatives`
(mined x_{i,k}⁻: the first m = `negatives` are used).

How the m_pos = 2 mined positives are used: Eq. 8 has one positive per anchor, so the loss takes one — the first
IPW draw (`candidates.pick` = 1: sampled first, without replacement, from P_pos). The second draw stays in `pairs`
for audit and for users who train on (x_i, x_i⁺₂) as an extra row; mine with `ipw.m_pos = 1` to keep only the one
the loss reads. The paper's m = 2 negatives all enter the denominator.

Settings ([train.debcse]): negatives (m = 2, the paper's).
- A row whose `positives` is None/empty uses a dropout view of x_i as its positive (x_i is encoded again in the
  positives pass, so only dropout noise separates the two — SimCSE's positive).
- A row with fewer than m negatives has the missing ones masked out of the denominator (not padded with text).

Every sentence is encoded with dropout: h_i = f(x_i), h_i⁺ = f(x_i⁺), h_{i,k}⁻ = f(x_{i,k}⁻). z = BN(h), a
BatchNorm1d without affine parameters in training mode: z = (h − μ)/√(σ² + 1e-5) with the batch mean and the
biased batch variance. Anchors, positives and negatives are three batches, each normalised with its own
statistics; the statistics are over the GLOBAL batch (gathered from all ranks; negatives: only the present ones),
so the loss does not depend on the number of processes. No running statistics are kept (nothing is exported).

One forward for the three: collate stacks anchors, positives and negatives into one batch (common.joined, padded to
the longest row of all and laid out padding-free on the host), the encoder runs once, and the pooled vectors are
split back into the three groups before anything mixes rows, so each BatchNorm above still sees its own group only.
A row's vector is the one a forward of its own group gives (attention sees its own tokens; with dropout on, every
row draws its own mask, as it would in a separate pass): the loss is unchanged (tests/test_one_forward.py: loss and
gradients equal the three-pass form to 1e-6 in float64).

With cos and τ = cfg.temperature, over a global batch of B rows:

    L(z_i, h_i⁺) = −log  e^{cos(z_i, h_i⁺)/τ} / ( e^{cos(z_i, h_i⁺)/τ} + Σ_k e^{cos(z_i, z_{i,k}⁻)/τ}
                                                   + Σ_{j≠i} e^{cos(z_i, h_j⁺)/τ} )
    L(z_i⁺, h_i) = the same with the two sides swapped: anchor z_i⁺, positive h_i, in-batch h_j, negatives z_{i,k}⁻
    ℓ_i = L(z_i, h_i⁺) + L(z_i⁺, h_i)           L = (1/B) Σ_i ℓ_i

Two choices the paper leaves open, made here (METHODS §7):
- The positive is KEPT in the denominator. Eq. 8 as printed leaves it out; every InfoNCE (and the reported
  training) keeps it, and leaving it out makes the loss unbounded below.
- The in-batch other rows j ≠ i use the OTHER side's representation (h_j⁺ for the first term, h_j for the
  second), i.e. the same kind of vector as the positive, as in SimCSE's in-batch logits.

collate(rows) -> {"enc.*": anchors, positives and the flat negatives stacked (tokenizer tensors), "groups": (B, B, n)
                  (n = 0 when the batch has no negative), "neg_index": LongTensor[B, m] (row into the flat negatives,
                  −1 = missing)}
forward(batch) -> (loss, {"acc": top-1 accuracy of the first term on this rank, a 0-dim tensor})
"""
from __future__ import annotations

import torch

from pydantic import Field

from contramine.pipeline.config import Section
from contramine.trainer import dist
from contramine.trainer.objectives.base import Objective
from contramine.trainer.objectives.common import cos_matrix, info_nce_terms, joined

BN_EPS = 1e-5


def batch_norm(x: torch.Tensor, eps: float = BN_EPS) -> torch.Tensor:
    """BatchNorm1d(affine=False) in training mode: batch mean, biased batch variance (at least float32)."""
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    mu = x.mean(0, keepdim=True)
    var = x.var(0, unbiased=False, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps)


class DebCSE(Objective):
    name = "debcse"
    tables = ("pairs",)
    loss, export_format = "DebCSELoss", "debcse"

    class Settings(Section):
        negatives: int = Field(2, ge=0, description="m mined negatives per anchor (the pairs' first m)")

    def collate(self, rows: list[dict]) -> dict:
        m = int(self.settings.negatives)
        tok = lambda texts: self.encoder.tokenize(texts, max_length=self.cfg.max_length)  # noqa: E731
        anchors = [r["text"] for r in rows]
        positives = [(r.get("positives") or [None])[0] or r["text"] for r in rows]
        neg_texts: list[str] = []
        neg_index = torch.full((len(rows), m), -1, dtype=torch.long)
        for i, r in enumerate(rows):
            for k, t in enumerate([t for t in (r.get("negatives") or []) if t][:m]):
                neg_index[i, k] = len(neg_texts)
                neg_texts.append(t)
        groups = [tok(anchors), tok(positives), tok(neg_texts) if neg_texts else None]
        return {**joined(self.encoder, groups), "neg_index": neg_index}

    def forward(self, batch: dict):
        h, hp, hn = self.encode_groups(batch)  # one forward; BatchNorm per group in debcse_loss
        return debcse_loss(h, hp, hn, batch["neg_index"], self.cfg.temperature)


def debcse_loss(h: torch.Tensor, hp: torch.Tensor, hn: torch.Tensor, neg_index: torch.Tensor, tau: float):
    """Eq. 8 (the module docstring) on encoded vectors: h anchors [B, d], hp positives [B, d], hn the flat negatives
    [n, d] and neg_index [B, m] (row into hn, −1 = missing). The lean objective and the sentence-transformers loss
    (trainer/st_losses/debcse.py) both call this: one implementation. Returns (loss, {"acc"}), the accuracy a
    detached 0-dim tensor (no host read)."""
    (H, HP, HN), (sizes, _, nsizes) = dist.gather_many([h, hp, hn])  # one collective (trainer/dist.py)
    sl = dist.local_slice(sizes)
    z, zp = batch_norm(H)[sl], batch_norm(HP)[sl]
    targets = torch.arange(sl.start, sl.stop, device=h.device)

    neg_index = neg_index.to(h.device)
    extra1 = extra2 = keep = None
    if len(hn) and neg_index.shape[1] > 0:
        # BatchNorm statistics over every rank's negatives; this rank's anchors see only their own negatives
        zn = batch_norm(HN)[dist.local_slice(nsizes)]
        keep = neg_index >= 0
        idx = neg_index.clamp(min=0)
        extra1 = cos_matrix(z, zn).gather(1, idx) / tau
        extra2 = cos_matrix(zp, zn).gather(1, idx) / tau
    l1 = info_nce_terms(z, HP, targets, tau, extra_logits=extra1, extra_keep=keep)
    l2 = info_nce_terms(zp, H, targets, tau, extra_logits=extra2, extra_keep=keep)
    loss = dist.global_mean(l1 + l2)
    with torch.no_grad():
        acc = (cos_matrix(z, HP).argmax(1) == targets).float().mean()
    return loss, {"acc": acc}
