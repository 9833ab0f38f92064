"""Surface distances between sentences (METHODS §4), vectorised with rapidfuzz.

- `edit_distance`: Levenshtein distance / length of the longer string, in [0, 1]; `level="char"` (default) or
  `"word"` (each distinct word becomes one code point, so word-level distance runs at string speed).
- `mer`: OssCSE Eq. 1 per pair, MER = (S+D+I)/(S+D+I+C) over lower-cased whitespace tokens, 0 for two empty strings.
  The alignment is rapidfuzz's Levenshtein alignment, the one jiwer 4 uses, so it equals `jiwer.mer(a, b)` per pair.
- `lexical_overlap`: DebCSE Tables 1 and 4, |words(a) ∩ words(b)| / max(|words(a)|, |words(b)|) with words as
  multisets (a word shared twice counts twice; a sentence against itself scores 1), over the same lower-cased
  whitespace tokens as `mer`; 0 when both are empty.
"""
from __future__ import annotations

from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rapidfuzz import process
from rapidfuzz.distance import Indel, Levenshtein


Texts: TypeAlias = "list[str] | pa.Array | pa.ChunkedArray"  # what mer and edit_distance accept
CHUNK_CHARS = 65536  # pairs per char-level cpdist call (bounds the Python strings alive at once)
CHUNK_PAIRS = 4096  # pairs tokenised together: small dictionaries (code points below the surrogates, 2-byte strings)


def _as_arrow(texts) -> pa.Array:
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    if isinstance(texts, pa.Array):
        return texts.cast(pa.large_string())
    return pa.array(list(texts), pa.large_string())


def _slice_strings(texts, start: int) -> list[str]:
    if isinstance(texts, (pa.Array, pa.ChunkedArray)):
        return texts.slice(start, CHUNK_CHARS).to_pylist()
    return list(texts[start:start + CHUNK_CHARS])


def words(text: str) -> list[str]:
    """The words every surface score here compares: lower-cased (Python's full case mapping), split on whitespace as
    `str.split()` does, punctuation kept. `_lower_split` computes the same for a whole column in Arrow."""
    return text.lower().split()


def edit_distance(a: Texts, b: Texts, level: str = "char") -> np.ndarray:
    """Normalised Levenshtein distance per pair (a[i], b[i]) in [0, 1]."""
    if len(a) != len(b):
        raise ValueError(f"edit_distance: {len(a)} left vs {len(b)} right texts")
    if level == "char":
        out: np.ndarray = np.zeros(len(a), dtype=np.float32)
        for start in range(0, len(a), CHUNK_CHARS):  # Python strings for one chunk at a time, not for every pair
            ca, cb = _slice_strings(a, start), _slice_strings(b, start)
            out[start:start + len(ca)] = process.cpdist(ca, cb, scorer=Levenshtein.normalized_distance, workers=-1,
                                                        dtype=np.float32)
        return out
    if level != "word":
        raise ValueError(f"edit level {level!r}: expected 'char' or 'word'")
    out = np.zeros(len(a), dtype=np.float32)
    for start, ra, hb in word_coded_pairs(a, b):
        out[start:start + len(ra)] = process.cpdist(ra, hb, scorer=Levenshtein.normalized_distance, workers=-1,
                                                    dtype=np.float32)
    return out


def _lower_split(texts: pa.Array) -> pa.LargeListArray:
    """Lower-cased whitespace words of each text, exactly as `[t.lower().split() for t in texts]`. ASCII texts stay
    in Arrow's C++ kernels; a text with any other character is lower-cased by Python (whose full case mapping
    Arrow's does not replicate). `utf8_split_whitespace` splits where `str.split()` does (every code point is
    checked in tests/test_textdist.py) but keeps an empty word for leading or trailing whitespace: those are dropped."""
    lowered = pc.ascii_lower(texts)
    other = pc.invert(pc.string_is_ascii(texts))
    if pc.any(other).as_py():
        by_python = [t.lower() for t in texts.filter(other).to_pylist()]
        lowered = pc.replace_with_mask(lowered, other, pa.array(by_python, pa.large_string()))
    lists = pc.utf8_split_whitespace(lowered)
    flat = lists.flatten()
    keep = pc.greater(pc.binary_length(flat), 0)
    kept_before = np.concatenate([[0], np.cumsum(keep.to_numpy(zero_copy_only=False))])
    offsets = lists.offsets.to_numpy()
    return pa.LargeListArray.from_arrays(kept_before[offsets - offsets[0]], flat.filter(keep))


def _word_code_strings(texts: pa.Array) -> list[str] | None:
    """Each text as a string with one code point per lower-cased whitespace word (equal words, equal code points),
    tokenised and dictionary-encoded by Arrow in C++. None when the distinct words outnumber the code points."""
    lists = _lower_split(texts)
    codes = pc.dictionary_encode(lists.flatten()).indices.to_numpy().astype(np.uint32) + 1
    codes[codes >= 0xD800] += 0x800  # skip the surrogates
    if len(codes) and int(codes.max()) > 0x10FFFF:
        return None
    joined = codes.tobytes().decode("utf-32-le")
    off = lists.offsets.to_numpy().tolist()
    return [joined[i:j] for i, j in zip(off[:-1], off[1:])]


