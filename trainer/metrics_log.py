"""metrics.jsonl, the training log (one JSON record per line: loss, lr, grad norm, dev scores; `step` in each): started
afresh, or trimmed back to the resumed step, and appended to without ever following a symlink planted in its place
(a shared run folder is data: the log's target outside the run is neither read nor written)."""
from __future__ import annotations

import json
from pathlib import Path

from pipeline.engine.atomic import atomic_file
from pipeline.engine.safe_paths import open_append


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


def open_for_append(run_root: Path, path: Path):
    """The log opened for appending, line-buffered: a regular file below the run, never through a link."""
    return open_append(run_root, path)
