"""Reading a corpus into sentences + rejected (the `sentences` and `pool_sentences` stages). Every input line ends
in exactly one of the two.

Lines are split on \\n, \\r\\n and \\r (as bytes.splitlines), a UTF-8 BOM is dropped, each line is decoded strictly
(undecodable → rejected, with its text decoded with replacement characters so nothing is lost). A line longer than
`max_chars` characters as written is rejected `too_long` before anything else is done to it; the others get control
characters → spaces, NFC and whitespace runs → one space (identity.normalise). Then: empty, too short, too long
(again: NFC can lengthen a line) and exact duplicates (the first occurrence is kept) are rejected with that reason.
The sid is the first 8 bytes of blake2b(text) as a signed int64: stable across runs, machines and shard counts.

A rejected row keeps the line's first KEEP characters in `text` (all of it for any line up to that), its full length
(`n_chars`, `n_bytes`) and `blake2b` (hex, 16 bytes) of its raw bytes, so a cut line is still accounted for.

Memory: the file is read in CHUNK pieces. A line over max(LONG, 4 x max_chars) bytes (so surely over max_chars
characters) is never held whole: it is read through piece by piece for its first KEEP characters, its lengths, its
hash and whether it decodes, then dropped. Parquet is read in record batches of about BATCH_BYTES of text (from
the column chunks' sizes), a dictionary-encoded `text` as its dictionary (a value repeated in many rows is held once
per batch, never expanded). The limit there: a plain-encoded value is one contiguous buffer in Parquet, so its row
holds it whole while its batch is read (a 2 GB value needs 2 GB, once); the stage never copies or decodes it whole.
What does grow with the corpus is the output: the kept sentences and the rejected rows (KEEP characters at most
each), built whole because the stage hands every shard over at once (one_job).
"""
from __future__ import annotations

import codecs
import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.errors import ExpectedError
from pipeline.identity import normalise, sentence_id
from pipeline.schema import SCHEMAS

CHUNK = 1 << 20         # bytes read (or taken from a long Parquet value) at a time
LONG = 1 << 20          # a line over this many bytes (or 4 x max_chars) is read through in pieces, never held whole
KEEP = 65_536           # characters of a rejected line kept in `rejected.text` (a 50,000-character line stays whole)
BATCH_BYTES = 16 << 20  # text bytes per Parquet record batch (from the column chunks' uncompressed sizes)
BATCH_ROWS = 4096       # rows per Parquet record batch at most


class CorpusError(ExpectedError, ValueError):
    """The corpus cannot be read at all (missing file, wrong format); names the file."""


class LongLine:
    """A line over the long-line bound, fed piece by piece: its first KEEP characters (`head`), its length in
    characters (undecodable bytes count as the U+FFFD they decode to) and bytes, blake2b of its bytes, and whether
    it decodes as UTF-8. The line itself is never held."""

    def __init__(self):
        self.hash, self.n_bytes, self.n_chars = hashlib.blake2b(digest_size=16), 0, 0
        self.head, self.undecodable = "", False
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
        if len(self.head) < KEEP:
            self.head += text[:KEEP - len(self.head)]
        return self

    def close(self) -> "LongLine":
        return self.feed(b"", final=True)


def read_lines(path: Path, long_bytes: int = LONG) -> Iterator[tuple[int, bytes | LongLine]]:
    """(line_no from 1, the line's raw bytes, or a LongLine for one over `long_bytes` bytes) for every line."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus {path}: no such file")
    lines = _parquet_lines(path, long_bytes) if path.suffix == ".parquet" else _text_lines(path, long_bytes)
    yield from enumerate(lines, start=1)


def _text_lines(path: Path, long_bytes: int) -> Iterator[bytes | LongLine]:
    with open(path, "rb") as f:
        _check_not_utf16(path, f.read(2))
        f.seek(0)
        if f.read(3) != b"\xef\xbb\xbf":
            f.seek(0)
        pending, long, skip_lf = b"", None, False  # skip_lf: the last line ended on \r, a \n next is its end too
        while chunk := f.read(CHUNK):
            if skip_lf and chunk[:1] == b"\n":
                chunk = chunk[1:]
            skip_lf = False
            if long is not None:  # reading through a long line: only its end matters
                end = _line_end(chunk)
                if end is None:
                    long.feed(chunk)
                    continue
                yield long.feed(chunk[:end[0]]).close()
                long, skip_lf, chunk = None, end[1] == len(chunk) and chunk[end[0]:] == b"\r", chunk[end[1]:]
            lines = (pending + chunk).splitlines(keepends=True)
            pending = lines.pop() if lines and not lines[-1].endswith((b"\n", b"\r")) else b""
            for line in lines:
                yield line.rstrip(b"\r\n")
            if lines and not pending and lines[-1].endswith(b"\r"):
                skip_lf = True
            if len(pending) > long_bytes:
                long, pending = LongLine().feed(pending), b""
        if long is not None:
            yield long.close()
        elif pending:
            yield pending


def _line_end(chunk: bytes) -> tuple[int, int] | None:
    """(start, end) of the first \\n, \\r\\n or \\r in chunk (bytes.find: a regex scans a 1 MiB piece 90x slower)."""
    ends = [i for i in (chunk.find(b"\n"), chunk.find(b"\r")) if i >= 0]
    if not ends:
        return None
    at = min(ends)
    return at, at + (2 if chunk[at:at + 2] == b"\r\n" else 1)


def _parquet_lines(path: Path, long_bytes: int) -> Iterator[bytes | LongLine]:
    check_corpus(path)
    meta = pq.read_metadata(path)
    leaf = [meta.schema.column(j).path for j in range(meta.num_columns)].index("text")
    chunks = [meta.row_group(r).column(leaf) for r in range(meta.num_row_groups)]
    # a dictionary-encoded column is read as its dictionary (pyarrow would expand it into every row); the batch
    # size follows the bytes of plain text per row, so a batch holds about BATCH_BYTES
    dictionary = bool(chunks) and all(c.has_dictionary_page for c in chunks)
    per_row = max([c.total_uncompressed_size / max(1, c.num_values) for c in chunks if not dictionary] or [1])
    rows = int(min(BATCH_ROWS, max(1, BATCH_BYTES // per_row)))
    parquet = pq.ParquetFile(path, read_dictionary=["text"] if dictionary else None)
    for batch in parquet.iter_batches(batch_size=rows, columns=["text"]):
        yield from _values(batch.column(0), long_bytes)


def _values(col: pa.Array, long_bytes: int) -> Iterator[bytes | LongLine]:
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
        line, end = LongLine(), int(starts[i + 1])
        for at in range(int(starts[i]), end, CHUNK):
            line.feed(bytes(memoryview(data)[at:min(at + CHUNK, end)]))
        value[i] = line.close()
    for i in rows.tolist():
        yield value[i]


def _check_not_utf16(path: Path, head: bytes) -> None:
    if head in (b"\xff\xfe", b"\xfe\xff"):  # UTF-16/32 BOM: read as UTF-8, every line would be garbage
        raise CorpusError(f"corpus {path}: UTF-16/UTF-32 text (byte order mark {head.hex()}); convert it to UTF-8")


def check_corpus(path: Path) -> None:
    """Raise CorpusError when the corpus cannot be read at all (before any work starts)."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus {path}: no such file (set data.corpus or CORPUS=...)")
    if path.suffix == ".parquet":
        try:
            field = pq.read_schema(path).field("text")
        except (KeyError, pa.ArrowInvalid, OSError) as e:
            raise CorpusError(f"corpus {path}: expected a Parquet file with a string column `text` ({e})") from None
        kind = field.type.value_type if pa.types.is_dictionary(field.type) else field.type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise CorpusError(f"corpus {path}: column `text` is {field.type}, expected a string column")
    else:
        with open(path, "rb") as f:
            _check_not_utf16(path, f.read(2))


