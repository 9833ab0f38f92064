"""The documents stay true: the settings reference is generated from the config (a stale one fails), and every
relative link in the README and docs/ points at a file that exists."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_settings_reference_is_generated_and_current():
    from contramine.flows.settings_doc import OUT, render

    assert OUT.read_text() == render(), "docs/settings.md is stale: python -m contramine.flows.settings_doc > docs/settings.md"
    text = OUT.read_text()
    assert "| `batch_size` | int | `128` | no (execution) |" in text  # encoder.batch_size: how fast, not what
    assert "## `[train.osscse]`" in text and "## `[neighbours]`" in text


def test_every_relative_link_resolves():
    pages = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"^[a-z]+://|^#|^mailto:", target):
                continue
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken
