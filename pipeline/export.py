"""`make export RUN=<run> FORMAT=<f>`: a run's mined rows as a Hugging Face dataset folder that sentence-transformers
trains on as is: `datasets.load_dataset(<folder>)` reads it, `push_to_hub` publishes it.

    artifacts/<run>/export/<format>/README.md                 dataset card: `configs:` header, columns, settings, counts
    artifacts/<run>/export/<format>/data/train-<digest>-00000-of-00002.parquet

<digest> is a hash of the Parquet bytes, and the card's `configs:` pattern names it. `datasets` caches a folder that
has a card under (folder name, card YAML), not the files' contents: with a fixed `data/train-*.parquet` every
`n-tuple` export (any run, any re-export) shared one cache entry, and `load_dataset` gave back whichever was loaded
first. With the digest in the pattern, the cache key changes exactly when the rows do. A re-export swaps the whole
folder in one step, so the old data files go with the old card.

Formats, named as sentence-transformers names its `mine_hard_negatives` outputs (PEERS.md):
- `triplet`: (anchor, positive, negative), one row per (positive, negative) of an anchor in `pairs`;
- `n-tuple`: (anchor, positive, negative_1 … negative_m), one row per (anchor, positive); m = the most negatives any
  anchor has (`ipw.m_neg`), anchors with fewer are left out (as sentence-transformers does) and counted in the card;
- `labeled-pair`: (sentence1, sentence2, label): label 1 for each positive, 0 for each negative of an anchor;
- `osscse-triplet`: (anchor, paraphrase, negation) from `triplets`, rows that have both.
The papers' own losses (trainer/st_losses/, docs/training.md) read four more:
- `sentences`: (anchor): SimCSE, WhitenedCSE;
- `debcse`: (anchor, positive, negative_1 … negative_m), one row per anchor: its first mined positive (the anchor
  itself where it has none, as the lean trainer does) and first m negatives; anchors with fewer are left out;
- `osscse-prompt`: (anchor, anchor_t2, paraphrase, negation) wrapped in OssCSE's two templates (T1, T2; the
  paraphrase and negation in T1), rows that have both: OssCSE's paper form reads the [MASK] vector;
- `dclr`: (anchor, label): label = the row's mined embedding (zeros where it has none), DCLR's instance weights.
Columnar (Arrow list kernels), rows in sid order, so an export is a pure function of the run's tables.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contramine.pipeline.citations import MINED_BY, bibtex
from contramine.pipeline.config.base import ConfigError
from contramine.pipeline.config.names import inside
from contramine.pipeline.storage.atomic import atomic_dir
from contramine.pipeline.storage.lock import run_lock
from contramine.pipeline.hints import command
from contramine.pipeline.prompts import OSSCSE_TEMPLATES, fill
from contramine.pipeline.schema import table_vectors
from contramine.pipeline.storage.safe_paths import check_below
from contramine.pipeline.storage.tables import RunTables, TableMissing

ROWS_PER_FILE = 500_000
DIGEST_CHARS = 16  # 64 bits of sha256: two different exports of one folder name never share a cache entry


def _lists(col) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """(flattened values, per-row start into them, per-row length) of a list column; null lists are empty."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    lengths = pc.list_value_length(col).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    return pc.list_flatten(col), np.cumsum(lengths) - lengths, lengths


def triplet_rows(pairs: pa.Table) -> pa.Table:
    pos, pos_start, n_pos = _lists(pairs.column("positives"))
    neg, neg_start, n_neg = _lists(pairs.column("negatives"))
    anchor_of_pos: np.ndarray = np.repeat(np.arange(pairs.num_rows), n_pos)
    reps = n_neg[anchor_of_pos]  # each positive once per negative of its anchor
    pos_idx: np.ndarray = np.repeat(np.arange(len(anchor_of_pos)), reps)
    within = np.arange(len(pos_idx)) - np.repeat(np.cumsum(reps) - reps, reps)
    anchor_idx = anchor_of_pos[pos_idx]
    return pa.table({"anchor": pairs.column("anchor").take(anchor_idx), "positive": pos.take(pos_idx),
                     "negative": neg.take(neg_start[anchor_idx] + within)})


