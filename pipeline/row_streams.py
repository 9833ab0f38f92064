"""Many rows' `seeding.row_rng` streams at once, as NumPy arrays: the same numbers, drawn for every row together.

`row_rng(seed, stage, *keys)` is `np.random.default_rng` of a SeedSequence: ~70 µs a row to build, most of a
stage's time where a row draws only a few numbers (noise, IPW). `RowStreams` builds the same PCG64 states for all
rows with array arithmetic (NumPy's SeedSequence mixing, PCG64's seeding and steps, on uint32/uint64 arrays), then
draws as `Generator.integers` and `Generator.random` do, row by row in the same order. A draw that NumPy would have
to reject and repeat (Lemire's method, about one in 2^32 / range) is not followed here: such rows are reported in
`unsure`, and their stage computes them with `row_rng` itself. `matches_numpy()` checks a sample against NumPy's
own Generator, so a NumPy whose streams changed falls back to `row_rng` everywhere instead of changing a table.
"""
from __future__ import annotations

import functools
import zlib

import numpy as np

from contramine.pipeline.seeding import _MASK, row_rng, row_seed

M32 = np.uint64(0xFFFFFFFF)
# NumPy's SeedSequence constants (numpy/random/bit_generator.pyx)
INIT_A, MULT_A, INIT_B, MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
MIX_MULT_L, MIX_MULT_R, POOL_SIZE = 0xCA01F9DD, 0x4973F715, 4
# PCG64's default 128-bit multiplier (numpy/random/src/pcg64/pcg64.h), as (high, low) words
PCG_MULT = (np.uint64(2549297995355413924), np.uint64(4865540595714422341))


def _words(k: int) -> list[int]:
    """SeedSequence's uint32 words of one non-negative integer: little end first, 0 as one word."""
    k = int(k)
    out = [k & 0xFFFFFFFF]
    while k > 0xFFFFFFFF:
        k >>= 32
        out.append(k & 0xFFFFFFFF)
    return out


def _hash_consts(start: int, mult: int, n: int) -> list[np.uint32]:
    """The hash constant before each of n hashmix calls (it depends on the call's number only, never on data)."""
    out, h = [], start
    for _ in range(n):
        out.append(h)
        h = (h * mult) & 0xFFFFFFFF
    return [np.uint32(c) for c in out]


def _hashmix(value: np.ndarray, const: np.uint32, mult: int) -> np.ndarray:
    value = value ^ const
    value = value * np.uint32((int(const) * mult) & 0xFFFFFFFF)
    return value ^ (value >> np.uint32(16))


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    r = np.uint32(MIX_MULT_L) * x - np.uint32(MIX_MULT_R) * y
    return r ^ (r >> np.uint32(16))


def _seed_pool(entropy: np.ndarray) -> np.ndarray:
    """SeedSequence.mix_entropy over rows: entropy (rows x words, uint32) -> pool (rows x 4)."""
    n_words = entropy.shape[1]
    calls = max(n_words, POOL_SIZE) + POOL_SIZE * (POOL_SIZE - 1) + max(n_words - POOL_SIZE, 0) * POOL_SIZE
    consts = iter(_hash_consts(INIT_A, MULT_A, calls))
    zero: np.ndarray = np.zeros(len(entropy), np.uint32)
    pool = [_hashmix(entropy[:, i] if i < n_words else zero, next(consts), MULT_A) for i in range(POOL_SIZE)]
    for src in range(POOL_SIZE):
        for dst in range(POOL_SIZE):
            if src != dst:
                pool[dst] = _mix(pool[dst], _hashmix(pool[src], next(consts), MULT_A))
    for src in range(POOL_SIZE, n_words):
        for dst in range(POOL_SIZE):
            pool[dst] = _mix(pool[dst], _hashmix(entropy[:, src], next(consts), MULT_A))
    return np.stack(pool, axis=1)


def _generate_state(pool: np.ndarray) -> list[np.ndarray]:
    """SeedSequence.generate_state(4, np.uint64) over rows: four uint64 columns."""
    consts = _hash_consts(INIT_B, MULT_B, 8)
    words: list[np.ndarray] = [_hashmix(pool[:, i % POOL_SIZE], consts[i], MULT_B).astype(np.uint64) for i in range(8)]
    return [words[2 * i] | (words[2 * i + 1] << np.uint64(32)) for i in range(4)]


