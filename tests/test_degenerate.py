"""Degenerate corpora, each mined end to end: one repeated line, identical embeddings, fewer sentences than
the pool, an empty file. Every line still ends in `sentences` or `rejected`."""
from __future__ import annotations


import numpy as np
import pyarrow.compute as pc
import pytest

from contramine.pipeline.config import NeighboursCfg
from contramine.pipeline.schema import table_vectors
from contramine.pipeline.search.band import band_neighbours, exact_band_neighbours
from contramine.pipeline.search.faiss_index import build_index
from contramine.pipeline.corpus import split_sentences
from contramine.pipeline.storage.store import Store

from hostile import plain_rows, wiki_lines, write_corpus

from mining_helpers import TABLES, _brute_force, _manifest, _mine, _tables

pytestmark = pytest.mark.usefixtures("prefect_harness")


# ---------------------------------------------------------------- degenerate corpora, each mined end to end

def _degenerate(tmp_path, name, rows, *extra):
    corpus = write_corpus(tmp_path / f"{name}.txt", rows)
    cfg = _mine(corpus, tmp_path / "runs", name, *extra)
    t = _tables(cfg.run.dir)
    # a rejected row stands for `lines` records: a run of one record repeated is one row
    assert t["sentences"].num_rows + sum(t["rejected"].column("lines").to_pylist()) == len(rows)
    assert t["pairs"].num_rows == t["embeddings"].num_rows == t["negations"].num_rows == t["sentences"].num_rows
    return cfg, t


def test_every_line_the_same_is_a_one_sentence_corpus(tmp_path):
    """12 copies of one line (6 with extra spaces): one sentence, 11 duplicates; shard 0 of 2 is empty. A corpus
    of that one line alone gives the very same `sentences` shards (checked here), hence the same cache keys and
    the same tables downstream: this run is the one-sentence corpus's run too."""
    line = wiki_lines(1, skip=1)[0]
    cfg, t = _degenerate(tmp_path, "same", plain_rows([line] * 6 + ["  " + line] * 6))
    assert t["sentences"].column("text").to_pylist() == [line]
    assert t["sentences"].column("line_no").to_pylist() == [1]
    assert t["rejected"].select(["line_no", "reason", "lines"]).to_pylist() == [  # two runs of one line each
        {"line_no": 2, "reason": "duplicate", "lines": 5}, {"line_no": 7, "reason": "duplicate", "lines": 6}]
    store = Store(cfg.run.dir)
    assert store.read_shard("sentences", 0, 2).num_rows == 0  # an empty shard went through every stage
    assert t["neighbours"].num_rows == 0
    assert t["variants"].num_rows == 2
    pair = t["pairs"].to_pylist()[0]
    assert pair["negatives"] == [] and len(pair["positives"]) == 2
    one = write_corpus(tmp_path / "one.txt", plain_rows([line]))
    kept, rejected = split_sentences(one, cfg.sentences.min_words, cfg.sentences.max_words, cfg.sentences.max_chars)
    assert rejected.num_rows == 0 and kept.equals(t["sentences"])


def test_identical_embeddings_and_fewer_sentences_than_pool_size(tmp_path):
    """With encoder.max_length=4 a line is read as [CLS] the cat [SEP]: ten distinct lines, one vector, every
    cosine 0.99999994. With hi = 1 every pair is in band, the ties are ranked by sid, and 10 sentences are fewer
    than pool_size = 12: each pool holds the 9 others. With the default band (hi = 0.75) there is no neighbour."""
    words = "really quietly slowly happily never always often then later first".split()
    lines = [f"The cat {w} sat on a mat number {i}" for i, w in enumerate(words)]
    _, t = _degenerate(tmp_path, "same-vectors", plain_rows(lines), "encoder.max_length=4", "neighbours.hi=1.0",
                       "neighbours.pool_size=12")
    sids, x = table_vectors(t["embeddings"])
    assert len(sids) == 10 and (x == x[0]).all()
    nb = t["neighbours"]
    assert nb.equals(_brute_force(t, 0.25, 1.0, 12))
    assert nb.num_rows == 10 * 9
    for sid in sids.tolist():
        got = nb.filter(pc.equal(nb.column("sid"), sid)).column("cand_sid").to_pylist()
        assert got == sorted(s for s in sids.tolist() if s != sid)
    neg = t["candidates"].filter(pc.equal(t["candidates"].column("kind"), "neg"))
    assert np.isfinite(neg.column("p").to_numpy()).all()
    assert np.allclose(neg.column("s_sem").to_numpy(), 1 / 9)  # one cosine: S_sem is uniform, edit decides
    assert sum(neg.column("chosen").to_pylist()) == 10 * 2
    nc = NeighboursCfg(pool_size=12)
    index, cpu_index = build_index(x, "flat", nc)
    none = band_neighbours(x, sids, x, sids, index, cpu_index, nc.lo, nc.hi, nc.pool_size, nc.slack)
    assert none.num_rows == 0 and none.equals(exact_band_neighbours(x, sids, x, sids, nc.lo, nc.hi, 12))


def test_empty_corpus_file(tmp_path):
    """0 bytes: succeeds with every table empty. A file of blank lines gives the same (empty) `sentences`
    shards, so the same run downstream; checked at the sentences stage."""
    corpus = tmp_path / "empty.txt"
    corpus.write_bytes(b"")
    cfg = _mine(corpus, tmp_path / "runs", "empty")
    t = _tables(cfg.run.dir)
    assert all(t[tb].num_rows == 0 for tb in TABLES)
    assert _manifest(cfg.run.dir, "sentences")["corpus_lines"] == 0
    blank = tmp_path / "blank.txt"
    blank.write_bytes(b"\n \n\t\n\r\n\r")
    kept, rejected = split_sentences(blank, 3, 128, 2000)
    assert kept.equals(t["sentences"]) and rejected.column("reason").to_pylist() == ["empty"] * 4
    assert rejected.column("lines").to_pylist() == [1, 1, 1, 2]  # "" (\r\n) and "" (\r): one run of two


# ---------------------------------------------------------------- determinism
