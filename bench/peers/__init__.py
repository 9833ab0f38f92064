"""The peer benches `make bench` runs (bench/run.py): each module's `run()` returns rows {name, ours, peer, unit,
ratio, goal}.

- backtranslate.py: Back-translation throughput: `backtranslate` (length-sorted batches, per-row caps) vs a plain per-
  sentence `model.generate` loop, both on HF generate.
- bergamot.py: The `backtranslate` stage on the default chain (Bergamot en→pt→en) against the bare engine called in a
  loop.
- ct2.py: Back-translation engines: our decode loop (engine "hf", decoder "loop": pipeline/models/translate/decode/loop.py) and
  `backtranslate.engine = "ctranslate2"` vs HF `generate` (engine "hf", decoder "generate"), same model, same
  sentences, same batch size, same per-row length caps, all through `backtranslate`.
- embeddings.py: Embedding throughput: our `Encoder.encode` vs sentence-transformers' `SentenceTransformer.encode`.
- eval.py: STS evaluation speed: our `evaluate_all` vs a plain per-subset loop, and our encode vs sentence-
  transformers'.
- growth.py: What a grown corpus, another shard count and another run pay with the row memo (pipeline/memo/rows.py).
- hardneg.py: Hard-negative mining end to end: our stages vs sentence-transformers' `util.mine_hard_negatives`.
- ivf.py: Approximate neighbours on REAL sentence vectors: exact flat search vs IVF (nprobe = "auto") and HNSW
  (ef_search = "auto", the default approximate index), on MiniLM vectors of 100k Tatoeba sentences
  (../shared/data/tatoeba_en.txt: short, conversational; CC BY 2.0).
- marian.py: Translation engines on a model of opus-mt's size: CTranslate2 int8 and float32 vs HF transformers
  `generate`.
- memo_index.py: The row memo's lookup index (pipeline/memo/index.py: NamespaceIndex) at 1M rows: bytes a row,
  building it, and what a new pack costs, against the index it replaced (measured here, in the same run).
- mer.py: MER throughput: `contramine.pipeline.text_distances.mer` (Arrow tokenisation + dictionary encoding, one
  multi-threaded rapidfuzz `cpdist` for the distances, editops only for pairs whose alignment is ambiguous) vs a per-
  pair `jiwer.mer` loop.
- negate.py: Throughput of the negation stage: `negate_texts` (lean pipes, batched `nlp.pipe`) vs the plain way, a
  per-sentence `nlp(text)` loop with the full pipeline (NER, attribute ruler, lemmatizer all on), same rule.
- neighbours.py: Negative-pool search: `band_neighbours` (flat index, exact band + top pool_size with widening) vs a
  bare `faiss.IndexFlatIP.search` k-NN with k = pool_size, on the same vectors.
- scaling.py: Scaling of `make mine` (default profile): wall seconds per stage and peak memory at growing corpus
  sizes.
- st_debcse.py: One DebCSE step: the lean trainer's against the same loss under sentence-transformers'
  SentenceTransformerTrainer.
- train.py: Training throughput: our trainer's SimCSE vs sentence-transformers' own SimCSE recipe, same model and
  batch.
- translate.py: HF generate through the pipeline's Translator on an opus-mt-shaped Marian, at the stage's batching and
  at batching sized for a GPU, beside plain `generate` at batch 64 as a user writes it.

"""
from __future__ import annotations
