"""The sentence encoder.

    encoder.py     Encoder: a HF model and its pooler (mean, cls, [MASK] of a prompt), encoding texts in batches
    batches.py     tokenising ahead of the model and packing rows into token-budget batches
    unpad.py       the padding-free forward (training and packed encoding)
    precomputed.py vectors read from a file instead of a model
    resource.py    the encoder as the embedding stages' declared resource: its plan, its row memo
"""
