"""`make export`: each sentence-transformers format equals a direct construction from the mined rows, loads with
`datasets.load_dataset(<folder>)` as is, and trains `SentenceTransformerTrainer` + MultipleNegativesRankingLoss."""
from __future__ import annotations

import pytest

from flows.cli import main as cli
from pipeline.export import FORMATS, export_run
from train_helpers import sentences_rows, write_table

datasets = pytest.importorskip("datasets")  # a test extra (pyproject): `make test` installs it


@pytest.fixture(scope="module")
def mined(tmp_path_factory):
    run = tmp_path_factory.mktemp("exp") / "r"
    sents = sentences_rows(40)
    pairs = [{"sid": r["sid"], "anchor": r["text"], "positives": [r["text"] + " too", "so " + r["text"]][: 1 + i % 2],
              "negatives": [f"neg {i} {j}" for j in range(3 if i % 5 else 2)]} for i, r in enumerate(sents)]
    write_table(run, "pairs", pairs[::-1], parts=3)  # reversed: the export orders by sid itself
    trip = [{"sid": r["sid"], "anchor": r["text"], "paraphrase": None if i % 4 == 0 else r["text"] + " again",
             "negation": "not " + r["text"], "para_mer": 0.3, "para_chain": "de"} for i, r in enumerate(sents)]
    write_table(run, "triplets", trip)
    (run / "pairs" / "_manifest.json").write_text('{"config": {"ipw": {"m_neg": 3}}, "shards": 3}')
    (run / "triplets" / "_manifest.json").write_text('{"config": {"negate": {"rules": "root"}}, "shards": 2}')
    return run, pairs, trip


def direct(fmt, pairs, trip):
    """Each format straight from its definition, row by row."""
    if fmt == "triplet":
        return [{"anchor": p["anchor"], "positive": q, "negative": n} for p in pairs for q in p["positives"]
                for n in p["negatives"]]
    if fmt == "n-tuple":
        m = max(len(p["negatives"]) for p in pairs)
        return [{"anchor": p["anchor"], "positive": q, **{f"negative_{j + 1}": p["negatives"][j] for j in range(m)}}
                for p in pairs for q in p["positives"] if len(p["negatives"]) >= m]
    if fmt == "labeled-pair":
        return [{"sentence1": p["anchor"], "sentence2": s, "label": lab} for p in pairs
                for s, lab in [(q, 1) for q in p["positives"]] + [(n, 0) for n in p["negatives"]]]
    return [{"anchor": t["anchor"], "paraphrase": t["paraphrase"], "negation": t["negation"]} for t in trip
            if t["paraphrase"] is not None and t["negation"] is not None]


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_export_equals_the_format_and_loads_with_datasets(mined, fmt, tmp_path):
    run, pairs, trip = mined
    folder = export_run(run, fmt, tmp_path / fmt)
    want = direct(fmt, pairs, trip)
    ds = datasets.load_dataset(str(folder), split="train")
    assert ds.to_list() == want and len(ds) > 0
    card = (folder / "README.md").read_text()
    assert card.startswith("---\nconfigs:\n- config_name: default") and "data/train-*.parquet" in card
    assert f"{len(want):,} rows" in card
    assert ('"rules": "root"' if fmt == "osscse-triplet" else '"m_neg": 3') in card  # the settings behind it
    assert all(f"`{c}`" in card for c in FORMATS[fmt][2])


def test_make_export_command_and_bad_format(mined, capsys):
    run, *_ = mined
    assert cli(["export", "--run", run.name, "--set", f"run.root={run.parent}", "--format", "triplet",
                "labeled-pair"]) == 0
    assert (run / "export" / "triplet" / "README.md").is_file() and (run / "export" / "labeled-pair").is_dir()
    with pytest.raises(SystemExit):
        cli(["export", "--run", run.name, "--format", "quadruplet"])
    assert "invalid choice: 'quadruplet'" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_sentence_transformers_trains_on_each_export(mined, fmt, bert, tmp_path):
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer import losses, modules as models

    run, *_ = mined
    train = datasets.load_dataset(str(export_run(run, fmt, tmp_path / fmt)), split="train")
    model = SentenceTransformer(modules=[models.Transformer(str(bert), max_seq_length=32),
                                         models.Pooling(_dim(bert), "mean")],
                                device="cpu")
    if fmt == "labeled-pair":  # a (text, text, label) dataset goes to a pair loss; MNRL takes the positive pairs
        train = train.filter(lambda r: r["label"] == 1).remove_columns("label")
    before = [p.detach().clone() for p in model.parameters()]
    args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "st"), max_steps=3, per_device_train_batch_size=8,
                                                learning_rate=1e-3, report_to=[], save_strategy="no", use_cpu=True,
                                                logging_steps=1, seed=0)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train,
                                         loss=losses.MultipleNegativesRankingLoss(model))
    out = trainer.train()
    assert out.global_step == 3 and out.training_loss > 0
    assert any(not (a == b).all() for a, b in zip(before, model.parameters()))


def _dim(bert) -> int:
    import json

    return json.loads((bert / "config.json").read_text())["hidden_size"]
