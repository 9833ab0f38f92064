"""Stage `sentences`: every input line ends in `sentences` or in `rejected` with a reason."""
import hashlib

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contramine.pipeline.corpus import check_corpus, count_lines, shard_bounds, split_sentences
from contramine.pipeline.identity import sentence_id


def _split(tmp_path, data: bytes, **kw):
    p = tmp_path / "c.txt"
    p.write_bytes(data)
    args = dict(min_words=3, max_words=20, max_chars=200) | kw
    return p, *split_sentences(p, **args)


def test_every_line_is_kept_or_rejected_with_a_reason(tmp_path):
    data = ("\ufeffthe first good sentence here\r\n"   # BOM + CRLF
            "\n"                                       # empty
            "   \t  \n"                                # whitespace only
            "too short\r"                              # CR line ending
            "the  first good   sentence here\n"        # duplicate after whitespace normalisation
            "a control\x07 character sentence\n"
            + "word " * 30 + "\n").encode() + b"bad \xff\xfe bytes in this line\n" + "مرحبا بالعالم يا صديقي 😀\n".encode()
    path, kept, rej = _split(tmp_path, data)
    assert kept.num_rows + rej.num_rows == count_lines(path) == 9
    reasons = dict(zip(rej.column("line_no").to_pylist(), rej.column("reason").to_pylist()))
    assert reasons == {2: "empty", 3: "empty", 4: "too_short", 5: "duplicate", 7: "too_long", 8: "undecodable"}
    texts = set(kept.column("text").to_pylist())
    assert texts == {"the first good sentence here", "a control character sentence", "مرحبا بالعالم يا صديقي 😀"}
    assert "\ufffd" in rej.filter(pc.equal(rej.column("reason"), "undecodable")).column("text")[0].as_py()


def test_a_rejected_row_has_the_whole_line_its_length_and_hash(tmp_path):
    """Short rejected lines keep their whole text; n_chars, n_bytes and blake2b describe the raw line (without its
    line break), so a row can be checked against the file."""
    raw = [b"", b"too short", "nai\u0308ve caf\u00e9 words".encode(), b"bad \xff\xfe bytes in this line",
           "na\u00efve caf\u00e9 words".encode(), ("word " * 30).encode()]  # line 5: line 3 after NFC
    _, kept, rej = _split(tmp_path, b"\r\n".join(raw) + b"\n")
    assert kept.column("text").to_pylist() == ["na\u00efve caf\u00e9 words"]
    rows = rej.to_pylist()
    assert [r["reason"] for r in rows] == ["empty", "too_short", "undecodable", "duplicate", "too_long"]
    for r in rows:
        line = raw[r["line_no"] - 1]
        assert r["text"] == line.decode("utf-8", errors="replace") and r["n_chars"] == len(r["text"])
        assert r["n_bytes"] == len(line) and r["blake2b"] == hashlib.blake2b(line, digest_size=16).hexdigest()


def test_sid_is_stable_and_table_sorted_by_sid(tmp_path):
    _, kept, _ = _split(tmp_path, b"one two three four\nfive six seven eight\nnine ten eleven twelve\n")
    sids = kept.column("sid").to_pylist()
    assert sids == sorted(sids)
    assert sentence_id("one two three four") in sids
    assert sentence_id("one two three four") == sentence_id("one two three four")


def test_parquet_corpus_with_text_column(tmp_path):
    p = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": ["alpha beta gamma delta", None, "x"]}), p)
    kept, rej = split_sentences(p, 3, 20, 200)
    assert kept.num_rows == 1 and rej.column("reason").to_pylist() == ["empty", "too_short"]


def test_parquet_corpus_with_a_dictionary_text_column(tmp_path):
    """pyarrow writes a dictionary column back as one (its schema is in the file): still a string column."""
    p = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": pa.array(["alpha beta gamma delta", "x", "x", None]).dictionary_encode()}), p)
    check_corpus(p)
    kept, rej = split_sentences(p, 3, 20, 200)
    assert kept.column("text").to_pylist() == ["alpha beta gamma delta"]
    # the two "x" rows, one after the other: one row standing for both
    assert rej.select(["line_no", "reason", "lines"]).to_pylist() == [
        {"line_no": 2, "reason": "too_short", "lines": 2}, {"line_no": 4, "reason": "empty", "lines": 1}]


