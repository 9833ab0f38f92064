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
from rapidfuzz.distance import Indel, Levenshtein


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


Texts = "list[str] | pa.Array | pa.ChunkedArray"
CHUNK_PAIRS = 4096  # pairs tokenised together: small dictionaries (code points below the surrogates, 2-byte strings)


def _as_arrow(texts) -> pa.Array:
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    if isinstance(texts, pa.Array):
        return texts.cast(pa.large_string())
    return pa.array(list(texts), pa.large_string())


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
    a, b = _as_arrow(a), _as_arrow(b)
    out = np.zeros(len(a), dtype=np.float64)
    for start in range(0, len(a), CHUNK_PAIRS):
        out[start:start + CHUNK_PAIRS] = _mer_chunk(a.slice(start, CHUNK_PAIRS), b.slice(start, CHUNK_PAIRS))
    return out


def _mer_chunk(a: pa.Array, b: pa.Array) -> np.ndarray:
    coded = _word_code_strings(pa.concat_arrays([a, b]))
    if coded is None:  # more distinct words than code points: halve
        h = len(a) // 2
        return np.concatenate([_mer_chunk(a.slice(0, h), b.slice(0, h)), _mer_chunk(a.slice(h), b.slice(h))])
    ra, hb = coded[:len(a)], coded[len(a):]
    e = process.cpdist(ra, hb, scorer=Levenshtein.distance, workers=-1, dtype=np.int64)
    n = np.fromiter(map(len, ra), np.int64, len(ra))
    m = np.fromiter(map(len, hb), np.int64, len(hb))
    ins = np.maximum(m - n, 0)
    maybe = np.flatnonzero(e - np.abs(m - n) >= 2)  # a deletion-insertion pair needs two edits beyond |m - n|
    if len(maybe):
        sub_a, sub_b = [ra[k] for k in maybe.tolist()], [hb[k] for k in maybe.tolist()]
        indel = process.cpdist(sub_a, sub_b, scorer=Indel.distance, workers=-1, dtype=np.int64)
        nm, mm, em = n[maybe], m[maybe], e[maybe]
        lcs = (nm + mm - indel) // 2
        c0 = np.minimum(nm, mm) - (em - np.abs(mm - nm))
        editops = Levenshtein.editops
        for k in np.flatnonzero(lcs > c0).tolist():
            ins[maybe[k]] = [op[0] for op in editops(sub_a[k], sub_b[k]).as_list()].count("insert")
    den = n + ins
    out = np.zeros(len(a), dtype=np.float64)
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
