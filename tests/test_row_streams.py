"""RowStreams: every row's numbers equal its own `row_rng` stream's, which is what keeps the noise and IPW tables
equal to the row-by-row code they replaced."""
import numpy as np
import pyarrow as pa

from contramine.pipeline.config import NoiseCfg
from contramine.pipeline.row_streams import RowStreams, matches_numpy
from contramine.pipeline.seeding import row_rng
from contramine.pipeline.stages.noise import _noise_row, noise_sentences


def test_streams_equal_row_rng_for_keys_of_every_width():
    rng = np.random.default_rng(0)
    sid = np.concatenate([rng.integers(0, 2**20, 100), rng.integers(2**32 - 3, 2**32 + 3, 100),
                          rng.integers(0, 2**63, 100, dtype=np.int64)]).astype(np.uint64)
    variant = rng.integers(0, 5, len(sid)).astype(np.uint64)
    streams, rows = RowStreams(11, "noise", sid, variant), np.arange(len(sid))
    small, unsure_small = streams.integers(rows, 2, 9)
    seed63 = streams.top_half(rows)
    unit = streams.random(rows)
    wide, unsure_wide = streams.integers(rows, 0, 2**31 + 7)  # a range where NumPy often rejects and redraws
    after = streams.integers(rows, 0, 100)[0]
    assert unsure_wide.any() and not unsure_small.any()
    for i in range(len(sid)):
        want = row_rng(11, "noise", int(sid[i]), int(variant[i]))
        assert (small[i], seed63[i], unit[i]) == (want.integers(2, 9), want.integers(0, 2**63, dtype=np.int64),
                                                  want.random())
        drawn = want.integers(0, 2**31 + 7)
        if not unsure_wide[i]:  # a rejected draw is reported, never passed off as NumPy's
            assert (wide[i], after[i]) == (drawn, want.integers(0, 100))
    assert matches_numpy()


def test_noise_equals_each_rows_own_stream():
    texts = ["", "one", "two words", "alpha beta gamma delta epsilon zeta", "a b c d e f g h i j k"] * 8
    sentences = pa.table({"sid": [3 * i + 2**33 * (i % 2) for i in range(len(texts))], "text": texts})
    vocab = ["the", "of", "and", "in"]
    cfg = NoiseCfg(n_variants=5, max_ops=3)
    out = noise_sentences(sentences, vocab, cfg, seed=9).to_pylist()
    want = [(sid, v, *_noise_row(text.split(), vocab, cfg, 9, sid, v))
            for sid, text in zip(sentences.column("sid").to_pylist(), texts) for v in range(1, 6)]
    assert [(r["sid"], r["variant"], r["text"].split(), r["ops"]) for r in out] == want


def test_row_seeds_equal_row_seed_for_one_seed_and_a_seed_per_row():
    from contramine.pipeline.row_streams import row_seeds
    from contramine.pipeline.seeding import row_seed

    sid = np.array([0, 5, 2**32 + 1, 2**62], np.int64)
    variant = np.array([0, 3, 1, 2], np.int64)
    first = row_seeds(7, "backtranslate", sid, variant)
    assert first == [row_seed(7, "backtranslate", int(s), int(v)) for s, v in zip(sid, variant)]
    assert row_seeds(np.array(first, np.uint64), "backtranslate-hop", np.ones(4, np.int64)) == \
        [row_seed(int(s), "backtranslate-hop", 1) for s in first]
