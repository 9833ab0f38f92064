"""The reader protocol every corpus form implements, and the registry that maps a file suffix (or a spec's scheme,
`hf:`) to its reader, as datatrove's readers do. A new form is one file holding its reader class, decorated with
`@form(...)`, plus its module's name in `pipeline/corpus/__init__.py`'s import of the readers.

A reader reads one part of a corpus (a file; or a whole hub split) as one stream of records:

    name        how `rejected.source` shows the part (its path below the folder or glob, `hf:<id>:<split>`)
    check()     raise CorpusError when it cannot be read at all (before any work starts)
    count()     its records (a text file's lines, a Parquet file's rows); 0 when unknown before it is read
    records(long_bytes, keep)   its values in order: bytes, a LongLine over long_bytes, a Refused record
    identity()  what its records depend on (for the `sentences` key): the file's name, form and content hash, the
                field where it has fields; a dataset's commit, config, split and field
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Literal, Protocol, overload

from contramine.pipeline.corpus.records import Part, Value

SUFFIXES: dict[str, FileReaderClass] = {}   # ".jsonl" -> its reader class (a file's form by its suffix, any codec)
SCHEMES: dict[str, SchemeReaderClass] = {}  # "hf:" -> a reader class whose `open(corpus)` gives the spec's readers
CODECS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
ALONE = "text"                   # the form of a single file whose name no form claims (as it always was)


class Reader(Protocol):
    name: str

    def check(self) -> None: ...
    def count(self) -> int: ...
    def records(self, long_bytes: int, keep: int) -> Iterator[Value]: ...
    def identity(self) -> str: ...


class FileReaderClass(Protocol):  # a file form's reader class, as @form registers it
    form: str

    def __call__(self, part: Part, corpus) -> Reader: ...


class SchemeReaderClass(Protocol):  # a scheme's reader class (hf:)
    def open(self, corpus) -> list[Reader]: ...


def form(name: str, suffixes: tuple[str, ...] = (), scheme: str | None = None):
    """Register a reader class as form `name`: for files ending in `suffixes` (each optionally .gz or .zst), or for
    specs starting with `scheme`. A file reader is built as cls(part, corpus); a scheme reader's classmethod
    `open(corpus)` returns its readers."""
    def register(cls):
        cls.form = name
        SUFFIXES.update({s: cls for s in suffixes})
        if scheme:
            SCHEMES[scheme] = cls
        return cls
    return register


def names() -> str:
    """The file forms, for messages: `.txt, .jsonl, ..., each optionally .gz or .zst`."""
    return ", ".join(SUFFIXES) + ", each optionally " + " or ".join(dict.fromkeys(c for c in CODECS if c != ".zstd"))


@overload
def form_of(path, alone: Literal[True]) -> tuple[str, str | None]: ...
@overload
def form_of(path, alone: bool) -> tuple[str, str | None] | None: ...


def form_of(path, alone: bool) -> tuple[str, str | None] | None:
    """(form, codec) by the file's suffixes: `c.jsonl.zst` is JSON Lines in zstd. A file given alone whose name no
    form claims is text; in a folder or a glob it is None (the caller refuses it)."""
    suffix = Path(path).suffix.lower()
    codec = CODECS.get(suffix)
    inner = Path(Path(path).stem).suffix.lower() if codec else suffix
    cls = SUFFIXES.get(inner)
    name = cls.form if cls else (ALONE if alone else None)
    return (name, codec) if name else None


def reader_of(part: Part, corpus) -> Reader:
    """The reader of a file part (`corpus`: the Corpus whose settings it reads by)."""
    cls = next(c for c in SUFFIXES.values() if c.form == part.form)
    return cls(part, corpus)


def scheme_of(spec: str) -> SchemeReaderClass | None:
    return next((cls for s, cls in SCHEMES.items() if spec.startswith(s)), None)
