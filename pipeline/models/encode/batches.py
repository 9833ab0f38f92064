"""How `Encoder.encode` feeds its model: texts tokenised ahead in worker threads, rows grouped into batches.

    chunks = tokenized_chunks(texts, tokenize, threads=4)   # Tokens of CHUNK_ROWS texts each, in input order
    same_length_batches(chunks, rows=128)                   # a CPU: rows of one token length, no padding at all
    packed_batches(chunks, tokens=32768)                    # a GPU: lengths merged, rows x padded length <= budget

Tokenising took 40% of a small model's encode time on this CPU, all of it before the first batch. HF's fast
tokenizers release the GIL inside `encode_batch` (tokenizers' bindings/python/src/tokenizer.rs: `py.detach`), so
worker threads tokenise the next chunks while the model runs the current batch; at most `2 x threads` chunks are
in flight, so memory stays bounded for millions of texts (the old path held every text's ids as Python lists).
A chunk's ids are one numpy array padded to its longest row; a batch is a fancy-index of it, never a list of lists.
"""
from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain
from typing import Callable, Generator, Iterable, Iterator, Sequence

import numpy as np

CHUNK_ROWS = 2048  # texts per tokenisation task: ~0.1-0.3 s of one thread, the delay before the first batch
MIN_ROWS = 8  # see same_length_batches
# ... and at least this many tokens (rows x length): below ~192 tokens per batch this machine's CPU GEMM takes
# other kernels whose last bits differ (measured on MiniLM: 11 rows of 17 tokens differ from 12+, 32 of 6 from 33+)
MIN_TOKENS = 256


def tokenize_threads() -> int:
    """Worker threads for tokenising: half the cores this process may use (the model's own threads keep the rest),
    at most 8 (a GPU's encode needs ~4 at 30k sentences/s)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, cores // 2))


@dataclass
class Tokens:
    """Tokenised rows: `rows` their positions in the input, `ids` (and `types`, the token type ids where the model
    takes them) padded with `pad_id` past each row's length to the longest row. A batch is a Tokens whose first
    `real` rows are its own (the rest repeat them: see same_length_batches)."""
    rows: np.ndarray  # int64 [n]
    lengths: np.ndarray  # int64 [n]
    ids: np.ndarray  # int64 [n, width]
    types: np.ndarray | None  # int64 [n, width] or None
    pad_id: int = 0
    real: int = -1

    def __post_init__(self):
        if self.real < 0:
            self.real = len(self.rows)

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())

    def take(self, sel: np.ndarray, real: int | None = None) -> "Tokens":
        """The rows `sel` (an index array), cut to their longest length."""
        width = int(self.lengths[sel].max(initial=0))
        return Tokens(self.rows[sel], self.lengths[sel], self.ids[sel, :width],
                      None if self.types is None else self.types[sel, :width], self.pad_id,
                      len(sel) if real is None else real)

    def attention_mask(self) -> np.ndarray:
        return (np.arange(self.ids.shape[1]) < self.lengths[:, None]).astype(np.int64)


def token_arrays(rows: np.ndarray, ids: Sequence[Sequence[int]], types: Sequence[Sequence[int]] | None,
                 pad_id: int) -> Tokens:
    """Tokens from per-row id lists (a tokenizer's output): one flat pass into a padded int64 array."""
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    width, total = int(lengths.max(initial=0)), int(lengths.sum())
    filled = np.arange(width) < lengths[:, None]

    def padded(lists, fill: int) -> np.ndarray:
        out: np.ndarray = np.full((len(lists), width), fill, np.int64)
        out[filled] = np.fromiter(chain.from_iterable(lists), np.int64, total)  # row-major: the rows' ids in order
        return out

    return Tokens(rows, lengths, padded(ids, pad_id), None if types is None else padded(types, 0), pad_id)


def tokenized_chunks(texts: Sequence[str], tokenize: Callable[[np.ndarray, list[str]], Tokens],
                     threads: int = 1, chunk: int | None = None) -> Generator[Tokens, None, None]:
    """`tokenize(rows, texts[rows])` over chunks of `chunk` (CHUNK_ROWS) texts, in input order, run ahead by
    `threads` worker threads (at most 2 x threads chunks in flight); inline when one chunk holds everything."""
    chunk = chunk or CHUNK_ROWS
    starts = range(0, len(texts), chunk)

    def task(s: int) -> Tokens:
        return tokenize(np.arange(s, min(s + chunk, len(texts)), dtype=np.int64), list(texts[s:s + chunk]))

    if threads < 1 or len(starts) <= 1:
        yield from map(task, starts)
        return
    pool = ThreadPoolExecutor(threads, thread_name_prefix="tokenize")
    try:
        ahead: deque = deque()
        for s in starts:
            ahead.append(pool.submit(task, s))
            if len(ahead) >= 2 * threads:
                yield ahead.popleft().result()
        while ahead:
            yield ahead.popleft().result()
    finally:  # the consumer stopped early (an error in its batch): cancel what has not started, wait for the rest
        pool.shutdown(wait=True, cancel_futures=True)


def concat(parts: list[Tokens]) -> Tokens:
    """One Tokens of several, padded to the widest (padding never reaches the model: batches cut to their length)."""
    if len(parts) == 1:
        return parts[0]
    width = max(p.ids.shape[1] for p in parts)

    def widen(a: np.ndarray, fill: int) -> np.ndarray:
        return np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=fill) if a.shape[1] < width else a

    return Tokens(np.concatenate([p.rows for p in parts]), np.concatenate([p.lengths for p in parts]),
                  np.concatenate([widen(p.ids, p.pad_id) for p in parts]),
                  None if parts[0].types is None else np.concatenate(  # one model's parts: all have types, or none
                      [widen(p.types, 0) for p in parts]),  # type: ignore[arg-type]
                  parts[0].pad_id)


