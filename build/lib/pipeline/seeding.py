"""Per-row randomness, the one scheme every stage uses: numbers drawn from (run seed, stage, row keys), never from
process state, so results do not depend on shard count, worker count, batch composition or order.

    rng = row_rng(seed, "noise", sid, variant)        # a numpy Generator for one row
    s = row_seed(seed, "backtranslate", sid, variant)  # a 63-bit integer seed (for torch generators)

Keys are integers (sids, indices) or strings (hashed with blake2b). Both functions read the same SeedSequence, so a
row's stream is defined once; changing this file changes every sampled table (its code version says so).
"""
from __future__ import annotations

import hashlib
import zlib

import numpy as np

_MASK = (1 << 64) - 1


def _key(k) -> int:
    if isinstance(k, str):
        return int.from_bytes(hashlib.blake2b(k.encode("utf-8"), digest_size=8).digest(), "little")
    return int(k) & _MASK


def _entropy(seed: int, stage: str, keys: tuple) -> list[int]:
    return [int(seed) & _MASK, zlib.crc32(stage.encode()), *(_key(k) for k in keys)]


def row_rng(seed: int, stage: str, *keys) -> np.random.Generator:
    return np.random.default_rng(_entropy(seed, stage, keys))


def row_seed(seed: int, stage: str, *keys) -> int:
    """A 63-bit seed (non-negative, fits torch.Generator.manual_seed) from the same stream as `row_rng`."""
    return int(np.random.SeedSequence(_entropy(seed, stage, keys)).generate_state(1, np.uint64)[0] >> np.uint64(1))
