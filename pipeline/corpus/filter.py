"""Filtering a corpus into sentences + rejected (the `sentences` and `pool_sentences` stages). Every input record
ends in exactly one of the two. The corpus forms (text, Parquet, JSON Lines, compressed, a folder or glob of them, a
hub dataset) and how each is read in bounded memory: pipeline/corpus/corpus.py.

Text lines are split on \\n, \\r\\n and \\r (as bytes.splitlines), a UTF-8 BOM is dropped, each record is decoded
strictly (undecodable → rejected, with its text decoded with replacement characters so nothing is lost). A record
longer than `max_chars` characters as written is rejected `too_long` before anything else is done to it; the others
get control characters → spaces, NFC and whitespace runs → one space (identity.normalise). Then: empty, too short,
too long (again: NFC can lengthen a line) and exact duplicates (the first occurrence is kept) are rejected with that
reason; a JSON line that gives no text with `not_json`, `no_field` or `not_text`. The sid is the first 8 bytes of
blake2b(text) as a signed int64: stable across runs, machines and shard counts.

`line_no` is a record's number in the whole corpus, from 1, its parts read in order: the same records as one text
file or as a folder of three parts get the same `sentences` table. A rejected row also names its `source` (the
part, as its reader names it) and `source_line` (its line, or row, there), and keeps the record's first
`sentences.rejected_chars` characters in `text` (all of it for any record up to that), its full length (`n_chars`,
`n_bytes`) and `blake2b` (hex, 16 bytes) of its raw bytes, so a cut record is still accounted for.

A run of identical records (the same bytes, one part, one after another: 5M empty lines, a line repeated) is one
`rejected` row: `lines` says how many records it stands for, from its `line_no` (and `source_line`) on; each of them
is the record that row describes, rejected for the same reason. Repeats in any order are bounded too: once
`rejected` has `sentences.rejected_rows` rows (ROWS), a record rejected again in the same part, for the same
reason, is counted in its last row (`lines`) wherever it repeats, and only a record not seen in the part since the
cap adds a row (alternating `a`/`b` lines are ROWS rows, however many there are). Every row's `lines` is still the
records it stands for, so `sentences` rows + sum(rejected.lines) is the corpus' records.

Memory: what grows with the corpus is the output, the kept sentences and the rejected rows (rejected_chars
characters at most each, and TEXT_BYTES (64 MiB) of `text` in all: past them, a row keeps its first 80 characters,
its full length and hash as ever; a run of repeats is one row; past ROWS rows, one row a distinct record of a part),
built whole because the stage hands every shard over at once (one_job). 50,000 distinct lines of 2,100 emoji (0.6 MB
of gzip) kept 8 KB a row: 1.55 GB.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa

from contramine.pipeline.corpus.corpus import Corpus
from contramine.pipeline.corpus.records import CorpusError, LongLine, Refused
from contramine.pipeline.corpus.streams import LONG
from contramine.pipeline.identity import normalise, sentence_id
from contramine.pipeline.schema import SCHEMAS

KEEP = 2000  # sentences.rejected_chars' default: characters of a rejected record kept in `rejected.text`
TEXT_BYTES = 64 << 20  # UTF-8 bytes of `rejected.text` in all; past them, a row keeps its first SHORT characters
SHORT = 80
ROWS = 50_000  # sentences.rejected_rows' default: rejected rows before repeats in any order fold


def as_corpus(corpus: Corpus | Path | str) -> Corpus:
    return corpus if isinstance(corpus, Corpus) else Corpus(str(corpus))


def corpus_of(data, spec) -> Corpus:
    """The corpus `spec` (data.corpus or data.candidates) read as the [data] settings say."""
    if spec is None:
        raise CorpusError("no corpus: give one with --corpus (a file, a folder, a glob or hf:<dataset id>) or set "
                          "data.corpus")
    return Corpus(str(spec), data.text_field, data.hf_split, data.hf_config, data.hf_revision, data.max_expansion,
                  data.outside_links, data.json_line_bytes, data.parquet_page_bytes)


def check_corpus(corpus: Corpus | Path | str) -> None:
    """Raise CorpusError when the corpus cannot be read at all (before any work starts)."""
    as_corpus(corpus).check()


def count_lines(corpus: Corpus | Path | str) -> int:
    """The corpus' records (its parts' counts; a hub dataset's are read through)."""
    corpus = as_corpus(corpus)
    counts = [n for _, n in corpus.sources()]
    if 0 in counts:  # unknown before reading (a dataset), or truly empty: read through
        return sum(1 for _ in corpus.records(LONG, 0))
    return sum(counts)


