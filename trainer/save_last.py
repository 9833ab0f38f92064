"""last/ (and best/) written off the training step: `LastSaver.save(dst, state, meta)` takes a snapshot of the state (every
tensor copied to host memory, so the steps that follow cannot change what is written) and hands it to one background
thread, which writes it with `checkpoint.save_state` (atomic: a kill leaves the old last/ or the new one). One save
at a time: a save waits for the one before it. `join()` waits for the one in flight and raises what it raised; the
trainer joins before it returns or fails, so a finished run's last/ is its last checkpoint's.

    saver = LastSaver()
    saver.save(last_dir, {"objective": model.state_dict(), ...}, meta)   # returns once the snapshot is taken
    ...
    saver.join()

A new best encoder goes the same way: `save(..., best=(best_dir, host_encoder(encoder), meta))` writes best/ first
and then last/, on the one thread (their folders share no file; the order keeps last/'s best score on disk in best/).

What the step still pays: the snapshots (memory copies of the weights and optimiser state; on a GPU the copies to
the host), not the serialisation, the writes and the fsyncs.
"""
from __future__ import annotations

import threading
from pathlib import Path

import torch


def host_snapshot(obj):
    """`obj` (dicts, lists, tuples of tensors and plain values) with every tensor a fresh host copy: detached,
    on the CPU, owning its memory (a CPU tensor is cloned: a state_dict's tensors are the live parameters)."""
    if torch.is_tensor(obj):
        t = obj.detach()
        return t.to("cpu", copy=True) if t.device.type != "cpu" else t.clone()
    if isinstance(obj, dict):
        return type(obj)((k, host_snapshot(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(host_snapshot(v) for v in obj)
    return obj


def host_encoder(encoder):
    """A copy of `encoder` (model, tokenizer, pooling settings) in host memory, for best/ to be written from while
    training changes the original."""
    import copy

    with torch.no_grad():
        return copy.deepcopy(encoder).to("cpu")


class LastSaver:
    """Writes last/ on a background thread, one save at a time (module docstring)."""

    def __init__(self):
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(self, dst: Path | str, state: dict, train_config: dict, best: tuple | None = None) -> None:
        """Snapshot `state` now, write it to `dst` in the background (after the save before it, if any, is done).
        best = (best_dir, encoder, train_config): that encoder (a host copy: `host_encoder`) written to best_dir
        first, by the same thread, so last/ never records a best that best/ does not hold yet."""
        self.join()
        snapshot = host_snapshot(state)
        self._thread = threading.Thread(target=self._write, args=(dst, snapshot, train_config, best),
                                        name="save-last")
        self._thread.start()

    def _write(self, dst, state, train_config, best) -> None:
        from contramine.trainer import checkpoint as ckpt  # looked up at call time: tests wrap ckpt.save_state

        try:
            if best is not None:
                ckpt.save_encoder(*best)
            ckpt.save_state(dst, state, train_config)
        except BaseException as e:  # raised in the training thread by the next save or join
            self._error = e

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join_quietly(self) -> None:
        """join(), dropping what the save raised (the caller is already failing with an error of its own)."""
        try:
            self.join()
        except BaseException:  # noqa: BLE001: the run's own error is the one to report
            pass

    def join(self) -> None:
        """Wait for the save in flight, if any; raise what it raised."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
