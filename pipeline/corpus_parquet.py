"""Reading Parquet corpus parts (pipeline/corpus_forms.py describes the forms): the string column checked, read in
record batches of about BATCH_BYTES of text, a dictionary-encoded column as its dictionary, a value over the long
bound read as a LongLine from Arrow's buffer, a compressed file first decompressed to a temporary file.
"""
from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.corpus_records import CorpusError, LongLine, Part
from pipeline.corpus_text import CHUNK, open_part

BATCH_BYTES = 16 << 20  # text bytes per Parquet record batch (from the column chunks' uncompressed sizes)
BATCH_ROWS = 4096       # rows per Parquet record batch at most


def check_parquet_field(path: Path, field: str, shown: Path) -> None:
    try:
        kind = pq.read_schema(path).field(field).type
    except (KeyError, pa.ArrowInvalid, OSError) as e:
        raise CorpusError(f"corpus {shown}: expected a Parquet file with a string column `{field}` ({e})") from None
    value = kind.value_type if pa.types.is_dictionary(kind) else kind
    if not (pa.types.is_string(value) or pa.types.is_large_string(value)):
        raise CorpusError(f"corpus {shown}: column `{field}` is {kind}, expected a string column")


@contextlib.contextmanager
def parquet_path(part: Part):
    """The part as a Parquet file on disk: itself, or (compressed) its bytes decompressed to a temporary file."""
    if not part.codec:
        yield part.path
        return
    with tempfile.TemporaryDirectory(prefix="contramine-corpus-") as tmp, open_part(part) as f:
        out = Path(tmp) / "part.parquet"
        with open(out, "wb") as dst:
            shutil.copyfileobj(f, dst, CHUNK)
        yield out


def parquet_values(path: Path, field: str, long_bytes: int, keep: int) -> Iterator[bytes | LongLine]:
    meta = pq.read_metadata(path)
    leaf = [meta.schema.column(j).path for j in range(meta.num_columns)].index(field)
    chunks = [meta.row_group(r).column(leaf) for r in range(meta.num_row_groups)]
    # a dictionary-encoded column is read as its dictionary (pyarrow would expand it into every row); the batch
    # size follows the bytes of plain text per row, so a batch holds about BATCH_BYTES
    dictionary = bool(chunks) and all(c.has_dictionary_page for c in chunks)
    per_row = max([c.total_uncompressed_size / max(1, c.num_values) for c in chunks if not dictionary] or [1])
    rows = int(min(BATCH_ROWS, max(1, BATCH_BYTES // per_row)))
    parquet = pq.ParquetFile(path, read_dictionary=[field] if dictionary else None)
    for batch in parquet.iter_batches(batch_size=rows, columns=[field]):
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
