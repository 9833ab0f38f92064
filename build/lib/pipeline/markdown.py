"""Markdown for the pages people read (the mining report, evaluation results, `make compare`): one cell and one
table formatter, so every page writes missing values, numbers and long texts the same way."""
from __future__ import annotations

MISSING = "–"


def cell(value, digits: int = 2, limit: int = 160) -> str:
    """One table cell: None -> "–", floats rounded to `digits`, text on one line without pipes, cut at `limit`."""
    if value is None:
        return MISSING
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    s = " ".join(str(value).split()).replace("|", "\\|")
    return s if len(s) <= limit else s[: limit - 1] + "…"


def table(header: list[str], rows: list[list], digits: int = 3, align: str = "") -> list[str]:
    """A Markdown table as lines (and an empty line after it). `align`: one of "l"/"r" per column (default left)."""
    marks = [("---:" if a == "r" else "---") for a in (align or "l" * len(header))]
    return ["| " + " | ".join(header) + " |", "|" + "|".join(marks) + "|",
            *("| " + " | ".join(cell(v, digits) for v in r) + " |" for r in rows), ""]
