"""WhitenedCSE (Zhuo et al., ACL 2023) for SentenceTransformerTrainer.

    φ_π(X) = tanh(SGW_π(X) Wᵀ + b)       SGW_π: shuffle channels by π, ZCA-whiten each of G groups, unshuffle
    ℓ_i = −λ_m Σ_{p=1..P} log( e^{cos(h_i, h_{i,p})/τ} / Σ_j e^{cos(h_i, h_{j,p})/τ} )        L = (1/B) Σ_i ℓ_i

h_i = φ_{π_0}(H)_i and h_{i,p} = φ_{π_p}(H')_i, with H, H' two dropout views of the batch and P + 1 permutations
drawn from torch's global generator each step. The computation is trainer/objectives/whitenedcse.py's
whitenedcse_loss (its docstring: the whitening in float64, ε on the eigenvalues).

The SGW module and the projection Linear(d, d) + Tanh are training-only heads owned by this loss (their parameters
are trained: SentenceTransformerTrainer optimises the loss's parameters too) and are not saved with the model, as the
lean trainer exports the bare encoder. Inputs: make export FORMAT=sentences — (anchor); labels: none.
Settings: groups (G, must divide the model's dimension; default 128, the authors' code), positives (P = 3), eps,
loss_weight (λ_m).
"""
from __future__ import annotations

import torch
from torch import nn

from contramine.pipeline.citations import CITATIONS
from contramine.trainer.objectives.whitenedcse import ShuffledGroupWhitening, WhitenedCSE, whitenedcse_loss
from contramine.trainer.st_losses.common import check_columns, settings, two_views


class WhitenedCSELoss(nn.Module):
    citation = CITATIONS["whitenedcse"]  # its paper's BibTeX: SentenceTransformerTrainer writes it into the model card

    def __init__(self, model, temperature: float = 0.05, groups: int = 128, positives: int = 3, eps: float = 1e-5,
                 loss_weight: float = 1.0):
        super().__init__()
        self.model, self.temperature = model, temperature
        self.settings = settings(WhitenedCSE, groups=groups, positives=positives, eps=eps, loss_weight=loss_weight)
        d = model.get_embedding_dimension()
        self.sgw = ShuffledGroupWhitening(d, self.settings.groups, self.settings.eps)
        self.proj = nn.Linear(d, d)  # the lean objective's names: a head's weights load from one into the other
        self.act = nn.Tanh()

    def view(self, H: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
        return self.act(self.proj(self.sgw(H, perm)))

    def forward(self, sentence_features, labels=None):
        features = list(sentence_features)
        check_columns("WhitenedCSELoss", features, 1, "sentences")
        h1, h2 = two_views(self.model, features[0])
        loss, self.last_metrics = whitenedcse_loss(h1, h2, self.view, self.sgw.dim, self.settings, self.temperature)
        return loss

    def get_config_dict(self):
        return {"temperature": self.temperature, **self.settings.model_dump()}
