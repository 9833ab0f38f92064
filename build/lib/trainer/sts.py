"""Loaders for the STS benchmarks in SentEval's layout (METHODS §8).

Text handling copies SentEval on purpose, because published numbers depend on it: every sentence is split on
whitespace and the batcher joins the tokens with one space (`senteval_text`). Files are read the way SentEval
reads them (utf-8, `splitlines`, tab split, no csv quoting: STS-B sentences contain bare `"` characters).

    senteval/STS/STS12-en-test … STS16-en-test   STS.input.<subset>.txt + STS.gs.<subset>.txt (empty gold = unscored)
    senteval/STS/STSBenchmark/sts-{train,dev,test}.csv   genre, file, year, id, score, sentence1, sentence2
    senteval/SICK/SICK_{train,trial,test_annotated}.txt  header; pair_ID, sentence_A, sentence_B, relatedness, ...
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

STS_TASKS = ("STS12", "STS13", "STS14", "STS15", "STS16")
STSB_FILES = {"train": "sts-train.csv", "dev": "sts-dev.csv", "test": "sts-test.csv"}
SICK_FILES = {"train": "SICK_train.txt", "trial": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}


class DataMissing(FileNotFoundError):
    """An STS file or folder is not where it should be; the message is one line naming the path."""


@dataclass
class PairSet:
    """Scored sentence pairs of one subset, e.g. ("STS12", "MSRvid") or ("STSBenchmark", "test")."""

    task: str
    subset: str
    s1: list[str]
    s2: list[str]
    gold: np.ndarray

    @property
    def name(self) -> str:
        return f"{self.task}/{self.subset}"

    def __len__(self) -> int:
        return len(self.gold)

    def head(self, n: int) -> "PairSet":
        return self if n <= 0 else PairSet(self.task, self.subset, self.s1[:n], self.s2[:n], self.gold[:n])


def senteval_text(sentence: str) -> str:
    """SentEval's loaders do `s.split()` and its batcher does `' '.join(tokens)`."""
    return " ".join(sentence.split())


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise DataMissing(f"STS data file not found: {path}")
    with io.open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def sts_subsets(task_dir: Path) -> list[str]:
    """Every subset with both an input and a gold file (STS12's gs.ALL and STS13's gs.SMT have no input)."""
    if not task_dir.is_dir():
        raise DataMissing(f"STS task folder not found: {task_dir}")
    names = sorted(p.name[len("STS.input."):-len(".txt")] for p in task_dir.glob("STS.input.*.txt"))
    return [n for n in names if (task_dir / f"STS.gs.{n}.txt").is_file()]


def load_sts_subset(task_dir: Path, task: str, subset: str) -> PairSet:
    inputs = _read_lines(task_dir / f"STS.input.{subset}.txt")
    golds = _read_lines(task_dir / f"STS.gs.{subset}.txt")
    if len(inputs) != len(golds):
        raise ValueError(f"{task}/{subset}: {len(inputs)} input lines vs {len(golds)} gold lines")
    s1, s2, gold = [], [], []
    for line, g in zip(inputs, golds):
        if not g.strip():  # unscored pair: SentEval drops it
            continue
        a, b = line.split("\t")
        s1.append(senteval_text(a))
        s2.append(senteval_text(b))
        gold.append(float(g))
    return PairSet(task, subset, s1, s2, np.asarray(gold, dtype=np.float64))


def load_sts_task(senteval_dir: Path | str, task: str) -> list[PairSet]:
    task_dir = Path(senteval_dir) / "STS" / f"{task}-en-test"
    return [load_sts_subset(task_dir, task, s) for s in sts_subsets(task_dir)]


def _load_columns(path: Path, task: str, subset: str, cols: tuple[int, int, int], header: bool) -> PairSet:
    lines = _read_lines(path)[1 if header else 0:]
    s1, s2, gold = [], [], []
    score, a, b = cols
    for line in lines:
        if not line.strip():
            continue
        fields = line.strip().split("\t")
        s1.append(senteval_text(fields[a]))
        s2.append(senteval_text(fields[b]))
        gold.append(float(fields[score]))
    return PairSet(task, subset, s1, s2, np.asarray(gold, dtype=np.float64))


def load_stsb(senteval_dir: Path | str, split: str) -> PairSet:
    path = Path(senteval_dir) / "STS" / "STSBenchmark" / STSB_FILES[split]
    return _load_columns(path, "STSBenchmark", split, (4, 5, 6), header=False)


def load_sick(senteval_dir: Path | str, split: str) -> PairSet:
    path = Path(senteval_dir) / "SICK" / SICK_FILES[split]
    return _load_columns(path, "SICK", split, (3, 1, 2), header=True)


def check_senteval_dir(senteval_dir: Path | str) -> Path:
    path = Path(senteval_dir)
    if not (path / "STS").is_dir():
        raise DataMissing(f"SentEval data folder not found: {path} (expected {path / 'STS'}; set --data-dir)")
    return path
