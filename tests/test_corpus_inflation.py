"""Corpora that inflate in memory, not on disk (issue 62): lines repeated in any order (alternating `a`/`b` lines
made a `rejected` row each: +733 MiB for 2M lines), one JSON line of `{}`s (63 KB of gzip parsed into 1.8 GB) and a
Parquet page that decompresses to 512 MB (16 KB on disk: 1.18 GB). Each is bounded by a setting, every record still
accounted for: repeats past `sentences.rejected_rows` rows count in their record's row, a JSON line over
`data.json_line_bytes` is rejected `too_long` unparsed, a page over `data.parquet_page_bytes` is refused in one line
from its header. The real-size cases run in a child that reports its own peak RSS (VmHWM: not inherited across
fork and exec), at default settings."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import contramine.pipeline.corpus.jsonl as jsonl
from contramine.pipeline.corpus import Corpus, CorpusError, count_lines, split_sentences
from contramine.pipeline.corpus.pages import chunk_pages

from child_env import CHILD_PYTHONPATH, ROOT

MIB_KIB = 1 << 10
# tests/data/page_bomb_512mib.parquet (16 KB): one value of 512 MiB of "x", as the issue built it:
#   pq.write_table(pa.table({"text": pa.array([b"x" * (512 << 20)]).cast(pa.string())}), path,
#                  compression="zstd", compression_level=19, use_dictionary=False)
PAGE_BOMB = ROOT / "tests" / "data" / "page_bomb_512mib.parquet"
# split_sentences at default settings in a child, then its own peak RSS in KiB (or the one-line refusal)
CHILD = """
import re, sys
from contramine.pipeline.corpus import Corpus, CorpusError, split_sentences
try:
    kept, rejected = split_sentences(Corpus(sys.argv[1]), 3, 128, 2000)
    print("rows", kept.num_rows, rejected.num_rows, sum(rejected.column("lines").to_pylist()))
except CorpusError as e:
    print("refused", e)
print("peak_kib", re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
"""


def _child(corpus: Path) -> tuple[str, int]:
    """(what the child printed before its peak, its peak RSS in KiB)."""
    r = subprocess.run([sys.executable, "-c", CHILD, str(corpus)], capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": CHILD_PYTHONPATH, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    said, peak = r.stdout.rsplit("peak_kib", 1)
    return said.strip(), int(peak)


def test_lines_repeated_in_any_order_count_in_their_row_past_the_cap(tmp_path):
    """Below `rejected_rows` rows, a row each record or run, as before; past it, a record rejected again in the same
    part adds to its last row's `lines`, wherever it repeats; a record new since the cap, or the same one in another
    part, adds a row. Sentences plus the rows' lines is every record."""
    good = "a sentence that is kept once"
    a_lines = ["a", "b", "a", "", "a", "b", good, "b", "b", "a", "c", good, "c", "a"]
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "a.txt").write_text("\n".join(a_lines) + "\n")
    (tmp_path / "parts" / "b.txt").write_text("a\nb\na\n")
    corpus = Corpus(str(tmp_path / "parts"))
    kept, rejected = split_sentences(corpus, 3, 20, 200, rejected_rows=4)
    rows = [(r["line_no"], r["source"], r["source_line"], r["reason"], r["text"], r["lines"])
            for r in rejected.to_pylist()]
    # the cap is reached at line 4: `a` counts on in its last row (line 3), `b` in its only one
    assert rows == [(1, "a.txt", 1, "too_short", "a", 1), (2, "a.txt", 2, "too_short", "b", 4),
                    (3, "a.txt", 3, "too_short", "a", 4), (4, "a.txt", 4, "empty", "", 1),
                    (11, "a.txt", 11, "too_short", "c", 2), (12, "a.txt", 12, "duplicate", good, 1),
                    (15, "b.txt", 1, "too_short", "a", 2), (16, "b.txt", 2, "too_short", "b", 1)]
    assert kept.column("text").to_pylist() == [good]
    assert kept.num_rows + sum(r[-1] for r in rows) == count_lines(corpus) == len(a_lines) + 3
    # 0: no cap, a row each occurrence that does not follow itself, as before the cap existed
    _, uncapped = split_sentences(corpus, 3, 20, 200, rejected_rows=0)
    assert uncapped.num_rows == 15 and set(uncapped.column("lines").to_pylist()) == {1, 2}
    assert uncapped.slice(0, 4).equals(rejected.slice(0, 4).set_column(
        8, "lines", pa.array([1, 1, 1, 1], pa.int64())))


def test_alternating_lines_are_a_bounded_table_at_default_settings(tmp_path):
    """150,000 lines of `a` and `b` in turn: the default 50,000 rows, not 150,000; all lines accounted for."""
    path = tmp_path / "alt.txt.gz"
    with pa.CompressedOutputStream(str(path), "gzip") as out:
        out.write(b"a\nb\n" * 75_000)
    kept, rejected = split_sentences(Corpus(str(path)), 3, 128, 2000)
    assert kept.num_rows == 0 and rejected.num_rows == 50_000
    assert sum(rejected.column("lines").to_pylist()) == 150_000
    assert rejected.slice(49_998).select(["line_no", "text", "lines"]).to_pylist() == [
        {"line_no": 49_999, "text": "a", "lines": 50_001}, {"line_no": 50_000, "text": "b", "lines": 50_001}]