def same_length_batches(chunks: Iterable[Tokens], rows: int) -> Iterator[Tokens]:
    """Batches of rows of ONE token length, at most `rows` rows, each length's rows in input order (as the whole
    input sorted by length would give): no padding at all, so a row's numbers do not depend on which other rows
    share its batch — on a CPU (checked; GPU kernels give no such promise). Small batches take other CPU kernels
    whose last bits differ, so a batch under MIN_ROWS rows or MIN_TOKENS tokens repeats its rows up to both (only
    the first `real` rows are its own). A length's rows wait in its bucket until `rows` of them are there; what is
    left is run at the end."""
    rows = max(1, rows)
    buckets: dict[int, list[Tokens]] = {}
    filled: dict[int, int] = {}

    def cut(length: int, final: bool) -> Iterator[Tokens]:
        both = concat(buckets.pop(length))
        n = len(both.rows)
        stop = n if final else n - n % rows
        for s in range(0, stop, rows):
            real = min(rows, stop - s)
            run = max(real, MIN_ROWS, -(-MIN_TOKENS // max(1, length)))
            yield both.take(np.resize(np.arange(s, s + real), run), real)
        if stop < n:
            buckets[length], filled[length] = [both.take(np.arange(stop, n))], n - stop
        else:
            filled.pop(length, None)

    for part in chunks:
        order = np.argsort(part.lengths, kind="stable")
        lengths = part.lengths[order]
        starts = np.flatnonzero(np.r_[True, lengths[1:] != lengths[:-1]])
        for s, e in zip(starts, np.r_[starts[1:], len(order)]):
            length = int(lengths[s])
            buckets.setdefault(length, []).append(part.take(order[s:e]))
            filled[length] = filled.get(length, 0) + int(e - s)
            if filled[length] >= rows:
                yield from cut(length, final=False)
    for length in sorted(buckets, reverse=True):
        yield from cut(length, final=True)


def packed_batches(chunks: Iterable[Tokens], tokens: int) -> Iterator[Tokens]:
    """Batches of rows sorted by length, longest first, padded to their longest, with rows x padded length <=
    `tokens` (a row longer than the budget runs alone): few, full batches whatever the length mix, for a GPU.
    Chunks are gathered until they hold 8 budgets of tokens, so a batch rarely stays part-full; the shortest rows
    of each gathering (the last, part-full batch) wait for the next one."""
    tokens = max(1, tokens)
    waiting: list[Tokens] = []
    have = 0
    for part in chain(chunks, [None]):
        if part is not None:
            waiting.append(part)
            have += part.tokens
            if have < 8 * tokens:
                continue
        if not waiting:
            break
        pool = concat(waiting)
        order = np.argsort(-pool.lengths, kind="stable")
        s, cuts = 0, []
        while s < len(order):
            n = max(1, tokens // max(1, int(pool.lengths[order[s]])))  # lengths fall: the first row sets the width
            cuts.append((s, min(s + n, len(order))))
            s += n
        last = part is not None and cuts[-1][1] - cuts[-1][0] < tokens // max(1, int(pool.lengths[order[cuts[-1][0]]]))
        for s, e in cuts[:-1] if last else cuts:
            yield pool.take(order[s:e])
        waiting = [pool.take(order[cuts[-1][0]:])] if last else []
        have = sum(w.tokens for w in waiting)