def n_tuple_rows(pairs: pa.Table, m: int | None = None) -> pa.Table:
    pos, pos_start, n_pos = _lists(pairs.column("positives"))
    neg, neg_start, n_neg = _lists(pairs.column("negatives"))
    m = int(n_neg.max(initial=0)) if m is None else m
    anchor_of_pos: np.ndarray = np.repeat(np.arange(pairs.num_rows), n_pos)
    keep = np.flatnonzero(n_neg[anchor_of_pos] >= m) if m else np.zeros(0, np.int64)
    anchors = anchor_of_pos[keep]
    cols = {"anchor": pairs.column("anchor").take(anchors), "positive": pos.take(keep)}
    for j in range(m):
        cols[f"negative_{j + 1}"] = neg.take(neg_start[anchors] + j)
    return pa.table(cols)


def labeled_pair_rows(pairs: pa.Table) -> pa.Table:
    pos, _, n_pos = _lists(pairs.column("positives"))
    neg, _, n_neg = _lists(pairs.column("negatives"))
    anchor = pairs.column("anchor")
    both = pa.table({"a": pa.concat_arrays([anchor.take(np.repeat(np.arange(pairs.num_rows), n_pos)).combine_chunks(),
                                            anchor.take(np.repeat(np.arange(pairs.num_rows), n_neg)).combine_chunks()]),
                     "b": pa.concat_arrays([pos, neg]),
                     "label": np.concatenate([np.ones(len(pos), np.int64), np.zeros(len(neg), np.int64)]),
                     # per anchor: its positives, then its negatives (a stable sort on the anchor's row)
                     "order": np.concatenate([np.repeat(np.arange(pairs.num_rows), n_pos),
                                              np.repeat(np.arange(pairs.num_rows), n_neg)])})
    both = both.take(np.argsort(both.column("order").to_numpy(), kind="stable"))
    return pa.table({"sentence1": both.column("a"), "sentence2": both.column("b"), "label": both.column("label")})


def osscse_triplet_rows(triplets: pa.Table) -> pa.Table:
    ok = pc.and_(pc.is_valid(triplets.column("paraphrase")), pc.is_valid(triplets.column("negation")))
    t = triplets.filter(ok)
    return pa.table({"anchor": t.column("anchor"), "paraphrase": t.column("paraphrase"),
                     "negation": t.column("negation")})


def sentence_rows(sentences: pa.Table) -> pa.Table:
    return pa.table({"anchor": sentences.column("text")})


def debcse_rows(pairs: pa.Table) -> pa.Table:
    pos, pos_start, n_pos = _lists(pairs.column("positives"))
    neg, neg_start, n_neg = _lists(pairs.column("negatives"))
    m = int(n_neg.max(initial=0))
    keep = np.flatnonzero(n_neg >= m)
    anchor = pairs.column("anchor").take(keep)
    first = pos.take(np.minimum(pos_start[keep], max(len(pos) - 1, 0))) if len(pos) else anchor
    positive = pc.if_else(pa.array(n_pos[keep] > 0), first, anchor)  # no positive: a dropout view of the anchor
    cols = {"anchor": anchor, "positive": positive}
    for j in range(m):
        cols[f"negative_{j + 1}"] = neg.take(neg_start[keep] + j)
    return pa.table(cols)