def _mul64(x: np.ndarray, y) -> tuple[np.ndarray, np.ndarray]:
    """The full 128-bit product of uint64 arrays, as (high, low)."""
    x0, x1, y0, y1 = x & M32, x >> np.uint64(32), y & M32, y >> np.uint64(32)
    p00, p01, p10, p11 = x0 * y0, x0 * y1, x1 * y0, x1 * y1
    mid = (p00 >> np.uint64(32)) + (p01 & M32) + (p10 & M32)
    return p11 + (p01 >> np.uint64(32)) + (p10 >> np.uint64(32)) + (mid >> np.uint64(32)), \
        (p00 & M32) | (mid << np.uint64(32))


def _add128(a_hi, a_lo, b_hi, b_lo):
    lo = a_lo + b_lo
    return a_hi + b_hi + (lo < a_lo).astype(np.uint64), lo


def _step(hi, lo, inc_hi, inc_lo):
    """state * MULT + inc (mod 2^128)."""
    p_hi, p_lo = _mul64(lo, PCG_MULT[1])
    p_hi = p_hi + hi * PCG_MULT[1] + lo * PCG_MULT[0]
    return _add128(p_hi, p_lo, inc_hi, inc_lo)


def seed_state(seed, stage: str, *keys) -> list[np.ndarray]:
    """`SeedSequence(seeding._entropy(seed, stage, keys)).generate_state(4, np.uint64)` for every row: `seed` an
    integer or a column (one per row), `keys` columns of integers (non-negative, or int64 read as seeding does)."""
    cols = [np.asarray(seed, np.uint64) if np.ndim(seed) else None, *(np.asarray(k).astype(np.uint64) for k in keys)]
    n = next((len(c) for c in cols if c is not None), 1)
    if n == 0:
        return [np.zeros(0, np.uint64) for _ in range(4)]
    stage_words = _words(zlib.crc32(stage.encode()))
    state: list[np.ndarray] = [np.zeros(n, np.uint64) for _ in range(4)]
    # a value below 2^32 is one word, else two: rows are grouped by how many words their values make
    varying = [c for c in cols if c is not None]
    wide = sum((c > M32).astype(np.int64) << i for i, c in enumerate(varying)) if varying else np.zeros(n, np.int64)
    for shape in np.unique(wide).tolist():
        rows = np.flatnonzero(wide == shape)
        words: list
        words, shape = [], iter([bool(shape >> i & 1) for i in range(len(varying))])
        for i, c in enumerate(cols):
            if c is None:
                words += [np.full(len(rows), w, np.uint32) for w in _words(int(seed) & _MASK)]
            else:
                words.append((c[rows] & M32).astype(np.uint32))
                if next(shape):
                    words.append((c[rows] >> np.uint64(32)).astype(np.uint32))
            if i == 0:
                words += [np.full(len(rows), w, np.uint32) for w in stage_words]
        for column, value in zip(state, _generate_state(_seed_pool(np.stack(words, axis=1)))):
            column[rows] = value
    return state


def row_seeds(seed, stage: str, *keys) -> list[int]:
    """`seeding.row_seed(seed, stage, *keys)` of every row (seed: an integer or a column)."""
    if not matches_numpy():  # a NumPy whose SeedSequence differs from seed_state's: row_seed itself, row by row
        seeds = np.broadcast_to(np.asarray(seed, np.uint64), (len(keys[0]) if keys else 1,))
        return [row_seed(int(s), stage, *(int(k[i]) for k in keys)) for i, s in enumerate(seeds.tolist())]
    return (seed_state(seed, stage, *keys)[0] >> np.uint64(1)).tolist()


