"""Models: what the stages compute with.

    encode/      the sentence encoder: its poolers and batches (encoder.py, batches.py), the padding-free forward
                 that training uses (unpad.py), vectors read from a file (precomputed.py), and the encoder as the
                 embedding stages' resource (resource.py)
    translate/   seq2seq translation with batch-independent outputs: the chains (chains.py), their settings and
                 budgets (settings.py), the engines (engines/: HF, CTranslate2, Bergamot) and our decode loop (decode/)
    hub.py       where models come from: a local folder, the HF cache, a hub download; their fingerprints
    standin.py   stand-in models with the real interfaces and no weights (`make scale`, tests)
    parser.py    spaCy's parser as the negate stage's resource
    attention_kernels.py   which attention kernels mining runs on a GPU (every SDPA kernel but cuDNN's, which plans
                 for each new shape)
    cublas.py, bergamot_files.py   CUDA 12's cuBLAS for CTranslate2; the Bergamot models' files
"""