def osscse_prompt_rows(triplets: pa.Table) -> pa.Table:
    t1, t2 = OSSCSE_TEMPLATES  # the lean objective's defaults too ([train.osscse] templates)
    t = osscse_triplet_rows(triplets)
    wrap = lambda col, tpl: pa.array([fill(tpl, x) for x in col.to_pylist()], pa.string())  # noqa: E731
    return pa.table({"anchor": wrap(t.column("anchor"), t1), "anchor_t2": wrap(t.column("anchor"), t2),
                     "paraphrase": wrap(t.column("paraphrase"), t1), "negation": wrap(t.column("negation"), t1)})


def dclr_rows(sentences: pa.Table) -> pa.Table:
    """`sentences` joined (by with_embeddings) with the mined vectors."""
    return pa.table({"anchor": sentences.column("text"), "label": sentences.column("emb")})


def with_embeddings(sentences: pa.Table, embeddings: pa.Table) -> pa.Table:
    """sentences + their mined vector as `emb` (float32 lists of d; zeros for a sentence the table lacks)."""
    sids, vecs = table_vectors(embeddings)
    d = vecs.shape[1] if vecs.ndim == 2 else 0
    out = np.zeros((sentences.num_rows, d), np.float32)
    if len(sids):
        order = np.argsort(sids, kind="stable")
        want = sentences.column("sid").to_numpy()
        at = np.searchsorted(sids[order], want).clip(max=len(sids) - 1)
        hit = sids[order][at] == want
        out[hit] = vecs[order[at[hit]]]
    emb = pa.FixedSizeListArray.from_arrays(pa.array(out.reshape(-1)), d)
    return sentences.append_column("emb", emb)


# format -> (table it reads, builder, what each column is)
FORMATS = {
    "triplet": ("pairs", triplet_rows, {
        "anchor": "a corpus sentence", "positive": "one of its mined positives (DebCSE: IPW-sampled noised / "
        "back-translated variants)", "negative": "one of its IPW-sampled hard negatives (nearest neighbours in the "
        "similarity band)"}),
    "n-tuple": ("pairs", n_tuple_rows, {
        "anchor": "a corpus sentence", "positive": "one of its mined positives",
        "negative_1 … negative_m": "its IPW-sampled hard negatives, in draw order"}),
    "labeled-pair": ("pairs", labeled_pair_rows, {
        "sentence1": "a corpus sentence (the anchor)", "sentence2": "a mined positive or hard negative",
        "label": "1 = positive, 0 = negative"}),
    "osscse-triplet": ("triplets", osscse_triplet_rows, {
        "anchor": "a corpus sentence", "paraphrase": "a back-translated paraphrase in the MER band (OssCSE)",
        "negation": "the sentence with its root verb negated by rule on the spaCy parse (OssCSE)"}),
    "sentences": ("sentences", sentence_rows, {"anchor": "a corpus sentence (SimCSE, WhitenedCSE: two dropout views)"}),
    "debcse": ("pairs", debcse_rows, {
        "anchor": "a corpus sentence", "positive": "its first IPW-drawn positive (the anchor where none was mined)",
        "negative_1 … negative_m": "its first m IPW-sampled hard negatives"}),
    "osscse-prompt": ("triplets", osscse_prompt_rows, {
        "anchor": "the sentence in OssCSE's template T1", "anchor_t2": "the sentence in template T2",
        "paraphrase": "its paraphrase in T1", "negation": "its negation in T1"}),
    "dclr": ("sentences", dclr_rows, {
        "anchor": "a corpus sentence", "label": "its mined embedding (DCLR's frozen model; zeros where none)"}),
}
JOINS = {"dclr": "embeddings"}  # a second table a format reads, joined by sid
LOSS_OF = {"sentences": "SimCSELoss(model)", "debcse": "DebCSELoss(model)", "osscse-prompt": "OssCSELoss(model)",
           "dclr": "DCLRLoss(model)"}  # the formats only contramine's losses read (trainer/st_losses/): the card's