def test_a_json_line_over_the_limit_is_rejected_unparsed(tmp_path, monkeypatch):
    """A line over `data.json_line_bytes` is `too_long` without being parsed, even when it holds a good sentence,
    its file and line named; the lines around it are parsed. The limit is in the part's identity (the cache key)."""
    parsed = []
    monkeypatch.setattr(jsonl.json, "loads", lambda text: parsed.append(len(text)) or json.JSONDecoder().decode(text))
    good = {"text": "a sentence of the json corpus"}
    over = {"text": "another sentence that is fine", "x": [{}] * 40}
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps(o) for o in (good, over, {"text": "the last sentence here"})) + "\n")
    kept, rejected = split_sentences(Corpus(str(path), json_line_bytes=100), 3, 20, 200)
    assert sorted(kept.column("text").to_pylist()) == ["a sentence of the json corpus", "the last sentence here"]
    assert rejected.select(["line_no", "reason", "source", "source_line", "n_bytes"]).to_pylist() == [
        {"line_no": 2, "reason": "too_long", "source": "c.jsonl", "source_line": 2, "n_bytes": len(json.dumps(over))}]
    assert all(n <= 100 for n in parsed) and len(parsed) == 2
    assert Corpus(str(path), json_line_bytes=100).identity() != Corpus(str(path)).identity()
    kept, _ = split_sentences(Corpus(str(path)), 3, 20, 200)  # at the default, the line is parsed and kept
    assert kept.num_rows == 3


def test_a_json_line_of_braces_stays_under_500_mb(tmp_path):
    """The issue's case: one line of 20M `{}`s (60 MiB, ~110 KB of gzip with its noise, inside the 1000x cap): it
    took 1.8 GB parsed; now rejected `too_long` read through in pieces, the line accounted for."""
    path = tmp_path / "braces.jsonl.gz"
    with pa.CompressedOutputStream(str(path), "gzip") as out:
        out.write(b'{"text": "one line", "pad": "' + random.Random(62).randbytes(40_000).hex().encode() + b'", "x": [')
        for _ in range(20):
            out.write(b"{}," * (1 << 20))
        out.write(b"{}]}\n")
    said, peak = _child(path)
    assert said == "rows 0 1 1" and peak < 500 * MIB_KIB, (said, peak)
    print(f"a 60 MiB JSON line of {{}}s: peak RSS {peak // MIB_KIB} MiB")


def test_a_parquet_page_over_the_limit_is_one_line_from_its_header(tmp_path):
    """A page over `data.parquet_page_bytes` is refused before it is decoded, naming the file, the row group and the
    column, when the corpus is checked and when it is read; under the limit the same file reads."""
    value = "x" * (2 << 20)
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "text": ["a first kept sentence", value, "the last kept one"]}), path,
                   compression="zstd", use_dictionary=False, row_group_size=2)
    assert path.stat().st_size < 10_000
    small = Corpus(str(path), parquet_page_bytes=1 << 20)
    for call in (lambda: small.check(), lambda: split_sentences(small, 3, 20, 200)):
        with pytest.raises(CorpusError, match=r"c.parquet: row group 0, column `text`: a data page at byte \d+ "
                                              r"decompresses to \d+ bytes, over data.parquet_page_bytes=1048576"):
            call()
    kept, rejected = split_sentences(Corpus(str(path)), 3, 20, 200)
    assert kept.num_rows == 2 and rejected.select(["line_no", "reason", "n_bytes"]).to_pylist() == [
        {"line_no": 2, "reason": "too_long", "n_bytes": len(value)}]


def test_a_parquet_page_of_512_mib_in_16_kb_stays_under_500_mb():
    """The issue's file: it took 1.18 GB to read; refused in one line at once."""
    assert PAGE_BOMB.stat().st_size < 20_000
    said, peak = _child(PAGE_BOMB)
    assert said.startswith(f"refused corpus {PAGE_BOMB}: row group 0, column `text`: a data page at byte 4 "
                           f"decompresses to 536870922 bytes, over data.parquet_page_bytes=67108864"), said
    assert peak < 500 * MIB_KIB, peak
    print(f"a 512 MiB Parquet page in 16 KB: peak RSS {peak // MIB_KIB} MiB")


def test_a_broken_parquet_page_header_is_one_line(tmp_path):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": ["a first kept sentence", "the last kept one"]}), path)
    start = pq.read_metadata(path).row_group(0).column(0).dictionary_page_offset
    data = bytearray(path.read_bytes())
    data[start:start + 12] = b"\x0f" * 12  # field headers of an unknown type
    path.write_bytes(bytes(data))
    with pytest.raises(CorpusError, match=r"c.parquet: row group 0, column `text`: the page header at byte 4 does "
                                          r"not parse"):
        split_sentences(Corpus(str(path)), 3, 20, 200)


def test_parquet_pages_garbled_at_random_are_one_line(tmp_path):
    """Random bytes over a page header or inside a page: the headers' reader or the page's decoding says so in one
    line naming the file; nothing else escapes, and nothing hangs."""
    clean = tmp_path / "clean.parquet"
    pq.write_table(pa.table({"text": [f"sentence number {i} of the file" for i in range(3000)]}), clean,
                   data_page_size=4096, write_batch_size=100, use_dictionary=False)
    chunk = pq.read_metadata(clean).row_group(0).column(0)
    with open(clean, "rb") as f:
        headers = [page.offset for page in chunk_pages(f, chunk, "clean")]
    assert len(headers) > 10
    rng, data = random.Random(62), clean.read_bytes()
    for trial in range(40):  # half over a header, half anywhere in the chunk
        at = rng.choice(headers) + rng.randrange(8) if trial % 2 else \
            rng.randrange(chunk.data_page_offset, chunk.data_page_offset + chunk.total_compressed_size - 16)
        path = tmp_path / f"c{trial}.parquet"
        path.write_bytes(data[:at] + rng.randbytes(16) + data[at + 16:])
        try:
            split_sentences(Corpus(str(path)), 3, 20, 200)
        except CorpusError as e:
            assert f"c{trial}.parquet" in str(e) and "\n" not in str(e)
