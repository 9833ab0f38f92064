"""What a corpus record is (the readers of pipeline/corpus/ yield them): a part (one file of a corpus), a text's raw
bytes, a `LongLine` read through in pieces and never held whole, or a `Refused` record that gives no text, and the
one-line `CorpusError` for a corpus that cannot be read at all.
"""
from __future__ import annotations

import codecs
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from contramine.pipeline.errors import ExpectedError

class CorpusError(ExpectedError, ValueError):
    """The corpus cannot be read at all (missing file, wrong format, an unknown dataset); names the file."""


@dataclass(frozen=True)
class Part:
    """One file of a corpus: `name` is how `rejected.source` shows it (its path below the folder or the glob's base;
    a single file's name), `form` the name its reader registered (text, jsonl, parquet), `codec` gzip | zstd | None."""
    name: str
    path: Path
    form: str
    codec: str | None
    # what the listing saw, checked again on the descriptor opened (streams.open_file): a link swapped in between
    listed: tuple[int, int] | None = field(default=None, compare=False)  # (st_dev, st_ino) of the file listed
    root: str | None = field(default=None, compare=False)  # the corpus root's real path it must lie in (None: anywhere)


@dataclass(frozen=True)
class Refused:
    """A record that gives no text (a JSON line that does not parse, lacks the field or holds no string there)."""
    reason: str
    raw: bytes


class LongLine:
    """A line over the long-line bound, fed piece by piece: its first `keep` characters (`head`), its length in
    characters (undecodable bytes count as the U+FFFD they decode to) and bytes, blake2b of its bytes, and whether
    it decodes as UTF-8. The line itself is never held."""

    def __init__(self, keep: int = 65_536):
        self.hash, self.n_bytes, self.n_chars = hashlib.blake2b(digest_size=16), 0, 0
        self.head, self.undecodable, self.keep = "", False, keep
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")

    def feed(self, piece: bytes, final: bool = False) -> "LongLine":
        self.hash.update(piece)
        self.n_bytes += len(piece)
        state = self._decoder.getstate()
        try:
            text = self._decoder.decode(piece, final)
        except UnicodeDecodeError:  # from here on with replacement characters, as `text` shows undecodable lines
            self.undecodable, self._decoder = True, codecs.getincrementaldecoder("utf-8")("replace")
            self._decoder.setstate(state)
            text = self._decoder.decode(piece, final)
        self.n_chars += len(text)
        if len(self.head) < self.keep:
            self.head += text[:self.keep - len(self.head)]
        return self

    def close(self) -> "LongLine":
        return self.feed(b"", final=True)


Value = bytes | LongLine | Refused


def text_value(value) -> Value:
    """A JSON field's or a dataset's value as a record: a string as UTF-8 (a lone surrogate kept, so the filter
    finds it undecodable), null as an empty record, anything else refused as `not_text`."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if value is None:
        return b""
    return Refused("not_text", json.dumps(value, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass"))