# recipe. Each objective declares the format its loss reads beside it (`loss`, `export_format`); this module stays
# below the trainer, so the card names the loss here and tests/test_objectives.py checks both say the same.
SETTINGS_OF = {"sentences": ("sentences", "encoder"),
               "pairs": ("encoder", "neighbours", "noise", "backtranslate", "scores", "ipw"),
               "triplets": ("backtranslate", "negate", "paraphrases")}


def format_tables(fmt: str) -> tuple[str, ...]:
    """The run's tables an export in format `fmt` reads: its own and the one it joins."""
    return (FORMATS[fmt][0], *((JOINS[fmt],) if fmt in JOINS else ()))


def dataset_card(run_dir: Path, fmt: str, out: pa.Table, source_rows: int, files: list[str], digest: str) -> str:
    table, _, columns = FORMATS[fmt]
    run = RunTables(run_dir)
    settings = {}
    for name in run.names():
        for section, values in ((run.manifest(name) or {}).get("config") or {}).items():
            if section in SETTINGS_OF[table]:
                settings[section] = values
    header = ["---", "configs:", "- config_name: default", "  data_files:", "  - split: train",
              f"    path: data/train-{digest}-*.parquet", "task_categories:", "- sentence-similarity", "tags:",
              "- sentence-transformers", "- contramine", f"- {fmt}", "size_categories:",
              f"- {_size_category(out.num_rows)}", "---", ""]
    body = [f"# contramine `{fmt}` export of run `{run_dir.name}`", "",
            f"{out.num_rows:,} rows from the run's `{table}` table ({source_rows:,} rows), in {len(files)} Parquet "
            "file(s) under `data/`. Mined with contramine (`" + command("mine") + "`), exported with "
            f"`{command('export', run=run_dir.name, format=fmt)}`.", "", "## Columns", "", "| column | what it is |",
            "|---|---|", *(f"| `{c}` | {w} |" for c, w in columns.items()), "",
            "## Use it", "", "```python", *usage(fmt), "```", "",
            "## How it was mined (settings of the stages behind it)", "", "```json",
            json.dumps(settings, indent=1, sort_keys=True), "```", ""]
    papers = papers_of(fmt)
    if papers:  # the papers whose mining method made these rows (`sentences` is the corpus itself: none)
        body += ["## Citation", "", "The method that mined these rows is from:", "", "```bibtex", bibtex(*papers),
                 "```", ""]
    return "\n".join(header + body)


def papers_of(fmt: str) -> tuple[str, ...]:
    """The objectives whose papers' mining method made a format's rows (its table's and a joined table's)."""
    table = FORMATS[fmt][0]
    return (*MINED_BY[table], *(MINED_BY[JOINS[fmt]] if fmt in JOINS else ()))


def usage(fmt: str) -> list[str]:
    """The card's training recipe (the README's): MultipleNegativesRankingLoss with NO_DUPLICATES batches. An anchor
    has a row per positive (and, in `triplet`, per negative): two of its rows in one batch would make its own
    positive one of its in-batch negatives."""
    if fmt in LOSS_OF:
        return ["from datasets import load_dataset",
                "from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, "
                "SentenceTransformerTrainingArguments",
                "from sentence_transformers.sentence_transformer.training_args import BatchSamplers",
                f"from contramine.trainer.st_losses import {LOSS_OF[fmt].split('(')[0]}  # contramine's (docs/training.md)", "",
                'train = load_dataset("<this folder or hub id>", split="train")',
                'model = SentenceTransformer("sentence-transformers/all-MiniLM-L6-v2")',
                'args = SentenceTransformerTrainingArguments(output_dir="st", batch_sampler=BatchSamplers.NO_DUPLICATES)',
                f"SentenceTransformerTrainer(model=model, args=args, train_dataset=train, loss={LOSS_OF[fmt]}).train()"]
    only_positives = ['train = train.filter(lambda r: r["label"] == 1).remove_columns("label")  '
                      "# MNRL takes the positive pairs"] if fmt == "labeled-pair" else []
    return ["from datasets import load_dataset",
            "from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, "
            "SentenceTransformerTrainingArguments",
            "from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss",
            "from sentence_transformers.sentence_transformer.training_args import BatchSamplers", "",
            'train = load_dataset("<this folder or hub id>", split="train")', *only_positives,
            'model = SentenceTransformer("sentence-transformers/all-MiniLM-L6-v2")',
            'args = SentenceTransformerTrainingArguments(output_dir="st", batch_sampler=BatchSamplers.NO_DUPLICATES)',
            "SentenceTransformerTrainer(model=model, args=args, train_dataset=train,",
            "                           loss=MultipleNegativesRankingLoss(model)).train()"]


