"""Models: where they come from (hub.py: local folder, HF cache, hub download), the sentence encoder and its
poolers (encoder.py), the padding-free forward that training uses (unpad.py), and seq2seq translation with
batch-independent outputs (translator.py), and which attention kernels they run on a GPU (attention_kernels.py:
every SDPA kernel but cuDNN's, which plans for each new shape)."""
