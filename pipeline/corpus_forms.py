"""The corpus forms `data.corpus` (and `data.candidates`) accept, each read as one stream of records in a defined
order, for pipeline/corpus.py to filter into `sentences` and `rejected`.

    "c.txt"             one sentence a line (a single file of any name the forms below do not claim)
    "c.parquet"         the string column `data.text_field` (default `text`), one record a row
    "c.jsonl"           JSON Lines (.jsonl, .ndjson, .json): one object a line, its string field `data.text_field`
    "c.jsonl.gz"        any of these compressed: .gz or .zst (pyarrow's decompressing streams, no other library)
    "parts/"            a folder: every file of these forms under it, by sorted relative path; names starting with
                        `.` or `_` are skipped (.crc, _SUCCESS), any other file is an error (it would be lost)
    "parts/*.jsonl.gz"  a glob (`**` crosses folders): the files it matches, in the same order
    "hf:owner/name"     a Hugging Face dataset, streamed with `datasets` (`data.hf_split`, `data.hf_config`, and
                        `data.hf_revision`: a branch or tag is resolved to its commit once, and that sha is read)

A record is (part, its line in the part from 1, its value): a text line's bytes, a JSON field's or a dataset value's
string as UTF-8, a Parquet value's bytes (a null is an empty record); a value over the long bound is a `LongLine`,
read through in pieces and never held whole; a JSON line that gives no text is `Refused` with the reason
(`not_json`: it does not parse or is no object; `no_field`; `not_text`: the field is no string) and the line's bytes.

Memory: text and JSON Lines are read in CHUNK pieces (a compressed file through its decompressing stream). A JSON
line is held whole up to JSON_LONG bytes (its other fields can outweigh its text, and an escaped character takes up
to 12 bytes), a longer one is read through and rejected `too_long`. Parquet is read in record batches of about
BATCH_BYTES of text, a dictionary-encoded column as its dictionary; a compressed Parquet file (rare: its pages are
compressed already) is first decompressed to a temporary file, since Parquet is read from its end. A dataset is
read in batches of DATASET_BATCH rows.

Identity (the `sentences` stage's key): every file's name and content hash, the field for JSON and Parquet; a
dataset's id, config, split, field and resolved commit. An edit to one part changes the key; each row's model work
is still reused by the row memo wherever its text did not change.
"""
from __future__ import annotations

import codecs
import contextlib
import glob
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.errors import ExpectedError

CHUNK = 1 << 20         # bytes read (or taken from a long Parquet value) at a time
LONG = 1 << 20          # a text line over this many bytes (or 4 x max_chars) is read through in pieces, never whole
JSON_LONG = 64 << 20    # a JSON line is parsed whole up to this many bytes
BATCH_BYTES = 16 << 20  # text bytes per Parquet record batch (from the column chunks' uncompressed sizes)
BATCH_ROWS = 4096       # rows per Parquet record batch at most
DATASET_BATCH = 1000    # rows per batch of a streamed dataset
COUNT_CHUNK = 1 << 24   # bytes read at a time when counting lines

TEXT, JSONL, PARQUET = "text", "jsonl", "parquet"
FORMS = {".txt": TEXT, ".text": TEXT, ".jsonl": JSONL, ".ndjson": JSONL, ".json": JSONL, ".parquet": PARQUET}
CODECS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
HUB = "hf:"


class CorpusError(ExpectedError, ValueError):
    """The corpus cannot be read at all (missing file, wrong format, an unknown dataset); names the file."""


@dataclass(frozen=True)
class Part:
    """One file of a corpus: `name` is how `rejected.source` shows it (its path below the folder or the glob's base;
    a single file's name), `form` text | jsonl | parquet, `codec` gzip | zstd | None."""
    name: str
    path: Path
    form: str
    codec: str | None


@dataclass(frozen=True)
class Refused:
    """A record that gives no text (a JSON line that does not parse, lacks the field or holds no string there)."""
    reason: str
    raw: bytes


