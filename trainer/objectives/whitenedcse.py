"""WhitenedCSE (Zhuo et al., "WhitenedCSE: Whitening-based Contrastive Learning of Sentence Embeddings", ACL 2023).

Inputs: rows of the `sentences` table (only `text`). The encoder's pooler gives the sentence vector (published:
[CLS], i.e. pooler `cls_before_pooler`).

Shuffled group whitening, SGW_π(X) for a batch X ∈ R^{B×d}, G = `groups` (G must divide d):
  1. permute the channels with a random permutation π: X̃ = X[:, π];
  2. split X̃ into G groups of c = d/G channels; for each group g: centre X_g − μ_g, covariance
     Σ_g = (1/B) (X_g − μ_g)ᵀ (X_g − μ_g), eigendecomposition Σ_g = U Λ Uᵀ, ZCA matrix
     W_g = U (Λ + ε)^{-1/2} Uᵀ (ε = `eps`), output (X_g − μ_g) W_g;
  3. undo the permutation (each channel goes back to its place).
  The whitening runs in float64 (eigh of a c×c matrix is cheap and its gradient is sensitive to round-off).
Then a projection Linear(d, d) + Tanh: φ(X) = tanh(SGW_π(X) Wᵀ + b). SGW and the projection are training-only
heads: `export_encoder()` returns the bare encoder.

Views: the batch is encoded twice with dropout (H, H'). The anchor view is h_i = φ_{π_0}(H)_i; P =
`positives` further permutations π_1..π_P applied to H' give P positives h_{i,p} = φ_{π_p}(H')_i.
Multi-positive loss, with the in-batch candidates of each positive's own view, λ_m = `loss_weight`:

    ℓ_i = −λ_m Σ_{p=1..P} log( e^{cos(h_i, h_{i,p})/τ} / Σ_j e^{cos(h_i, h_{j,p})/τ} )       L = (1/B) Σ_i ℓ_i

Distributed: the covariance is that of the GLOBAL batch (every rank whitens the gathered batch) and the P+1
permutations are drawn once (torch's global generator on rank 0) and broadcast, so the loss does not depend on
the process count; the loss of this rank's anchors is scaled as in trainer/dist.py.

The two dropout views H, H' come from ONE encoder forward over the batch stacked twice (common.joined in collate;
each row draws its own dropout mask), split after pooling.

collate(rows) -> {"enc.*", "groups": (B, B)}
forward(batch) -> (loss, {"acc": top-1 accuracy for the first positive, a 0-dim tensor})
"""
from __future__ import annotations

import torch

from pydantic import Field

from contramine.pipeline.config import Section
from contramine.trainer import dist
from contramine.trainer.objectives.base import Objective
from contramine.trainer.objectives.common import cos_matrix, info_nce_terms, joined


def group_zca(x: torch.Tensor, groups: int, eps: float) -> torch.Tensor:
    """ZCA-whiten each group of consecutive channels of x (B×d) with the batch covariance (float64 inside)."""
    B, d = x.shape
    c = d // groups
    with torch.autocast(device_type=x.device.type, enabled=False):
        xg = x.double().reshape(B, groups, c).transpose(0, 1)  # G×B×c
        xc = xg - xg.mean(1, keepdim=True)
        cov = xc.transpose(1, 2) @ xc / B  # G×c×c
        evals, U = torch.linalg.eigh(cov)
        W = U @ torch.diag_embed((evals + eps).rsqrt()) @ U.transpose(1, 2)
        return (xc @ W).transpose(0, 1).reshape(B, d).to(x.dtype)


class ShuffledGroupWhitening(torch.nn.Module):
    """SGW_π: permute channels by π, ZCA-whiten each group, put the channels back."""

    def __init__(self, dim: int, groups: int, eps: float):
        super().__init__()
        if groups < 1 or dim % groups:
            raise ValueError(f"train.whitenedcse.groups ({groups}) must divide the embedding size ({dim})")
        self.dim, self.groups, self.eps = dim, groups, eps

    def forward(self, x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
        out = group_zca(x[:, perm], self.groups, self.eps)
        return out[:, torch.argsort(perm)]


class WhitenedCSE(Objective):
    name = "whitenedcse"
    tables = ("sentences",)
    loss, export_format = "WhitenedCSELoss", "sentences"

    class Settings(Section):
        """WhitenedCSE §4: 3 positives; the paper's group setting "384" for BERT, their released code 128 groups."""
        groups: int = Field(128, ge=1, description="G: channel groups whitened separately (must divide d)")
        positives: int = Field(3, ge=1, description="P: SGW passes with other permutations = positives per row")
        eps: float = Field(1e-5, gt=0, description="ε added to the eigenvalues")
        loss_weight: float = Field(1.0, gt=0, description="λ_m")

    def __init__(self, encoder, cfg):
        super().__init__(encoder, cfg)
        d = encoder.dim
        self.sgw = ShuffledGroupWhitening(d, self.settings.groups, self.settings.eps)
        self.proj = torch.nn.Linear(d, d)
        self.act = torch.nn.Tanh()

    def collate(self, rows: list[dict]) -> dict:
        tokens = self.encoder.tokenize([r["text"] for r in rows], max_length=self.cfg.max_length)
        return joined(self.encoder, [tokens, tokens])  # the two dropout views: the batch twice, one forward

    def view(self, H: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
        return self.act(self.proj(self.sgw(H, perm)))

    def forward(self, batch: dict):
        h1, h2 = self.encode_groups(batch)
        return whitenedcse_loss(h1, h2, self.view, self.sgw.dim, self.settings, self.cfg.temperature)

    def export_encoder(self):
        return self.encoder


def permutations(n: int, dim: int, device) -> torch.Tensor:
    """n channel permutations from torch's global generator, the same on every rank (rank 0's)."""
    perms = torch.stack([torch.randperm(dim) for _ in range(n)])
    return dist.broadcast(perms.to(device))


def whitenedcse_loss(h1: torch.Tensor, h2: torch.Tensor, view, dim: int, settings, tau: float):
    """The multi-positive loss of the module docstring on the two dropout views h1, h2 [B, d]; `view(H, perm)` is
    φ_π (SGW, projection, Tanh). Draws P + 1 permutations from torch's global generator. Shared by the lean objective
    and the sentence-transformers loss (trainer/st_losses/whitenedcse.py). Returns (loss, {"acc"}), the accuracy a
    detached 0-dim tensor (no host read; on a GPU the eigendecomposition still checks its result on the host)."""
    (H1, H2), (sizes, _) = dist.gather_many([h1, h2])
    sl = dist.local_slice(sizes)
    targets = torch.arange(sl.start, sl.stop, device=h1.device)
    P = int(settings.positives)
    perms = permutations(P + 1, dim, h1.device)
    anchors = view(H1, perms[0])[sl]
    per = anchors.new_zeros(len(anchors))
    first = None
    for p in range(1, P + 1):
        cand = view(H2, perms[p])
        per = per + info_nce_terms(anchors, cand, targets, tau)
        first = cand if first is None else first
    loss = settings.loss_weight * dist.global_mean(per)
    with torch.no_grad():
        acc = (cos_matrix(anchors, first).argmax(1) == targets).float().mean()
    return loss, {"acc": acc}
