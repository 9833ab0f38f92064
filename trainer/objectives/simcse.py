"""Unsupervised SimCSE (Gao, Yao & Chen, "SimCSE: Simple Contrastive Learning of Sentence Embeddings", EMNLP 2021).

Inputs: rows of the `sentences` table (only `text` is read).

Each sentence x_i is encoded twice; the two passes differ only by dropout noise, giving h_i and h'_i.
In-batch InfoNCE with cosine similarity and temperature τ (cfg.temperature), over the global batch of B rows:

    ℓ_i = −log  e^{cos(h_i, h'_i)/τ} / Σ_{j=1..B} e^{cos(h_i, h'_j)/τ}          L = (1/B) Σ_i ℓ_i

With mlp_train_only = True ([train.simcse], the published unsup setting) an MLP head, Linear(d, d) + Tanh, is put over the
pooled vector during training only: h = tanh(W·pool(x) + b). `export_encoder()` returns the bare encoder (the
head is left out), so evaluation uses the encoder's own pooler (published: `cls_before_pooler`). With
mlp_train_only = False no head is added: training and evaluation both use the encoder's pooler as is.

Settings ([train.simcse]): mlp_train_only (True).

Dropout is the encoder's own (the loop builds the model with cfg.dropout); the two views come from one forward
pass in training mode over the batch stacked twice (2B rows, each with its own dropout mask), stacked in collate
(common.joined: in the DataLoader workers, with the padding-free layout) and split after the pooler and the head.

Distributed: anchors are this rank's rows, candidates h'_j are gathered from all ranks with gradient, and the
rank's loss is (W/B)·Σ_{local i} ℓ_i — see trainer/dist.py for why DDP then reproduces the single-process gradient.

collate(rows) -> {"enc.input_ids", "enc.attention_mask", ["enc.token_type_ids"], ["enc.mask_positions"],
                  ["enc.unpad_index", "enc.unpad_positions"]: the B rows twice; "groups": (B, B)}
forward(batch) -> (loss, {"acc": top-1 in-batch accuracy of this rank's anchors, a 0-dim tensor})
"""
from __future__ import annotations

import torch

from contramine.pipeline.config import Section
from contramine.trainer import dist
from contramine.trainer.objectives.base import Objective
from contramine.trainer.objectives.common import MLPHead, cos_matrix, info_nce_terms, joined


# ------------------------------------------------------------------------------------------------- objective
class SimCSE(Objective):
    name = "simcse"
    tables: tuple[str, ...] = ("sentences",)
    loss, export_format = "SimCSELoss", "sentences"

    class Settings(Section):
        mlp_train_only: bool = True  # Linear + Tanh over the pooled vector, in training only

    def __init__(self, encoder, cfg):
        super().__init__(encoder, cfg)
        self.mlp = MLPHead(encoder.dim) if self.settings.mlp_train_only else None

    def collate(self, rows: list[dict]) -> dict:
        tokens = self.encoder.tokenize([r["text"] for r in rows], max_length=self.cfg.max_length)
        return joined(self.encoder, [tokens, tokens])  # the two dropout views: the batch twice, one forward

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.mlp(h) if self.mlp is not None else h

    def forward(self, batch: dict):
        h1, h2 = self.encode_groups(batch, self.head)
        return simcse_loss(h1, h2, self.cfg.temperature)

    def export_encoder(self):
        return self.encoder


def simcse_loss(h1: torch.Tensor, h2: torch.Tensor, tau: float):
    """In-batch InfoNCE of the module docstring on two views h1, h2 [B, d] (after the head, if any); shared by the
    lean objective, DCLR's base and the sentence-transformers loss (trainer/st_losses/simcse.py). (loss, {"acc"}),
    the accuracy a detached 0-dim tensor (no host read)."""
    (g2,), (sizes,) = dist.gather_many([h2])
    sl = dist.local_slice(sizes)
    targets = torch.arange(sl.start, sl.stop, device=h1.device)
    loss = dist.global_mean(info_nce_terms(h1, g2, targets, tau))
    with torch.no_grad():
        acc = (cos_matrix(h1, g2).argmax(1) == targets).float().mean()
    return loss, {"acc": acc}