class LongLine:
    """A line over the long-line bound, fed piece by piece: its first `keep` characters (`head`), its length in
    characters (undecodable bytes count as the U+FFFD they decode to) and bytes, blake2b of its bytes, and whether
    it decodes as UTF-8. The line itself is never held."""

    def __init__(self, keep: int = 65_536):
        self.hash, self.n_bytes, self.n_chars = hashlib.blake2b(digest_size=16), 0, 0
        self.head, self.undecodable, self.keep = "", False, keep
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
        if len(self.head) < self.keep:
            self.head += text[:self.keep - len(self.head)]
        return self

    def close(self) -> "LongLine":
        return self.feed(b"", final=True)


Value = bytes | LongLine | Refused


# ------------------------------------------------------------------------------------------------ which files
def form_of(path: Path, alone: bool) -> tuple[str, str | None] | None:
    """(form, codec) by the file's suffixes: `c.jsonl.zst` is JSON Lines in zstd. A file given alone whose name no
    form claims is text (as it always was); in a folder or a glob it is None (the caller refuses it)."""
    suffix = path.suffix.lower()
    codec = CODECS.get(suffix)
    inner = Path(path.stem).suffix.lower() if codec else suffix
    form = FORMS.get(inner, TEXT if alone else None)
    return (form, codec) if form else None


def _skipped(relative: str) -> bool:
    return any(p.startswith((".", "_")) for p in relative.split("/"))


def _parts_below(base: Path, paths: list[Path], what: str) -> list[Part]:
    parts = []
    for path in sorted(paths, key=lambda p: p.relative_to(base).as_posix()):
        name = path.relative_to(base).as_posix()
        if _skipped(name):
            continue
        kind = form_of(path, alone=False)
        if kind is None:
            raise CorpusError(f"corpus {what}: {path} is none of the corpus forms (.txt, .jsonl, .ndjson, .json, "
                              f".parquet, each optionally .gz or .zst): a glob can leave it out")
        parts.append(Part(name, path, *kind))
    if not parts:
        raise CorpusError(f"corpus {what}: no corpus files (.txt, .jsonl, .parquet, optionally .gz or .zst) found")
    return parts


def find_parts(spec: str) -> list[Part]:
    """The files of a local corpus, in reading order."""
    if any(c in spec for c in "*?["):
        head = re.split(r"[*?\[]", spec, maxsplit=1)[0]
        base = Path(head if head.endswith(os.sep) else os.path.dirname(head) or ".")
        found = [Path(p) for p in glob.glob(spec, recursive=True) if os.path.isfile(p)]
        return _parts_below(base, found, f"glob {spec}")
    path = Path(spec)
    if path.is_dir():
        found = [Path(d) / f for d, _, files in os.walk(path) for f in files]
        return _parts_below(path, [p for p in found if p.is_file()], f"folder {path}")
    if path.is_file():
        return [Part(path.name, path, *form_of(path, alone=True))]
    raise CorpusError(f"corpus {spec}: no such file or folder")


# ------------------------------------------------------------------------------------------------ reading files
@contextlib.contextmanager
def _stream(part: Part):
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


def _chunks(f, path: Path) -> Iterator[bytes]:
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


