"""Degenerate translations: an output that repeats itself or is far longer or shorter than its input.

Greedy decoding of small translation models sometimes loops ("the F13 F13 spear spear spear event") or runs on
past its input ("She is an Italian women's champion of the 2010 Italian season."). Such an output is not a
positive nor a paraphrase of its input. The `backtranslate` stage keeps every output and writes in its `flag`
column why one is degenerate (null when it is not); the stages that read back-translations skip flagged rows, and
the manifest and the report count them, so a user can look at them with SQL:

    SELECT flag, count(*) FROM backtranslations GROUP BY flag

Rules, in this order (backtranslate.degenerate_* settings):
- "repeats":   a word n-gram (n <= 4; lower-cased, edge punctuation stripped) repeated back to back in the output
               and not in the input ("title title", "of the State of the State");
- "too_long":  more than max_ratio x the input's words, when the longer of the two has at least min_words words;
- "too_short": fewer than min_ratio x the input's words, same condition.
Measured on 1,748 wiki1m lines through bergamot en→pt→en: 12 repeat, 4 run long, none run short.

`degenerate_flag` is the rule for one row; `degenerate_flags`, what the stage calls, gives the same flags for whole
columns (Arrow and NumPy; the rows where the two could differ go through `degenerate_flag`).
"""
from __future__ import annotations

import operator
import string

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MAX_N = 4
_EDGE = string.punctuation + "“”‘’«»…–—"


def words(text: str) -> list[str]:
    """Lower-cased words with edge punctuation stripped (a word of punctuation only is kept as it is)."""
    return [w.strip(_EDGE).lower() or w for w in text.split()]


def back_to_back(tokens: list[str], max_n: int = MAX_N) -> set[tuple[str, ...]]:
    """The n-grams (n <= max_n) that occur twice in a row."""
    found = set()
    for n in range(1, max_n + 1):
        # an n-gram repeated at i starts with tokens[i] == tokens[i + n]: most texts have no such pair (checked in C)
        if not any(map(operator.eq, tokens, tokens[n:])):
            continue
        for i in range(len(tokens) - 2 * n + 1):
            if tokens[i:i + n] == tokens[i + n:i + 2 * n]:
                found.add(tuple(tokens[i:i + n]))
    return found


def degenerate_flag(source: str, output: str, max_ratio: float = 1.5, min_ratio: float = 0.5,
                    min_words: int = 6) -> str | None:
    """Why `output` is a degenerate translation of `source` ("repeats", "too_long", "too_short"), else None."""
    if not output:
        return None  # an empty output is no candidate anywhere already
    src, out = words(source), words(output)
    repeated = back_to_back(out)
    if repeated and repeated - back_to_back(src):  # the input's repeats are read only when the output has some
        return "repeats"
    if max(len(src), len(out)) >= min_words:
        if len(out) > max_ratio * len(src):
            return "too_long"
        if len(out) < min_ratio * len(src):
            return "too_short"
    return None


# `degenerate_flags`: the same rules over whole columns. Arrow's whitespace split and trim give what `str.split` and
# `str.strip` give for every code point, and its lower what `str.lower` gives but for the code points below (Unicode
# versions apart, and Python's final-sigma rule): a row with one of those takes `degenerate_flag` itself, as does a
# row whose output and input both repeat (whether they repeat the same n-gram decides). Checked against
# `degenerate_flag` code point by code point in tests/test_degenerate_flags.py.
LOWER_UNLIKE_PYTHON = (
    "\u0130\u03a3\u1c89\ua7cb-\ua7cc\ua7ce\ua7d2\ua7d4\ua7da\ua7dc-\ua7dd\ua7e2\uab6c-\uab6d"
    "\U00010d50-\U00010d65\U00016ea0-\U00016eb8\U0001df40\U0001df48\U0001df4a\U0001df4d\U0001df51\U0001df68"
    "\U0001df6a\U0001df6c\U0001df6e\U0001df72\U0001df74\U0001df76\U0001df78\U0001df7a\U0001df7c\U0001df7e")


