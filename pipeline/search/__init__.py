"""Nearest-neighbour search for the `neighbours` stage (METHODS §2), apart from the stage itself:

- band.py: the band search, exact by construction against any index with `search(x, k)` (no FAISS import);
- torch_exact.py: exact blocked k-NN in torch (`neighbours.engine = "torch"`; no FAISS import);
- faiss_index.py: FAISS indexes (flat / IVF / HNSW), their GPU copies, the engine and device choice;
- index.py: the stage's `index` resource: the run's search plan and what each process loads for it.
"""
