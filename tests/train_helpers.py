"""Shared by the trainer tests: tiny mined tables, a tiny SentEval folder, profiles and the tiny BERT fixture."""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from contramine.pipeline.schema import SCHEMAS
from tiny_bert import WORDS

ROOT = Path(__file__).resolve().parent.parent
VOCAB = [w for w in WORDS if w.isalpha()]


# ------------------------------------------------------------------------------------------------ fixtures
def sentence(rng: random.Random, lo: int = 4, hi: int = 12) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(rng.randint(lo, hi)))


def write_table(run_dir: Path, name: str, rows: list[dict], parts: int = 2) -> None:
    """A mined table as the pipeline writes it: part files, split by contiguous sid ranges (written in reverse
    order so the reader cannot rely on file order)."""
    d = run_dir / name
    d.mkdir(parents=True, exist_ok=True)
    chunks = np.array_split(np.arange(len(rows)), parts)
    for i, idx in reversed(list(enumerate(chunks))):
        pq.write_table(pa.Table.from_pylist([rows[j] for j in idx], schema=SCHEMAS[name]),
                       d / f"part-{i:05d}-of-{parts:05d}.parquet")
    # the commit: a manifest without a file list names its layout's part files (pipeline/storage/store.py)
    (d / "_manifest.json").write_text(json.dumps({"shards": parts}))


def sentences_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for sid in range(n):
        text = sentence(rng)
        out.append({"sid": sid * 3 + 1, "text": text, "n_words": len(text.split()), "line_no": sid})
    return out


def write_senteval(root: Path, n: int = 16, seed: int = 0) -> Path:
    """A SentEval-layout folder with n scored pairs per file: enough for every number evaluate_all reports."""
    rng = random.Random(seed)

    def pairs():
        return [(sentence(rng), sentence(rng), round(rng.uniform(0, 5), 2)) for _ in range(n)]

    for task in ("STS12", "STS13", "STS14", "STS15", "STS16"):
        d = root / "STS" / f"{task}-en-test"
        d.mkdir(parents=True)
        ps = pairs()
        (d / "STS.input.news.txt").write_text("".join(f"{a}\t{b}\n" for a, b, _ in ps))
        (d / "STS.gs.news.txt").write_text("".join(f"{g}\n" for *_, g in ps))
    d = root / "STS" / "STSBenchmark"
    d.mkdir(parents=True)
    for split in ("train", "dev", "test"):
        (d / f"sts-{split}.csv").write_text(
            "".join(f"main-captions\tMSRvid\t2012test\t{i:04d}\t{g}\t{a}\t{b}\n" for i, (a, b, g) in enumerate(pairs())))
    d = root / "SICK"
    d.mkdir(parents=True)
    for name in ("SICK_train.txt", "SICK_trial.txt", "SICK_test_annotated.txt"):
        (d / name).write_text("pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n" + "".join(
            f"{i}\t{a}\t{b}\t{g}\tNEUTRAL\n" for i, (a, b, g) in enumerate(pairs())))
    return root




def write_profile(path: Path, root: Path, run: str, model: Path, senteval: Path, pooler: str = "cls_before_pooler",
                  **train) -> Path:
    """A self-contained profile (no `inherit`): the tests do not depend on configs/default.toml."""
    # log_every 1: a metrics.jsonl row per step, the numbers most tests compare (tests/test_train.py checks the
    # rows of a longer log_every)
    settings = {"objective": "simcse", "batch_size": 8, "lr": 1e-3, "max_steps": 12, "eval_every": 4,
                "eval_max_pairs": 0, "num_workers": 0, "final_eval": False, "seed": 7, "log_every": 1, **train}
    lines = ["[run]", f'name = "{run}"', f'root = "{root}"', "[data]", f'senteval_dir = "{senteval}"',
             f'probe = "{root / "no-probe.tsv"}"', "[encoder]", f'model = "{model}"', f'pooler = "{pooler}"',
             "max_length = 64", "[train]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in settings.items() if not isinstance(v, dict)]
    for name, section in settings.items():  # an objective's own settings: [train.<name>]
        if isinstance(section, dict):
            lines += [f"[train.{name}]"] + [f"{k} = {json.dumps(v)}" for k, v in section.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ------------------------------------------------------------------------------------------------ data reader
