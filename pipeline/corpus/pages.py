"""A Parquet column chunk's page headers, read before any page is decoded: how many bytes each page decompresses to
and how many values it holds. The footer gives only a chunk's totals, and one page can hide in a small chunk: 16 KB
of zstd hold a 512 MB page, which pyarrow decompresses whole, then copies into the batch (1.18 GB for one value).
pyarrow exposes no page headers, so they are read here: each is a Thrift struct in the compact protocol, right
before its page's bytes (parquet.thrift's PageHeader: 1 type, 2 uncompressed_page_size, 3 compressed_page_size,
5 data_page_header, 7 dictionary_page_header, 8 data_page_header_v2; each header's field 1 is its num_values).
A header that does not parse is one line naming the file, as any broken file is.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from contramine.pipeline.corpus.records import CorpusError

FIRST_READ = 1 << 10    # bytes read for a header at first (grown x8, up to MAX_HEADER, while it runs past them)
MAX_HEADER = 16 << 20   # a header over this is refused (Arrow's own reader stops at 16 MiB too)
DEPTH = 32              # structs and lists nested deeper are refused (a page header nests three)
PAGE_HEADERS = {5: "data", 7: "dictionary", 8: "data"}  # PageHeader's fields that hold a page kind's header


def footer_length(fd: int, size: int) -> int | None:
    """The length a Parquet file's last 8 bytes give its footer (read before the footer is: a reader bounds it
    first), or None where they are no Parquet ending (cut short, or not Parquet)."""
    tail = os.pread(fd, 8, max(0, size - 8))
    return int.from_bytes(tail[:4], "little") if size >= 12 and len(tail) == 8 and tail[4:] == b"PAR1" else None


class _Short(Exception):
    """The header runs past the bytes read so far."""


@dataclass(frozen=True)
class Page:
    kind: str          # data | dictionary | index
    offset: int        # where its header starts in the file
    size: int          # bytes it decompresses to
    values: int        # values it holds (0 where its header does not say)


class _Compact:
    """Thrift's compact protocol over a bytes buffer, enough to read a struct's integers and skip the rest."""

    def __init__(self, buf: bytes):
        self.buf, self.at = buf, 0

    def byte(self) -> int:
        if self.at >= len(self.buf):
            raise _Short
        self.at += 1
        return self.buf[self.at - 1]

    def varint(self) -> int:
        shift = value = 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if b < 0x80:
                return value
            shift += 7
            if shift > 70:
                raise ValueError("a varint over 10 bytes")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip(self, kind: int, depth: int) -> int | dict | None:
        """A value of compact type `kind`: an integer or a struct's fields; anything else skipped (None)."""
        if depth > DEPTH:
            raise ValueError(f"structs or lists nested over {DEPTH} deep")
        if kind in (1, 2):       # a bool in a field header: no bytes of its own
            return None
        if kind == 3:
            self.byte()
        elif kind in (4, 5, 6):
            return self.zigzag()
        elif kind == 7:
            self.take(8)
        elif kind == 8:
            self.take(self.varint())
        elif kind in (9, 10):    # list, set: size in the high nibble (15: a varint follows), element type low
            head = self.byte()
            n, elem = head >> 4, head & 0x0F
            for _ in range(self.varint() if n == 15 else n):
                self.skip(3 if elem in (1, 2) else elem, depth + 1)  # a bool element is one byte
        elif kind == 11:
            n = self.varint()
            types = self.byte() if n else 0
            for _ in range(n):
                self.skip(3 if types >> 4 in (1, 2) else types >> 4, depth + 1)
                self.skip(3 if types & 0x0F in (1, 2) else types & 0x0F, depth + 1)
        elif kind == 12:
            return self.struct(depth + 1)
        else:
            raise ValueError(f"unknown compact type {kind}")
        return None

    def take(self, n: int) -> None:
        if self.at + n > len(self.buf):
            raise _Short
        self.at += n

    def struct(self, depth: int = 0) -> dict:
        fields: dict[int, int | dict | None] = {}
        last = 0
        while (head := self.byte()) != 0:
            delta, kind = head >> 4, head & 0x0F
            last = last + delta if delta else self.zigzag()
            fields[last] = self.skip(kind, depth)
        return fields


def _header(f, offset: int, end: int, where: str) -> tuple[dict, int]:
    """The page header at `offset` (its fields) and its length in bytes."""
    want = FIRST_READ
    while True:
        f.seek(offset)
        buf = f.read(min(want, end - offset))
        reader = _Compact(buf)
        try:
            return reader.struct(), reader.at
        except _Short:
            if len(buf) < want or want >= MAX_HEADER:  # the chunk (or the file) ends first, or a giant header
                raise CorpusError(f"{where}: a page header at byte {offset} runs past its column chunk or over "
                                  f"{MAX_HEADER} bytes (a broken Parquet file)") from None
            want = min(want * 8, MAX_HEADER)
        except (ValueError, RecursionError) as e:
            raise CorpusError(f"{where}: the page header at byte {offset} does not parse ({e})") from None


def chunk_pages(f, chunk, where: str) -> Iterator[Page]:
    """The pages of a column chunk (pyarrow's ColumnChunkMetaData) in file order, from their headers."""
    start = chunk.data_page_offset
    if chunk.has_dictionary_page and 0 < chunk.dictionary_page_offset < start:
        start = chunk.dictionary_page_offset
    offset, end = start, start + chunk.total_compressed_size
    while offset < end:
        fields, length = _header(f, offset, end, where)
        size, stored = fields.get(2), fields.get(3)
        if not isinstance(size, int) or not isinstance(stored, int) or size < 0 or stored < 0:
            raise CorpusError(f"{where}: the page header at byte {offset} has no page sizes (a broken Parquet file)")
        kind, sub = "index", {}
        for k, name in PAGE_HEADERS.items():
            if isinstance(header := fields.get(k), dict):
                kind, sub = name, header
                break
        values = sub.get(1)
        yield Page(kind, offset, size, values if isinstance(values, int) and values > 0 else 0)
        offset += length + stored
