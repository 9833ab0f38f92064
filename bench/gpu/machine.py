"""The lent GPU machine, as far as `make gpu-check` depends on it: one place for its package versions and for the
wheels we carry to it. `make gpu-wheels` downloads CARRIED for its Python; `make gpu-rehearsal`
(bench/gpu/rehearsal.py) builds a throwaway venv from PREINSTALLED + CARRIED and runs the check's CPU twin there,
strict. Update this file when the machine's image changes (the device tool's KINDS.md lists its packages), and run
the rehearsal whenever the imports of the stages, the models or the trainer change.

    python -m bench.gpu.machine wheels      # CARRIED as pip requirement lines (what `make gpu-wheels` reads)
    python -m bench.gpu.machine preinstalled
"""
from __future__ import annotations

import sys

PYTHON = "3.12"  # the machine's python3 (/opt/torch/.venv/bin/python3, Python 3.12.3)

# What the machine's image has, at the versions a session read there (2026-11; KINDS.md's "pip list" row). Only the
# packages the check's sections can import are named. Unpinned: present on the machine, version not read; the
# rehearsal takes the registry's newest. torch is the one exception the rehearsal cannot match: the registry's
# torch 2.11 for Python 3.12 is a multi-GB CUDA build, so it uses this box's torch (TORCH_HERE).
PREINSTALLED = {
    "torch": "2.11.0",
    "transformers": "5.17.0",
    "sentence-transformers": "6.0.1",
    "tokenizers": "0.23.2",
    "huggingface-hub": "1.33.0",
    "safetensors": "0.8.0",
    "sentencepiece": "0.2.2",
    "accelerate": "1.15.0",
    "numpy": "",
    "pyarrow": "",
    "scipy": "",
    "pandas": "",
    "tqdm": "",
    "pyyaml": "",
    "regex": "",
    "packaging": "",
}
TORCH_HERE = "2.13.0"  # pyproject's pin, CPU build, on local disk here

# What the machine lacks and the sections import: pydantic (the config, the objectives) and its parts, CTranslate2
# (generate_ct2), rapidfuzz (pipeline/text_distances.py, imported by the stages' registry). `make gpu-wheels` fetches
# these for PYTHON; carry .gpu-wheels/ and bench/gpu/check.py installs them there with no index. Same versions as
# pyproject where pyproject pins them.
CARRIED = {
    "pydantic": "2.14.4",
    "pydantic-core": "2.50.5",
    "annotated-types": "",
    "typing-inspection": "",
    "typing-extensions": "",
    "ctranslate2": "4.8.5",
    "rapidfuzz": "3.14.6",
}

# Of CARRIED, those the machine has too (carried anyway, for pydantic's sake): the rehearsal removes every other
# CARRIED package that a PREINSTALLED one pulled in here (the registry's typer needs pydantic; the machine's does not).
ALSO_THERE = ("typing-extensions",)

# Never on the machine and never imported by a section (bench/gpu/check.py's HEAVY): the rehearsal checks that the
# venv it builds does not have them, so a section that starts importing one fails there, not on the GPU.
ABSENT = ("faiss", "prefect", "duckdb", "spacy", "jiwer")


def requirements(packages: dict[str, str]) -> list[str]:
    """pip requirement lines: `name==version`, or the bare name where no version is pinned."""
    return [f"{name}=={version}" if version else name for name, version in packages.items()]


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "wheels"
    if which not in ("wheels", "preinstalled"):
        raise SystemExit(f"usage: python -m bench.gpu.machine [wheels|preinstalled], not {which!r}")
    print(" ".join(requirements(CARRIED if which == "wheels" else PREINSTALLED)))
