"""A corpus file's bytes, as every reader of pipeline/corpus/ gets them: opened without blocking and checked to be a
regular file (a FIFO, socket or device is one line naming it, never a hang), decompressed through pyarrow's streams
with the expansion capped (`data.max_expansion`), in CHUNK pieces with a UTF-8 byte order mark dropped; and the line
rules, written once here: lines split on \\n, \\r\\n and a bare \\r (as bytes.splitlines), a line over the long bound
read through as a LongLine. Counting a part's lines is reading them (`count_lines`): the count and the reader cannot
disagree.
"""
from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from contramine.pipeline.corpus.records import CorpusError, LongLine, Part

CHUNK = 1 << 20         # bytes read (or taken from a long Parquet value) at a time
LONG = 1 << 20          # a text line over this many bytes (or 4 x max_chars) is read through in pieces, never whole
KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
         stat.S_IFBLK: "a block device", stat.S_IFDIR: "a folder"}


def kind_of(mode: int) -> str:
    """What a file that is not a regular file is, in words (for the one-line refusal)."""
    return KINDS.get(stat.S_IFMT(mode), "not a regular file")


def open_file(where: Path | Part):
    """A part (or a path) opened for reading, refused in one line unless it is a regular file. Non-blocking, so a
    FIFO's open returns at once; fstat then says what it is. A part is checked on the descriptor itself, after the
    opening (which follows links): it must be the file its listing saw (device and inode) and, where its corpus
    keeps to its root, lie inside that root (/proc/self/fd's path of it, on Linux). Between the listing and the
    opening a link can be swapped in; only the open descriptor says what is read."""
    part = where if isinstance(where, Part) else None
    path: Path = where.path if isinstance(where, Part) else where
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise CorpusError(f"corpus {path}: no such file") from None
    except OSError as e:
        raise CorpusError(f"corpus {path}: cannot open it ({e.strerror})") from None
    st = os.fstat(fd)
    problem = (f"{kind_of(st.st_mode)}, not a corpus file" if not stat.S_ISREG(st.st_mode)
               else _moved(fd, st, part) if part else None)
    if problem:
        os.close(fd)
        raise CorpusError(f"corpus {path}: {problem}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _moved(fd: int, st: os.stat_result, part: Part) -> str | None:
    """Why the opened descriptor is not the part its listing checked, or None."""
    if part.listed is not None and (st.st_dev, st.st_ino) != part.listed:
        return ("is another file than the one listed (replaced, or a link swapped in, after the corpus was listed); "
                "refused: read the corpus when nothing is changing it")
    if part.root is None:
        return None
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc: the device and inode the listing checked stand alone
        return None
    root = part.root.rstrip(os.sep) + os.sep
    if real != part.root and not real.startswith(root):
        return (f"opened, it is {real}, outside the corpus ({part.root}); refused: a link swapped in after the "
                f"corpus was listed")
    return None


class Capped:
    """A decompressing stream that stops, in one line naming the file and the setting, once it has given more than
    `limit` bytes (a decompression bomb: 174 bytes of zstd expand to 5 MB of newlines). limit 0: no cap."""

    def __init__(self, stream, path: Path, limit: int, ratio: float, size: int):
        self.stream, self.path, self.limit, self.ratio, self.size, self.given = stream, path, limit, ratio, size, 0

    def read(self, n: int = CHUNK) -> bytes:
        data = self.stream.read(n)
        self.given += len(data)
        if self.limit and self.given > self.limit:
            raise CorpusError(f"corpus {self.path}: decompresses to over {self.ratio:g} times its {self.size} bytes "
                              f"(data.max_expansion={self.ratio:g}); raise data.max_expansion, or set it to 0, to read "
                              f"it whole")
        return data


@contextlib.contextmanager
def open_part(part: Part, max_expansion: float = 0):
    """The part's bytes as a readable stream (decompressed, capped at max_expansion times the file's size); a broken
    file is one line naming it."""
    with open_file(part) as raw:
        try:
            if not part.codec:
                yield raw
                return
            size = os.fstat(raw.fileno()).st_size
            with pa.CompressedInputStream(pa.PythonFile(raw, mode="r"), part.codec) as f:
                yield Capped(f, part.path, int(max_expansion * max(size, 1)), max_expansion, size)
        except (OSError, pa.ArrowInvalid) as e:
            raise CorpusError(f"corpus {part.path}: cannot read it as {part.codec or 'a plain file'} "
                              f"({' '.join(str(e).split())[:300]})") from None


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


class _Skipped(LongLine):
    """A long line only counted (count_lines): neither hashed nor decoded."""

    def feed(self, piece: bytes, final: bool = False) -> "_Skipped":
        return self


def text_lines(chunks: Iterator[bytes], long_bytes: int, keep: int, long_line=LongLine) -> Iterator[bytes | LongLine]:
    """Every line (split on \\n, \\r\\n and \\r as bytes.splitlines) as its raw bytes, a line over `long_bytes`
    bytes as a LongLine; a \\r\\n cut between two chunks is one line end."""
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
            long, pending = long_line(keep).feed(pending), b""
    if long is not None:
        yield long.close()
    elif pending:
        yield pending


def count_lines(part: Part, max_expansion: float = 0) -> int:
    """A part's lines as text_lines splits them (a last line without its end counts)."""
    with open_part(part, max_expansion) as f:
        return sum(1 for _ in text_lines(read_chunks(f, part.path), LONG, 0, _Skipped))
