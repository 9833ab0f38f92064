"""DCLR (Zhou et al., "Debiased Contrastive Learning of Unsupervised Sentence Representations", ACL 2022).

Inputs: rows of `sentences` joined with `embeddings`: `text` and `emb` (the mined, L2-normalised vector of §1,
which stands for DCLR's frozen complementary model — no second model is run). A row whose `emb` is None gets
weight 1 against every other row (it is never removed from a denominator).

SimCSE (two dropout views h, h', the same optional training-only MLP head as `simcse`), plus:

(a) Noise negatives: n = k·B vectors ĥ_1..ĥ_n ~ N(0, I_d) (k = noise_per_row, B the global batch), then
    `noise_steps` steps of normalised gradient ascent of size η = noise_step_size on the non-uniformity loss
        L_u(ĥ) = (1/B) Σ_i −log e^{cos(h_i, h'_i)/τ_u} / Σ_{j=1..n} e^{cos(h_i, ĥ_j)/τ_u}       (τ_u = tau_u)
        ĥ_j ← ĥ_j + η · g_j / ‖g_j‖,   g_j = ∂L_u/∂ĥ_j   (each noise vector's gradient normalised on its own)
    with h, h' detached (the noise moves, the encoder does not). The noise is drawn once from torch's global
    generator on rank 0 and broadcast, so every rank uses the same n = k·B_global vectors.
(b) Instance weighting: the in-batch negative j of anchor i gets weight
        w_ij = 0 if cos(e_i, e_j) ≥ φ (e = the rows' mined `emb`, φ = phi), else 1;   w_ii = 1.

    ℓ_i = −log  e^{cos(h_i,h'_i)/τ} / ( Σ_j w_ij e^{cos(h_i,h'_j)/τ} + Σ_{m=1..n} e^{cos(h_i,ĥ_m)/τ} )
    L = (1/B) Σ_i ℓ_i          (τ = cfg.temperature; noise negatives have weight 1)

collate(rows) -> {"enc.*", "groups": (B, B) (SimCSE's: the two views in one forward), "emb": FloatTensor[B, d_e] (zeros where missing; d_e = 0 when no row has one),
                  "emb_valid": BoolTensor[B]}
forward(batch) -> (loss, {"acc", "removed": fraction of in-batch negatives weighted 0}; 0-dim tensors)
"""
from __future__ import annotations

import numpy as np
import torch

from pydantic import Field

from contramine.trainer import dist
from contramine.trainer.objectives.common import cos_matrix, cos_rows, info_nce_terms
from contramine.trainer.objectives.simcse import SimCSE


class DCLR(SimCSE):
    name = "dclr"
    tables = ("sentences", "embeddings")
    loss, export_format = "DCLRLoss", "dclr"

    class Settings(SimCSE.Settings):
        """DCLR §5 (BERT-base): φ = 0.9, k = 1, 4 steps of 1e-3; SimCSE's MLP head in training."""
        phi: float = Field(0.9, description="φ: an in-batch negative this close under the mined vectors is dropped")
        noise_per_row: int = Field(1, ge=0, description="k: noise negatives per row of the global batch")
        noise_steps: int = Field(4, ge=0, description="gradient-ascent steps on the noise")
        noise_step_size: float = Field(1e-3, gt=0, description="η")
        tau_u: float = Field(0.05, gt=0, description="τ_u of the non-uniformity loss")

    def collate(self, rows: list[dict]) -> dict:
        out = super().collate(rows)
        embs = [r.get("emb") for r in rows]
        dim = next((int(np.asarray(e).shape[-1]) for e in embs if e is not None), 0)
        emb = torch.zeros((len(rows), dim), dtype=torch.float32)
        valid = torch.zeros(len(rows), dtype=torch.bool)
        for i, e in enumerate(embs):
            if e is not None:
                emb[i] = torch.as_tensor(np.asarray(e, dtype=np.float32))
                valid[i] = True
        out["emb"], out["emb_valid"] = emb, valid
        return out

    def forward(self, batch: dict):
        h1, h2 = self.encode_groups(batch, self.head)
        return dclr_loss(h1, h2, batch["emb"], batch["emb_valid"], self.settings, self.cfg.temperature)


def noise_negatives(H: torch.Tensor, HP: torch.Tensor, settings) -> torch.Tensor:
    """k·B noise vectors moved by normalised gradient ascent on the non-uniformity loss (h, h⁺ detached)."""
    n = int(settings.noise_per_row) * len(H)
    noise = dist.broadcast(torch.randn(n, H.shape[1]).to(device=H.device, dtype=H.dtype))
    if n == 0:
        return noise
    H, HP = H.detach(), HP.detach()
    pos = cos_rows(H, HP) / settings.tau_u
    for _ in range(int(settings.noise_steps)):
        with torch.enable_grad():
            x = noise.detach().requires_grad_(True)
            l_u = (torch.logsumexp(cos_matrix(H, x) / settings.tau_u, dim=1) - pos).mean()
            (g,) = torch.autograd.grad(l_u, x)
        noise = noise + settings.noise_step_size * g / g.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    return noise.detach()


def dclr_loss(h1: torch.Tensor, h2: torch.Tensor, emb: torch.Tensor, valid: torch.Tensor, settings, tau: float):
    """ℓ of the module docstring on the two views h1, h2 [B, d] (after the head, if any), the rows' mined vectors
    emb [B, d_e] and which of them exist, valid [B]. Draws the noise from torch's global generator. Shared by the lean
    objective and the sentence-transformers loss (trainer/st_losses/dclr.py). (loss, {"acc", "removed"}), the
    metrics detached 0-dim tensors (no host read)."""
    (H1, H2), (sizes, _) = dist.gather_many([h1, h2])
    sl = dist.local_slice(sizes)
    targets = torch.arange(sl.start, sl.stop, device=h1.device)

    # (b) instance weights from the mined embeddings (no gradient)
    emb = emb.to(h1.device, torch.float32)
    valid = valid.to(h1.device)
    d_e = dist.all_max(emb.shape[1], h1.device)
    if emb.shape[1] < d_e:  # this rank had no embeddings at all
        emb = torch.zeros((len(emb), d_e), device=h1.device)
    E = dist.gather_nograd(emb)
    V = dist.gather_nograd(valid)
    if d_e > 0:
        sim = cos_matrix(emb, E)
        removed = (sim >= settings.phi) & valid[:, None] & V[None, :]
    else:
        removed = torch.zeros((len(h1), len(E)), dtype=torch.bool, device=h1.device)
    removed[torch.arange(len(h1), device=h1.device), targets] = False
    keep = ~removed

    # (a) noise negatives
    noise = noise_negatives(H1, H2, settings)
    extra = cos_matrix(h1, noise) / tau if len(noise) else None

    per = info_nce_terms(h1, H2, targets, tau, keep=keep, extra_logits=extra)
    loss = dist.global_mean(per)
    with torch.no_grad():
        acc = (cos_matrix(h1, H2).argmax(1) == targets).float().mean()
        n_neg = max(1, removed.numel() - len(h1))
        frac = removed.sum() / n_neg
    return loss, {"acc": acc, "removed": frac}