def test_shard_bounds_cover_rows_once():
    for n_rows, n in [(0, 3), (5, 7), (100, 4), (11914, 4)]:
        b = shard_bounds(n_rows, n)
        assert len(b) == n and b[0][0] == 0 and b[-1][1] == n_rows
        assert all(b[i][1] == b[i + 1][0] for i in range(n - 1))


# ---- the corpus forms (pipeline/corpus/) ------------------------------------------------------------------------
import gzip  # noqa: E402
import json  # noqa: E402

import pytest  # noqa: E402

from contramine.pipeline.corpus import CorpusError  # noqa: E402
from contramine.pipeline.corpus import Corpus  # noqa: E402

FORM_LINES = ["the first good sentence here", "", "too short", "the  first good   sentence here",
              "a control\x07 character sentence", "word " * 30, "مرحبا بالعالم يا صديقي 😀",
              "nai\u0308ve caf\u00e9 words here", "a line\twith a tab in it", "   ", "the last sentence of it all"]
ACCOUNT = ["line_no", "text", "reason", "n_chars", "n_bytes", "blake2b"]


def _jsonl(lines, field="text") -> bytes:
    return "".join(json.dumps({"id": i, field: t}) + "\n" for i, t in enumerate(lines)).encode()


def _zst(data: bytes, path) -> None:
    with pa.CompressedOutputStream(str(path), "zstd") as out:
        out.write(data)


def test_every_corpus_form_gives_the_text_files_tables(tmp_path):
    """The same records as a text file, JSON Lines, gzipped JSON Lines, zstd text, Parquet, a folder of three parts of
    three forms and a glob: equal `sentences`, the same `rejected` accounting; only `source` names the part."""
    text = "\n".join(FORM_LINES).encode() + b"\n"
    (tmp_path / "c.txt").write_bytes(text)
    (tmp_path / "c.jsonl").write_bytes(_jsonl(FORM_LINES))
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(_jsonl(FORM_LINES)))
    _zst(text, tmp_path / "c.txt.zst")
    pq.write_table(pa.table({"text": FORM_LINES}), tmp_path / "c.parquet")
    parts = tmp_path / "parts"
    (parts / "b").mkdir(parents=True)
    (parts / "a.jsonl.gz").write_bytes(gzip.compress(_jsonl(FORM_LINES[:4])))
    pq.write_table(pa.table({"text": FORM_LINES[4:7]}), parts / "b" / "part.parquet")
    _zst("\n".join(FORM_LINES[7:]).encode(), parts / "c.txt.zst")  # no newline after its last line
    (parts / "_SUCCESS").write_bytes(b"")  # what Spark leaves: skipped, as names starting with `.`
    (parts / ".a.jsonl.gz.crc").write_bytes(b"\0")
    want_kept, want_rejected = split_sentences(tmp_path / "c.txt", 3, 20, 200)
    assert want_kept.num_rows + want_rejected.num_rows == len(FORM_LINES)
    for spec in ("c.jsonl", "c.jsonl.gz", "c.txt.zst", "c.parquet", "parts", "parts/**/*.*"):
        kept, rejected = split_sentences(Corpus(str(tmp_path / spec)), 3, 20, 200)
        assert kept.equals(want_kept), spec
        assert rejected.select(ACCOUNT).equals(want_rejected.select(ACCOUNT)), spec
    _, rejected = split_sentences(Corpus(str(parts)), 3, 20, 200)
    assert list(zip(*(rejected.column(c).to_pylist() for c in ("line_no", "source", "source_line")))) == [
        (2, "a.jsonl.gz", 2), (3, "a.jsonl.gz", 3), (4, "a.jsonl.gz", 4), (6, "b/part.parquet", 2),
        (10, "c.txt.zst", 3)]
    assert count_lines(parts) == len(FORM_LINES)
    assert [p.name for p in Corpus(str(parts)).parts()] == ["a.jsonl.gz", "b/part.parquet", "c.txt.zst"]


