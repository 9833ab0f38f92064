"""The row memo's audit (rows.py describes the memo; runner.memo_verify sets its share): which reused rows are
computed again, and whether a stored row equals its fresh computation.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa


def audit_rows(packs: np.ndarray, verify: float) -> np.ndarray:
    """Indexes (into the found rows, `packs` the pack each came from) to compute again: a random `verify` share of
    them, and a random one of every pack they came from. Random, not seeded: a writer cannot know which rows will be
    checked, and the tables do not depend on it (an audited row is served only when it equals the fresh one)."""
    n = len(packs)
    if verify <= 0 or not n:
        return np.zeros(0, np.int64)
    rng = np.random.default_rng()
    share = rng.choice(n, size=min(n, int(np.ceil(verify * n))), replace=False)
    order = rng.permutation(n)
    _, first = np.unique(packs[order], return_index=True)
    return np.union1d(share, order[first])


def same_rows(a: pa.Table, b: pa.Table, exact: bool) -> np.ndarray:
    """Per row: whether `a`'s row equals `b`'s (exactly; vectors to 1e-4 where the memo is not `exact`)."""
    same = np.ones(a.num_rows, bool)
    for name in a.column_names:
        x, y = a.column(name).combine_chunks(), b.column(name).combine_chunks()
        if not exact and pa.types.is_fixed_size_binary(x.type) and x.type.byte_width % 4 == 0:
            w = x.type.byte_width
            fx = np.frombuffer(x.buffers()[1], np.float32)[x.offset * w // 4:(x.offset + len(x)) * w // 4]
            fy = np.frombuffer(y.buffers()[1], np.float32)[y.offset * w // 4:(y.offset + len(y)) * w // 4]
            same &= np.isclose(fx.reshape(len(x), -1), fy.reshape(len(y), -1), atol=1e-4, rtol=0).all(1)
        else:
            same &= np.array([u == v for u, v in zip(x.to_pylist(), y.to_pylist())], bool)
    return same
