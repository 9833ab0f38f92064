"""The contract between the training loop and an objective.

The loop reads rows (dicts) from mined Parquet tables, hands lists of rows to `collate` (called in DataLoader
workers, so tokenisation stays off the hot path), moves the returned tensors to the device and calls `forward`.

Row keys the reader provides (None where the table has no value for that sentence):
    sid: int, text: str,
    positives: list[str] | None, negatives: list[str] | None          (from `pairs`)
    paraphrase: str | None, negation: str | None                       (from `triplets`)
    emb: np.ndarray[float32, d] | None                                 (from `embeddings`, L2-normalised)
"""
from __future__ import annotations

import abc

import torch

from pipeline.encoder import Encoder


class Objective(torch.nn.Module, abc.ABC):
    name: str = "base"
    # Tables this objective reads, in the order the reader joins them: the first is the row source.
    tables: tuple[str, ...] = ("sentences",)
    # The pooler this objective needs whatever the profile says (OssCSE: "mask"); None = the configured one.
    pooler: str | None = None

    @classmethod
    def eval_prompt(cls, cfg) -> str | None:
        """The prompt template the trained encoder is evaluated and saved with; None = encoder.prompt."""
        return None

    @classmethod
    def data_notes(cls, rows) -> list[str]:
        """Warnings about the mined rows this objective is about to train on (printed once, loudly, at start)."""
        return []

    def __init__(self, encoder: Encoder, cfg):
        super().__init__()
        self.encoder = encoder
        self.cfg = cfg  # pipeline.config.TrainCfg

    @abc.abstractmethod
    def collate(self, rows: list[dict]) -> dict:
        """Tokenise a list of rows into a dict of tensors (and plain values)."""

    @abc.abstractmethod
    def forward(self, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """Return the scalar loss of this rank's rows and a few floats to log."""

    def export_encoder(self) -> Encoder:
        """The encoder to evaluate and save (training-only heads left out)."""
        return self.encoder