class RowStreams:
    """One PCG64 stream per row, equal to `row_rng(seed, stage, *keys_of_that_row)`; `keys` are columns of
    integers (one value per row each)."""

    def __init__(self, seed: int, stage: str, *keys: np.ndarray):
        s0, s1, i0, i1 = seed_state(seed, stage, *keys)
        n = len(s0)
        # pcg64_srandom_r: inc = seq << 1 | 1; state = 0; step; state += initstate; step
        self.inc_hi, self.inc_lo = (i0 << np.uint64(1)) | (i1 >> np.uint64(63)), (i1 << np.uint64(1)) | np.uint64(1)
        hi, lo = _add128(self.inc_hi, self.inc_lo, s0, s1)
        self.hi, self.lo = _step(hi, lo, self.inc_hi, self.inc_lo)
        self.has32: np.ndarray = np.zeros(n, bool)
        self.buf32: np.ndarray = np.zeros(n, np.uint64)

    def next64(self, rows: np.ndarray) -> np.ndarray:
        """The next uint64 of each of `rows` (PCG64's XSL-RR output after one step)."""
        hi, lo = _step(self.hi[rows], self.lo[rows], self.inc_hi[rows], self.inc_lo[rows])
        self.hi[rows], self.lo[rows] = hi, lo
        x, rot = hi ^ lo, hi >> np.uint64(58)
        return (x >> rot) | (x << ((np.uint64(64) - rot) & np.uint64(63)))

    def next32(self, rows: np.ndarray) -> np.ndarray:
        """PCG64's next_uint32: the high half of the last uint64 when one is kept, else the low half of a new one."""
        out: np.ndarray = np.empty(len(rows), np.uint64)
        kept = self.has32[rows]
        out[kept] = self.buf32[rows[kept]]
        fresh = rows[~kept]
        x = self.next64(fresh)
        out[~kept] = x & M32
        self.buf32[fresh] = x >> np.uint64(32)
        self.has32[rows] = ~kept
        return out

    def integers(self, rows: np.ndarray, low, high) -> tuple[np.ndarray, np.ndarray]:
        """`Generator.integers(low, high)` (int64, high exclusive, high - low < 2^32) for each of `rows`, and which
        rows NumPy would have rejected a draw for (their value here is not NumPy's)."""
        low, high = np.broadcast_to(np.asarray(low, np.int64), rows.shape), np.broadcast_to(np.asarray(high, np.int64), rows.shape)
        span = (high - low - 1).astype(np.uint64)  # NumPy's `rng`: 0 draws nothing
        unsure: np.ndarray
        out: np.ndarray
        out, unsure = low.copy(), np.zeros(len(rows), bool)
        drawn = np.flatnonzero(span > 0)
        excl = span[drawn] + np.uint64(1)
        m = self.next32(rows[drawn]) * excl
        leftover = m & M32
        threshold = (np.uint64(1 << 32) - excl) % excl
        unsure[drawn] = leftover < threshold
        out[drawn] += (m >> np.uint64(32)).astype(np.int64)
        return out, unsure

    def top_half(self, rows: np.ndarray) -> np.ndarray:
        """`Generator.integers(0, 2**63, dtype=np.int64)`: Lemire's method over 2^63 never rejects and is x >> 1."""
        return (self.next64(rows) >> np.uint64(1)).astype(np.int64)

    def random(self, rows: np.ndarray) -> np.ndarray:
        """`Generator.random()`: 53 bits of the next uint64."""
        return (self.next64(rows) >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


@functools.lru_cache(maxsize=1)
def matches_numpy() -> bool:
    """This NumPy's `row_rng` streams are the ones `RowStreams` computes (checked once per process on keys of
    every width: small, 32-bit, 64-bit)."""
    keys = np.array([0, 1, 7, 2**31, 2**32 - 1, 2**32, 2**40 + 3, 2**63 - 1, 2**64 - 1], np.uint64)
    second: np.ndarray = np.arange(len(keys), dtype=np.uint64)[::-1].copy()
    streams, rows = RowStreams(12345, "check", keys, second), np.arange(len(keys))
    got = [streams.integers(rows, 0, 10)[0], streams.top_half(rows), streams.integers(rows, 3, 1000)[0],
           streams.random(rows)]
    for i, (a, b) in enumerate(zip(keys.tolist(), second.tolist())):
        rng = row_rng(12345, "check", a, b)
        want = [rng.integers(10), rng.integers(0, 2**63, dtype=np.int64), rng.integers(3, 1000), rng.random()]
        if [g[i] for g in got] != want:
            return False
    return True