def _text_value(value) -> Value:
    """A JSON field's or a dataset's value as a record: a string as UTF-8 (a lone surrogate kept, so the filter
    finds it undecodable), null as an empty record, anything else refused as `not_text`."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if value is None:
        return b""
    return Refused("not_text", json.dumps(value, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass"))


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
            yield _text_value(obj[field])


def _parquet_field(path: Path, field: str, shown: Path) -> None:
    try:
        kind = pq.read_schema(path).field(field).type
    except (KeyError, pa.ArrowInvalid, OSError) as e:
        raise CorpusError(f"corpus {shown}: expected a Parquet file with a string column `{field}` ({e})") from None
    value = kind.value_type if pa.types.is_dictionary(kind) else kind
    if not (pa.types.is_string(value) or pa.types.is_large_string(value)):
        raise CorpusError(f"corpus {shown}: column `{field}` is {kind}, expected a string column")


@contextlib.contextmanager
def _parquet_path(part: Part):
    """The part as a Parquet file on disk: itself, or (compressed) its bytes decompressed to a temporary file."""
    if not part.codec:
        yield part.path
        return
    with tempfile.TemporaryDirectory(prefix="contramine-corpus-") as tmp, _stream(part) as f:
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


def part_values(part: Part, field: str, long_bytes: int, keep: int) -> Iterator[Value]:
    if part.form == PARQUET:
        with _parquet_path(part) as path:
            _parquet_field(path, field, part.path)
            yield from parquet_values(path, field, long_bytes, keep)
        return
    with _stream(part) as f:
        if part.form == TEXT:
            yield from text_lines(_chunks(f, part.path), long_bytes, keep)
        else:
            yield from json_values(text_lines(_chunks(f, part.path), JSON_LONG, keep), field)


def _check_part(part: Part, field: str) -> None:
    """What can be seen before reading: the file opens (and decompresses), is no UTF-16, a JSON file is no JSON
    array, a Parquet file has the string column."""
    if part.form == PARQUET:
        if not part.codec:
            _parquet_field(part.path, field, part.path)
        else:
            with _stream(part) as f:
                f.read(4)
        return
    with _stream(part) as f:
        head = next(_chunks(f, part.path), b"")
    if part.form == JSONL and head.lstrip()[:1] == b"[":
        raise CorpusError(f"corpus {part.path}: a JSON array, not JSON Lines (one object a line): convert it, e.g. "
                          f"with `jq -c '.[]'`")


def _count_part(part: Part) -> int:
    """Records in a part: its lines (a last line without its newline counts), or a Parquet file's rows."""
    if part.form == PARQUET:
        with _parquet_path(part) as path:
            return pq.read_metadata(path).num_rows
    stat = part.path.stat()
    return _count_lines(part, stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=4096)
def _count_lines(part: Part, size: int, mtime_ns: int) -> int:
    # (cached per process by size and mtime: every stage flow of a run configures the run, and so counts again;
    # the count only sizes the shards, the content hash decides what is recomputed)
    # line ends as the reader splits them: \n, \r\n and a bare \r (a \r\n cut between two chunks is one end)
    lines, last, first = 0, b"\n", True
    with _stream(part) as f:
        while chunk := f.read(COUNT_CHUNK):
            if first:
                chunk, first = chunk.removeprefix(b"\xef\xbb\xbf"), False
            if not chunk:
                continue
            lines += chunk.count(b"\n") + chunk.count(b"\r") - chunk.count(b"\r\n")
            lines -= last == b"\r" and chunk[:1] == b"\n"
            last = chunk[-1:]
    return lines + (last not in (b"\n", b"\r"))


# ------------------------------------------------------------------------------------------------ datasets
_REVISIONS: dict[tuple[str, str | None], str] = {}


def hub_commit(repo: str, revision: str | None) -> str:
    """The commit a dataset's revision (None: its default branch) names now, asked once per process."""
    if revision and re.fullmatch(r"[0-9a-f]{40}", revision):
        return revision
    if (repo, revision) not in _REVISIONS:
        try:
            from huggingface_hub import HfApi

            _REVISIONS[repo, revision] = HfApi().dataset_info(repo, revision=revision).sha
        except Exception as e:  # not found, gated, offline (HF_HUB_OFFLINE), no network: one line either way
            why = " ".join(str(e).split())[:300]
            raise CorpusError(f"corpus {HUB}{repo}: cannot resolve dataset revision {revision or 'main'} on the hub "
                              f"({type(e).__name__}: {why})") from None
    return _REVISIONS[repo, revision]


