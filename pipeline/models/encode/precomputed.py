"""Precomputed embeddings as the encoder (`embeddings.from = "<file>.parquet"`): vectors from any embedder (an API's,
a model this project cannot run) instead of `encoder.model`.

The file has a vector column `emb` (list<float> or fixed_size_list<float>, one length) and a key column: `sid` (our
sentence id, see pipeline/identity.py) or `text` (normalised as the `sentences` stage does, then hashed to
the sid). Lookup is by sid, so a text matches whatever its row, shard or duplicate count. Vectors are L2-normalised
here (cosines, as with `encoder.model`; rows already of unit length are kept bit for bit). Every text the run
embeds must be in the file: the sentences (`embeddings` stage) and, for DebCSE, the positive candidates the
`scores` stage embeds (noised copies, back-translations: their texts are in the `variants` and `backtranslations`
tables). A missing text fails the stage with the count and the first few missing texts; vectors are never mixed
with another model's. Every problem is a `PrecomputedError`, a `StageError` (pipeline/errors.py): one line naming
the file and the row, column or texts.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contramine.pipeline.errors import StageError
from contramine.pipeline.identity import normalise, sentence_id


class PrecomputedError(StageError, ValueError):
    """The file cannot serve as embeddings (missing column, ragged or non-finite vectors, missing texts). Still a
    ValueError, as it was before StageError existed, for callers that catch that."""


def _sids_of(texts) -> np.ndarray:
    return np.fromiter((sentence_id(normalise(t or "")) for t in texts), np.int64, len(texts))


class PrecomputedEncoder:
    """Encoder's interface (`encode`, `dim`, `device`) over a Parquet file of vectors."""

    def __init__(self, path: Path):
        self.path, self.device, self.name = Path(path), "cpu", f"precomputed:{path}"
        if not self.path.is_file():
            raise PrecomputedError(f"embeddings.from {self.path}: no such file")
        try:
            table = pq.read_table(self.path)
        except pa.ArrowInvalid as e:
            why = " ".join(str(e).split())  # one line
            raise PrecomputedError(f"embeddings.from {self.path}: not a Parquet file ({why})") from None
        names = table.column_names
        if "emb" not in names or not ({"sid", "text"} & set(names)):
            raise PrecomputedError(f"embeddings.from {self.path}: expected a vector column `emb` and a key column "
                                   f"`sid` or `text`; found {names}")
        emb = table.column("emb").combine_chunks()
        if not any(f(emb.type) for f in (pa.types.is_list, pa.types.is_fixed_size_list, pa.types.is_large_list)):
            raise PrecomputedError(f"embeddings.from {self.path}: column `emb` is {emb.type}, expected a list of "
                                   f"floats")
        lengths = pc.list_value_length(emb).to_numpy(zero_copy_only=False)
        if emb.null_count or len(set(lengths.tolist())) > 1:
            row = int(np.flatnonzero(emb.is_null().to_numpy(zero_copy_only=False) | (lengths != lengths[0]))[0])
            raise PrecomputedError(f"embeddings.from {self.path}: row {row} has a vector of another length (or none); "
                                   f"every `emb` must have the same length")
        self.dim = int(lengths[0]) if len(lengths) else 0
        vecs = pc.list_flatten(emb).to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(emb), self.dim)
        norms = np.linalg.norm(vecs, axis=1)
        bad = np.flatnonzero(~np.isfinite(norms) | (norms == 0))
        if len(bad):
            raise PrecomputedError(f"embeddings.from {self.path}: row {int(bad[0])} has a zero or non-finite vector "
                                   f"({len(bad)} such rows)")
        sids = (table.column("sid").to_numpy().astype(np.int64) if "sid" in names
                else _sids_of(table.column("text").to_pylist()))
        order = np.argsort(sids, kind="stable")
        # rows already unit length (as most embedders return them) are kept bit for bit; others are normalised
        scale = np.where(np.abs(norms - 1.0) < 1e-6, 1.0, norms).astype(np.float32)
        self.sids, self.vecs = sids[order], vecs[order] / scale[order, None]
        dup = np.flatnonzero(self.sids[1:] == self.sids[:-1])
        if len(dup) and not np.array_equal(self.vecs[dup], self.vecs[dup + 1]):
            raise PrecomputedError(f"embeddings.from {self.path}: the same sentence has two different vectors "
                                   f"(sid {int(self.sids[dup[0]])})")

    def encode(self, texts: list[str], batch_size: int = 128, normalize: bool = True, progress=False) -> np.ndarray:
        want = _sids_of(texts)
        at = np.minimum(np.searchsorted(self.sids, want), max(len(self.sids) - 1, 0))
        found = (self.sids[at] == want) if len(self.sids) else np.zeros(len(want), bool)
        if not found.all():
            missing = [texts[i] for i in np.flatnonzero(~found)[:3]]
            raise PrecomputedError(
                f"embeddings.from {self.path}: no vector for {int((~found).sum())} of {len(texts)} texts, e.g. "
                f"{missing!r}; the file must hold every sentence and, for DebCSE's scores, every positive candidate "
                f"(the texts of the `variants` and `backtranslations` tables)")
        return self.vecs[at].copy()


@functools.lru_cache(maxsize=1)
def _load(path: str, size: int, mtime_ns: int) -> PrecomputedEncoder:
    return PrecomputedEncoder(Path(path))


def precomputed_encoder(path: Path) -> PrecomputedEncoder:
    """One loaded file per process (reloaded when the file changes)."""
    p = Path(path).resolve()
    st = p.stat() if p.is_file() else None
    return _load(str(p), st.st_size if st else -1, st.st_mtime_ns if st else -1)
