"""Nearest-neighbour search for the `neighbours` stage (METHODS §2), apart from the stage itself:

- band.py: the band search, exact by construction against any index with `search(x, k)` (no FAISS import): the
  rules for a block of queries at once (`resolve`, torch, on the block's device);
- torch_exact.py: the torch engine (`neighbours.engine = "torch"`; no FAISS import): the band search on its device
  (scores, top-k, resolve, widening; float32, TF32 or bf16 scores) and exact blocked k-NN;
- faiss_index.py: FAISS indexes (flat / IVF / HNSW), their GPU copies, the engine and device choice;
- index.py: the stage's `index` resource: the run's search plan and what each process loads for it.
"""
