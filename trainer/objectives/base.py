"""The contract between the training loop and an objective.

The loop reads rows (dicts) from mined Parquet tables, hands lists of rows to `collate` (called in DataLoader
workers, so tokenisation stays off the hot path), moves the returned tensors to the device and calls `forward`.

One encoder forward per step: an objective that encodes several groups of sentences (two dropout views; anchors,
positives, negatives; two prompt templates, paraphrases, negations) has collate stack them into one batch
(common.joined, which also makes the padding-free layout on the host) and forward split the pooled vectors back
(`encode_groups`). Statistics an objective defines per group (DebCSE's BatchNorm) are computed on the split groups.

What forward returns stays on the device: the loss and the metrics are tensors; the loop reads them back every
train.log_every steps (trainer/train.py), so a step never waits for the device to answer.

Row keys the reader provides (None where the table has no value for that sentence):
    sid: int, text: str,
    positives: list[str] | None, negatives: list[str] | None          (from `pairs`)
    paraphrase: str | None, negation: str | None                       (from `triplets`)
    emb: np.ndarray[float32, d] | None                                 (from `embeddings`, L2-normalised)
"""
from __future__ import annotations

import abc
from pathlib import Path

import torch
from pydantic import ValidationError

from contramine.pipeline.config import ConfigError, Section
from contramine.pipeline.export import format_tables
from contramine.pipeline.models.encode.encoder import Encoder
from contramine.trainer.objectives.common import sub_batch


def settings_of(cls: type["Objective"], train_cfg):
    """The objective's own settings, [train.<name>], validated by its `Settings` (a one-line ConfigError naming the
    key otherwise)."""
    try:
        return cls.Settings.model_validate(getattr(train_cfg, cls.name, None) or {})
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(["train", cls.name, *(str(p) for p in err["loc"])])
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        raise ConfigError(f"config error: {key}: {msg}") from None


class Objective(torch.nn.Module, abc.ABC):
    name: str = "base"

    class Settings(Section):
        """The objective's own settings ([train.<name>]); each objective declares its own."""
    # Tables this objective reads, in the order the reader joins them: the first is the row source.
    tables: tuple[str, ...] = ("sentences",)
    # The pooler this objective needs whatever the profile says (OssCSE: "mask"); None = the configured one.
    pooler: str | None = None
    # Its sentence-transformers loss: the class name in trainer/st_losses/<name>.py (None: it has none), and the
    # `make export` format that loss reads (pipeline/export.py FORMATS). contramine.trainer.st_losses.LOSSES is built from these.
    loss: str | None = None
    export_format: str | None = None

    @classmethod
    def mined_tables(cls) -> tuple[str, ...]:
        """The mined tables its training (`tables`) and its export format read: what `mine --for <name>` (the
        setting mine.for) mines, with the tables they are computed from (pipeline/engine/discovery.py stages_for)."""
        exported = format_tables(cls.export_format) if cls.export_format else ()
        return tuple(dict.fromkeys((*cls.tables, *exported)))

    @classmethod
    def train_pooler(cls, cfg) -> str | None:
        """The pooler this objective trains (and its checkpoint is evaluated) with, given its settings; None = the
        configured one (train.pooler, else encoder.pooler)."""
        return cls.pooler

    @classmethod
    def eval_prompt(cls, cfg) -> str | None:
        """The prompt template the trained encoder is evaluated and saved with; None = encoder.prompt."""
        return None

    @classmethod
    def data_notes(cls, rows) -> list[str]:
        """Warnings about the mined rows this objective is about to train on (printed once, loudly, at start)."""
        return []

    @classmethod
    def start_notes(cls, train_cfg, start_dir: Path | str) -> list[str]:
        """Warnings about the start model (its folder: `start_dir`) under this objective's settings, printed like
        data_notes."""
        return []

    def __init__(self, encoder: Encoder, cfg):
        super().__init__()
        self.encoder = encoder
        self.cfg = cfg  # contramine.pipeline.config.TrainCfg: the settings every objective shares (temperature, lengths, ...)
        self.settings = settings_of(type(self), cfg)  # this objective's own: [train.<name>]

    @abc.abstractmethod
    def collate(self, rows: list[dict]) -> dict:
        """Tokenise a list of rows into a dict of tensors (and plain values)."""

    @abc.abstractmethod
    def forward(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Return the scalar loss of this rank's rows and a few numbers to log: detached 0-dim tensors on the
        device (no host read in a step)."""

    def encode_groups(self, batch: dict, head=None) -> tuple[torch.Tensor, ...]:
        """The pooled vectors of every group `common.joined` stacked under "enc.", from ONE encoder forward (and one
        pass of the training-only `head`, row by row, where given), split back into the groups in order."""
        h = self.encoder(sub_batch(batch, "enc"))
        return (h if head is None else head(h)).split(list(batch["groups"]))

    def export_encoder(self) -> Encoder:
        """The encoder to evaluate and save (training-only heads left out)."""
        return self.encoder
