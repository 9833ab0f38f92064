"""Surface scores: MER equals jiwer per pair; normalised edit distance; lexical overlap."""
import random
from collections import Counter

import jiwer
import numpy as np

from contramine.pipeline.identity import normalise
from contramine.pipeline.text_distances import edit_distance, lexical_overlap, mer

WIKI = "../shared/data/wiki1m_head.txt"


def test_mer_equals_jiwer_on_1000_random_pairs():
    lines = [normalise(x).lower() for x in open(WIKI, encoding="utf-8").read().splitlines()[:2000]]
    rng = random.Random(0)
    a, b = [], []
    for _ in range(1000):
        x = rng.choice(lines)
        w = x.split()
        for _ in range(rng.randint(0, 8)):  # deletions, insertions, substitutions, and unrelated sentences
            op = rng.random()
            if op < 0.3 and w:
                w.pop(rng.randrange(len(w)))
            elif op < 0.6:
                w.insert(rng.randrange(len(w) + 1), rng.choice(["the", "a", "of", "zz"]))
            elif op < 0.95 and w:
                w[rng.randrange(len(w))] = "qq"
            else:
                w = rng.choice(lines).split()
        a.append(x)
        b.append(" ".join(w))
    ours = mer(a, b)
    theirs = [jiwer.mer(x, y) for x, y in zip(a, b)]
    assert np.array_equal(ours, np.array(theirs))


def test_mer_edge_cases():
    assert mer(["", "a b"], ["", "a b"]).tolist() == [0.0, 0.0]
    assert mer(["a b c d"], ["a x c d"]).tolist() == [0.25]  # S=1, C=3


def test_edit_distance_char_and_word_levels():
    assert edit_distance(["kitten"], ["sitting"]).tolist() == np.float32([3 / 7]).tolist()
    assert edit_distance(["the cat sat", "a b"], ["the dog sat", "a b"], level="word").tolist() == \
        np.float32([1 / 3, 0.0]).tolist()


def _overlap(x, y):  # DebCSE's lexical overlap written out: multiset intersection / words of the longer sentence
    wx, wy = x.lower().split(), y.lower().split()
    longest = max(len(wx), len(wy))
    return sum((Counter(wx) & Counter(wy)).values()) / longest if longest else 0.0


def test_lexical_overlap():
    assert lexical_overlap(["The cat sat down"], ["the cat ran"]).tolist() == [0.5]


def test_lexical_overlap_counts_words_as_multisets():
    same = ["the cat saw the dog", "a a a", "Der Hund, der Hund!"]
    assert lexical_overlap(same, same).tolist() == [1.0, 1.0, 1.0]  # a set-based count gave 0.8, 1/3, 0.75
    assert lexical_overlap(["a a b"], ["a b b"]).tolist() == [2 / 3]
    assert lexical_overlap(["a a b", "x", "", ""], ["a", "", "y", ""]).tolist() == [1 / 3, 0.0, 0.0, 0.0]


def test_lexical_overlap_tokenises_like_lower_split():
    """Words are `text.lower().split()`: Python's case mapping (İ -> i̇, final sigma), any Unicode whitespace splits,
    punctuation stays on the word."""
    a = ["The cat.", "CAT cat", "a\tb\nc\u3000d", "İstanbul ΣΑΣ", "  lead and trail  "]
    b = ["the cat", "cat Cat", "a b c d", "i̇stanbul σας", "trail and lead"]
    assert lexical_overlap(a, b).tolist() == [0.5, 1.0, 1.0, 1.0, 1.0]
    assert lexical_overlap(a, b).tolist() == [_overlap(x, y) for x, y in zip(a, b)]


def test_lexical_overlap_equals_direct_computation_on_1000_pairs():
    import pyarrow as pa

    lines = [normalise(x) for x in open(WIKI, encoding="utf-8").read().splitlines()[:2000]]
    rng = random.Random(1)
    a, b = [], []
    for _ in range(1000):
        x = rng.choice(lines)
        w = x.split()
        for _ in range(rng.randint(0, 6)):  # repeated words, case changes, drops, unrelated sentences
            op = rng.random()
            if op < 0.3 and w:
                w.insert(rng.randrange(len(w) + 1), rng.choice(w))
            elif op < 0.5 and w:
                k = rng.randrange(len(w))
                w[k] = w[k].upper()
            elif op < 0.8 and w:
                w.pop(rng.randrange(len(w)))
            else:
                w = rng.choice(lines).split()
        a.append(x)
        b.append(" ".join(w))
    want = np.array([_overlap(x, y) for x, y in zip(a, b)])
    assert np.array_equal(lexical_overlap(a, b), want)
    assert np.array_equal(lexical_overlap(pa.chunked_array([a[:300], a[300:]]), pa.array(b, pa.large_string())), want)
    assert any(len(set(y.lower().split())) < len(y.split()) for y in b)  # the sample has repeated words


def test_mer_tokenises_like_python_split_and_lower_for_every_code_point():
    """Arrow's whitespace split and lower-casing stand in for `str.lower().split()`: every code point as a
    separator candidate, plus letters whose lower case differs between Unicode implementations (İ, Σ, ẞ)."""
    import sys

    import pyarrow as pa

    from contramine.pipeline.text_distances import _lower_split

    seps = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]
    texts = [f"{c}Ab{c}cD{c}{c}e{c}" for c in seps] + ["İstanbul ΣΑΣ ẞ straße", "\x1cA\x1fb\x85c\u2028d\u3000E"]
    got = _lower_split(pa.array(texts, pa.large_string())).to_pylist()
    assert got == [t.lower().split() for t in texts]


def test_mer_takes_arrow_columns_and_chunks_without_changing_results(monkeypatch):
    import pyarrow as pa

    import contramine.pipeline.text_distances as td

    a = ["the cat sat on the mat", "A b C", "", "ΣΑΣ went home", "x y z w"] * 7
    b = ["the dog sat on a mat", "a B c d", "", "σας went away home", "w x y z"] * 7
    want = np.array([jiwer.mer(x.lower(), y.lower()) if x or y else 0.0 for x, y in zip(a, b)])
    assert np.array_equal(mer(a, b), want)
    monkeypatch.setattr(td, "CHUNK_PAIRS", 3)  # chunk edges inside the batch, ASCII and non-ASCII chunks mixed
    assert np.array_equal(mer(pa.chunked_array([a[:10], a[10:]]), pa.array(b)), want)
