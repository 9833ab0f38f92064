"""Where vectors and negatives come from: precomputed embeddings (`embeddings.from`) and a separate candidate corpus
(`data.candidates`), as sentence-transformers' `mine_hard_negatives` users have them (issue 15)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from mining_helpers import SMALL, _tables

from contramine.pipeline.config import configure
from contramine.pipeline.engine.runner import load_stages, run_stage
from contramine.pipeline.models.encode.precomputed import PrecomputedEncoder, PrecomputedError
from contramine.pipeline.models.standin import StandInEncoder
from contramine.pipeline.schema import table_vectors
from contramine.pipeline.search.band import exact_band_neighbours
from contramine.pipeline.identity import normalise, sentence_id

STANDIN = "standin:encoder-32"
FAST = [f"encoder.model={STANDIN}"]


def _mine(corpus, root, name: str, *extra: str):
    """Every stage in order through the runner's own driver (what `mine`'s flow maps; the flow itself:
    tests/test_mine_flow.py): where the vectors and negatives come from is decided inside the stages."""
    cfg = configure("default", name, str(corpus), [*SMALL, f"run.root={root}", *extra])
    for stage in load_stages():
        run_stage(stage, cfg, log=lambda line: None)
    return cfg


def _vectors_file(path, texts, key="text", scale=1.0):
    vecs = StandInEncoder(STANDIN).encode(texts) * scale  # scale != 1: not unit, the reader normalises
    keys = texts if key == "text" else [sentence_id(normalise(t)) for t in texts]
    pq.write_table(pa.table({key: keys, "emb": pa.array(list(vecs), pa.list_(pa.float32()))}), path)
    return path


@pytest.fixture(scope="module")
def corpus40(small_corpus, tmp_path_factory):
    """small_corpus's first 40 lines (its rejected lines among them): where vectors and negatives come from is the
    point, not how many sentences; fewer lines for spaCy's negations in each of the file's mines."""
    p = tmp_path_factory.mktemp("corpus") / "c40.txt"
    p.write_text("".join(small_corpus.read_text(encoding="utf-8").splitlines(keepends=True)[:40]), encoding="utf-8")
    return p


@pytest.fixture(scope="module")
def standin_run(corpus40, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return _mine(corpus40, root, "standin", *FAST), root


def test_precomputed_embeddings_give_the_tables_of_the_encoder_itself(standin_run, corpus40, tmp_path):
    cfg, root = standin_run
    want = _tables(cfg.run.dir)
    # every text the run embeds: the sentences, and the positive candidates the scores stage embeds
    texts = sorted(set(want["sentences"].column("text").to_pylist()) | set(want["variants"].column("text").to_pylist()))
    src = _vectors_file(tmp_path / "vectors.parquet", texts)
    got = _tables(_mine(corpus40, root, "precomputed", f"embeddings.from={src}").run.dir)  # encoder.model unused
    for table in ("embeddings", "neighbours", "scores", "candidates", "pairs"):
        assert got[table].equals(want[table]), table


def test_precomputed_file_missing_the_positives_fails_naming_the_file(standin_run, corpus40, tmp_path):
    cfg, root = standin_run
    sentences = _tables(cfg.run.dir)["sentences"].column("text").to_pylist()
    src = _vectors_file(tmp_path / "only-sentences.parquet", sentences)
    with pytest.raises(Exception, match="only-sentences.parquet: no vector for .*variants"):
        _mine(corpus40, root, "missing", f"embeddings.from={src}")


def test_precomputed_reader_keys_by_sid_or_text_and_rejects_bad_files(tmp_path):
    texts = ["the cat sat on the mat", "a dog ran in  the park", "stocks fell sharply today"]
    by_text = PrecomputedEncoder(_vectors_file(tmp_path / "t.parquet", texts, scale=3.0))
    by_sid = PrecomputedEncoder(_vectors_file(tmp_path / "s.parquet", texts, key="sid"))
    want = StandInEncoder(STANDIN).encode(texts)
    np.testing.assert_allclose(by_text.encode(texts[::-1]), want[::-1], rtol=1e-6)
    np.testing.assert_allclose(by_sid.encode(texts), by_text.encode(texts), rtol=1e-6)
    assert by_text.encode(["a dog ran in the park"]).shape == (1, 32)  # normalised like the sentences stage

    vec = lambda rows: pa.array(rows, pa.list_(pa.float32()))  # noqa: E731
    bad = {"ragged": pa.table({"text": ["a b c", "d e f"], "emb": vec([[1.0, 0.0], [1.0]])}),
           "zero": pa.table({"text": ["a b c", "d e f"], "emb": vec([[1.0, 0.0], [0.0, 0.0]])}),
           "nokey": pa.table({"id": [1], "emb": vec([[1.0]])})}
    for name, table in bad.items():
        pq.write_table(table, tmp_path / f"{name}.parquet")
        with pytest.raises(PrecomputedError, match=f"{name}.parquet: " + ("row 1" if name != "nokey" else "expected")):
            PrecomputedEncoder(tmp_path / f"{name}.parquet")
    with pytest.raises(PrecomputedError, match="t.parquet: no vector for 1 of 2 texts"):
        by_text.encode(["the cat sat on the mat", "never seen before here"])


def test_negatives_from_a_separate_candidate_corpus(standin_run, corpus40, tmp_path):
    cfg, root = standin_run
    anchors = _tables(cfg.run.dir)["sentences"].column("text").to_pylist()
    # candidates sharing about half their words with an anchor (in the band), plus lines to reject and an anchor
    # itself (same sid: never its own negative)
    lines = [" ".join(t.split()[: max(3, len(t.split()) // 2)] + ["quite", "unlike", "anything", "before"])
             for t in anchors[:60]]
    lines += ["", "too short", lines[0], anchors[0]]
    corpus = tmp_path / "candidates.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    run = _mine(corpus40, root, "pool", f"data.candidates={corpus}")
    t = _tables(run.run.dir)
    assert t["pool_sentences"].num_rows + t["pool_rejected"].num_rows == len(lines)
    assert set(t["pool_rejected"].column("reason").to_pylist()) == {"empty", "too_short", "duplicate"}

    q_sids, q = table_vectors(t["embeddings"])
    p_sids, p = table_vectors(t["pool_embeddings"])
    c = run.neighbours
    want = exact_band_neighbours(q, q_sids, p, p_sids, c.lo, c.hi, c.pool_size)
    got = t["neighbours"]
    assert got.num_rows > 0 and got.select(["sid", "cand_sid", "rank"]).equals(want.select(["sid", "cand_sid", "rank"]))
    assert set(got.column("cand_sid").to_pylist()) <= set(p_sids.tolist())
    negatives = t["scores"].filter(pc.equal(t["scores"].column("kind"), "neg")).column("text").to_pylist()
    pool_texts = set(t["pool_sentences"].column("text").to_pylist())
    assert negatives and set(negatives) <= pool_texts
    chosen = {n for row in t["pairs"].column("negatives").to_pylist() for n in row}
    assert chosen and chosen <= pool_texts
