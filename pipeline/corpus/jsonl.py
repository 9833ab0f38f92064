"""The JSON Lines form (.jsonl, .ndjson, .json): one object a line, its string field `data.text_field` the record.
Lines as the text form reads them; a line is parsed whole up to JSON_LONG bytes (its other fields can outweigh its
text, and an escaped character takes up to 12 bytes), a longer one is read through and rejected `too_long`. A line
that gives no text is `Refused`: `not_json` (it does not parse or is no object), `no_field`, `not_text`.
"""
from __future__ import annotations

import json
from collections.abc import Iterator

from contramine.pipeline.corpus.forms import form
from contramine.pipeline.corpus.records import CorpusError, LongLine, Refused, Value, text_value
from contramine.pipeline.corpus.text import TextReader, file_identity

JSON_LONG = 64 << 20    # a JSON line is parsed whole up to this many bytes


@form("jsonl", suffixes=(".jsonl", ".ndjson", ".json"))
class JsonLinesReader(TextReader):
    def __init__(self, part, corpus):
        super().__init__(part, corpus)
        self.field = corpus.field

    def check(self) -> None:
        if self.head().lstrip()[:1] == b"[":
            raise CorpusError(f"corpus {self.part.path}: a JSON array, not JSON Lines (one object a line): convert "
                              f"it, e.g. with `jq -c '.[]'`")

    def records(self, long_bytes: int, keep: int) -> Iterator[Value]:
        for line in self.lines(JSON_LONG, keep):
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
            elif self.field not in obj:
                yield Refused("no_field", line)
            else:
                yield text_value(obj[self.field])

    def identity(self) -> str:
        return file_identity(self.part, self.field)
