"""The sentence-transformers losses, under the one name users import:

    from contramine.losses import DebCSELoss, OssCSELoss, WhitenedCSELoss, DCLRLoss, SimCSELoss

Each takes the SentenceTransformer model first, like sentence-transformers' own losses (docs/training.md shows a
SentenceTransformerTrainer recipe for each).
"""
from __future__ import annotations

from contramine.trainer.st_losses import DCLRLoss, DebCSELoss, OssCSELoss, SimCSELoss, WhitenedCSELoss

__all__ = ["DebCSELoss", "OssCSELoss", "WhitenedCSELoss", "DCLRLoss", "SimCSELoss"]
