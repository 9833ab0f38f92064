"""The papers' objectives as sentence-transformers losses, for SentenceTransformerTrainer on what `make export` writes.

    from contramine.trainer.st_losses import DebCSELoss
    loss = DebCSELoss(model)              # model: a SentenceTransformer; columns: make export FORMAT=debcse

One file per objective, in the style of sentence_transformers/.../losses: an nn.Module(model, ...) whose
forward(sentence_features, labels) returns the scalar loss. Each encodes the columns with the SentenceTransformer and
hands the vectors to the SAME function the lean trainer's objective calls (trainer/objectives/<name>.py: simcse_loss,
debcse_loss, osscse_loss, whitenedcse_loss, dclr_loss): the math is written once. The settings are the lean
objective's own `Settings` (same defaults, same validation). tests/test_st_losses.py checks each against the lean
objective on one batch and a short SentenceTransformerTrainer run against lean steps.

| loss | export FORMAT | columns (in order) | labels |
|---|---|---|---|
| SimCSELoss | sentences | anchor | - |
| DebCSELoss | debcse | anchor, positive, negative_1 … negative_m | - |
| OssCSELoss(form="paper") | osscse-prompt | anchor, anchor_t2, paraphrase, negation (templated) | - |
| OssCSELoss(form="start-pooler") | osscse-triplet | anchor, paraphrase, negation | - |
| WhitenedCSELoss | sentences | anchor | - |
| DCLRLoss | dclr | anchor | label: the mined vector |
"""
from contramine.trainer.st_losses.dclr import DCLRLoss
from contramine.trainer.st_losses.debcse import DebCSELoss
from contramine.trainer.st_losses.osscse import OssCSELoss
from contramine.trainer.st_losses.simcse import SimCSELoss
from contramine.trainer.st_losses.whitenedcse import WhitenedCSELoss

import importlib as _importlib

from contramine.trainer.objectives import OBJECTIVES as _OBJECTIVES

# objective name -> its loss, as each objective declares it (`loss`: the class in trainer/st_losses/<name>.py)
LOSSES = {name: getattr(_importlib.import_module(f"{__name__}.{name}"), cls.loss)
          for name, cls in _OBJECTIVES.items() if cls.loss}

__all__ = ["LOSSES", "SimCSELoss", "DebCSELoss", "OssCSELoss", "WhitenedCSELoss", "DCLRLoss"]
