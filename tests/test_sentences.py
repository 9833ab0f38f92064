"""Stage `sentences`: every input line ends in `sentences` or in `rejected` with a reason."""
import hashlib

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.corpus import check_corpus, count_lines, shard_bounds, split_sentences
from pipeline.identity import sentence_id


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
    assert rej.column("reason").to_pylist() == ["too_short", "too_short", "empty"]


def test_shard_bounds_cover_rows_once():
    for n_rows, n in [(0, 3), (5, 7), (100, 4), (11914, 4)]:
        b = shard_bounds(n_rows, n)
        assert len(b) == n and b[0][0] == 0 and b[-1][1] == n_rows
        assert all(b[i][1] == b[i + 1][0] for i in range(n - 1))
