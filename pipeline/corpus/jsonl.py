"""The JSON Lines form (.jsonl, .ndjson, .json): one object a line, its string field `data.text_field` the record.
Lines as the text form reads them; a line is parsed whole up to `data.json_line_bytes` (4 MiB; its other fields can
outweigh its text, and an escaped character takes up to 12 bytes), a longer one is read through in pieces, never
held or parsed (parsed, a line of `{}`s takes ~28 times its bytes: 63 KB of gzip took 1.8 GB), and rejected
`too_long`, its `source` and `source_line` naming the file and line. The limit decides which lines are parsed, so it
is in the part's identity (the cache key). A line that gives no text is `Refused`: `not_json` (it does not parse or
is no object), `no_field`, `not_text`.
"""
from __future__ import annotations

import json
from collections.abc import Iterator

from contramine.pipeline.corpus.forms import form
from contramine.pipeline.corpus.records import CorpusError, LongLine, Refused, Value, text_value
from contramine.pipeline.corpus.text import TextReader, file_identity


@form("jsonl", suffixes=(".jsonl", ".ndjson", ".json"))
class JsonLinesReader(TextReader):
    def __init__(self, part, corpus):
        super().__init__(part, corpus)
        self.field, self.line_bytes = corpus.field, corpus.json_line_bytes

    def check(self) -> None:
        if self.head().lstrip()[:1] == b"[":
            raise CorpusError(f"corpus {self.part.path}: a JSON array, not JSON Lines (one object a line): convert "
                              f"it, e.g. with `jq -c '.[]'`")

    def records(self, long_bytes: int, keep: int) -> Iterator[Value]:
        for line in self.lines(self.line_bytes, keep):
            if not isinstance(line, LongLine) and len(line) > self.line_bytes:  # whole in one piece read, still over
                line = LongLine(keep).feed(line).close()
            if isinstance(line, LongLine) or not line.strip():
                yield line  # over the limit: too_long unparsed; a blank line: an empty record
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
        return file_identity(self.part, self.field) + f";json_line_bytes={self.line_bytes}"
