"""metrics.jsonl, the training log (one JSON record per line: loss, lr, grad norm, dev scores; `step` in each): started
afresh, or trimmed back to the resumed step, and appended to without ever following a symlink planted in its place
(a shared run folder is data: the log's target outside the run is neither read nor written).

A training row is written at step 1, every train.log_every steps, at every evaluation (checkpoint) step and at the
last step. Its loss, grad_norm and the objective's numbers (acc, l_c, ...) are the MEAN over the steps since the
previous row, `steps_in_mean` of them (1 for step 1 and with log_every = 1); `lr` is the learning rate after the
row's step. The steps' numbers stay on the device until the row is written (`MetricWindow`): one host read per
row, none per step. Every checkpoint step ends a window, so a resumed run writes the rows an uninterrupted one does.

The same records go to TensorBoard event files beside it (`make tensorboard RUN=<run>`), written by the one
`MetricsLog.record` call that writes the line, so the curves are the log by construction: train/loss, train/lr,
train/grad_norm, train/<objective metric>, dev/<set> (Spearman × 100) and dev/score, at the record's step (TensorBoard
keeps scalars as float32). On open, the event files are written afresh from the (trimmed) log: a resumed run's curves
hold every step it kept once, never the steps a killed run logged past its checkpoint. Without the tensorboard
package, or when a write fails, training goes on with metrics.jsonl alone (one line says so).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch

from contramine.pipeline.storage.atomic import atomic_file
from contramine.pipeline.storage.safe_paths import open_append, open_folder


def _step_of(line: str) -> int | None:
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    return rec.get("step", 0) if isinstance(rec, dict) and isinstance(rec.get("step", 0), int) else None


def trim_jsonl(path: Path, max_step: int) -> None:
    """Drop log lines past `max_step`: steps a killed run logged after its last checkpoint are redone on resume. A
    line that is no log record (the torn last line of a kill) goes too. A symlink in the log's place is dropped,
    unread: the log then restarts here (its target is neither read into the run nor written)."""
    if path.is_symlink():
        path.unlink()
        return
    if not path.is_file():  # absent (or a folder: open_append then refuses it in one line)
        return
    keep = [ln for ln in path.read_text(errors="replace").splitlines()
            if (step := _step_of(ln)) is not None and step <= max_step]
    with atomic_file(path) as tmp:
        tmp.write_text("".join(ln + "\n" for ln in keep))


def restart(path: Path, resumed_step: int | None) -> None:
    """A fresh run removes the log (a symlink there goes, not its target); a resumed one keeps what it logged up to
    its checkpoint's step."""
    if resumed_step is None:
        if path.is_symlink() or path.is_file():
            path.unlink()
    else:
        trim_jsonl(path, resumed_step)


EVENTS_GLOB = "events.out.tfevents.*"
EVENTS = re.compile(r"events\.out\.tfevents\.[^/]+")  # what a SummaryWriter names its files
SKIP = {"step", "epoch", "t", "best", "best_step", "steps_in_mean"}  # positions and bookkeeping, not curves


def scalars(record: dict) -> list[tuple[str, float]]:
    """(tag, value) of every number in a log record: a dev record's scores under dev/, the rest under train/."""
    out = []
    for key, value in record.items():
        if key in SKIP:
            continue
        if key == "dev" and isinstance(value, dict):
            out += [(f"dev/{k}", float(v)) for k, v in value.items() if isinstance(v, (int, float))]
        elif key == "dev_score":
            out.append(("dev/score", float(value))) if isinstance(value, (int, float)) else None
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append((f"train/{key}", float(value)))
    return out


def tensorboard_writer(folder: Path):
    """A SummaryWriter over `folder`, or None (one line on stderr) where tensorboard is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        print(f"[train] no TensorBoard curves ({e}); metrics.jsonl has every number", file=sys.stderr)
        return None
    return SummaryWriter(log_dir=str(folder), flush_secs=10)


class MetricsLog:
    """metrics.jsonl (line-buffered: a regular file below the run, never through a link) and its TensorBoard
    curves, written together."""

    def __init__(self, run_root: Path, path: Path, curves: bool = True):
        self.file = open_append(run_root, path)
        self.writer, self.folder = None, None
        if curves:
            # the folder as opened from the run without a link: the event files are removed and written in it (the
            # writer is given its /proc/self/fd path), whatever happens to its path meanwhile
            self.folder = open_folder(run_root, path.parent)
            for e in self.folder.entries():
                self.folder.unlink(e.name, EVENTS)  # only event files; a link among them goes, not its target
            self.writer = tensorboard_writer(self.folder.at())
            for line in path.read_text(errors="replace").splitlines():  # what the resumed run kept, once
                if (rec := _record(line)) is not None:
                    self._curves(rec)

    def record(self, rec: dict) -> None:
        self.file.write(json.dumps(rec) + "\n")
        self._curves(rec)

    def _curves(self, rec: dict) -> None:
        if self.writer is None:
            return
        try:
            for tag, value in scalars(rec):
                self.writer.add_scalar(tag, value, rec.get("step", 0))
        except Exception as e:  # a full disk or a broken writer: the curves stop, training does not
            print(f"[train] TensorBoard curves stopped ({type(e).__name__}: {e}); metrics.jsonl goes on",
                  file=sys.stderr)
            self.writer = None

    def close(self) -> None:
        self.file.close()
        if self.writer is not None:
            self.writer.close()
        if self.folder is not None:
            self.folder.close()


def _record(line: str) -> dict | None:
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


class MetricWindow:
    """The numbers of the training steps since the last logged row, summed where they were computed: `add` once per
    step (the tensors are stacked and added to a running sum on their device, three small kernels: no host read),
    `read` once per row (ONE host read for all of them), which returns their means over the window and empties it.
    The sum is float64: a mean of thousands of float32 losses keeps the float32 digits. A step whose grad norm was
    inf (an fp16 overflow the scaler skipped) makes its window's mean grad_norm inf: the row says one happened."""

    def __init__(self):
        self.keys: list[str] = []  # the device numbers, in the order of `sums`
        self.sums: torch.Tensor | None = None
        self.host: dict[str, float] = {}  # plain numbers an objective may return
        self.steps = 0

    def add(self, values: dict) -> None:
        tensors = {k: v for k, v in values.items() if torch.is_tensor(v)}
        if self.sums is not None and list(tensors) != self.keys:
            raise ValueError(f"metrics changed within a logging window: {self.keys} then {list(tensors)}")
        self.keys = list(tensors)
        if tensors:
            step = torch.stack([v.detach().float().reshape(()) for v in tensors.values()]).double()
            self.sums = step if self.sums is None else self.sums + step
        for k, v in values.items():
            if v is not None and k not in tensors:
                self.host[k] = self.host.get(k, 0.0) + float(v)
        self.steps += 1

    def read(self) -> tuple[dict[str, float], int]:
        """({name: mean over the window}, steps in it); the window starts afresh."""
        n = max(self.steps, 1)
        means = dict(zip(self.keys, (self.sums / n).tolist())) if self.sums is not None else {}  # the one read
        means.update({k: v / n for k, v in self.host.items()})
        steps = self.steps
        self.keys, self.sums, self.host, self.steps = [], None, {}, 0
        return means, steps
