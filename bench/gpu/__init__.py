"""`make gpu-check`: GPU speeds at the papers' model sizes and GPU-vs-CPU checks (`python -m bench.gpu.check`), and
the rehearsal of it on this machine (`make gpu-rehearsal`).

- check.py: `make gpu-check`: one command that says what a lent GPU machine does with this project's own code: speeds
  at the papers' model sizes, each against the peer a user would reach for and against the card's own GEMM rate, all
  in the same run; the 1M path projected from them; and whether the GPU's results agree with the CPU's. Nothing
  downloads: every model is built here with random weights (bench/fixtures/shapes.py), and Prefect is not used.
- budget.py: The GPU check's clock (issue 63): a lease is 15 minutes of device time in all, start-up included, and
  one call at most 10, so the check has a deadline of its own and every row a time budget.
- limits.py: The card's limits in `make gpu-check` (bench/gpu/check.py has what they measure and how to run it): its
  own GEMM rate at the jobs' shapes, a profile of a few encode and generate batches, and the summary that sets every
  job against its peer, its limit and the 1M path. Standard library at import time; each section imports what it uses.
- machine.py: The lent GPU machine, as far as `make gpu-check` depends on it: one place for its package versions and
  for the wheels we carry to it. `make gpu-wheels` downloads CARRIED for its Python; `make gpu-rehearsal`
  (bench/gpu/rehearsal.py) builds a throwaway venv from PREINSTALLED + CARRIED and runs the check's CPU twin there,
  strict. Update this file when the machine's image changes (the device tool's KINDS.md lists its packages), and run
  the rehearsal whenever the imports of the stages, the models or the trainer change.
- rehearsal.py: `make gpu-rehearsal`: the GPU check's CPU twin in an environment built like the lent GPU machine's, so
  that a section that would be skipped or break there fails here first, at no device time.
- sections.py: The sections of `make gpu-check` (bench/gpu/check.py has what they measure and how to run it): each
  takes the shared models, the device and the sizes, and returns rows. Standard library at import time; each section
  imports what it uses (torch, transformers, the project's modules), and none imports FAISS, Prefect, DuckDB or spaCy
  itself.
- speeds.py: The speed sections of `make gpu-check` (bench/gpu/check.py has what they measure and how to run it):
  encoding, the band search, training steps (translation: bench/gpu/generate.py). Standard library at import time;
  each section imports what it uses.

What the rest of the project uses, importable from the package (loaded on first use, so importing
the package imports none of its modules):
"""
from __future__ import annotations

from bench import lazy_attributes

_HOME = {
    "failures": "bench.gpu.budget",
    "PATH_1M": "bench.gpu.limits",
    "marian_flop": "bench.gpu.limits",
    "summary": "bench.gpu.limits",
    "Models": "bench.gpu.sections",
    "apply_settings": "bench.gpu.sections",
    "guarded": "bench.gpu.sections",
    "marian_texts": "bench.gpu.sections",
    "mem_unit": "bench.gpu.sections",
    "peak_mib": "bench.gpu.sections",
    "reset_peak": "bench.gpu.sections",
    "row": "bench.gpu.sections",
    "sync": "bench.gpu.sections",
    "topic_vectors": "bench.gpu.sections",
    "translator": "bench.gpu.sections",
    "ENCODE_ROWS": "bench.gpu.speeds",
    "SEARCH_ROWS": "bench.gpu.speeds",
    "TRAIN_ROWS": "bench.gpu.speeds",
}
__all__ = sorted(_HOME)


__getattr__ = lazy_attributes(__name__, _HOME)
