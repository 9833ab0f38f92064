"""Surface distances between sentences (METHODS §4), vectorised with rapidfuzz.

- `edit_distance`: Levenshtein distance / length of the longer string, in [0, 1]; `level="char"` (default) or
  `"word"` (each distinct word becomes one code point, so word-level distance runs at string speed).
- `mer`: OssCSE Eq. 1 per pair, MER = (S+D+I)/(S+D+I+C) over lower-cased whitespace tokens, 0 for two empty strings.
  The alignment is rapidfuzz's Levenshtein alignment, the one jiwer 4 uses, so it equals `jiwer.mer(a, b)` per pair.
- `lexical_overlap`: |shared words| / words in the longer sentence (DebCSE Tables 1 and 4).
"""
from __future__ import annotations

import numpy as np
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


def mer(a: list[str], b: list[str]) -> np.ndarray:
    """Match error rate per pair (a[i], b[i])."""
    if len(a) != len(b):
        raise ValueError(f"mer: {len(a)} left vs {len(b)} right texts")
    enc = _WordCodes()
    out = np.empty(len(a), dtype=np.float64)
    for k, (x, y) in enumerate(zip(a, b)):
        s, d, i, c = mer_counts(x, y, enc)
        errors = s + d + i
        out[k] = errors / (errors + c) if errors + c else 0.0
    return out


def lexical_overlap(a: list[str], b: list[str]) -> np.ndarray:
    out = np.empty(len(a), dtype=np.float64)
    for k, (x, y) in enumerate(zip(a, b)):
        wx, wy = words(x), words(y)
        longest = max(len(wx), len(wy))
        out[k] = len(set(wx) & set(wy)) / longest if longest else 0.0
    return out
