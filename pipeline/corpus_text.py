"""Reading text and JSON Lines corpus parts (pipeline/corpus_forms.py describes the forms): a part's bytes through
its decompressing stream in CHUNK pieces, split into lines as bytes.splitlines does, a line over the long bound read
through as a LongLine, and each JSON line's text field.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from pipeline.corpus_records import CorpusError, LongLine, Part, Refused, Value, text_value

CHUNK = 1 << 20         # bytes read (or taken from a long Parquet value) at a time
LONG = 1 << 20          # a text line over this many bytes (or 4 x max_chars) is read through in pieces, never whole
JSON_LONG = 64 << 20    # a JSON line is parsed whole up to this many bytes


@contextlib.contextmanager
def open_part(part: Part):
    """The part's bytes as a readable stream (decompressed); a broken file is one line naming it."""
    try:
        if part.codec:
            with pa.CompressedInputStream(pa.OSFile(str(part.path)), part.codec) as f:
                yield f
        else:
            with open(part.path, "rb") as f:
                yield f
    except (OSError, pa.ArrowInvalid) as e:
        if isinstance(e, FileNotFoundError):
            raise CorpusError(f"corpus {part.path}: no such file") from None
        raise CorpusError(f"corpus {part.path}: cannot read it as {part.codec or 'a plain file'} ({e})") from None


def _check_not_utf16(path: Path, head: bytes) -> None:
    if head[:2] in (b"\xff\xfe", b"\xfe\xff"):  # UTF-16/32 BOM: read as UTF-8, every line would be garbage
        raise CorpusError(f"corpus {path}: UTF-16/UTF-32 text (byte order mark {head[:2].hex()}); convert it to UTF-8")


def read_chunks(f, path: Path) -> Iterator[bytes]:
    """The stream in CHUNK pieces, a leading UTF-8 byte order mark dropped (after the UTF-16 check)."""
    head = f.read(CHUNK)
    while 0 < len(head) < 3 and (more := f.read(CHUNK)):
        head += more
    _check_not_utf16(path, head)
    head = head[3:] if head.startswith(b"\xef\xbb\xbf") else head
    if head:
        yield head
    while chunk := f.read(CHUNK):
        yield chunk


def _line_end(chunk: bytes) -> tuple[int, int] | None:
    """(start, end) of the first \\n, \\r\\n or \\r in chunk (bytes.find: a regex scans a 1 MiB piece 90x slower)."""
    ends = [i for i in (chunk.find(b"\n"), chunk.find(b"\r")) if i >= 0]
    if not ends:
        return None
    at = min(ends)
    return at, at + (2 if chunk[at:at + 2] == b"\r\n" else 1)


def text_lines(chunks: Iterator[bytes], long_bytes: int, keep: int) -> Iterator[bytes | LongLine]:
    """Every line (split on \\n, \\r\\n and \\r as bytes.splitlines) as its raw bytes, a line over `long_bytes`
    bytes as a LongLine."""
    pending, long, skip_lf = b"", None, False  # skip_lf: the last line ended on \r, a \n next is its end too
    for chunk in chunks:
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
            long, pending = LongLine(keep).feed(pending), b""
    if long is not None:
        yield long.close()
    elif pending:
        yield pending


def json_values(lines: Iterator[bytes | LongLine], field: str) -> Iterator[Value]:
    for line in lines:
        if isinstance(line, LongLine) or not line.strip():
            yield line  # over JSON_LONG: too_long unparsed; a blank line: an empty record
            continue
        try:
            obj = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            yield line  # the filter rejects it `undecodable`, as a text line
            continue
        except (ValueError, RecursionError):
            obj = None
        if not isinstance(obj, dict):
            yield Refused("not_json", line)
        elif field not in obj:
            yield Refused("no_field", line)
        else:
            yield text_value(obj[field])
