"""The tables every stage writes: names and column types are a contract (tests and users' SQL rely on them).

Layout: artifacts/<run>/<table>/part-<i>-of-<n>.parquet (+ one `.json` sidecar per shard with its cache key and
content hash) and artifacts/<run>/<table>/_manifest.json (config hash, input hashes, row counts, seconds).
Per-sentence tables are sharded by the same contiguous sid ranges as `sentences`, rows sorted by sid inside
a shard, so reading the parts in order gives the table sorted by sid whatever the shard count.
"""
import numpy as np
import pyarrow as pa

SCHEMAS: dict[str, pa.Schema] = {
    "sentences": pa.schema([("sid", pa.int64()), ("text", pa.string()), ("n_words", pa.int32()),
                            ("line_no", pa.int64())]),
    # text: the record as read, cut at its first sentences.rejected_chars characters; n_chars, n_bytes: the whole
    # record's length as read; blake2b: hex of its raw bytes (16-byte digest), so a cut record is accounted for;
    # source, source_line: the corpus part (its path below the folder or glob, a single file's name, hf:<id>:<split>)
    # and the record's line (or row) in it, from 1 (line_no counts records across the whole corpus); lines: the
    # records the row stands for, 1, or a run of that same record repeated right after it (line_no .. line_no +
    # lines - 1, all in `source`): 5M empty lines are one row; past sentences.rejected_rows rows, also its later
    # repeats in `source` wherever they are; sentences + sum(lines) is the corpus' records
    "rejected": pa.schema([("line_no", pa.int64()), ("text", pa.string()), ("reason", pa.string()),
                           ("n_chars", pa.int64()), ("n_bytes", pa.int64()), ("blake2b", pa.string()),
                           ("source", pa.string()), ("source_line", pa.int64()), ("lines", pa.int64())]),
    # emb: FLOAT[d] in DuckDB (a fixed-size list); d is set by the encoder
    "embeddings": pa.schema([("sid", pa.int64()), ("emb", pa.list_(pa.float32()))]),
    "neighbours": pa.schema([("sid", pa.int64()), ("cand_sid", pa.int64()), ("cos", pa.float32()),
                             ("rank", pa.int32())]),
    "variants": pa.schema([("sid", pa.int64()), ("variant", pa.int32()), ("text", pa.string()),
                           ("ops", pa.string())]),
    "backtranslations": pa.schema([("sid", pa.int64()), ("chain", pa.string()), ("variant", pa.int32()),
                                   ("pivot_text", pa.string()), ("text", pa.string()), ("model", pa.string()),
                                   ("role", pa.string()),  # the chain's role: positives | paraphrases | both
                                   ("flag", pa.string())]),  # why the output is degenerate (pipeline/degenerate.py)
    "scores": pa.schema([("sid", pa.int64()), ("kind", pa.string()), ("cand_sid", pa.int64()), ("text", pa.string()),
                         ("source", pa.string()), ("edit", pa.float32()), ("cos", pa.float32())]),
    "candidates": pa.schema([("sid", pa.int64()), ("kind", pa.string()), ("cand_sid", pa.int64()),
                             ("text", pa.string()), ("source", pa.string()), ("edit", pa.float32()),
                             ("cos", pa.float32()), ("s_sur", pa.float64()), ("s_sem", pa.float64()),
                             ("p_tilde", pa.float64()), ("p", pa.float64()), ("chosen", pa.bool_())]),
    "pairs": pa.schema([("sid", pa.int64()), ("anchor", pa.string()), ("positives", pa.list_(pa.string())),
                        ("negatives", pa.list_(pa.string()))]),
    "negations": pa.schema([("sid", pa.int64()), ("text", pa.string()), ("rule", pa.string()),
                            ("reason", pa.string())]),
    "paraphrases": pa.schema([("sid", pa.int64()), ("text", pa.string()), ("mer", pa.float64()),
                              ("chain", pa.string())]),
    "triplets": pa.schema([("sid", pa.int64()), ("anchor", pa.string()), ("paraphrase", pa.string()),
                           ("negation", pa.string()), ("para_mer", pa.float64()), ("para_chain", pa.string())]),
}
# The `data.candidates` corpus' tables have the anchors' columns. Listed here, not only in their stages, so that a
# reader (`make sql`, `make report`) finds every shipped table's schema without importing any stage.
SCHEMAS.update({"pool_sentences": SCHEMAS["sentences"], "pool_rejected": SCHEMAS["rejected"],
                "pool_embeddings": SCHEMAS["embeddings"]})


# The `emb` column as a matrix and back.
def vectors_table(sids: np.ndarray, vectors: np.ndarray) -> pa.Table:
    """sid + emb as a fixed-size list (DuckDB: FLOAT[d])."""
    d = vectors.shape[1] if vectors.ndim == 2 else 0
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1))
    return pa.table({"sid": pa.array(sids, pa.int64()), "emb": pa.FixedSizeListArray.from_arrays(flat, d)})


def table_vectors(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(sids, vectors float32 [n, d]) from an embeddings table."""
    sids = table.column("sid").to_numpy()
    col = table.column("emb").combine_chunks()
    if len(col) == 0:
        return sids, np.zeros((0, 0), dtype=np.float32)
    d = col.type.list_size if pa.types.is_fixed_size_list(col.type) else len(col[0])
    return sids, col.flatten().to_numpy(zero_copy_only=False).reshape(-1, d).astype(np.float32, copy=False)


def read_vectors(store, table: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(sids, vectors) of a whole table, copied shard by shard into one array, each shard's Arrow table dropped (and
    Arrow's pool trimmed) as it goes: the peak is the array plus one shard. `table_vectors(store.read(...))` holds
    the table, its combined copy and, in Arrow's allocator, both again after they are freed (6 GB at 1M x 384)."""
    rows = [store.cached_rows(table, i, n) for i in range(n)]
    out: np.ndarray
    out_sids, out, at = np.empty(sum(rows), np.int64), np.zeros((0, 0), np.float32), 0
    for i in range(n):
        s, v = table_vectors(store.read_shard(table, i, n))
        if len(s) != rows[i]:
            raise ValueError(f"{store.shard_path(table, i, n)}: {len(s)} rows where its sidecar says {rows[i]}")
        if len(s) and not out.size:
            out = np.empty((sum(rows), v.shape[1]), np.float32)
        out_sids[at:at + len(s)] = s
        if len(s):
            out[at:at + len(s)] = v
        at += len(s)
        del s, v
        pa.default_memory_pool().release_unused()
    return out_sids, out
