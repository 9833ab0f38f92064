"""The host bench: this checkout against a base commit on the host's share of each GPU job (`python -m
bench.host.bench`).

- bench.py: The host bench (`make bench` runs it; alone: `python -m bench.host.bench`): what the host's own work lets
  a GPU do in each job of the 1M path, measured without a GPU, on today's code and on this checkout's in the same run.
- hollow.py: The host bench's hollow models (bench/host/jobs.py times the jobs with them): each model's arithmetic
  removed, its call structure kept, the same on both checkouts. The feature width is cut to WIDTH, so no op has
  arithmetic to speak of on this CPU, while the batch and sequence shapes stay the jobs' own: - HollowBert: bert-
  base's `model(**batch)` (config: model_type "bert", so the trainer's padding-free path runs as on the real model).
  Its output is a lookup of [B, L, WIDTH]; and every call runs a real 12-layer BertModel of width 4 on one token, so
  the model's own Python and op dispatch (~ its kernel launches) is paid per call, as on a GPU, with no arithmetic.
  Gradients reach every weight of both: the optimiser steps over ~200 tensors, as for bert-base. - HollowMarian: a
  real MarianMTModel of opus-mt's layout (6 + 6 layers, Marian's tokenizer and generation config) at width 4 and a
  64-entry output vocabulary, so HF `generate` runs its real per-step decoder, cache and logits processors; the
  encoder pass is hollow like HollowBert's. Each row emits a translation's length (target_lengths: 0.8-1.3x its
  source's tokens, its last one eos), and one row in 23 never stops by itself and runs to its cap (a degenerate
  output; the Translator forces its eos there). Under our decode loop (a checkout that has
  pipeline/models/translate/decode/loop.py) HollowSteps decodes the same rows through the loop's real per-step layer calls. -
  HollowIndex: TorchExact's part on the card (the score GEMM and the top-k) done before the clock starts: `search`
  returns the exact top-k of the queries from a table computed once with TorchExact, found by a key of each query's
  first coordinates (bench/host/bench.py builds it); a k past the table is searched exactly in numpy.
- jobs.py: The host bench's worker (bench/host/bench.py runs it): the four GPU jobs of the 1M path on one checkout's
  code, with each model's arithmetic removed, timed on this CPU. What is left is what the host does for the card.
- measure.py: How the host bench's worker measures a job (bench/host/jobs.py): the best wall and CPU time of a few
  passes, the torch ops (~ kernel launches on a GPU) and host reads counted under a dispatch mode, a job's settings,
  its lines.
- model_jobs.py: The host bench's model jobs (bench/host/jobs.py runs them): the encoder's `encode`, the translator's
  greedy `translate`, and one DebCSE step of trainer/train.py's loop, each on a hollow model (bench/host/hollow.py).
- search_jobs.py: The host bench's search jobs (bench/host/jobs.py runs them): the band search with the torch engine
  as it runs on a GPU (`search`), and the host's resolve of an index that only has `search(x, k)` (`resolve`).

What the rest of the project uses, importable from the package (loaded on first use, so importing
the package imports none of its modules):
"""
from __future__ import annotations

from bench import lazy_attributes

_HOME = {
    "export_base": "bench.host.bench",
    "side_settings": "bench.host.bench",
    "HollowIndex": "bench.host.hollow",
    "WIDTH": "bench.host.hollow",
    "hollow_bert": "bench.host.hollow",
    "hollow_marian": "bench.host.hollow",
    "hollow_steps": "bench.host.hollow",
    "target_lengths": "bench.host.hollow",
}
__all__ = sorted(_HOME)


__getattr__ = lazy_attributes(__name__, _HOME)