def test_a_json_line_that_gives_no_text_is_rejected_with_its_file_and_line(tmp_path):
    lines = [b'{"text": "a good json sentence here"}', b'{"text": "cut off', b'{"body": "no text field here"}',
             b'{"text": 42}', b'{"text": null}', b'["text", "an array"]', b'', b'{"text": "lone \\ud800 surrogate"}',
             b'{"content": "the field set to another name", "text": "x"}']
    (tmp_path / "c.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    kept, rejected = split_sentences(Corpus(str(tmp_path / "c.jsonl")), 3, 20, 200)
    assert kept.column("text").to_pylist() == ["a good json sentence here"]
    rows = rejected.to_pylist()
    assert [(r["source"], r["source_line"], r["reason"]) for r in rows] == [
        ("c.jsonl", 2, "not_json"), ("c.jsonl", 3, "no_field"), ("c.jsonl", 4, "not_text"), ("c.jsonl", 5, "empty"),
        ("c.jsonl", 6, "not_json"), ("c.jsonl", 7, "empty"), ("c.jsonl", 8, "undecodable"), ("c.jsonl", 9, "too_short")]
    assert rows[0]["text"] == '{"text": "cut off' and rows[0]["n_bytes"] == len(lines[1])  # the raw line, accounted
    assert rows[0]["blake2b"] == hashlib.blake2b(lines[1], digest_size=16).hexdigest()
    kept, _ = split_sentences(Corpus(str(tmp_path / "c.jsonl"), field="content"), 3, 20, 200)
    assert kept.column("text").to_pylist() == ["the field set to another name"]


def test_a_corpus_that_cannot_be_read_is_one_line_naming_the_file(tmp_path):
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "a.txt").write_text("a sentence of the corpus\n")
    (tmp_path / "parts" / "notes.md").write_text("# not a corpus file\n")
    (tmp_path / "array.json").write_text('[{"text": "a"}]\n')
    (tmp_path / "bad.txt.gz").write_bytes(b"not gzip at all")
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "no_text.parquet")
    for spec, words in [("parts", "notes.md is none of the corpus forms"), ("nothing/*.jsonl", "no corpus files"),
                        ("array.json", "a JSON array, not JSON Lines"), ("bad.txt.gz", "cannot read it as gzip"),
                        ("no_text.parquet", "string column `text`"), ("missing.txt", "no such file or folder")]:
        with pytest.raises(CorpusError, match=words) as e:
            check_corpus(Corpus(str(tmp_path / spec)))
        assert "\n" not in str(e.value), spec


def test_the_corpus_identity_covers_every_part_and_the_field(tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    for name in ("a.txt", "b.jsonl"):
        (parts / name).write_bytes(b'{"text": "one two three"}\n')
    base = Corpus(str(parts)).identity()
    assert Corpus(str(parts), field="body").identity() != base  # a JSON part: the field is part of it
    (parts / "b.jsonl").write_bytes(b'{"text": "one two four"}\n')
    edited = Corpus(str(parts)).identity()
    (parts / "b.jsonl").rename(parts / "c.jsonl")
    assert len({base, edited, Corpus(str(parts)).identity()}) == 3
    single = tmp_path / "c.txt"
    single.write_bytes(b"one two three\n")
    assert Corpus(str(single), field="body").identity() == Corpus(str(single)).identity()  # text has no field


def test_record_counts_match_what_is_read(tmp_path, monkeypatch):
    """The counts that size the shards and map a line_no to its part split lines as the reader does (\\n, \\r\\n, a
    bare \\r, a \\r\\n cut between two reads, a BOM, a last line without its end)."""
    import contramine.pipeline.corpus.streams as streams
    import contramine.pipeline.corpus.text as text

    data = b"\xef\xbb\xbfone\r\ntwo\rthree\n\nfour\r\r\nfive"
    (tmp_path / "c.txt").write_bytes(data)
    _zst(data, tmp_path / "c.txt.zst")
    for spec in ("c.txt", "c.txt.zst"):
        [(_, n)] = Corpus(str(tmp_path / spec)).sources()
        assert n == count_lines(tmp_path / spec) == 7, spec
    monkeypatch.setattr(text, "cached_count", text.cached_count.__wrapped__)
    monkeypatch.setattr(streams, "CHUNK", 4)  # "one\r" | "\ntwo": the \r\n across two reads is one end
    [(_, n)] = Corpus(str(tmp_path / "c.txt")).sources()
    assert n == 7
