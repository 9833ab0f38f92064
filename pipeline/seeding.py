"""Per-row randomness: a generator seeded from (run seed, stage, sid, ...), never from process state, so
results do not depend on shard count, worker count or order."""
from __future__ import annotations

import zlib

import numpy as np

_MASK = (1 << 64) - 1


def row_rng(seed: int, stage: str, sid: int, *more: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(stage.encode()), int(sid) & _MASK, *(int(m) & _MASK for m in more)])
