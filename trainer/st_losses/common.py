"""What the sentence-transformers losses share: encoding columns with the model, and the settings check."""
from __future__ import annotations

import torch
from pydantic import ValidationError

from contramine.pipeline.config import ConfigError


def embed(model, features: dict) -> torch.Tensor:
    """The model's sentence vector of one tokenised column (its own pooler), with grad."""
    return model(features)["sentence_embedding"]


def two_views(model, features: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Two dropout views of one column in ONE forward over the batch stacked twice (as the lean trainer's collate
    stacks them, trainer/objectives/common.py joined): each row draws its own dropout mask."""
    doubled = {k: torch.cat([v, v]) if torch.is_tensor(v) else v for k, v in features.items()}
    return embed(model, doubled).chunk(2)


def settings(objective_cls, **values):
    """The lean objective's own Settings ([train.<name>]): the loss keeps its defaults and refuses what it refuses,
    in one line."""
    try:
        return objective_cls.Settings.model_validate(values)
    except ValidationError as e:
        err = e.errors()[0]
        raise ConfigError(f"{objective_cls.name} loss: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None


def check_columns(loss: str, features: list, n: int | tuple[int, ...], export: str) -> None:
    """Refuse a batch with another number of columns than the loss reads, naming the export that has them."""
    ok = n if isinstance(n, tuple) else (n,)
    if len(features) not in ok:
        raise ValueError(f"{loss} reads {' or '.join(map(str, ok))} text column(s) (make export FORMAT={export}), "
                         f"got {len(features)}")
