"""Markdown for the pages people read (the mining report, evaluation results, `make compare`): one cell and one
table formatter, so every page writes missing values, numbers and long texts the same way.

Text is data: a corpus line that holds `<script>`, `**`, `[a](b)`, `|` or a line break must read on the page as
the characters it is, never become HTML, emphasis, a link, a table column or a new line. `cell` writes every text
that way (CommonMark backslash escapes; an underscore inside a word, `too_short`, is no emphasis and stays as is).
A bare URL or address is no link either (GFM autolinks `http://`, `www.` and `a@b`: the `:`, `.` or `@` that makes
one is escaped), and a bidirectional control character, which would reorder the text shown around it, is written
as its code point, `(U+202E)`.
"""
from __future__ import annotations

import re

MISSING = "–"
# what could start HTML, an entity, emphasis, code, a link or image, strikethrough, math or a table column mid-line;
# `_` only where it is no part of a word (CommonMark: an intraword underscore never opens or closes emphasis)
_SPECIAL = re.compile(r"[\\`*\[\]<>&|~$]|(?<![^\W_])_|_(?![^\W_])")
_AUTOLINK = re.compile(r"(?i)\b(https?:|ftp:|www\.)|@")  # what starts a GFM autolink (extended autolinks)
_BIDI = re.compile("[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")


def escape(text: str) -> str:
    """`text` on one line (every run of whitespace, line breaks included, one space) with Markdown and HTML special
    characters backslash-escaped: it renders as the characters it holds."""
    text = _SPECIAL.sub(lambda m: "\\" + m.group(0), " ".join(str(text).split()))
    text = _AUTOLINK.sub(lambda m: "\\@" if m.group(0) == "@" else m.group(0)[:-1] + "\\" + m.group(0)[-1], text)
    return _BIDI.sub(lambda m: f"(U+{ord(m.group(0)):04X})", text)


def cell(value, digits: int = 2, limit: int = 160) -> str:
    """One table cell: None -> "–", floats rounded to `digits`, text on one line, escaped, cut at `limit` characters
    (cut before escaping, so no escape is split)."""
    if value is None:
        return MISSING
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    s = " ".join(str(value).split())
    return escape(s if len(s) <= limit else s[: limit - 1] + "…")


def table(header: list[str], rows: list[list], digits: int = 3, align: str = "") -> list[str]:
    """A Markdown table as lines (and an empty line after it). `align`: one of "l"/"r" per column (default left)."""
    marks = [("---:" if a == "r" else "---") for a in (align or "l" * len(header))]
    return ["| " + " | ".join(header) + " |", "|" + "|".join(marks) + "|",
            *("| " + " | ".join(cell(v, digits) for v in r) + " |" for r in rows), ""]
