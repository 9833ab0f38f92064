"""DebCSE (Miao et al., CIKM 2023, §4.3, Eq. 8) for SentenceTransformerTrainer.

    L(z_i, h_i⁺) = −log  e^{cos(z_i,h_i⁺)/τ} / ( e^{cos(z_i,h_i⁺)/τ} + Σ_k e^{cos(z_i,z_{i,k}⁻)/τ}
                                                 + Σ_{j≠i} e^{cos(z_i,h_j⁺)/τ} )
    ℓ_i = L(z_i, h_i⁺) + L(z_i⁺, h_i)        L = (1/B) Σ_i ℓ_i        z = BatchNorm(h) (no affine, batch statistics)

The computation is trainer/objectives/debcse.py's debcse_loss, the lean objective's (its docstring has the whole
formula and our two documented choices: the positive kept in the denominator, in-batch rows from the other side).

Inputs: make export FORMAT=debcse — (anchor, positive, negative_1, …, negative_m): one row per anchor, its first
IPW-drawn positive (the anchor itself where none was mined: a dropout view, as the lean trainer does) and its first
m negatives; labels: none. Anchors with fewer than m negatives are left out of that export (the lean trainer masks
the missing ones instead), so every row here has all m. Train with batch_sampler=BatchSamplers.NO_DUPLICATES: an
anchor's own text must not be another row's in-batch negative.

Settings: negatives (m, default the paper's 2; must match the export's m).
"""
from __future__ import annotations

import torch
from torch import nn

from contramine.pipeline.citations import CITATIONS
from contramine.trainer.objectives.debcse import DebCSE, debcse_loss
from contramine.trainer.st_losses.common import check_columns, embed, settings


class DebCSELoss(nn.Module):
    citation = CITATIONS["debcse"]  # its paper's BibTeX: SentenceTransformerTrainer writes it into the model card

    def __init__(self, model, temperature: float = 0.05, negatives: int = 2):
        super().__init__()
        self.model, self.temperature = model, temperature
        self.settings = settings(DebCSE, negatives=negatives)

    def forward(self, sentence_features, labels=None):
        features = list(sentence_features)
        m = int(self.settings.negatives)
        check_columns("DebCSELoss", features, 2 + m, "debcse")
        # three batches, as the lean trainer encodes them: anchors, positives, the m negatives stacked column-major
        h, hp = embed(self.model, features[0]), embed(self.model, features[1])
        hn = torch.cat([embed(self.model, f) for f in features[2:]]) if m else h.new_zeros((0, h.shape[1]))
        B = len(h)
        neg_index = torch.arange(m, device=h.device)[None, :] * B + torch.arange(B, device=h.device)[:, None]
        loss, self.last_metrics = debcse_loss(h, hp, hn, neg_index, self.temperature)
        return loss

    def get_config_dict(self):
        return {"temperature": self.temperature, **self.settings.model_dump()}
