"""What a memo pack may cost before its hashes can be checked: a pack is read from a folder others may write, so its
footer is bounded before it is parsed, and what its columns decode to before they are decoded.

- The footer: at most FOOTER_MAX bytes (a pack's is a few KiB), read only when the file's last 8 bytes say so. A
  sparse 5 GiB file whose footer length says 4 GB, or a real one of 450,000 row groups, is refused at once.
- The footer's promises: every key is 16 bytes, written plain and uncompressed (store.write_pack_file), so the key
  column's chunks hold at least 16 bytes a row and the rows fit the file; every row group has every column; the
  column chunks decompress to at most `decoded_limit(size)`.
- Dictionary pages: a text column may be dictionary-encoded (the memo writes them so), and one 64 MiB value that 64
  rows point at decodes to 4 GiB from a pack of 4 KB. Such columns are read as dictionaries, their decoded size is
  counted from the dictionary's lengths and the indices, and only a pack within the limit is decoded.
Each is a reason (one line; the caller quarantines the pack, naming its owner), never an exception."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contramine.pipeline.corpus.pages import chunk_pages, footer_length
from contramine.pipeline.corpus.records import CorpusError

FOOTER_MAX = 1 << 20
DECODED_FLOOR = 128 << 20  # what any pack may decode to; more only in proportion to its bytes:
DECODED_RATIO = 32         # zstd makes text 3-5x smaller, and a repeated value (a chain's name) more


def decoded_limit(size: int) -> int:
    return max(DECODED_FLOOR, DECODED_RATIO * size)


def open_footer(f, size: int) -> tuple[pq.ParquetFile | None, str | None]:
    """(the pack's ParquetFile, None) once its footer is checked (module doc), or (None, why not). `f`: the pack's
    file as opened, `size` its fstat size."""
    if (n := footer_length(f.fileno(), size)) is None:
        return None, f"no Parquet footer at the end of its {size:,} bytes (cut short, or not a pack)"
    if n > FOOTER_MAX or n + 12 > size:
        return None, f"a footer of {n:,} bytes in {size:,} (a pack's is a few KiB; at most {FOOTER_MAX:,} are read)"
    try:
        # the footer's bytes read once, here, and parsed from them: the pack is never asked for its footer again (its
        # writer could rewrite the file's tail between a check and a second parse). On this thread only (a pack is
        # small): no IO pool pre-buffering reads of a Python file object (an Arrow thread still reading one when a
        # short command exits aborts the process, apache/arrow#34314)
        meta = pq.read_metadata(pa.BufferReader(os.pread(f.fileno(), n + 8, size - 8 - n)))
        pf = pq.ParquetFile(f, metadata=meta, page_checksum_verification=True, pre_buffer=False)
        problem = footer_problem(meta, size)
    except (OSError, pa.ArrowException, ValueError, IndexError) as e:
        return None, f"does not read ({type(e).__name__}: {e})"
    return (None, problem) if problem is not None else (pf, None)


def footer_problem(meta: pq.FileMetaData, size: int) -> str | None:
    """Why a pack's footer promises more than its bytes hold (module doc), or None. A dictionary-encoded or
    compressed key column (228 KiB claiming 30M rows would decode to 480 MB and more) is refused here."""
    if meta.num_rows < 0 or meta.num_rows * 16 > size:
        return f"claims {meta.num_rows:,} rows in {size:,} bytes (a key alone is 16 bytes)"
    if meta.num_columns < 1:
        return "no columns"
    inflated = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        if group.num_columns != meta.num_columns:
            return f"a row group of {group.num_columns} columns where its schema has {meta.num_columns}"
        col = group.column(0)
        if col.path_in_schema != "key":
            return "no key column first"
        if col.has_dictionary_page or any("DICTIONARY" in e for e in col.encodings):
            return "a dictionary-encoded key column (this memo writes keys plain)"
        if col.compression != "UNCOMPRESSED":
            return f"a {col.compression}-compressed key column (this memo writes keys uncompressed)"
        if col.total_compressed_size < 16 * group.num_rows:
            return (f"a key column of {col.total_compressed_size:,} bytes for {group.num_rows:,} rows of 16-byte "
                    f"keys")
        inflated += sum(max(group.column(i).total_uncompressed_size, 0) for i in range(group.num_columns))
    if inflated > decoded_limit(size):
        return f"columns that decompress to {inflated:,} bytes from {size:,} (at most {decoded_limit(size):,})"
    return None


def read_values(f, pf: pq.ParquetFile, size: int) -> tuple[pa.Table | None, str | None]:
    """(the whole pack, None), or (None, why it is not decoded): every page's size is read from its header first (the
    footer's totals are the writer's word: Arrow allocates what a page header says); every dictionary-encoded text
    column is read as a dictionary and decoded only when what it decodes to is within `decoded_limit(size)`; a
    dictionary-encoded leaf inside a list (`texts: list<string>`), which this memo never writes, is refused."""
    meta, limit, schema = pf.metadata, decoded_limit(size), pf.schema_arrow
    try:
        if (problem := _pages_problem(f, meta, size)) is not None:
            return None, problem
        chunks = [meta.row_group(g).column(i) for g in range(meta.num_row_groups) for i in range(meta.num_columns)]
        if nested := next((c.path_in_schema for c in chunks if c.has_dictionary_page and "." in c.path_in_schema), None):
            return None, f"a dictionary-encoded nested column `{nested}` (this memo writes none)"
        encoded = sorted({c.path_in_schema for c in chunks if c.has_dictionary_page and c.physical_type == "BYTE_ARRAY"})
        if encoded:
            pf = pq.ParquetFile(f, metadata=meta, page_checksum_verification=True, pre_buffer=False,
                                read_dictionary=encoded)
        table = pf.read(use_threads=False)
        if not encoded:
            return table, None
        decoded = sum(_decoded_bytes(chunk) for col in table.columns for chunk in col.chunks)
        if decoded > limit:
            return None, f"dictionary-encoded values that decode to {decoded:,} bytes from {size:,} (at most {limit:,})"
        return table.cast(pa.schema(list(schema), metadata=table.schema.metadata)), None
    except (OSError, pa.ArrowException, ValueError, IndexError, CorpusError) as e:
        return None, f"does not read ({type(e).__name__}: {e})"


def _pages_problem(f, meta: pq.FileMetaData, size: int) -> str | None:
    """Why the pages' own headers promise more than `decoded_limit(size)`, or None: what they decompress to, and
    what their values take once decoded (each value, null or not, its width: a fixed-size binary's bytes, else 8;
    100M null strings are a few bytes of levels and 800 MB decoded)."""
    total, limit = 0, decoded_limit(size)
    for i in range(meta.num_columns):
        leaf = meta.schema.column(i)
        width = leaf.length if leaf.physical_type == "FIXED_LEN_BYTE_ARRAY" and leaf.length else 8
        for g in range(meta.num_row_groups):
            chunk = meta.row_group(g).column(i)
            values = 0
            for page in chunk_pages(f, chunk, "memo pack"):
                total += page.size
                values += page.values if page.kind == "data" else 0
            total += max(values, chunk.num_values) * width
            if total > limit:
                return f"pages whose headers say they decode to over {limit:,} bytes, from {size:,}"
    return None


def _decoded_bytes(chunk: pa.Array) -> int:
    """What `chunk` decodes to, where it is a dictionary array (0 else: plain pages are bounded by their headers)."""
    if isinstance(chunk, pa.DictionaryArray):
        lengths = pc.fill_null(pc.binary_length(chunk.dictionary), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        if not len(lengths):
            return 0
        return int(lengths[pc.fill_null(chunk.indices, 0).to_numpy(zero_copy_only=False)].sum())
    return 0