def _stream_dataset(repo: str, config: str | None, split: str, commit: str):
    try:
        from datasets import load_dataset
    except ImportError:
        raise CorpusError(f"corpus {HUB}{repo}: reading a hub dataset needs the `datasets` package "
                          f"(pip install datasets)") from None
    try:
        return load_dataset(repo, config, split=split, streaming=True, revision=commit)
    except Exception as e:
        why = " ".join(str(e).split())[:300]
        raise CorpusError(f"corpus {HUB}{repo}@{commit[:12]}: cannot stream split {split!r}"
                          f"{f' of config {config!r}' if config else ''} ({type(e).__name__}: {why})") from None


# ------------------------------------------------------------------------------------------------ a corpus
@dataclass(frozen=True)
class Corpus:
    """A corpus as the settings name it: `spec` (data.corpus or data.candidates) and how its records are read."""
    spec: str
    field: str = "text"
    split: str = "train"
    config: str | None = None
    revision: str | None = None

    @property
    def repo(self) -> str | None:
        """The dataset id of `hf:owner/name` (or DuckDB's `hf://datasets/owner/name`), else None."""
        if not self.spec.startswith(HUB):
            return None
        return self.spec[len(HUB):].removeprefix("//").removeprefix("datasets/").strip("/")

    def parts(self) -> list[Part]:
        return find_parts(self.spec)

    def check(self) -> None:
        """Raise CorpusError when the corpus cannot be read at all (before any work starts)."""
        if self.repo is None:
            for part in self.parts():
                _check_part(part, self.field)
            return
        stream = _stream_dataset(self.repo, self.config, self.split, hub_commit(self.repo, self.revision))
        columns = list(stream.features) if stream.features is not None else None
        if columns is not None and self.field not in columns:
            raise CorpusError(f"corpus {self.spec}: split {self.split!r} has no column `{self.field}` (columns: "
                              f"{', '.join(columns)}); set data.text_field")

    def identity(self) -> str:
        """What the corpus' records depend on, for the key: every part's name (`rejected.source`), form and content
        hash, the field where a part has fields; or the dataset, its commit, config, split and field."""
        if self.repo is not None:
            return (f"{HUB}{self.repo}@{hub_commit(self.repo, self.revision)};config={self.config};"
                    f"split={self.split};field={self.field}")
        from pipeline.engine.store import file_hash

        parts = self.parts()
        h = hashlib.blake2b(digest_size=16)
        for p in parts:
            h.update(f"{p.name}\0{p.form}\0{p.codec}\0{file_hash(p.path)}\0".encode())
        return h.hexdigest() + (f";field={self.field}" if any(p.form != TEXT for p in parts) else "")

    def records(self, long_bytes: int, keep: int) -> Iterator[tuple[str, int, Value]]:
        """(source, line in the source from 1, value) for every record, parts in order."""
        if self.repo is not None:
            yield from self._dataset_records()
            return
        for part in self.parts():
            for line, value in enumerate(part_values(part, self.field, long_bytes, keep), start=1):
                yield part.name, line, value

    def _dataset_records(self) -> Iterator[tuple[str, int, Value]]:
        commit = hub_commit(self.repo, self.revision)
        source, row = f"{HUB}{self.repo}:{self.split}", 0
        for batch in _stream_dataset(self.repo, self.config, self.split, commit).iter(batch_size=DATASET_BATCH):
            if self.field not in batch:
                raise CorpusError(f"corpus {self.spec}@{commit[:12]}: a row has no column `{self.field}` (columns: "
                                  f"{', '.join(batch)}); set data.text_field")
            for value in batch[self.field]:
                row += 1
                yield source, row, _text_value(value)

    def sources(self) -> list[tuple[str, int]]:
        """(source, records) of each part in reading order; a dataset's count is unknown before it is read (0)."""
        if self.repo is not None:
            return [(f"{HUB}{self.repo}:{self.split}", 0)]
        return [(p.name, _count_part(p)) for p in self.parts()]
