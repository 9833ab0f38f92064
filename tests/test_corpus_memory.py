"""Memory follows the tables, not the corpus file or its longest line: a 200 MB line and a 20 MB Parquet value
repeated in 200 rows are mined through the CLI (in a subprocess that reports its own peak RSS), each with every line
accounted for; a line is rejected for its length before it is normalised."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import contramine.pipeline.corpus.filter as corpus
import contramine.pipeline.corpus.streams as streams
from contramine.pipeline.corpus import KEEP, split_sentences
from contramine.pipeline.storage.tables import RunTables

from child_env import CHILD_PYTHONPATH
from mining_helpers import _cli_env

GIB_KIB = 1 << 20  # VmHWM is in KiB
BEFORE = ["the first normal line of this corpus", "another normal line before the long one"]
AFTER = ["the last normal line of the corpus", "and one more after it for good measure"]
# the CLI in this process, then its own peak RSS: VmHWM of its own address space (ru_maxrss would not do: it is
# inherited across fork and exec, so a child of a pytest worker that has grown to 1.5 GB starts at 1.5 GB)
PEAK = ("import re, sys\nfrom contramine.flows.cli import main\ncode = main(sys.argv[1:])\n"
        "hwm = re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1)\n"
        "print('peak_kib', hwm)\nsys.exit(code)")
OFFLINE = ["encoder.model=standin:encoder-384", "backtranslate.chains=[]", "run.shards=2"]


def _stage_peak_kib(stage: str, corpus_path, root, *sets: str) -> int:
    argv = ["stage", stage, "--run", "big", "--corpus", str(corpus_path), "--set", *OFFLINE, f"run.root={root}", *sets]
    r = subprocess.run([sys.executable, "-c", PEAK, *argv], env=_cli_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    peak = int(r.stdout.split("peak_kib")[-1].split()[0])
    print(f"{stage} on {corpus_path.name}: peak RSS {peak / 1024:.0f} MiB")  # pytest -s shows it
    return peak


@pytest.mark.usefixtures("prefect_harness")
def test_a_200mb_line_is_read_through_not_held(tmp_path):
    words = b"lorem ipsum dolor sit amet consectetur adipiscing elit "
    piece = (words * ((1 << 20) // len(words) + 1))[:1 << 20]
    digest, path = hashlib.blake2b(digest_size=16), tmp_path / "one_long_line.txt"
    with open(path, "wb") as f:  # 200 x 1 MiB, never one 200 MB string
        f.write("\n".join(BEFORE).encode() + b"\n")
        for _ in range(200):
            f.write(piece)
            digest.update(piece)
        f.write(b"\r\n" + "\n".join(AFTER).encode() + b"\n")
    try:
        peak = _stage_peak_kib("sentences", path, tmp_path / "runs")
    finally:
        path.unlink()
    assert peak < GIB_KIB, f"peak RSS {peak / 1024:.0f} MiB"  # it was 3.6 GB when the line was read whole
    tables = RunTables(tmp_path / "runs" / "big")
    assert sorted(tables.read("sentences").column("text").to_pylist()) == sorted(BEFORE + AFTER)
    assert tables.read("rejected").to_pylist() == [{
        "line_no": 3, "text": (piece * 2)[:KEEP].decode(), "reason": "too_long", "n_chars": 200 << 20,
        "n_bytes": 200 << 20, "blake2b": digest.hexdigest(), "source": "one_long_line.txt", "source_line": 3,
        "lines": 1}]


@pytest.mark.usefixtures("prefect_harness")
def test_a_dictionary_encoded_parquet_value_is_not_expanded(tmp_path):
    """One 20 MB value in 200 rows: 4 GB once expanded; the Parquet file holds it once (a dictionary page), and
    so does each record batch read from it. Read as `data.candidates` by `pool_sentences` (same reader)."""
    big = ("a long value that repeats " * 800_000)[:20_000_000]
    values = pa.array([BEFORE[0], big, BEFORE[1], AFTER[0], AFTER[1]])
    rows = [1] * 100 + [0, 2, None, 3] + [1] * 100 + [4]
    path = tmp_path / "candidates.parquet"
    # without the Arrow schema, as Spark or DuckDB write it: pyarrow would read `text` back as plain strings
    pq.write_table(pa.table({"text": pa.DictionaryArray.from_arrays(pa.array(rows, pa.int32()), values)}), path,
                   store_schema=False)
    assert path.stat().st_size < 2_000_000 and pq.read_schema(path).field("text").type == pa.string()
    peak = _stage_peak_kib("pool_sentences", path, tmp_path / "runs", f"data.candidates={path}")
    assert peak < GIB_KIB, f"peak RSS {peak / 1024:.0f} MiB"
    tables = RunTables(tmp_path / "runs" / "big")
    assert sorted(tables.read("pool_sentences").column("text").to_pylist()) == sorted(BEFORE + AFTER)
    rejected = tables.read("pool_rejected")
    # each run of 100 rows of the value is one row standing for 100 (pipeline/corpus/filter.py)
    assert sum(rejected.column("lines").to_pylist()) == len(rows) - 4
    long = [r for r in rejected.to_pylist() if r["reason"] == "too_long"]
    assert [(r["line_no"], r["lines"]) for r in long] == [(1, 100), (105, 100)]
    assert {(r["text"], r["n_chars"], r["n_bytes"], r["blake2b"]) for r in long} == \
        {(big[:KEEP], len(big), len(big), hashlib.blake2b(big.encode(), digest_size=16).hexdigest())}
    assert [r["reason"] for r in rejected.to_pylist() if r["line_no"] == 103] == ["empty"]  # the null row


def test_a_line_is_rejected_for_its_length_before_it_is_normalised(tmp_path, monkeypatch):
    """Padded with spaces, the line would shrink to 5 words; over max_chars as written, it is `too_long` and never
    reaches normalise. A line just inside the limit is normalised and kept."""
    seen = []
    real = corpus.normalise
    monkeypatch.setattr(corpus, "normalise", lambda text: seen.append(len(text)) or real(text))
    padded = "five words in this line" + " " * 300
    inside = "five words in this   line".ljust(200)
    path = tmp_path / "c.txt"
    path.write_text(f"{padded}\n{inside}\n", encoding="utf-8")
    kept, rejected = split_sentences(path, 3, 20, 200)
    assert rejected.select(["line_no", "reason", "n_chars"]).to_pylist() == [
        {"line_no": 1, "reason": "too_long", "n_chars": len(padded)}]
    assert rejected.column("text").to_pylist() == [padded]
    assert kept.column("text").to_pylist() == ["five words in this line"]
    assert seen == [200]


def test_long_lines_read_in_pieces_match_the_whole_line(tmp_path, monkeypatch):
    """Tiny pieces and bounds: a long line cut across pieces (and \\r\\n split between two) gives the same text,
    lengths and hash as the whole line; an undecodable long line is `undecodable`; line numbers stay right."""
    monkeypatch.setattr(streams, "CHUNK", 7)
    monkeypatch.setattr(corpus, "LONG", 16)
    long_ok = "é".join(["word"] * 20).encode()  # 99 characters, 118 bytes
    long_bad = b"x" * 30 + b"\xff" + b"y" * 30
    lines = [b"one two three", long_ok, b"", long_bad, b"four five six", long_ok]
    path = tmp_path / "c.txt"
    path.write_bytes(b"\r\n".join(lines) + b"\r")
    kept, rejected = split_sentences(path, 3, 20, 4, rejected_chars=10)
    assert kept.num_rows == 0 and rejected.column("line_no").to_pylist() == [1, 2, 3, 4, 5, 6]
    got = {r["line_no"]: r for r in rejected.to_pylist()}
    for no in (2, 6):
        assert got[no]["reason"] == "too_long" and got[no]["text"] == long_ok.decode()[:10]
        assert (got[no]["n_chars"], got[no]["n_bytes"]) == (len(long_ok.decode()), len(long_ok))
        assert got[no]["blake2b"] == hashlib.blake2b(long_ok, digest_size=16).hexdigest()
    assert got[4]["reason"] == "undecodable" and got[4]["n_chars"] == 61 and got[4]["n_bytes"] == 61
    assert got[4]["blake2b"] == hashlib.blake2b(long_bad, digest_size=16).hexdigest()
    assert [got[no]["reason"] for no in (1, 3, 5)] == ["too_long", "empty", "too_long"]


SPLIT_PEAK = ("import re, sys\nfrom contramine.pipeline.corpus import Corpus, split_sentences\n"
              "kept, rejected = split_sentences(Corpus(sys.argv[1]), 3, 128, 2000)\n"
              "print(kept.num_rows, sum(rejected.column('lines').to_pylist()),\n"
              "      re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1))")


def test_a_batch_holds_one_row_groups_dictionary_and_a_footer_is_bounded(tmp_path, monkeypatch):
    """8 row groups, each a dictionary page of 32 distinct 1 MiB values (8 MiB of zstd in all): a record batch
    across row groups held every group's page at once (1.45 GB at 16 groups of 60 MiB); a row group at a time holds
    one. A footer over the reader's bound (a file of ~100,000 row groups) is one line before it is parsed."""
    path = tmp_path / "dict8.parquet"
    with pq.ParquetWriter(path, pa.schema([("text", pa.dictionary(pa.int32(), pa.string()))]), compression="zstd",
                          dictionary_pagesize_limit=1 << 30) as w:
        for g in range(8):
            values = pa.array([f"{g:02d}-{i:02d} " + "x" * ((1 << 20) - 6) for i in range(32)])
            w.write_table(pa.table({"text": values.dictionary_encode()}), row_group_size=32)
    r = subprocess.run([sys.executable, "-c", SPLIT_PEAK, str(path)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": CHILD_PYTHONPATH})
    kept, lines, peak_kib = map(int, r.stdout.split())
    assert (kept, lines) == (0, 256), r.stderr[-2000:]  # every row accounted for: rejected as too long
    assert peak_kib < 400 << 10, f"peak RSS {peak_kib >> 10} MiB"
    import contramine.pipeline.corpus.parquet as parquet
    monkeypatch.setattr(parquet, "FOOTER_BYTES", 100)
    with pytest.raises(corpus.CorpusError, match="a Parquet footer of [0-9,]+ bytes, over 100 "):
        split_sentences(corpus.Corpus(str(path)), 3, 128, 2000)
