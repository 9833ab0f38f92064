"""What the memo tests share: a pack's vector values, the encode memo's call with a record of what it computed, and
the log lines that name given words (tests/test_memo_trust.py, test_memo_binding.py, test_read_traps.py)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from contramine.pipeline.memo.rows import RowMemo, row_key


def vectors(texts, width: int = 4) -> pa.Table:
    """A float32 vector per text (its length, then +1, +2, ...), as the encode memo stores one: fixed-size bytes."""
    vecs = np.array([[len(t) + j for j in range(width)] for t in texts], np.float32)
    return pa.table({"vec": pa.FixedSizeBinaryArray.from_buffers(pa.binary(4 * width), len(texts),
                                                                 [None, pa.py_buffer(vecs.tobytes())])})


def memo_rows(memo: RowMemo, texts, calls: list, schema=None) -> pa.Table:
    """The encode memo's call (no schema given: the width is the model's); `calls` gets each computed batch's texts."""
    def compute(missing):
        calls.append([texts[i] for i in missing])
        return vectors([texts[i] for i in missing])
    return memo.rows([row_key(t) for t in texts], compute, schema)


def log_lines(caplog, *words) -> list[str]:
    """The captured log messages that contain every one of `words`."""
    return [r.getMessage() for r in caplog.records if all(w in r.getMessage() for w in words)]
