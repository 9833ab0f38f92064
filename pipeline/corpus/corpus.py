"""`Corpus`: a corpus as the settings name it (data.corpus or data.candidates), read as one stream of records in a
defined order, for pipeline/corpus/filter.py to filter into `sentences` and `rejected`.

    "c.txt"             one sentence a line (a single file of any name the forms below do not claim)
    "c.parquet"         the string column `data.text_field` (default `text`), one record a row
    "c.jsonl"           JSON Lines (.jsonl, .ndjson, .json): one object a line, its string field `data.text_field`
    "c.jsonl.gz"        any of these compressed: .gz or .zst (pyarrow's decompressing streams, no other library),
                        expanding to at most `data.max_expansion` times the file's size
    "parts/"            a folder: every file of these forms under it, by sorted relative path (parts.py: names
                        starting with `.` or `_` skipped, links leading outside refused, any other file an error)
    "parts/*.jsonl.gz"  a glob (`**` crosses folders): the files it matches, in the same order
    "hf:owner/name"     a Hugging Face dataset, streamed with `datasets` (hub.py)

Each part is read by the reader its form registered (forms.py: the protocol; text.py, jsonl.py, parquet.py, hub.py).
A record is (part, its line in the part from 1, its value): a text line's bytes, a JSON field's or a dataset value's
string as UTF-8, a Parquet value's bytes (a null is an empty record); a value over the long bound is a `LongLine`,
read through in pieces and never held whole; a record that gives no text is `Refused` with the reason.

Identity (the `sentences` key): every part's name, form and content hash, the field where a part has fields; a
dataset's id, config, split, field and resolved commit. An edit to one part changes the key; each row's model work
is still reused by the row memo wherever its text did not change.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

from contramine.pipeline.corpus.forms import Reader, reader_of, scheme_of
from contramine.pipeline.corpus.parts import find_parts
from contramine.pipeline.corpus.records import Part, Value

MAX_EXPANSION = 1000.0  # data.max_expansion's default
JSON_LINE_BYTES = 4 << 20  # data.json_line_bytes' default: a JSON line is parsed whole up to this many bytes
PAGE_BYTES = 64 << 20  # data.parquet_page_bytes' default: the most a Parquet page of the text column decompresses to


@dataclass(frozen=True)
class Corpus:
    """A corpus as the settings name it: `spec` and how its records are read."""
    spec: str
    field: str = "text"
    split: str = "train"
    config: str | None = None
    revision: str | None = None
    max_expansion: float = MAX_EXPANSION
    outside_links: bool = False
    json_line_bytes: int = JSON_LINE_BYTES
    parquet_page_bytes: int = PAGE_BYTES

    def parts(self) -> list[Part]:
        """The files of a local corpus, in reading order."""
        return find_parts(self.spec, self.outside_links)

    def readers(self) -> list[Reader]:
        """One reader a part, in reading order: the spec's scheme's (hf:), or each file's form's."""
        scheme = scheme_of(self.spec)
        return scheme.open(self) if scheme else [reader_of(p, self) for p in self.parts()]

    def check(self) -> None:
        """Raise CorpusError when the corpus cannot be read at all (before any work starts)."""
        for reader in self.readers():
            reader.check()

    def identity(self) -> str:
        """What the corpus' records depend on, for the key: one part's identity, or a hash of its parts'."""
        ids = [r.identity() for r in self.readers()]
        return ids[0] if len(ids) == 1 else hashlib.blake2b("\n".join(ids).encode(), digest_size=16).hexdigest()

    def records(self, long_bytes: int, keep: int) -> Iterator[tuple[str, int, Value]]:
        """(source, line in the source from 1, value) for every record, parts in order."""
        for reader in self.readers():
            for line, value in enumerate(reader.records(long_bytes, keep), start=1):
                yield reader.name, line, value

    def sources(self) -> list[tuple[str, int]]:
        """(source, records) of each part in reading order; a dataset's count is unknown before it is read (0)."""
        return [(r.name, r.count()) for r in self.readers()]
