"""Surface distances between sentences (METHODS §4), vectorised with rapidfuzz.

- `edit_distance`: Levenshtein distance / length of the longer string, in [0, 1]; `level="char"` (default) or
  `"word"` (each distinct word becomes one code point, so word-level distance runs at string speed).
- `mer`: OssCSE Eq. 1 per pair, MER = (S+D+I)/(S+D+I+C) over lower-cased whitespace tokens, 0 for two empty strings.
  The alignment is rapidfuzz's Levenshtein alignment, the one jiwer 4 uses, so it equals `jiwer.mer(a, b)` per pair.
- `lexical_overlap`: |shared words| / words in the longer sentence (DebCSE Tables 1 and 4).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rapidfuzz import process
from rapidfuzz.distance import Levenshtein


class _WordCodes:
    """Map each distinct word to one code point (skipping the surrogate range)."""

    def __init__(self):
        self.codes: dict[str, str] = {}

    def __call__(self, words: list[str]) -> str:
        codes = self.codes
        out = []
        for w in words:
            c = codes.get(w)
            if c is None:
                n = len(codes) + 1
                c = codes[w] = chr(n if n < 0xD800 else n + 0x800)
            out.append(c)
        return "".join(out)


def words(text: str) -> list[str]:
    return text.lower().split()


def edit_distance(a: list[str], b: list[str], level: str = "char") -> np.ndarray:
    """Normalised Levenshtein distance per pair (a[i], b[i]) in [0, 1]."""
    if len(a) != len(b):
        raise ValueError(f"edit_distance: {len(a)} left vs {len(b)} right texts")
    if not a:
        return np.zeros(0, dtype=np.float32)
    if level == "word":
        enc = _WordCodes()
        a = [enc(words(t)) for t in a]
        b = [enc(words(t)) for t in b]
    elif level != "char":
        raise ValueError(f"edit level {level!r}: expected 'char' or 'word'")
    return process.cpdist(a, b, scorer=Levenshtein.normalized_distance, workers=-1, dtype=np.float32)


def mer_counts(a: str, b: str, _enc: _WordCodes | None = None) -> tuple[int, int, int, int]:
    """(S, D, I, C) of the word alignment of reference a and hypothesis b."""
    enc = _enc or _WordCodes()
    ra, hb = enc(words(a)), enc(words(b))
    s = d = i = 0
    for op in Levenshtein.editops(ra, hb):
        if op.tag == "replace":
            s += 1
        elif op.tag == "delete":
            d += 1
        else:
            i += 1
    return s, d, i, len(ra) - s - d


def _word_code_strings(texts: list[str]) -> list[str] | None:
    """Each text as a string with one code point per lower-cased whitespace word (equal words, equal code points),
    tokenised and dictionary-encoded by Arrow in C++. `utf8_split_whitespace` splits exactly where `str.split()`
    does (compared over every code point); None when the distinct words outnumber the code points."""
    lists = pc.utf8_split_whitespace(pa.array([t.lower() for t in texts], pa.large_string()))
    codes = pc.dictionary_encode(lists.flatten()).indices.to_numpy().astype(np.uint32) + 1
    codes[codes >= 0xD800] += 0x800  # skip the surrogates
    if len(codes) and int(codes.max()) > 0x10FFFF:
        return None
    joined = codes.tobytes().decode("utf-32-le")
    off = lists.offsets.to_numpy().tolist()
    return [joined[i:j] for i, j in zip(off[:-1], off[1:])]


def mer(a: list[str], b: list[str]) -> np.ndarray:
    """Match error rate per pair (a[i], b[i]), equal to `jiwer.mer(a[i], b[i])` on lower-cased text.

    With n, m the two word counts, E the Levenshtein distance and I the insertions of rapidfuzz's alignment
    (jiwer's): MER = E / (E + hits) = E / (n + I). E comes from one multi-threaded `cpdist` call. When
    E - |m - n| <= 1 every optimal alignment has no deletion-insertion pair, so I = max(m - n, 0); only the other
    pairs (whose alignments can trade two substitutions for a deletion and an insertion) need their editops."""
    if len(a) != len(b):
        raise ValueError(f"mer: {len(a)} left vs {len(b)} right texts")
    coded = _word_code_strings(list(a) + list(b)) if len(a) else []
    if coded is None:  # more distinct words than code points: halve
        h = len(a) // 2
        return np.concatenate([mer(a[:h], b[:h]), mer(a[h:], b[h:])])
    ra, hb = coded[:len(a)], coded[len(a):]
    out = np.zeros(len(a), dtype=np.float64)
    if not len(a):
        return out
    e = process.cpdist(ra, hb, scorer=Levenshtein.distance, workers=-1, dtype=np.int64)
    n = np.fromiter(map(len, ra), np.int64, len(ra))
    m = np.fromiter(map(len, hb), np.int64, len(hb))
    ins = np.maximum(m - n, 0)
    editops = Levenshtein.editops
    ambiguous = np.flatnonzero(e - np.abs(m - n) >= 2).tolist()
    ins[ambiguous] = [[op[0] for op in editops(ra[k], hb[k]).as_list()].count("insert") for k in ambiguous]
    den = n + ins
    nz = den > 0
    out[nz] = e[nz] / den[nz]
    return out


def lexical_overlap(a: list[str], b: list[str]) -> np.ndarray:
    out = np.empty(len(a), dtype=np.float64)
    for k, (x, y) in enumerate(zip(a, b)):
        wx, wy = words(x), words(y)
        longest = max(len(wx), len(wy))
        out[k] = len(set(wx) & set(wy)) / longest if longest else 0.0
    return out
