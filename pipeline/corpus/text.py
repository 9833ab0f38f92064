"""The text form: one sentence a line (.txt, .text; and a single file of any name no other form claims), a line's
raw bytes as its record, read in CHUNK pieces through its decompressing stream (pipeline/corpus/streams.py).
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from functools import lru_cache

from contramine.pipeline.corpus.forms import form
from contramine.pipeline.corpus.records import LongLine, Part, Value
from contramine.pipeline.corpus.streams import count_lines, open_file, open_part, read_chunks, text_lines


@lru_cache(maxsize=4096)
def cached_count(part: Part, size: int, mtime_ns: int, max_expansion: float) -> int:
    # cached per process by size and mtime: every stage flow of a run configures the run, and so counts again; the
    # count only sizes the shards, the content hash decides what is recomputed
    return count_lines(part, max_expansion)


def file_identity(part: Part, field: str | None) -> str:
    """A file part's name (`rejected.source`), form, codec and content hash; the field where the form has one."""
    h = hashlib.blake2b(digest_size=16)
    with open_file(part) as f:  # (the FIFO and listing checks again: the file can change after it was listed)
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return f"{part.name};form={part.form};codec={part.codec};hash={h.hexdigest()}" + (f";field={field}" if field
                                                                                            else "")


@form("text", suffixes=(".txt", ".text"))
class TextReader:
    def __init__(self, part: Part, corpus):
        self.part, self.name, self.max_expansion = part, part.name, corpus.max_expansion

    def head(self) -> bytes:
        """The first piece of the text, checked (opens, decompresses, no UTF-16)."""
        with open_part(self.part, self.max_expansion) as f:
            return next(read_chunks(f, self.part.path), b"")

    def check(self) -> None:
        self.head()

    def count(self) -> int:
        st = os.stat(self.part.path)
        return cached_count(self.part, st.st_size, st.st_mtime_ns, self.max_expansion)

    def lines(self, long_bytes: int, keep: int) -> Iterator[bytes | LongLine]:
        with open_part(self.part, self.max_expansion) as f:
            yield from text_lines(read_chunks(f, self.part.path), long_bytes, keep)

    def records(self, long_bytes: int, keep: int) -> Iterator[Value]:
        return self.lines(long_bytes, keep)

    def identity(self) -> str:
        return file_identity(self.part, None)
