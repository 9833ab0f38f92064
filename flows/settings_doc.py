"""`docs/settings.md`, generated from the pydantic config: every section and key, its type, default and description,
and which keys stay out of cache keys (execution settings: how fast, not what; resolved settings: the plan records
what they resolve to). Each objective's own `[train.<name>]` settings come from its `Settings` class.

    python -m contramine.flows.settings_doc > docs/settings.md      # tests/test_docs.py fails when the file is stale
"""
from __future__ import annotations

import json
import sys
import typing

from contramine.pipeline.config import ROOT, SHARED_DATA, Config

OUT = ROOT / "docs" / "settings.md"


def _type(annotation) -> str:
    text = str(annotation) if typing.get_origin(annotation) else getattr(annotation, "__name__", str(annotation))
    return text.replace("typing.", "").replace("pathlib.", "").replace("NoneType", "None")


def _default(field) -> str:
    value = field.get_default(call_default_factory=True)
    if hasattr(value, "model_dump"):
        return "(section)"
    text = json.dumps(value, default=str)
    text = text.replace(str(SHARED_DATA), "<repo>/../shared/data").replace(str(ROOT), "<repo>")
    return f"`{text}`" if len(text) < 60 else f"`{text[:57]}...`"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


# Keys outside the stages' `settings` sections that still enter cache keys, and how.
KEYED_ELSEWHERE = {"run.seed": "yes (every stage)", "run.shards": "yes (the layout)",
                   "data.corpus": "yes (its content hash)", "data.candidates": "yes (its content hash)",
                   **{f"data.{k}": "yes (the corpus' identity)" for k in ("text_field", "hf_split", "hf_config",
                                                                          "hf_revision", "json_line_bytes")}}


def comments(cls) -> dict[str, str]:
    """key -> the source comment on its line or on the lines right above it (settings documented as comments), in
    the class and the classes it builds on (TrainCfg is made from its base, one section per objective)."""
    import inspect

    lines = []
    for c in reversed(cls.__mro__):
        try:
            lines += inspect.getsource(c).splitlines()
        except (OSError, TypeError):
            continue
    out, above = {}, []
    for line in lines:
        text = line.strip()
        if text.startswith("#"):
            above.append(text.lstrip("# "))
            continue
        key = text.split(":", 1)[0].strip()
        if ":" in text and key.isidentifier() and not text.startswith(("def ", "class ", "@", "return")):
            same = text.split("  # ", 1)[1] if "  # " in text else ""
            out[key] = " ".join([*above, same]).strip()
        above = []
    return out


def section_table(name: str, cls, keyed_section: bool) -> list[str]:
    execution: frozenset[str]
    resolved: frozenset[str]
    execution, resolved = getattr(cls, "EXECUTION", frozenset()), getattr(cls, "RESOLVED", frozenset())
    doc = " ".join((cls.__doc__ or "").split()) if cls.__doc__ and "A config section." not in cls.__doc__ else ""
    notes = comments(cls)
    lines = [f"## `[{name}]`", ""] + ([doc, ""] if doc else [])
    lines += ["| key | type | default | in cache keys | description |", "|---|---|---|---|---|"]
    for key, field in cls.model_fields.items():
        if hasattr(field.annotation, "model_fields"):
            continue  # a nested section: its own table
        keyed = "no (execution)" if key in execution else "no (resolved into the plan)" if key in resolved \
            else "yes" if keyed_section else KEYED_ELSEWHERE.get(f"{name}.{key}", "no")
        lines.append(f"| `{field.alias or key}` | {_cell(_type(field.annotation))} | {_default(field)} | {keyed} | "
                     f"{_cell(field.description or notes.get(key, ''))} |")
    return lines + [""]


def render() -> str:
    from contramine.pipeline.engine.discovery import load_stages
    from contramine.trainer.objectives import OBJECTIVES

    keyed = {s for stage in load_stages().values() for s in stage.settings}

    out = ["# Settings reference", "",
           "Generated from the pydantic config by `python -m contramine.flows.settings_doc > docs/settings.md` (a test fails "
           "when this file is stale). Set any key in a profile (`configs/<name>.toml`) or on the command line: "
           "`make mine SET=\"section.key=value\"`. \"in cache keys\": whether changing the key recomputes the "
           "stages that declare its section; execution settings change how fast, never what, and resolved "
           "settings are keyed by what they resolve to (the device kind, the precision, the engine).", ""]
    for name, field in Config.model_fields.items():
        if hasattr(field.annotation, "model_fields"):
            out += section_table(name, field.annotation, name in keyed)
    for name, cls in OBJECTIVES.items():
        out += section_table(f"train.{name}", cls.Settings, False)
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