def mer(a: Texts, b: Texts) -> np.ndarray:
    """Match error rate per pair (a[i], b[i]), equal to `jiwer.mer(a[i], b[i])` on lower-cased text.

    a and b: lists of strings or Arrow string arrays (the pipeline's tables pass their columns without a round trip
    through Python objects). With n, m the two word counts, E the Levenshtein distance and I the insertions of
    rapidfuzz's alignment (jiwer's): MER = E / (E + hits) = E / (n + I). E comes from one multi-threaded `cpdist`
    call. Every optimal alignment has I = max(m - n, 0) + k, where k (its deletion-insertion pairs) is at most
    LCS - C0, C0 = min(n, m) - (E - |m - n|) being the hits of the alignment without such pairs and LCS (from the
    Indel distance) the most hits any alignment can have. Only pairs with LCS > C0 can have two optimal alignments
    with different I; for those alone the insertions of rapidfuzz's own alignment are counted from its editops."""
    if len(a) != len(b):
        raise ValueError(f"mer: {len(a)} left vs {len(b)} right texts")
    out: np.ndarray = np.zeros(len(a), dtype=np.float64)
    for start, ra, hb in word_coded_pairs(a, b):
        out[start:start + len(ra)] = _mer_of_codes(ra, hb)
    return out


def word_coded_pairs(a: Texts, b: Texts):
    """(offset, left code strings, right code strings) for consecutive chunks of the pairs (a[i], b[i]): each text
    as one code point per lower-cased whitespace word, equal words equal code points within a chunk (all that a
    pairwise distance needs). Chunks of CHUNK_PAIRS, halved where their distinct words outnumber the code points."""
    a, b = _as_arrow(a), _as_arrow(b)
    todo = [(start, a.slice(start, CHUNK_PAIRS), b.slice(start, CHUNK_PAIRS)) for start in range(0, len(a), CHUNK_PAIRS)]
    while todo:
        start, ca, cb = todo.pop(0)
        coded = _word_code_strings(pa.concat_arrays([ca, cb]))
        if coded is None:
            h = len(ca) // 2
            todo[:0] = [(start, ca.slice(0, h), cb.slice(0, h)), (start + h, ca.slice(h), cb.slice(h))]
        else:
            yield start, coded[:len(ca)], coded[len(ca):]


def _mer_of_codes(ra: list[str], hb: list[str]) -> np.ndarray:
    e = process.cpdist(ra, hb, scorer=Levenshtein.distance, workers=-1, dtype=np.int64)
    n = np.fromiter(map(len, ra), np.int64, len(ra))
    m = np.fromiter(map(len, hb), np.int64, len(hb))
    ins = np.maximum(m - n, 0)
    maybe = np.flatnonzero(e - np.abs(m - n) >= 2)  # a deletion-insertion pair needs two edits beyond |m - n|
    if len(maybe):
        picked = maybe.tolist()
        sub_a, sub_b = [ra[k] for k in picked], [hb[k] for k in picked]
        indel = process.cpdist(sub_a, sub_b, scorer=Indel.distance, workers=-1, dtype=np.int64)
        nm, mm, em = n[maybe], m[maybe], e[maybe]
        lcs = (nm + mm - indel) // 2
        c0 = np.minimum(nm, mm) - (em - np.abs(mm - nm))
        editops = Levenshtein.editops
        for k in np.flatnonzero(lcs > c0).tolist():
            ins[maybe[k]] = [op[0] for op in editops(sub_a[k], sub_b[k]).as_list()].count("insert")
    den = n + ins
    out: np.ndarray = np.zeros(len(ra), dtype=np.float64)
    nz = den > 0
    out[nz] = e[nz] / den[nz]
    return out


def lexical_overlap(a: Texts, b: Texts) -> np.ndarray:
    """DebCSE's lexical overlap per pair (a[i], b[i]): the multiset intersection of the two sentences' words (the
    sum over words of the smaller count) over the word count of the longer one; 0.0 when both have no words.
    Words are `words(text)`, i.e. `text.lower().split()` (Python's lower-casing, split on Unicode whitespace,
    punctuation kept: "cat." and "cat" differ), tokenised by Arrow as for `mer`. Vectorised: one dictionary
    encoding of all words, then (pair, word) counts from np.unique on both sides and a sorted intersection."""
    if len(a) != len(b):
        raise ValueError(f"lexical_overlap: {len(a)} left vs {len(b)} right texts")
    n = len(a)
    if n == 0:
        return np.zeros(0, dtype=np.float64)
    lists = _lower_split(pa.concat_arrays([_as_arrow(a), _as_arrow(b)]))
    codes = pc.dictionary_encode(lists.flatten()).indices.to_numpy().astype(np.int64)
    off = lists.offsets.to_numpy()
    n_words = np.diff(off - off[0])
    n_words_a, n_words_b = n_words[:n], n_words[n:]
    split = int(n_words_a.sum())
    n_vocab = int(codes.max()) + 1 if len(codes) else 1
    pair: tuple[np.ndarray, np.ndarray]
    pair = np.repeat(np.arange(n, dtype=np.int64), n_words_a), np.repeat(np.arange(n, dtype=np.int64), n_words_b)
    keys_a, count_a = np.unique(pair[0] * n_vocab + codes[:split], return_counts=True)  # (pair, word) -> count
    keys_b, count_b = np.unique(pair[1] * n_vocab + codes[split:], return_counts=True)
    _, ia, ib = np.intersect1d(keys_a, keys_b, assume_unique=True, return_indices=True)
    shared = np.bincount(keys_a[ia] // n_vocab, weights=np.minimum(count_a[ia], count_b[ib]), minlength=n)
    longest = np.maximum(n_words_a, n_words_b)
    out: np.ndarray = np.zeros(n, dtype=np.float64)
    np.divide(shared, longest, out=out, where=longest > 0)
    return out