def _size_category(n: int) -> str:
    for limit, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")):
        if n < limit:
            return name
    return "1M<n<10M"


def export_run(run_dir: Path | str, fmt: str, dst: Path | str | None = None) -> Path:
    """Write the export folder and swap it in whole (a reader or a kill sees the previous export or this one, never a
    mix); returns its path. Below the run folder (or below `dst`'s own folder, for a `dst` elsewhere) no folder may be
    a link: the export is neither written into a link's target nor swapped with it (pipeline/storage/atomic.py)."""
    if fmt not in FORMATS:
        raise ConfigError(f"export format {fmt!r}: one of {', '.join(FORMATS)}")
    run_dir = Path(run_dir)
    table, build, _ = FORMATS[fmt]
    # the format names the folder: checked to stay in the run's export/, whatever FORMATS comes to hold
    dst = Path(dst) if dst else inside(run_dir / "export", fmt, setting="export format")
    root = run_dir if os.path.abspath(dst).startswith(os.path.abspath(run_dir) + os.sep) else dst.parent
    check_below(root, dst, final=True)  # a linked export/ is one line before anything is read
    src = _read(run_dir, table)
    if fmt in JOINS:
        src = with_embeddings(src, _read(run_dir, JOINS[fmt]))
    src = src.sort_by("sid")
    out = build(src)
    # one export of a format at a time (export/.<format>.lock; other formats export beside it)
    with run_lock(dst.parent, command("export", run=run_dir.name, format=fmt), root=root, name=f".{dst.name}.lock",
                  hint="export again when it is done"):
        with atomic_dir(dst, root=root) as tmp:  # complete and fsynced, then swapped in whole, or absent
            files, digest = write_data(out, tmp)
            (tmp / "README.md").write_text(dataset_card(run_dir, fmt, out, src.num_rows, files, digest),
                                           encoding="utf-8")
    return dst


def _read(run_dir: Path, table: str) -> pa.Table:
    """RunTables.read; for a table the run never mined, the line naming the stage that writes it (the stages are
    loaded on this error's path only: a fresh `contramine export` has loaded none, and said "a mining stage")."""
    try:
        return RunTables(run_dir).read(table)
    except TableMissing:
        from contramine.pipeline.engine.discovery import load_stages

        load_stages()
        raise RunTables(run_dir).missing(table) from None


def write_data(out: pa.Table, folder: Path) -> tuple[list[str], str]:
    """The rows as Parquet files under folder/data, named by a digest of their bytes: (names, digest)."""
    (folder / "data").mkdir(parents=True)
    n_files = max(1, -(-out.num_rows // ROWS_PER_FILE))
    shards = [f"{i:05d}-of-{n_files:05d}.parquet" for i in range(n_files)]
    h = hashlib.sha256()
    for i, shard in enumerate(shards):
        pq.write_table(out.slice(i * ROWS_PER_FILE, ROWS_PER_FILE), folder / "data" / shard, compression="zstd")
        with open(folder / "data" / shard, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    digest = h.hexdigest()[:DIGEST_CHARS]
    for shard in shards:
        os.rename(folder / "data" / shard, folder / "data" / f"train-{digest}-{shard}")
    return [f"data/train-{digest}-{shard}" for shard in shards], digest