class _Rejected:
    """The `rejected` rows in record order: the text cut at `keep` characters, the record's full lengths and hash,
    where it came from, and how many identical records it stands for (a run of them; past `cap` rows, also its later
    repeats in its part, wherever they are)."""

    def __init__(self, keep: int, cap: int = ROWS):
        self.cols: dict[str, list] = {name: [] for name in SCHEMAS["rejected"].names}
        self.keep, self.cap = keep, cap
        self.runs = self.cols["lines"]
        self.last: tuple | None = None  # (source, reason, n_bytes, digest) of the last record
        self.next_no = 0                # the line_no a repeat of the last record would have
        self.row = -1                   # the row the last record was counted in
        # past the cap: each record of the current part -> its last row (only that part's: a row names one part)
        self.rows_of: dict[tuple, int] | None = None
        self.part: str | None = None
        self.text_bytes = 0             # UTF-8 bytes of `text` kept so far

    def add(self, no: int, source: str, line: int, raw: bytes | LongLine, text: str, reason: str) -> None:
        if isinstance(raw, LongLine):
            n_chars, n_bytes, digest = raw.n_chars, raw.n_bytes, raw.hash.hexdigest()
        else:
            n_chars, n_bytes, digest = len(text), len(raw), hashlib.blake2b(raw, digest_size=16).hexdigest()
        record = (source, reason, n_bytes, digest)
        if no == self.next_no and self.last == record:  # the same record again: one row
            self.repeat()
            return
        self.last, self.next_no = record, no + 1
        if self.rows_of is not None:
            if source != self.part:
                self.rows_of, self.part = {}, source
            if (at := self.rows_of.get(record)) is not None:  # seen in this part: counted in its last row
                self.runs[at] += 1
                self.row = at
                return
        kept = text[:self.keep]
        size = len(kept) if kept.isascii() else len(kept.encode("utf-8", "surrogatepass"))
        if self.text_bytes + size > TEXT_BYTES:  # the table's text is bounded in bytes too (module doc)
            kept = kept[:SHORT]
            size = len(kept.encode("utf-8", "surrogatepass"))
        self.text_bytes += size
        row = (no, kept, reason, n_chars, n_bytes, digest, source, line, 1)
        for name, v in zip(self.cols, row):
            self.cols[name].append(v)
        self.row = len(self.runs) - 1
        if self.rows_of is not None:
            self.rows_of[record] = self.row
        elif self.cap and len(self.runs) >= self.cap:
            self._fold_from_here(source)

    def _fold_from_here(self, source: str) -> None:
        """The cap is reached: index the current part's rows, each record at its last row."""
        c, self.rows_of, self.part = self.cols, {}, source
        at = len(self.runs) - 1
        while at >= 0 and c["source"][at] == source:
            self.rows_of.setdefault((source, c["reason"][at], c["n_bytes"][at], c["blake2b"][at]), at)
            at -= 1

    def repeat(self) -> None:
        """The last record once more, right after it."""
        self.runs[self.row] += 1
        self.next_no += 1

    def table(self) -> pa.Table:
        return pa.table(self.cols, schema=SCHEMAS["rejected"])


def split_sentences(corpus: Corpus | Path | str, min_words: int, max_words: int, max_chars: int,
                    rejected_chars: int = KEEP, rejected_rows: int = ROWS) -> tuple[pa.Table, pa.Table]:
    """Read and filter the corpus: (sentences sorted by sid, rejected in record order)."""
    corpus = as_corpus(corpus)
    kept: dict[int, tuple[str, int, int]] = {}
    rejected = _Rejected(rejected_chars, rejected_rows)
    # over 4 x max_chars bytes a line has over max_chars characters: too long whatever it holds, never held whole
    records = corpus.records(long_bytes=max(LONG, 4 * max_chars), keep=rejected_chars)
    before: tuple = (None, None, False)  # (source, raw bytes, rejected) of the record before
    for no, (source, line, raw) in enumerate(records, start=1):
        if before[2] and isinstance(raw, bytes) and raw == before[1] and source == before[0]:
            rejected.repeat()  # the same bytes as the rejected record before: the same verdict, the same row
            continue
        before = (source, raw, True)
        if isinstance(raw, Refused):
            rejected.add(no, source, line, raw.raw, raw.raw.decode("utf-8", errors="replace"), raw.reason)
            continue
        if isinstance(raw, LongLine):
            rejected.add(no, source, line, raw, raw.head, "undecodable" if raw.undecodable else "too_long")
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            rejected.add(no, source, line, raw, raw.decode("utf-8", errors="replace"), "undecodable")
            continue
        if len(text) > max_chars:  # by its length as written: a giant line is never normalised
            rejected.add(no, source, line, raw, text, "too_long")
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
                before = (source, raw, False)
                continue
            if kept[sid][0] != clean:  # 64-bit collision: astronomically unlikely, but never silent
                raise CorpusError(f"corpus {corpus.spec}: record {no} and record {kept[sid][2]} share sid {sid}")
            reason = "duplicate"
        rejected.add(no, source, line, raw, text, reason)
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
