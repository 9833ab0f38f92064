"""Stage `noise`: one or two inserted frequent words or dropped words, seeded per (sentence, variant)."""
import pyarrow as pa

from contramine.pipeline.config import NoiseCfg
from contramine.pipeline.stages.noise import frequent_words, noise_sentences


def _sentences(texts):
    return pa.table({"sid": list(range(100, 100 + len(texts))), "text": texts})


def test_variants_insert_or_drop_one_or_two_words():
    texts = ["alpha beta gamma delta epsilon zeta", "one two three four five six seven"]
    vocab = ["the", "of"]
    out = noise_sentences(_sentences(texts), vocab, NoiseCfg(n_variants=6), seed=3)
    assert out.num_rows == 12
    for sid, text, ops in zip(*(out.column(c).to_pylist() for c in ("sid", "text", "ops"))):
        orig = texts[sid - 100].split()
        words = text.split()
        n = int(ops[-1])
        assert n in (1, 2)
        if ops.startswith("insert"):
            assert len(words) == len(orig) + n and all(w in orig or w in vocab for w in words)
        else:
            assert len(words) == len(orig) - n and all(w in orig for w in words)


def test_per_row_seeding_independent_of_batch():
    texts = [f"w{i} x{i} y{i} z{i} q{i}" for i in range(30)]
    cfg = NoiseCfg()
    whole = noise_sentences(_sentences(texts), ["the", "a"], cfg, seed=1).to_pylist()
    part = noise_sentences(_sentences(texts).slice(10, 5), ["the", "a"], cfg, seed=1).to_pylist()
    assert part == [r for r in whole if 110 <= r["sid"] < 115]


def test_frequent_words_are_alphabetic_and_ordered():
    assert frequent_words(["The cat, the dog.", "the end 2 cat"], 2) == ["the", "cat"]  # "cat," and "2" are not words
