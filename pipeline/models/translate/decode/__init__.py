"""Our decode loop for HF Marian and FSMT models: the same sequences as `generate`, with preallocated caches.

    loop.py      DecodeLoop: greedy, sampling (Gumbel over per-row seeds) and beam, dropping finished rows
    steps.py     one decoding step over the batch's caches; logits processors with a per-row `subset`
    beam.py      transformers' vectorised beam search, step by step
    tokens.py    a Marian tokenizer's input ids and output texts through SentencePiece's batch calls
    mt19937.py   numpy's MT19937 uniforms, as torch's sampling draws them per row
"""