_ASCII_EDGE = "".join(c for c in _EDGE if c.isascii())
_ASCII_SPACE: np.ndarray = np.zeros(256, bool)
_ASCII_SPACE[[9, 10, 11, 12, 13, 32]] = True  # what str.split splits ASCII text at, but \x1c-\x1f


def _words(column: pa.Array, ascii: bool) -> tuple[np.ndarray, np.ndarray]:
    """The words of each row as `words` gives them, as ids (equal words, equal ids), and the row of each. `ascii`:
    the column is ASCII without \\x1c-\\x1f (which `str.split` splits at and Arrow's ASCII split does not), so
    Arrow's ASCII kernels give the same words, faster."""
    parts = (pc.ascii_split_whitespace if ascii else pc.utf8_split_whitespace)(column)
    row, raw = pc.list_parent_indices(parts).to_numpy(), pc.list_flatten(parts)
    real = pc.not_equal(raw, "").to_numpy(zero_copy_only=False)  # not the empty parts at a leading / trailing space
    row, raw = row[real], raw.filter(pa.array(real))
    if ascii:
        word = pc.dictionary_encode(pc.ascii_lower(pc.ascii_trim(raw, characters=_ASCII_EDGE)))
    else:
        word = pc.dictionary_encode(pc.utf8_lower(pc.utf8_trim(raw, characters=_EDGE)))
    ids = word.indices.to_numpy().astype(np.int64)
    punctuation = np.flatnonzero(pc.equal(word, "").to_numpy(zero_copy_only=False))
    if len(punctuation):  # a word of punctuation only is kept as it is: ids past the others'
        ids[punctuation] = len(word.dictionary) + pc.dictionary_encode(raw.take(pa.array(punctuation))).indices.to_numpy()
    return row, ids


def _repeats(row: np.ndarray, ids: np.ndarray, rows: int, max_n: int = MAX_N) -> np.ndarray:
    """Per row: whether `back_to_back` of its words is non-empty."""
    hit: np.ndarray = np.zeros(rows, bool)
    for n in range(1, max_n + 1):
        same = (ids[:-n] == ids[n:]) & (row[:-n] == row[n:])  # word i equals word i + n, in one row
        starts = max(len(same) - n + 1, 0)  # where n words can start (never a negative slice end: it would wrap)
        run = same[:starts].copy()  # ... and so do the n - 1 words after each: n words repeated
        for j in range(1, n):
            run &= same[j:starts + j]
        hit[row[:len(run)][run]] = True
    return hit


