"""Training rows from the mined tables: joined by sid, shuffled per epoch, sharded by rank, resumable.

    rows = MinedRows(cfg.run.dir, objective.tables)          # ("sentences", "triplets") for osscse, …
    loader = make_loader(rows, objective.collate, batch_size=64, seed=42, epoch=0, start=0)
    for batch in loader: ...                                    # collate ran in the DataLoader workers

Reading. Each table is a pyarrow dataset over the run's current shards of that table (RunTables: the layout its
manifest records, so shards an interrupted re-shard left behind are never read twice), read with column
projection only (the `sentences` table's n_words/line_no, the pairs' audit columns … are never decoded) into
Arrow buffers: no Python object per row lives longer than one batch, and forked DataLoader workers share the
buffers copy-on-write. The first table of `objective.tables` is the row source (one training row per row of it,
ordered by sid so the order does not depend on how many shards the mining run wrote); every further table is
joined to it by sid (a left join: a sentence without a triplet gets paraphrase = negation = None). Embeddings are
held as one float32 matrix (N×d: 3 GB for 1M sentences at d = 768, the price of a random-access shuffle).

Order. The permutation of epoch e is a function of (seed, e) only; global batch k of that epoch is rows
perm[k·B:(k+1)·B]. Rank r of W takes slice r of every global batch, so the global batch — and the loss, see
trainer/dist.py — is the same whatever W is (B must divide by W). A position is (epoch, k): resuming at it
yields exactly the batches an uninterrupted run would have seen next. The last incomplete batch of an epoch is
dropped by default (a contrastive loss over a handful of rows is a poor step, and W equal shards need B rows).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from contramine.pipeline.errors import ExpectedError
from contramine.trainer.keys import checked_dataset

# What the reader takes from each table: parquet column -> row key (METHODS / objectives/base.py row keys).
COLUMNS: dict[str, dict[str, str]] = {
    "sentences": {"text": "text"},
    "pairs": {"anchor": "text", "positives": "positives", "negatives": "negatives"},
    "triplets": {"anchor": "text", "paraphrase": "paraphrase", "negation": "negation"},
    "embeddings": {"emb": "emb"},
}
ROW_KEYS = ("sid", "text", "positives", "negatives", "paraphrase", "negation", "emb")


class TableNotTrainable(ExpectedError, ValueError):
    """A mined table without the columns the trainer reads (a table of another version, a hand-made one)."""


def _read(run_dir: Path | str, table: str, source: bool) -> pa.Table:
    """sid + the table's row-key columns, sorted by sid. A joined table does not bring its own `text` (the
    triplets' anchor): the row source's text is the row's text."""
    if table not in COLUMNS:
        raise ValueError(f"the trainer cannot read table {table!r}; readable: {', '.join(COLUMNS)}")
    dataset = checked_dataset(run_dir, table)  # a missing table's line names the stage that writes it
    mapping = {c: k for c, k in COLUMNS[table].items() if source or k != "text"}
    missing = [c for c in ["sid", *mapping] if c not in dataset.schema.names]
    if missing:
        raise TableNotTrainable(f"mined table {table!r} under {run_dir} lacks column(s) {missing} (schema "
                                f"{dataset.schema.names})")
    tbl = dataset.to_table(columns=["sid", *mapping]).sort_by("sid")
    return tbl.rename_columns(["sid", *mapping.values()])


