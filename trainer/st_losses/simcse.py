"""SimCSE (Gao, Yao & Chen, EMNLP 2021) as the MultipleNegativesRankingLoss it is.

    ℓ_i = −log  e^{cos(h_i, h'_i)/τ} / Σ_j e^{cos(h_i, h'_j)/τ}          L = (1/B) Σ_i ℓ_i

h_i and h'_i are two dropout views of the same sentence: MNRL with scale = 1/τ on (anchor, anchor) pairs. This class
only lets the dataset carry the sentence once (make export FORMAT=sentences: one column, `anchor`); with two columns
it is MNRL unchanged. Both views come from one forward over the batch stacked twice, as in the lean trainer.

Inputs: (anchor) or (anchor, positive); labels: none. Deviation from the lean `simcse`: no training-only MLP head
(the lean trainer's [train.simcse] mlp_train_only = false is this loss); the head only shapes training, and the
published unsup checkpoints drop it at evaluation. Equal to the lean objective with mlp_train_only = false
(tests/test_st_losses.py), and to trainer/objectives/simcse.py's simcse_loss, which the test also checks.
"""
from __future__ import annotations

from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

from contramine.pipeline.citations import CITATIONS
from contramine.trainer.st_losses.common import check_columns, two_views


class SimCSELoss(MultipleNegativesRankingLoss):
    citation = CITATIONS["simcse"]  # its paper's BibTeX: SentenceTransformerTrainer writes it into the model card

    def __init__(self, model, temperature: float = 0.05):
        super().__init__(model, scale=1.0 / temperature)  # MNRL's `temperature` is 1 / scale

    def forward(self, sentence_features, labels=None):
        features = list(sentence_features)
        check_columns("SimCSELoss", features, (1, 2), "sentences")
        if len(features) == 1:  # the sentence twice: two dropout views, one forward
            return self.compute_loss_from_embeddings(list(two_views(self.model, features[0])), labels)
        return super().forward(features, labels)
