"""Reading a corpus into sentences + rejected (the `sentences` and `pool_sentences` stages). Every input line ends
in exactly one of the two.

Lines are split on \\n, \\r\\n and \\r (bytes.splitlines), a UTF-8 BOM is dropped, each line is decoded strictly
(undecodable → rejected, with its text decoded with replacement characters so nothing is lost), control
characters become spaces and whitespace runs collapse to one space. Then: empty, too short, too long, and exact
duplicates (the first occurrence is kept) are rejected with that reason. The sid is the first 8 bytes of
blake2b(text) as a signed int64: stable across runs, machines and shard counts.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.errors import ExpectedError
from pipeline.identity import normalise, sentence_id
from pipeline.schema import SCHEMAS


class CorpusError(ExpectedError, ValueError):
    """The corpus cannot be read at all (missing file, wrong format); names the file."""


def read_lines(path: Path) -> Iterator[tuple[int, str | None, str]]:
    """(line_no from 1, decoded text or None when undecodable, lossless text) for every line of the corpus."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus {path}: no such file")
    if path.suffix == ".parquet":
        try:
            col = pq.read_table(path, columns=["text"]).column("text")
        except (KeyError, pa.ArrowInvalid) as e:
            raise CorpusError(f"corpus {path}: expected a Parquet file with a string column `text` ({e})") from None
        for no, value in enumerate(col.to_pylist(), start=1):
            yield no, value if value is not None else "", value if value is not None else ""
        return
    data = path.read_bytes()
    _check_not_utf16(path, data[:2])
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    for no, raw in enumerate(data.splitlines(), start=1):
        try:
            text = raw.decode("utf-8")
            yield no, text, text
        except UnicodeDecodeError:
            yield no, None, raw.decode("utf-8", errors="replace")


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
        if not (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)):
            raise CorpusError(f"corpus {path}: column `text` is {field.type}, expected a string column")
    else:
        with open(path, "rb") as f:
            _check_not_utf16(path, f.read(2))


def count_lines(path: Path) -> int:
    return sum(1 for _ in read_lines(path))


def split_sentences(path: Path, min_words: int, max_words: int, max_chars: int) -> tuple[pa.Table, pa.Table]:
    """Read and filter the corpus: (sentences sorted by sid, rejected in line order)."""
    kept: dict[int, tuple[str, int, int]] = {}
    rejected: list[tuple[int, str, str]] = []
    for no, text, lossless in read_lines(path):
        if text is None:
            rejected.append((no, lossless, "undecodable"))
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
        rejected.append((no, lossless, reason))
    sids = np.array(sorted(kept), dtype=np.int64)
    sentences = pa.table({
        "sid": sids,
        "text": [kept[s][0] for s in sids.tolist()],
        "n_words": pa.array([kept[s][1] for s in sids.tolist()], pa.int32()),
        "line_no": pa.array([kept[s][2] for s in sids.tolist()], pa.int64()),
    }, schema=SCHEMAS["sentences"])
    rej = pa.table({"line_no": [r[0] for r in rejected], "text": [r[1] for r in rejected],
                    "reason": [r[2] for r in rejected]}, schema=SCHEMAS["rejected"])
    return sentences, rej


def shard_bounds(n_rows: int, n_shards: int) -> list[tuple[int, int]]:
    """Contiguous, near-equal row ranges: shard i of a table sorted by sid."""
    edges = np.linspace(0, n_rows, n_shards + 1).round().astype(int)
    return [(int(edges[i]), int(edges[i + 1])) for i in range(n_shards)]
