"""The hub form, `hf:owner/name` (or DuckDB's `hf://datasets/owner/name`): a Hugging Face dataset's split, its
column `data.text_field`, streamed with `datasets` (`data.hf_split`, `data.hf_config`, and `data.hf_revision`: a
branch or tag is resolved to its commit once a process, and that commit is read) in batches of DATASET_BATCH rows.

The id always goes through the hub's own validation (huggingface_hub's validate_repo_id), and an id that names a
local path is refused: `datasets` would read that folder from the disk, keyed by nothing of its content. Local data
is given as a path (a folder of files), whose identity is every file's content hash.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator

from contramine.pipeline.corpus.forms import form
from contramine.pipeline.corpus.records import CorpusError, Value, text_value

HUB = "hf:"
DATASET_BATCH = 1000    # rows per batch of a streamed dataset
_REVISIONS: dict[tuple[str, str | None], str] = {}


def hub_commit(repo: str, revision: str | None) -> str:
    """The commit a dataset's revision (None: its default branch) names now, asked once per process."""
    if revision and re.fullmatch(r"[0-9a-f]{40}", revision):
        return revision
    if (repo, revision) not in _REVISIONS:
        try:
            from huggingface_hub import HfApi  # huggingface_hub: an hf: corpus only (the CLI loads this module)

            _REVISIONS[repo, revision] = HfApi().dataset_info(repo, revision=revision).sha
        except Exception as e:  # not found, gated, offline (HF_HUB_OFFLINE), no network: one line either way
            why = " ".join(str(e).split())[:300]
            raise CorpusError(f"corpus {HUB}{repo}: cannot resolve dataset revision {revision or 'main'} on the hub "
                              f"({type(e).__name__}: {why})") from None
    return _REVISIONS[repo, revision]


def stream_dataset(repo: str, config: str | None, split: str, commit: str):
    try:
        from datasets import load_dataset  # datasets: optional (the hf extra)
    except ImportError:
        raise CorpusError(f"corpus {HUB}{repo}: reading a hub dataset needs the `datasets` package "
                          f"(pip install datasets)") from None
    try:
        return load_dataset(repo, config, split=split, streaming=True, revision=commit)
    except Exception as e:
        why = " ".join(str(e).split())[:300]
        raise CorpusError(f"corpus {HUB}{repo}@{commit[:12]}: cannot stream split {split!r}"
                          f"{f' of config {config!r}' if config else ''} ({type(e).__name__}: {why})") from None


@form("hub", scheme=HUB)
class HubReader:
    """A dataset's split as one part, `hf:<id>:<split>`; its records are counted only as they are read (count 0)."""

    @classmethod
    def open(cls, corpus) -> list["HubReader"]:
        return [cls(corpus)]

    def __init__(self, corpus):
        self.spec, self.field, self.split, self.config = corpus.spec, corpus.field, corpus.split, corpus.config
        self.repo = corpus.spec[len(HUB):].removeprefix("//").removeprefix("datasets/").rstrip("/")
        self.revision, self.name = corpus.revision, f"{HUB}{self.repo}:{self.split}"
        from huggingface_hub.utils import HFValidationError, validate_repo_id  # huggingface_hub: an hf: corpus only

        try:
            validate_repo_id(self.repo)
        except HFValidationError as e:
            raise CorpusError(f"corpus {self.spec}: not a hub dataset id ({' '.join(str(e).split())[:200]}); "
                              f"local data is given as a path") from None
        if os.path.lexists(self.repo):
            raise CorpusError(f"corpus {self.spec}: {self.repo} is a local path, and hf: names a hub dataset; give "
                              f"local data as the path itself (--corpus {self.repo})")

    def commit(self) -> str:
        return hub_commit(self.repo, self.revision)

    def check(self) -> None:
        stream = stream_dataset(self.repo, self.config, self.split, self.commit())
        columns = list(stream.features) if stream.features is not None else None
        if columns is not None and self.field not in columns:
            raise CorpusError(f"corpus {self.spec}: split {self.split!r} has no column `{self.field}` (columns: "
                              f"{', '.join(columns)}); set data.text_field")

    def count(self) -> int:
        return 0

    def identity(self) -> str:
        return f"{HUB}{self.repo}@{self.commit()};config={self.config};split={self.split};field={self.field}"

    def records(self, long_bytes: int, keep: int) -> Iterator[Value]:
        commit = self.commit()
        for batch in stream_dataset(self.repo, self.config, self.split, commit).iter(batch_size=DATASET_BATCH):
            if self.field not in batch:
                raise CorpusError(f"corpus {self.spec}@{commit[:12]}: a row has no column `{self.field}` (columns: "
                                  f"{', '.join(batch)}); set data.text_field")
            for value in batch[self.field]:
                yield text_value(value)
