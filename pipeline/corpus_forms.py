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

Here: which files a spec names, a part's records, and `Corpus`. Beside it: corpus_records.py (Part, LongLine, Refused,
CorpusError), corpus_text.py (text and JSON Lines), corpus_parquet.py and corpus_hub.py (a hub dataset).
"""
from __future__ import annotations

import glob
import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pyarrow.parquet as pq

from pipeline.corpus_hub import DATASET_BATCH, HUB, hub_commit, stream_dataset
from pipeline.corpus_parquet import check_parquet_field, parquet_path, parquet_values
from pipeline.corpus_records import JSONL, PARQUET, TEXT, CorpusError, Part, Value, text_value
from pipeline.corpus_text import JSON_LONG, json_values, open_part, read_chunks, text_lines

COUNT_CHUNK = 1 << 24   # bytes read at a time when counting lines
FORMS = {".txt": TEXT, ".text": TEXT, ".jsonl": JSONL, ".ndjson": JSONL, ".json": JSONL, ".parquet": PARQUET}
CODECS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}


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


# ------------------------------------------------------------------------------------------------ reading a part
def part_values(part: Part, field: str, long_bytes: int, keep: int) -> Iterator[Value]:
    if part.form == PARQUET:
        with parquet_path(part) as path:
            check_parquet_field(path, field, part.path)
            yield from parquet_values(path, field, long_bytes, keep)
        return
    with open_part(part) as f:
        if part.form == TEXT:
            yield from text_lines(read_chunks(f, part.path), long_bytes, keep)
        else:
            yield from json_values(text_lines(read_chunks(f, part.path), JSON_LONG, keep), field)


def _check_part(part: Part, field: str) -> None:
    """What can be seen before reading: the file opens (and decompresses), is no UTF-16, a JSON file is no JSON
    array, a Parquet file has the string column."""
    if part.form == PARQUET:
        if not part.codec:
            check_parquet_field(part.path, field, part.path)
        else:
            with open_part(part) as f:
                f.read(4)
        return
    with open_part(part) as f:
        head = next(read_chunks(f, part.path), b"")
    if part.form == JSONL and head.lstrip()[:1] == b"[":
        raise CorpusError(f"corpus {part.path}: a JSON array, not JSON Lines (one object a line): convert it, e.g. "
                          f"with `jq -c '.[]'`")


def _count_part(part: Part) -> int:
    """Records in a part: its lines (a last line without its newline counts), or a Parquet file's rows."""
    if part.form == PARQUET:
        with parquet_path(part) as path:
            return pq.read_metadata(path).num_rows
    stat = part.path.stat()
    return _count_lines(part, stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=4096)
def _count_lines(part: Part, size: int, mtime_ns: int) -> int:
    # (cached per process by size and mtime: every stage flow of a run configures the run, and so counts again;
    # the count only sizes the shards, the content hash decides what is recomputed)
    # line ends as the reader splits them: \n, \r\n and a bare \r (a \r\n cut between two chunks is one end)
    lines, last, first = 0, b"\n", True
    with open_part(part) as f:
        while chunk := f.read(COUNT_CHUNK):
            if first:
                chunk, first = chunk.removeprefix(b"\xef\xbb\xbf"), False
            if not chunk:
                continue
            lines += chunk.count(b"\n") + chunk.count(b"\r") - chunk.count(b"\r\n")
            lines -= last == b"\r" and chunk[:1] == b"\n"
            last = chunk[-1:]
    return lines + (last not in (b"\n", b"\r"))


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
        stream = stream_dataset(self.repo, self.config, self.split, hub_commit(self.repo, self.revision))
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
        for batch in stream_dataset(self.repo, self.config, self.split, commit).iter(batch_size=DATASET_BATCH):
            if self.field not in batch:
                raise CorpusError(f"corpus {self.spec}@{commit[:12]}: a row has no column `{self.field}` (columns: "
                                  f"{', '.join(batch)}); set data.text_field")
            for value in batch[self.field]:
                row += 1
                yield source, row, text_value(value)

    def sources(self) -> list[tuple[str, int]]:
        """(source, records) of each part in reading order; a dataset's count is unknown before it is read (0)."""
        if self.repo is not None:
            return [(f"{HUB}{self.repo}:{self.split}", 0)]
        return [(p.name, _count_part(p)) for p in self.parts()]