class MinedRows:
    """Random access to training rows: `rows(indices)` -> list of dicts with every key in ROW_KEYS."""

    def __init__(self, run_dir: Path | str, tables: tuple[str, ...] | list[str]):
        tables = tuple(tables)
        if not tables:
            raise ValueError("an objective must name at least one table")
        self.tables = tables
        self.source = _read(run_dir, tables[0], source=True)
        self.sid = self.source.column("sid").to_numpy()
        # For every other table: its columns and, per source row, the matching row there (-1 = no such sid).
        self.joins: list[tuple[pa.Table | np.ndarray, np.ndarray]] = []
        for table in tables[1:]:
            other = _read(run_dir, table, source=False)
            osid = other.column("sid").to_numpy()
            pos = np.searchsorted(osid, self.sid).clip(0, max(len(osid) - 1, 0))
            hit = (osid[pos] == self.sid) if len(osid) else np.zeros(len(self.sid), bool)
            where = np.where(hit, pos, -1).astype(np.int64)
            if table == "embeddings":
                # One dense matrix: a list column would build a Python list of floats per row per batch.
                flat = other.column("emb").combine_chunks()
                dim = len(flat[0]) if len(flat) else 0
                # a writable copy (Arrow's buffers are read-only, and torch warns on read-only arrays)
                values = np.array(flat.flatten().to_numpy(zero_copy_only=False), dtype=np.float32)
                if len(values) != dim * len(flat):
                    raise ValueError(f"embeddings under {run_dir}: rows of different lengths")
                self.joins.append((values.reshape(len(flat), dim), where))
            else:
                self.joins.append((other.drop_columns(["sid"]), where))

    def __len__(self) -> int:
        return len(self.sid)

    def count_present(self, *keys: str) -> int:
        """Rows for which every row key in `keys` has a value (a joined table's column, non-null)."""
        ok: np.ndarray = np.ones(len(self.sid), dtype=bool)
        for key in keys:
            found = False
            for other, where in self.joins:
                if isinstance(other, pa.Table) and key in other.column_names:
                    valid = other.column(key).is_valid().to_numpy(zero_copy_only=False)
                    ok &= (where >= 0) & valid[np.maximum(where, 0)] if len(valid) else np.zeros_like(ok)
                    found = True
            if not found and key in self.source.column_names:
                ok &= self.source.column(key).is_valid().to_numpy(zero_copy_only=False)
            elif not found:
                ok[:] = False
        return int(ok.sum())

    def rows(self, idx: np.ndarray) -> list[dict]:
        idx = np.asarray(idx, dtype=np.int64)
        out = [dict.fromkeys(ROW_KEYS) for _ in idx]
        for name, values in self.source.take(pa.array(idx)).to_pydict().items():
            for row, v in zip(out, values):
                row[name] = v
        for other, where in self.joins:
            at = where[idx]
            have = np.flatnonzero(at >= 0)
            if isinstance(other, np.ndarray):
                for i in have:
                    out[i]["emb"] = other[at[i]].copy()  # the caller may modify its row, not ours
                continue
            for name, values in other.take(pa.array(at[have])).to_pydict().items():
                for i, v in zip(have, values):
                    out[i][name] = v
        return out


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The row order of one epoch: a function of (seed, epoch) only."""
    return np.random.default_rng([int(seed), int(epoch)]).permutation(n)


def batches_per_epoch(n_rows: int, batch_size: int, drop_last: bool = True) -> int:
    return n_rows // batch_size if drop_last else -(-n_rows // batch_size)


def rank_slice(global_idx: np.ndarray, rank: int, world: int) -> np.ndarray:
    """Rank r's part of one global batch: contiguous, equal when B divides by W (np.array_split otherwise)."""
    return np.array_split(global_idx, world)[rank]


class EpochBatches(torch.utils.data.Dataset):
    """Item i = this rank's slice of global batch `start + i` of one epoch, already collated."""

    def __init__(self, rows: MinedRows, collate, batch_size: int, seed: int, epoch: int, start: int = 0,
                 rank: int = 0, world: int = 1, drop_last: bool = True):
        if batch_size % world:
            raise ValueError(f"global batch size {batch_size} does not divide by the world size {world}")
        self.rows, self.collate, self.batch_size = rows, collate, batch_size
        self.rank, self.world = rank, world
        self.perm = epoch_permutation(len(rows), seed, epoch)
        self.n_batches = batches_per_epoch(len(rows), batch_size, drop_last)
        self.start = min(start, self.n_batches)

    def __len__(self) -> int:
        return self.n_batches - self.start

    def indices(self, i: int) -> np.ndarray:
        k = self.start + i
        return rank_slice(self.perm[k * self.batch_size:(k + 1) * self.batch_size], self.rank, self.world)

    def __getitem__(self, i: int):
        return self.collate(self.rows.rows(self.indices(i)))


def _identity(batch):
    return batch


def make_loader(rows: MinedRows, collate, batch_size: int, seed: int, epoch: int, start: int = 0,
                rank: int = 0, world: int = 1, num_workers: int = 0, pin_memory: bool = False,
                drop_last: bool = True) -> torch.utils.data.DataLoader:
    """A DataLoader over the rest of one epoch from global batch `start`: tokenisation runs in the workers.

    The loader gets its own torch.Generator: creating a DataLoader iterator otherwise draws a seed from the
    global torch RNG, which would shift the dropout masks of a resumed run against an uninterrupted one."""
    data = EpochBatches(rows, collate, batch_size, seed, epoch, start, rank, world, drop_last)
    return torch.utils.data.DataLoader(
        data, batch_size=None, shuffle=False, collate_fn=_identity, num_workers=num_workers,
        pin_memory=pin_memory, prefetch_factor=4 if num_workers else None,
        generator=torch.Generator().manual_seed(int(seed) * 1000003 + int(epoch)))
