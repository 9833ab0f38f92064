"""Count the host reads of tensor values (what makes a GPU step wait for the device) on any machine.

    with HostReads() as reads:
        ...
    reads.count, reads.where          # how many, and (kind, caller file:line) of each

A CPU has no device to wait for, so torch.cuda.set_sync_debug_mode cannot be used here; instead the Python-level
ways of reading a tensor's value are wrapped: .item(), .tolist(), .numpy(), .cpu(), bool()/int()/float()/index() of a
tensor, nonzero (its output size depends on the values), torch.equal, and indexing with a boolean mask. Reads made
inside torch's C++ (a CUDA eigh checking its info) are not seen.
"""
from __future__ import annotations

import sys
import traceback

import torch

_METHODS = ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__", "nonzero")


class HostReads:
    def __init__(self):
        self.where: list[tuple[str, str]] = []
        self._saved: list[tuple[object, str, object]] = []

    @property
    def count(self) -> int:
        return len(self.where)

    def _note(self, kind: str) -> None:
        frame = traceback.extract_stack(sys._getframe(2), limit=1)[0]
        self.where.append((kind, f"{frame.filename}:{frame.lineno}"))

    def _wrap(self, owner, name: str, when=None) -> None:
        original = getattr(owner, name)
        own = name in vars(owner)  # else inherited (torch.Tensor's C base): removed again on exit, not set
        reads = self

        def wrapped(*args, **kwargs):
            if when is None or when(*args, **kwargs):
                reads._note(name)
            return original(*args, **kwargs)

        self._saved.append((owner, name, original if own else None))
        setattr(owner, name, wrapped)

    def __enter__(self) -> "HostReads":
        for name in _METHODS:
            self._wrap(torch.Tensor, name)
        self._wrap(torch, "nonzero")
        self._wrap(torch, "equal")
        self._wrap(torch.Tensor, "__getitem__",
                   when=lambda _self, index, *a, **k: torch.is_tensor(index) and index.dtype == torch.bool)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, original in reversed(self._saved):
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._saved.clear()
