"""torch's CPU random generator for many seeds at once, on any device: what

    torch.rand(n, generator=torch.Generator().manual_seed(seed))

draws, bit for bit, for each seed of an int64 tensor, computed with integer tensor ops where the seeds are (a GPU
too), so that sampling draws its per-row noise without the host (pipeline/models/translate/engines/hf.py, GumbelSampler).

    u = mt19937_uniform(seeds, n)    # (len(seeds), n) float32 in [0, 1)

torch's CPU generator is MT19937 (Matsumoto & Nishimura 1998) seeded with the seed's low 32 bits by the reference
initialisation, state[i] = 1812433253 * (state[i-1] ^ (state[i-1] >> 30)) + i (mod 2^32), and torch.rand(float32)
takes one 32-bit draw per number, u = (draw & (2^24 - 1)) / 2^24 (ATen's uniform_real_distribution), which float32
holds exactly. MT19937 regenerates ("twists") its 624 words at once and each draw is the next word, tempered. Rows
are vectorised; the 623 initialisation steps and the ceil(n / 624) twists run one after another, each a few tensor
ops over every row, so a call costs a few thousand small ops whatever the number of rows: ~10 ms here for 32 rows of
a 58,101-token vocabulary, where 32 torch generators on the host take ~0.1-0.2 s.
"""
from __future__ import annotations

import torch

N, M = 624, 397
WORD = 0xFFFFFFFF
UPPER, LOWER, MATRIX_A = 0x80000000, 0x7FFFFFFF, 0x9908B0DF


def _twist_words(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The twist's contribution of words i (a) and i + 1 (b): (y >> 1) ^ (MATRIX_A if y is odd), y = a's top bit
    joined to b's lower 31."""
    y = (a & UPPER) | (b & LOWER)
    return (y >> 1) ^ ((y & 1) * MATRIX_A)


def _twist(mt: torch.Tensor) -> torch.Tensor:
    """The next 624 words of each row of `mt` ((rows, 624) int64 holding 32-bit words). Word i becomes
    word (i + 397) mod 624 ^ twist(word i, word i + 1), in order: words 227 on read words the same twist wrote."""
    new, k = torch.empty_like(mt), N - M  # k = 227: words read ahead (i + 397) stay unwritten below i = k
    new[:, :k] = mt[:, M:] ^ _twist_words(mt[:, :k], mt[:, 1:k + 1])
    new[:, k:2 * k] = new[:, :k] ^ _twist_words(mt[:, k:2 * k], mt[:, k + 1:2 * k + 1])
    new[:, 2 * k:N - 1] = new[:, k:M - 1] ^ _twist_words(mt[:, 2 * k:N - 1], mt[:, 2 * k + 1:])
    new[:, N - 1] = new[:, M - 1] ^ _twist_words(mt[:, N - 1], new[:, 0])
    return new


def _temper(y: torch.Tensor) -> torch.Tensor:
    y = y ^ (y >> 11)
    y = y ^ ((y * 128) & 0x9D2C5680)  # (y << 7: a multiplication runs vectorised on a CPU, a shift of int64 does not)
    y = y ^ ((y * 32768) & 0xEFC60000)  # (y << 15)
    return y ^ (y >> 18)


def mt19937_uniform(seeds: torch.Tensor, n: int) -> torch.Tensor:
    """(len(seeds), n) float32: row r is torch.rand(n, generator=torch.Generator().manual_seed(seeds[r])), on
    seeds' device. Seeds are non-negative int64 (only their low 32 bits count, as in torch)."""
    x = seeds.to(torch.int64) & WORD
    words = [x]
    for i in range(1, N):  # products stay below 2^63: 1812433253 < 2^31, the word below 2^32
        x = (1812433253 * (x ^ (x >> 30)) + i) & WORD
        words.append(x)
    mt, blocks = torch.stack(words, dim=1), []
    for _ in range(-(-n // N)):
        mt = _twist(mt)
        blocks.append(mt)
    draws = _temper(torch.cat(blocks, dim=1)[:, :n])
    return (draws & 0xFFFFFF).to(torch.float32) * (1.0 / (1 << 24))