def count_lines(path: Path) -> int:
    return sum(1 for _ in read_lines(path))


class _Rejected:
    """The `rejected` rows in line order: the text cut at KEEP characters, the line's full lengths and hash."""

    def __init__(self):
        self.cols: dict[str, list] = {name: [] for name in SCHEMAS["rejected"].names}

    def add(self, no: int, raw: bytes | LongLine, text: str, reason: str) -> None:
        if isinstance(raw, LongLine):
            n_chars, n_bytes, digest = raw.n_chars, raw.n_bytes, raw.hash.hexdigest()
        else:
            n_chars, n_bytes, digest = len(text), len(raw), hashlib.blake2b(raw, digest_size=16).hexdigest()
        for name, v in zip(self.cols, (no, text[:KEEP], reason, n_chars, n_bytes, digest)):
            self.cols[name].append(v)

    def table(self) -> pa.Table:
        return pa.table(self.cols, schema=SCHEMAS["rejected"])


def split_sentences(path: Path, min_words: int, max_words: int, max_chars: int) -> tuple[pa.Table, pa.Table]:
    """Read and filter the corpus: (sentences sorted by sid, rejected in line order)."""
    kept: dict[int, tuple[str, int, int]] = {}
    rejected = _Rejected()
    # over 4 x max_chars bytes a line has over max_chars characters: too long whatever it holds, never held whole
    for no, raw in read_lines(path, long_bytes=max(LONG, 4 * max_chars)):
        if isinstance(raw, LongLine):
            rejected.add(no, raw, raw.head, "undecodable" if raw.undecodable else "too_long")
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            rejected.add(no, raw, raw.decode("utf-8", errors="replace"), "undecodable")
            continue
        if len(text) > max_chars:  # by its length as written: a giant line is never normalised
            rejected.add(no, raw, text, "too_long")
            continue
        clean = normalise(text)
        n_words = len(clean.split())
        if not clean:
            reason = "empty"
        elif len(clean) > max_chars:
            reason = "too_long"
        elif n_words < min_words:
            reason = "too_short"
        elif n_words > max_words:
            reason = "too_long"
        else:
            sid = sentence_id(clean)
            if sid not in kept:
                kept[sid] = (clean, n_words, no)
                continue
            if kept[sid][0] != clean:  # 64-bit collision: astronomically unlikely, but never silent
                raise CorpusError(f"corpus {path}: line {no} and line {kept[sid][2]} share sid {sid}")
            reason = "duplicate"
        rejected.add(no, raw, text, reason)
    sids = np.array(sorted(kept), dtype=np.int64)
    sentences = pa.table({
        "sid": sids,
        "text": [kept[s][0] for s in sids.tolist()],
        "n_words": pa.array([kept[s][1] for s in sids.tolist()], pa.int32()),
        "line_no": pa.array([kept[s][2] for s in sids.tolist()], pa.int64()),
    }, schema=SCHEMAS["sentences"])
    return sentences, rejected.table()


def shard_bounds(n_rows: int, n_shards: int) -> list[tuple[int, int]]:
    """Contiguous, near-equal row ranges: shard i of a table sorted by sid."""
    edges = np.linspace(0, n_rows, n_shards + 1).round().astype(int)
    return [(int(edges[i]), int(edges[i + 1])) for i in range(n_shards)]
