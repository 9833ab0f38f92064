"""argparse types of the commands' numeric options: a value out of range is argparse's one line (`argument
--max-rows: a whole number >= 1, not '-1'`, exit 2), not a traceback from deep inside (DuckDB's show(), a
tokenizer's max_length) and not a silent surprise (`cache --older-than -1` removed every pack)."""
from __future__ import annotations

import argparse
import math
from typing import Callable

from contramine.pipeline.errors import printable


class ArgumentParser(argparse.ArgumentParser):
    """argparse's, without abbreviations (`--for debcse` was taken as `--force debcse`), its error line written
    with control characters escaped (an unrecognised argument that holds terminal escapes reached the terminal)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message: str):  # type: ignore[override]
        super().error(printable(message))


def whole_number(minimum: int) -> Callable[[str], int]:
    """A type for an int option that must be >= `minimum`."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = minimum - 1
        if n < minimum:
            raise argparse.ArgumentTypeError(f"a whole number >= {minimum}, not {text!r}")
        return n

    parse.__name__ = f"whole number >= {minimum}"  # what argparse names in its own messages
    return parse


def days(text: str) -> float:
    """A finite number of days >= 0."""
    try:
        n = float(text)
    except ValueError:
        n = math.nan
    if not (math.isfinite(n) and n >= 0):
        raise argparse.ArgumentTypeError(f"a number of days >= 0, not {text!r}")
    return n
