"""Reading a Hugging Face dataset as a corpus (pipeline/corpus_forms.py describes the forms): its revision resolved
to a commit once per process, and that commit streamed with `datasets` in batches of DATASET_BATCH rows.
"""
from __future__ import annotations

import re

from pipeline.corpus_records import CorpusError

HUB = "hf:"
DATASET_BATCH = 1000    # rows per batch of a streamed dataset
_REVISIONS: dict[tuple[str, str | None], str] = {}


def hub_commit(repo: str, revision: str | None) -> str:
    """The commit a dataset's revision (None: its default branch) names now, asked once per process."""
    if revision and re.fullmatch(r"[0-9a-f]{40}", revision):
        return revision
    if (repo, revision) not in _REVISIONS:
        try:
            from huggingface_hub import HfApi

            _REVISIONS[repo, revision] = HfApi().dataset_info(repo, revision=revision).sha
        except Exception as e:  # not found, gated, offline (HF_HUB_OFFLINE), no network: one line either way
            why = " ".join(str(e).split())[:300]
            raise CorpusError(f"corpus {HUB}{repo}: cannot resolve dataset revision {revision or 'main'} on the hub "
                              f"({type(e).__name__}: {why})") from None
    return _REVISIONS[repo, revision]


def stream_dataset(repo: str, config: str | None, split: str, commit: str):
    try:
        from datasets import load_dataset
    except ImportError:
        raise CorpusError(f"corpus {HUB}{repo}: reading a hub dataset needs the `datasets` package "
                          f"(pip install datasets)") from None
    try:
        return load_dataset(repo, config, split=split, streaming=True, revision=commit)
    except Exception as e:
        why = " ".join(str(e).split())[:300]
        raise CorpusError(f"corpus {HUB}{repo}@{commit[:12]}: cannot stream split {split!r}"
                          f"{f' of config {config!r}' if config else ''} ({type(e).__name__}: {why})") from None
