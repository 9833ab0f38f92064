"""Training objectives (METHODS §7), one per file, all on the contract in `base.py`.

    cls = get_objective("debcse"); obj = cls(encoder, cfg.train)
    reader tables: obj.tables; DataLoader(collate_fn=obj.collate); loss, metrics = obj(batch)

Names: simcse, debcse, osscse, whitenedcse, dclr.
"""
from __future__ import annotations

from trainer.objectives.base import Objective
from trainer.objectives.dclr import DCLR
from trainer.objectives.debcse import DebCSE
from trainer.objectives.osscse import OssCSE
from trainer.objectives.simcse import SimCSE
from trainer.objectives.whitenedcse import WhitenedCSE

OBJECTIVES: dict[str, type[Objective]] = {
    "simcse": SimCSE,
    "debcse": DebCSE,
    "osscse": OssCSE,
    "whitenedcse": WhitenedCSE,
    "dclr": DCLR,
}


def get_objective(name: str) -> type[Objective]:
    """The Objective class registered under `name`; a clear error naming the known ones otherwise."""
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown objective {name!r}; one of {', '.join(OBJECTIVES)}") from None


__all__ = ["OBJECTIVES", "Objective", "get_objective", "SimCSE", "DebCSE", "OssCSE", "WhitenedCSE", "DCLR"]
