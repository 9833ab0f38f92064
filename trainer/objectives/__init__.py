"""Training objectives (METHODS §7), one per file, all on the contract in `base.py`; what several share is in
`common.py`. Each declares its own settings ([train.<name>] in a profile) as a nested `Settings` class.

    cls = get_objective("debcse"); obj = cls(encoder, cfg.train)
    reader tables: obj.tables; DataLoader(collate_fn=obj.collate); loss, metrics = obj(batch)

Adding an objective: a file here, <name>.py, with its class (formula docstring, `name`, `tables`, Settings, collate,
forward, and where it has one its sentence-transformers `loss` and the `export_format` that loss reads), plus its
name in pipeline/config/training.py's OBJECTIVE_NAMES: the one registration line. OBJECTIVES, the config's
[train.<name>] section and contramine.trainer.st_losses.LOSSES are derived from it.
Keep its math in a module-level function of the encoded vectors (simcse_loss, debcse_loss, ...) that forward calls:
its sentence-transformers loss (trainer/st_losses/) calls the same function.
Encode in ONE forward: collate returns common.joined(encoder, [group, ...]) (every group the step encodes, stacked)
and forward splits the vectors with self.encode_groups(batch); return metrics as detached tensors (no .item()).
"""
from __future__ import annotations

import importlib

from contramine.pipeline.config.training import OBJECTIVE_NAMES
from contramine.trainer.objectives.base import Objective, settings_of
from contramine.trainer.objectives.dclr import DCLR
from contramine.trainer.objectives.debcse import DebCSE
from contramine.trainer.objectives.osscse import OssCSE
from contramine.trainer.objectives.simcse import SimCSE
from contramine.trainer.objectives.whitenedcse import WhitenedCSE


def _declared(name: str) -> type[Objective]:
    """The Objective class that trainer/objectives/<name>.py declares under `name` (a file may import another's
    class, as DCLR builds on SimCSE: the one whose `name` is the file's is taken)."""
    module = importlib.import_module(f"{__name__}.{name}")
    found = [c for c in vars(module).values()
             if isinstance(c, type) and issubclass(c, Objective) and c.__dict__.get("name") == name]
    if len(found) != 1:
        raise TypeError(f"trainer/objectives/{name}.py declares {len(found)} Objective classes named {name!r}, "
                        "expected one (the name registered in OBJECTIVE_NAMES)")
    return found[0]


OBJECTIVES: dict[str, type[Objective]] = {name: _declared(name) for name in OBJECTIVE_NAMES}  # registration order


def check_settings(train_cfg) -> None:
    """Validate every objective's [train.<name>] section: a typo stops the run at start, with one line."""
    for cls in OBJECTIVES.values():
        settings_of(cls, train_cfg)


def get_objective(name: str) -> type[Objective]:
    """The Objective class registered under `name`; a clear error naming the known ones otherwise."""
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown objective {name!r}; one of {', '.join(OBJECTIVES)}") from None


__all__ = ["OBJECTIVES", "Objective", "get_objective", "check_settings", "settings_of", "SimCSE", "DebCSE", "OssCSE", "WhitenedCSE", "DCLR"]
