"""Names that become folders: a run (`run.name`, `--reuse-from`, `compare.mined_runs`), a compare variant, an export
format. Each must be one path component inside its root, so that no name, typed or read from a profile, puts a
file outside it (`..` was a valid run name once, and wrote tables into the repository root)."""
from __future__ import annotations

import os
import re
from pathlib import Path

from contramine.pipeline.config.base import ConfigError

NAME_MAX = 128
RULE = "letters, digits, '_', '-', '.', not starting with '.'"
# No leading '.': '.' and '..' are not folders of their own, and '.name' is how the pipeline names its temporary
# folders (.<table>.new, .<table>.old). fullmatch, not '$': '$' would let a trailing newline through.
_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]*")


def name_problem(setting: str, value, what: str, where: str) -> str | None:
    """The one-line refusal of `value` as `setting` (a `what`, one folder inside `where`), or None when it is one."""
    if isinstance(value, str) and _NAME.fullmatch(value) and len(value) <= NAME_MAX:
        return None
    rule = f"at most {NAME_MAX} characters" if isinstance(value, str) and len(value) > NAME_MAX else RULE
    return f"{setting} {value!r}: {what} is one folder inside {where}: {rule}"


def check_name(setting: str, value, what: str, where: str) -> str:
    if problem := name_problem(setting, value, what, where):
        raise ConfigError(problem)
    return value


def inside(root: Path | str, *parts: str, setting: str) -> Path:
    """`root / parts`, refused (naming `setting`) unless it stays inside `root`: the check behind every name check,
    for a path built from a name no validator saw (a model_copy skips validation). Compared after normalising `..`
    without following symbolic links: a run folder linked to another disk is the user's choice, not an escape."""
    path = Path(root).joinpath(*parts)
    base, full = os.path.abspath(root), os.path.abspath(path)
    if full == base or os.path.commonpath([base, full]) != base:
        raise ConfigError(f"{setting} {os.path.join(*parts)!r}: {full} is not inside {base}/")
    return path
