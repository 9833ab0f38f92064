"""Lazy package attributes (PEP 562): a package's `__init__` names what it offers and where each name lives, and a
name's module is imported the first time the name is read, so importing the package imports none of them.

    _HOME = {"Store": "contramine.pipeline.storage.store", ...}
    __all__ = sorted(_HOME)
    __getattr__ = lazy_attributes(__name__, _HOME)
"""
from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_attributes(package: str, home: dict[str, str]) -> Callable[[str], object]:
    """The module-level `__getattr__` of `package`: a name of `home` from its module, anything else AttributeError."""

    def __getattr__(name: str):
        if name in home:
            return getattr(importlib.import_module(home[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
