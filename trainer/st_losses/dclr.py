"""DCLR (Zhou et al., ACL 2022) for SentenceTransformerTrainer.

    ℓ_i = −log  e^{cos(h_i,h'_i)/τ} / ( Σ_j w_ij e^{cos(h_i,h'_j)/τ} + Σ_{m=1..k·B} e^{cos(h_i,ĥ_m)/τ} )
    w_ij = 0 if cos(e_i, e_j) ≥ φ else 1 (w_ii = 1)          L = (1/B) Σ_i ℓ_i

h, h' two dropout views (through SimCSE's training-only MLP head with mlp_train_only, the default; the head is this
loss's and is not saved with the model); ĥ noise vectors from N(0, I) moved by a few normalised gradient-ascent steps
on the non-uniformity loss; e the rows' vectors under a frozen complementary model. The computation is
trainer/objectives/dclr.py's dclr_loss (noise drawn from torch's global generator).

Inputs: make export FORMAT=dclr — (anchor) plus a `label` column: the row's mined embedding (the `embeddings` table:
the mining encoder stands for DCLR's frozen model, as in the lean trainer; no second model runs). A zero vector
marks a row without one (weight 1 against every row). Without a label column, pass frozen_model= (a
SentenceTransformer kept in eval mode, no gradient): it embeds the anchors each step instead.
Settings: phi (φ = 0.9), noise_per_row (k = 1), noise_steps (4), noise_step_size (1e-3), tau_u, mlp_train_only.
"""
from __future__ import annotations

import torch
from torch import nn

from contramine.pipeline.citations import CITATIONS
from contramine.trainer.objectives.common import MLPHead
from contramine.trainer.objectives.dclr import DCLR, dclr_loss
from contramine.trainer.st_losses.common import check_columns, settings, two_views


class DCLRLoss(nn.Module):
    citation = CITATIONS["dclr"]  # its paper's BibTeX: SentenceTransformerTrainer writes it into the model card

    def __init__(self, model, temperature: float = 0.05, frozen_model=None, **dclr_settings):
        super().__init__()
        self.model, self.temperature = model, temperature
        self.settings = settings(DCLR, **dclr_settings)
        self.mlp = MLPHead(model.get_embedding_dimension()) if self.settings.mlp_train_only else None
        self._frozen = [frozen_model] if frozen_model is not None else []  # a list: not a submodule, never trained

    def mined_vectors(self, labels, features: dict) -> torch.Tensor:
        if labels is not None:
            return labels
        if not self._frozen:
            raise ValueError("DCLRLoss needs each row's mined vector as its `label` (make export FORMAT=dclr) or a "
                             "frozen_model")
        with torch.no_grad():
            return self._frozen[0].eval()(features)["sentence_embedding"]

    def forward(self, sentence_features, labels=None):
        features = list(sentence_features)
        check_columns("DCLRLoss", features, 1, "dclr")
        h1, h2 = two_views(self.model, features[0])
        if self.mlp is not None:
            h1, h2 = self.mlp(torch.cat([h1, h2])).chunk(2)
        emb = self.mined_vectors(labels, features[0]).float()
        valid = emb.norm(dim=-1) > 0
        loss, self.last_metrics = dclr_loss(h1, h2, emb, valid, self.settings, self.temperature)
        return loss

    def get_config_dict(self):
        return {"temperature": self.temperature, **self.settings.model_dump()}
