"""docs/training.md's recipe for the papers' losses runs as written for every objective: the block is executed with
only its `objective, run, start` line changed (a tiny mined run, exported in every format it names, and a tiny BERT
saved as a SentenceTransformer)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from contramine.pipeline.citations import CITATIONS
from contramine.pipeline.export import export_run
from tiny_bert import build_tiny_bert
from train_helpers import sentences_rows, write_table

ROOT = Path(__file__).resolve().parent.parent
datasets = pytest.importorskip("datasets")
LINE = 'objective, run, start = "debcse", "artifacts/default", "sentence-transformers/all-MiniLM-L6-v2"'


def recipe() -> str:
    section = (ROOT / "docs" / "training.md").read_text(encoding="utf-8").split(
        "### The papers' objectives as sentence-transformers losses")[1]
    block = re.search(r"^```python\n(.*?)^```", section, re.S | re.M).group(1)
    assert LINE in block
    return block


@pytest.fixture(scope="module")
def mined(tmp_path_factory):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules

    root = tmp_path_factory.mktemp("recipe")
    bert = build_tiny_bert(root / "bert", seed=0, dropout=0.1)
    start = root / "start"
    SentenceTransformer(modules=[modules.Transformer(str(bert)), modules.Pooling(32, "mean")], device="cpu").save(
        str(start))
    run = root / "artifacts" / "default"
    sents = sentences_rows(12)
    write_table(run, "sentences", sents)
    write_table(run, "pairs", [{"sid": r["sid"], "anchor": r["text"], "positives": ["so " + r["text"]],
                                "negatives": [f"no {r['text']}", f"never {r['text']}"]} for r in sents])
    write_table(run, "triplets", [{"sid": r["sid"], "anchor": r["text"], "paraphrase": r["text"] + " again",
                                   "negation": "not " + r["text"], "para_mer": 0.3, "para_chain": "de"} for r in sents])
    write_table(run, "embeddings", [{"sid": r["sid"], "emb": [1.0, float(i), 0.5]} for i, r in enumerate(sents)])
    return run, start


def test_the_recipe_names_every_loss():
    block = recipe()
    for name in ("simcse", "debcse", "osscse", "osscse-start-pooler", "whitenedcse", "dclr"):
        assert f'"{name}": (' in block
    assert "batch_sampler=BatchSamplers.NO_DUPLICATES" in block


@pytest.mark.parametrize("objective", ["simcse", "debcse", "osscse", "osscse-start-pooler", "whitenedcse", "dclr"])
def test_the_docs_recipe_trains_each_objective(mined, objective, tmp_path, monkeypatch):
    run, start = mined
    block = recipe()
    fmt = re.search(rf'"{objective}": \("([a-z-]+)"', block).group(1)
    export_run(run, fmt)  # make export RUN=default FORMAT=<fmt>
    monkeypatch.chdir(tmp_path)  # output_dir=st-<objective> lands here
    code = block.replace(LINE, f'objective, run, start = "{objective}", "{run}", "{start}"')
    namespace: dict = {}
    exec(compile(code, "docs/training.md recipe", "exec"), namespace)
    assert (tmp_path / f"st-{objective}" / "final" / "modules.json").is_file()
    assert namespace["model"].max_seq_length == 32
    # the model card SentenceTransformerTrainer wrote cites the objective's paper (the loss's `citation`)
    card = (tmp_path / f"st-{objective}" / "final" / "README.md").read_text(encoding="utf-8")
    assert CITATIONS[objective.split("-")[0]] in card and "Sentence-BERT" in card
