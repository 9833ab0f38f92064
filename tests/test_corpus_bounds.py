"""Bounded corpora (issue 52): a few hundred compressed bytes that expand to millions of empty lines, or to a GB of
zeros, end in bounded time and memory with a small run folder, or are refused in one line naming the file and the
setting that lifts the cap (`data.max_expansion`); a run of one record repeated is one `rejected` row that counts
them; a compressed Parquet file is checked for Parquet's magic bytes before anything is written to disk."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contramine.pipeline.corpus import Corpus, CorpusError, count_lines, split_sentences
from contramine.pipeline.storage.tables import RunTables

from mining_helpers import _cli_env

OFFLINE = ["encoder.model=standin:encoder-384", "backtranslate.chains=[]", "run.shards=2"]
# the CLI, then its own peak RSS (VmHWM: its own address space, not inherited across fork and exec)
PEAK = ("import re, sys\nfrom contramine.flows.cli import main\ncode = main(sys.argv[1:])\n"
        "hwm = re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1)\n"
        "print('peak_kib', hwm)\nsys.exit(code)")


def _zst(path, piece: bytes, times: int):
    with pa.CompressedOutputStream(str(path), "zstd") as out:
        for _ in range(times):
            out.write(piece)
    return path


def _stage(corpus, root, *sets: str, env: dict | None = None) -> subprocess.CompletedProcess:
    argv = ["stage", "sentences", "--run", "bomb", "--corpus", str(corpus), "--set", *OFFLINE, f"run.root={root}",
            *sets]
    return subprocess.run([sys.executable, "-c", PEAK, *argv], env=_cli_env(**(env or {})), capture_output=True,
                          text=True, timeout=300)


def _folder_bytes(path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


@pytest.mark.usefixtures("prefect_harness")
def test_millions_of_compressed_empty_lines_are_refused_or_one_row(tmp_path):
    """The issue's case: ~200 bytes of zstd, 5M newlines (it made 5M `rejected` rows, 1.95 GB RSS, a 485 MB table).
    By default refused in one line naming the file and data.max_expansion; with the cap lifted, one row for 5M."""
    bomb = _zst(tmp_path / "c.txt.zst", b"\n" * (1 << 20), 5)
    assert bomb.stat().st_size < 400
    r = _stage(bomb, tmp_path / "runs")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    line = [x for x in r.stderr.splitlines() if "c.txt.zst" in x]
    assert len(line) == 1 and "data.max_expansion=1000" in line[0] and "decompresses to over" in line[0], r.stderr

    t0 = time.monotonic()
    r = _stage(bomb, tmp_path / "lifted", "data.max_expansion=0")
    seconds = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    peak_kib = int(r.stdout.split("peak_kib")[-1].split()[0])
    rejected = RunTables(tmp_path / "lifted" / "bomb").read("rejected").to_pylist()
    assert [(x["line_no"], x["reason"], x["lines"], x["source_line"], x["n_bytes"]) for x in rejected] == [
        (1, "empty", 5 << 20, 1, 0)]  # every line accounted for, in one row
    assert peak_kib < 1 << 20 and _folder_bytes(tmp_path / "lifted") < 50 << 20 and seconds < 120, \
        (peak_kib, _folder_bytes(tmp_path / "lifted"), seconds)
    print(f"5M empty lines, cap lifted: {seconds:.1f} s, peak RSS {peak_kib >> 10} MiB")


@pytest.mark.usefixtures("prefect_harness")
def test_a_compressed_gb_of_zeros_is_refused_before_it_is_written(tmp_path):
    """A .parquet.zst of zeros (it wrote 945 MB to the temporary folder, then failed with a misleading message):
    refused in one line on its first 4 bytes, nothing written to the temporary folder; as text, refused at the cap."""
    zeros = b"\0" * (1 << 24)
    parquet = _zst(tmp_path / "c.parquet.zst", zeros, 64)  # 1 GiB
    text = _zst(tmp_path / "z.txt.zst", zeros, 64)
    assert parquet.stat().st_size < 100_000
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = _stage(parquet, tmp_path / "runs", env={"TMPDIR": str(tmp)})
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "c.parquet.zst: decompressed, it is no Parquet file" in r.stderr, r.stderr[-2000:]
    assert _folder_bytes(tmp) == 0
    with pytest.raises(CorpusError, match=r"z.txt.zst: decompresses to over 1000 times its \d+ bytes"):
        split_sentences(text, 3, 20, 200)


def test_a_parquet_file_of_a_million_null_rows_is_checked_from_its_footer(tmp_path):
    """Parquet compresses on its own: a million null rows take a few KB (pyarrow's writer: ~500 rows a byte). Its
    footer's row count is checked against the file's size before a row is read; read, they are one row."""
    path = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"text": pa.nulls(1_000_000, pa.string())}), path)
    assert path.stat().st_size < 10_000
    for call in (lambda c: c.check(), lambda c: split_sentences(c, 3, 20, 200), count_lines):
        with pytest.raises(CorpusError, match=r"nulls.parquet: 1000000 rows in \d+ bytes, over "
                                              r"data.max_expansion=100 rows a byte"):
            call(Corpus(str(path), max_expansion=100))
    kept, rejected = split_sentences(Corpus(str(path)), 3, 20, 200)
    assert kept.num_rows == 0 and rejected.select(["line_no", "reason", "lines"]).to_pylist() == [
        {"line_no": 1, "reason": "empty", "lines": 1_000_000}]


def test_a_compressed_parquet_file_is_still_read(tmp_path):
    table = pa.table({"text": ["the first sentence of the file", "x", "the second sentence of the file"]})
    pq.write_table(table, tmp_path / "c.parquet")
    _zst(tmp_path / "c.parquet.zst", (tmp_path / "c.parquet").read_bytes(), 1)
    want = split_sentences(tmp_path / "c.parquet", 3, 20, 200)
    got = split_sentences(Corpus(str(tmp_path / "c.parquet.zst")), 3, 20, 200)
    assert got[0].equals(want[0]) and got[1].drop(["source"]).equals(want[1].drop(["source"]))


def test_a_run_of_one_record_repeated_is_one_row_that_counts_it(tmp_path):
    """Identical records one after another (same bytes, same part) are one row: `lines` records from its line_no
    on, each the record the row describes; different records, or the same one in another part, start a row.
    Sentences plus the rows' lines is every record of the corpus."""
    good = "a sentence that is kept once"
    lines = ["", "", "", "  ", "  ", "too short", "too short", good, good, good, "", "too short", "", ""]
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "a.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "parts" / "b.txt").write_text("\n\n" + good + "\n")
    kept, rejected = split_sentences(Corpus(str(tmp_path / "parts")), 3, 20, 200)
    assert kept.column("text").to_pylist() == [good]
    rows = [(r["line_no"], r["source"], r["source_line"], r["reason"], r["text"], r["lines"])
            for r in rejected.to_pylist()]
    assert rows == [(1, "a.txt", 1, "empty", "", 3), (4, "a.txt", 4, "empty", "  ", 2),
                    (6, "a.txt", 6, "too_short", "too short", 2), (9, "a.txt", 9, "duplicate", good, 2),
                    (11, "a.txt", 11, "empty", "", 1), (12, "a.txt", 12, "too_short", "too short", 1),
                    (13, "a.txt", 13, "empty", "", 2), (15, "b.txt", 1, "empty", "", 2),
                    (17, "b.txt", 3, "duplicate", good, 1)]
    assert kept.num_rows + sum(r[-1] for r in rows) == count_lines(tmp_path / "parts") == len(lines) + 3


def test_the_rejected_texts_are_bounded_in_bytes_in_all(tmp_path, monkeypatch):
    """Distinct lines of 2,100 emoji, each cut at 2,000 characters (8 KB): 50,000 of them kept 400 MB of text (1.55
    GB at peak). Past the table's byte bound a row keeps its first 80 characters; its length and hash, and every
    line's count, are as before."""
    import hashlib

    import contramine.pipeline.corpus.filter as corpus_filter

    monkeypatch.setattr(corpus_filter, "TEXT_BYTES", 40_000)  # five rows' 8 KB, then 80 characters a row
    lines = [f"{i} " + "\U0001F600" * 2100 for i in range(20)]
    path = tmp_path / "emoji.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    kept, rejected = split_sentences(Corpus(str(path)), 3, 128, 2000)
    rows = rejected.to_pylist()
    assert kept.num_rows == 0 and sum(r["lines"] for r in rows) == 20
    assert [len(r["text"]) for r in rows] == [2000] * 5 + [80] * 15
    assert all(r["text"] == line[:len(r["text"])] and r["n_chars"] == len(line) and
               r["blake2b"] == hashlib.blake2b(line.encode(), digest_size=16).hexdigest() for r, line in zip(rows, lines))
