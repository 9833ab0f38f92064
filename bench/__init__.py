"""The benches (not installed): peers/ (`make bench`, bench/run.py), gpu/ (`make gpu-check`), host/ (the host bench),
fixtures/ (models built in seconds), scale.py (`make scale`), mine_memory.py."""
from __future__ import annotations

import importlib


def lazy_attributes(package: str, home: dict[str, str]):
    """A package's PEP 562 `__getattr__`: a name of `home` from its module, imported on first use. The benches keep
    their own (contramine.pipeline.lazy's twin): the host bench's worker runs these packages against older
    checkouts, whose `contramine.pipeline` may not have that module."""

    def __getattr__(name: str):
        if name in home:
            return getattr(importlib.import_module(home[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
