"""The Parquet form (.parquet): the string column `data.text_field`, one record a row (a null is an empty record),
read in record batches of about BATCH_BYTES of text, a dictionary-encoded column as its dictionary (pyarrow would
expand it into every row), a value over the long bound read as a LongLine from Arrow's buffer.

Bounded: its footer is at most FOOTER_BYTES (8 MiB), from the file's last 8 bytes before it is parsed; a batch
lies in one row group (so it holds one dictionary page at most); a file's rows may number at most
`data.max_expansion` times its bytes (a row read as text is at least its
line end; 1 GB of null rows fits in a few KB of Parquet), checked from its footer before a row is read. Each page of
the text column may decompress to at most `data.parquet_page_bytes` (64 MiB; a value lies in one page), checked from
its header (pages.py) before any page is decoded: 16 KB of zstd hold a 512 MB page. The batch's rows follow the
densest page (its bytes a value), so a batch holds about BATCH_BYTES plus the pages it starts and ends in. A compressed
Parquet file (rare: its pages are compressed already) is decompressed to a temporary file, since Parquet is read
from its end: its first 4 bytes must be Parquet's magic `PAR1` before anything is written, and the copy is capped
as any decompression is.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contramine.pipeline.corpus.forms import form
from contramine.pipeline.corpus.pages import Page, chunk_pages, footer_length
from contramine.pipeline.corpus.records import CorpusError, LongLine, Part, Value
from contramine.pipeline.corpus.streams import CHUNK, open_file, open_part
from contramine.pipeline.corpus.text import file_identity

BATCH_BYTES = 16 << 20  # text bytes per Parquet record batch (from the column chunks' uncompressed sizes)
BATCH_ROWS = 4096       # rows per Parquet record batch at most
MAGIC = b"PAR1"
FOOTER_BYTES = 8 << 20  # a Parquet footer read at most: a corpus file's is KiBs (a row group's metadata ~100 bytes)


@form("parquet", suffixes=(".parquet",))
class ParquetReader:
    def __init__(self, part: Part, corpus):
        self.part, self.name, self.field, self.max_expansion = part, part.name, corpus.field, corpus.max_expansion
        self.page_bytes = corpus.parquet_page_bytes

    @contextlib.contextmanager
    def _file(self):
        """The part as an open Parquet file, checked: itself, or (compressed) decompressed to a temporary file."""
        if not self.part.codec:
            with open_file(self.part) as f:
                yield f
            return
        with tempfile.TemporaryDirectory(prefix="contramine-corpus-") as tmp, \
                open_part(self.part, self.max_expansion) as src:
            first = src.read(len(MAGIC))
            if first != MAGIC:
                raise CorpusError(f"corpus {self.part.path}: decompressed, it is no Parquet file (it starts with "
                                  f"{first[:4]!r}, not {MAGIC!r})")
            out = Path(tmp) / "part.parquet"
            with open(out, "wb") as dst:
                dst.write(first)
                while piece := src.read(CHUNK):
                    dst.write(piece)
            with open(out, "rb") as f:
                yield f

    def _meta(self, f, column: bool = True) -> pq.FileMetaData:
        """The footer (at most FOOTER_BYTES, from the file's last 8 bytes, before it is parsed), its row count checked
        against the file's size; the text column's type with `column`."""
        size = os.fstat(f.fileno()).st_size
        footer = footer_length(f.fileno(), size)
        if footer is not None and footer > FOOTER_BYTES:  # (no magic there: pyarrow's own line below)
            raise CorpusError(f"corpus {self.part.path}: a Parquet footer of {footer:,} bytes, over {FOOTER_BYTES:,} "
                              f"(~100,000 row groups; parsed, it would take ~10x that in memory): rewrite the file "
                              f"with larger row groups")
        try:
            kind = pq.read_schema(f).field(self.field).type if column else None
            meta = pq.read_metadata(f)
        except (KeyError, pa.ArrowInvalid, OSError) as e:
            raise CorpusError(f"corpus {self.part.path}: expected a Parquet file with a string column `{self.field}` "
                              f"({' '.join(str(e).split())[:300]})") from None
        value = kind.value_type if kind is not None and pa.types.is_dictionary(kind) else kind
        if column and not (pa.types.is_string(value) or pa.types.is_large_string(value)):
            raise CorpusError(f"corpus {self.part.path}: column `{self.field}` is {kind}, expected a string column")
        if self.max_expansion and meta.num_rows > self.max_expansion * size:
            raise CorpusError(f"corpus {self.part.path}: {meta.num_rows} rows in {size} bytes, over "
                              f"data.max_expansion={self.max_expansion:g} rows a byte; raise data.max_expansion, or "
                              f"set it to 0, to read it")
        return meta

    def _pages(self, f, meta: pq.FileMetaData) -> list[list[Page]]:
        """Each row group's pages of the text column, from their headers; a page over the limit is one line."""
        leaf = [meta.schema.column(j).path for j in range(meta.num_columns)].index(self.field)
        groups = []
        for r in range(meta.num_row_groups):
            where = f"corpus {self.part.path}: row group {r}, column `{self.field}`"
            pages = list(chunk_pages(f, meta.row_group(r).column(leaf), where))
            for page in pages:
                if page.size > self.page_bytes:
                    raise CorpusError(f"{where}: a {page.kind} page at byte {page.offset} decompresses to "
                                      f"{page.size} bytes, over data.parquet_page_bytes={self.page_bytes}; raise "
                                      f"data.parquet_page_bytes to read it")
            groups.append(pages)
        return groups

    def check(self) -> None:
        with self._file() as f:
            self._pages(f, self._meta(f))

    def count(self) -> int:
        with self._file() as f:  # (the rows only: the column is checked where it is read)
            return self._meta(f, column=False).num_rows

    def identity(self) -> str:
        return file_identity(self.part, self.field)

    def records(self, long_bytes: int, keep: int) -> Iterator[Value]:
        with self._file() as f:
            meta = self._meta(f)
            groups = self._pages(f, meta)
            # a dictionary-encoded column is read as its dictionary; the batch size follows the bytes of plain text
            # per row in the densest page, so a batch holds about BATCH_BYTES
            dictionary = bool(groups) and all(any(p.kind == "dictionary" for p in g) for g in groups)
            per_row = max([p.size / max(1, p.values) for g in groups for p in g if p.kind == "data" and not dictionary]
                          or [1])
            rows = int(min(BATCH_ROWS, max(1, BATCH_BYTES // per_row)))
            parquet = pq.ParquetFile(f, read_dictionary=[self.field] if dictionary else None)
            # a row group at a time: a batch across row groups held every one's dictionary page at once (16 pages
            # of 60 MiB in 45 KB of zstd: 1.45 GB), one row group holds at most one page of data.parquet_page_bytes
            batches = (b for r in range(meta.num_row_groups)
                       for b in parquet.iter_batches(batch_size=rows, row_groups=[r], columns=[self.field]))
            while True:
                try:
                    batch = next(batches, None)
                except (OSError, pa.ArrowInvalid) as e:  # a page its header vouched for that does not decode
                    raise CorpusError(f"corpus {self.part.path}: cannot read column `{self.field}` "
                                      f"({' '.join(str(e).split())[:300]})") from None
                if batch is None:
                    return
                yield from _values(batch.column(0), long_bytes, keep)


def _values(col: pa.Array, long_bytes: int, keep: int) -> Iterator[bytes | LongLine]:
    """A batch's values as raw bytes (null → empty), a value over `long_bytes` as a LongLine read in pieces from
    Arrow's buffer; a dictionary value is read once however many rows repeat it."""
    if pa.types.is_dictionary(col.type):
        source, rows = col.dictionary, pc.fill_null(col.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    else:
        source, rows = col, np.arange(len(col))
    large = pa.types.is_large_string(source.type)
    source = source.view(pa.large_binary() if large else pa.binary())
    lengths = pc.fill_null(pc.binary_length(source), 0).to_numpy(zero_copy_only=False)
    used = np.unique(rows[rows >= 0])
    short = used[lengths[used] <= long_bytes]
    value: dict[int, bytes | LongLine] = {-1: b""}
    value.update(zip(short.tolist(), (v or b"" for v in source.take(pa.array(short)).to_pylist())))
    _, offsets, data = source.buffers()  # a long value is read from Arrow's buffer in place (a scalar copies it)
    starts = np.frombuffer(offsets, np.int64 if large else np.int32)[source.offset:source.offset + len(source) + 1]
    for i in used[lengths[used] > long_bytes].tolist():
        line, end = LongLine(keep), int(starts[i + 1])
        for at in range(int(starts[i]), end, CHUNK):
            line.feed(bytes(memoryview(data)[at:min(at + CHUNK, end)]))
        value[i] = line.close()
    for i in rows.tolist():
        yield value[i]