def _bytes_of(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A string column's UTF-8 bytes and its rows' offsets into them."""
    _, offsets, data = column.buffers()
    offsets = np.frombuffer(offsets, np.int32)[column.offset:column.offset + len(column) + 1]
    return (np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)), offsets


def _plain_ascii(column: pa.Array) -> np.ndarray:
    """Per row: ASCII, without the separators only `str.split` knows (\\x1c-\\x1f)."""
    plain = pc.string_is_ascii(column).fill_null(False).to_numpy(zero_copy_only=False)
    data, offsets = _bytes_of(column)
    at = np.flatnonzero((data[offsets[0]:offsets[-1]] - 0x1c) < 4) + offsets[0]
    plain[np.searchsorted(offsets, at, "right") - 1] = False
    return plain


def _word_stats(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Per row: how many words, and whether they repeat back to back (`back_to_back` non-empty)."""
    counts: np.ndarray = np.zeros(len(column), np.int64)
    repeats: np.ndarray = np.zeros(len(column), bool)
    plain = _plain_ascii(column)
    for ascii, rows in ((True, np.flatnonzero(plain)), (False, np.flatnonzero(~plain))):
        if len(rows):
            row, ids = _words(_rows(column, rows), ascii)
            counts[rows] = np.bincount(row, minlength=len(rows))
            repeats[rows] = _repeats(row, ids, len(rows))
    return counts, repeats


def _word_counts(column: pa.Array) -> np.ndarray:
    """Per row: how many words (`len(text.split())`); of plain ASCII rows from their bytes, words not made."""
    counts: np.ndarray = np.zeros(len(column), np.int64)
    plain = _plain_ascii(column)
    if len(rows := np.flatnonzero(~plain)):
        counts[rows] = _word_stats(_rows(column, rows))[0]
    if len(rows := np.flatnonzero(plain)):
        data, offsets = _bytes_of(_rows(column, rows))
        lo, hi = offsets[0], offsets[-1]
        space = _ASCII_SPACE[data[lo:hi]]
        first = np.zeros(hi - lo, bool)
        first[offsets[:-1][np.diff(offsets) > 0] - lo] = True
        starts = np.flatnonzero(~space & (first | np.r_[True, space[:-1]])) + lo  # after a space, or a row's start
        counts[rows] = np.bincount(np.searchsorted(offsets, starts, "right") - 1, minlength=len(rows))
    return counts


def _strings(column) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else pa.array(column, pa.string())


def _rows(column: pa.Array, rows: np.ndarray) -> pa.Array:
    return column if len(rows) == len(column) else column.take(pa.array(rows, pa.int64()))


def _unlike_python(column: pa.Array) -> np.ndarray:
    """Per row: null, or a code point Arrow lowers otherwise than Python."""
    odd = pc.match_substring_regex(column, f"[{LOWER_UNLIKE_PYTHON}]").fill_null(True)
    return odd.to_numpy(zero_copy_only=False)


def degenerate_flags(sources, outputs, max_ratio: float = 1.5, min_ratio: float = 0.5,
                     min_words: int = 6) -> pa.Array:
    """`degenerate_flag` of each (source, output) row, as one string column, by Arrow and NumPy over the columns;
    row by row only where the two could differ (see above) and where both texts repeat. `sources` may be a
    dictionary column (a source is the input of several outputs: each is read once), else it is encoded as one."""
    outputs = _strings(outputs)
    if isinstance(sources, pa.ChunkedArray):
        sources = sources.combine_chunks()
    source = sources if isinstance(sources, pa.DictionaryArray) else pc.dictionary_encode(_strings(sources))
    texts, of = source.dictionary, source.indices.to_numpy(zero_copy_only=False)
    flags: np.ndarray = np.full(len(outputs), None, object)
    by_rows = _unlike_python(texts)[of] | _unlike_python(outputs)
    fast = np.flatnonzero(~by_rows)
    if len(fast):
        fast_outputs = _rows(outputs, fast)
        out_n, out_rep = _word_stats(fast_outputs)
        src_n = _word_counts(texts)[of[fast]]
        src_rep: np.ndarray = np.zeros(len(texts), bool)  # read where the output repeats: those sources only
        if len(asked := np.unique(of[fast[out_rep]])):
            src_rep[asked] = _word_stats(texts.take(pa.array(asked)))[1]
        src_rep = src_rep[of[fast]]
        judged = (np.maximum(src_n, out_n) >= min_words) & (pc.binary_length(fast_outputs).to_numpy() > 0)
        flags[fast[judged & (out_n < min_ratio * src_n)]] = "too_short"
        flags[fast[judged & (out_n > max_ratio * src_n)]] = "too_long"
        flags[fast[out_rep & ~src_rep]] = "repeats"  # an input without repeats repeats none of the output's
        by_rows[fast[out_rep & src_rep]] = True
    slow = np.flatnonzero(by_rows)
    src, out = texts.take(pa.array(of[slow])).to_pylist(), _rows(outputs, slow).to_pylist()
    flags[slow] = [degenerate_flag(s, o, max_ratio, min_ratio, min_words) for s, o in zip(src, out)]
    return pa.array(flags.tolist(), pa.string())
