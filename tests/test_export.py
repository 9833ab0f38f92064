"""`make export`: each sentence-transformers format equals a direct construction from the mined rows, loads with
`datasets.load_dataset(<folder>)` as is (that folder's current rows, whatever else was exported or loaded before),
and trains `SentenceTransformerTrainer` + MultipleNegativesRankingLoss with no anchor twice in a batch."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from contramine.flows.cli import main as cli
from contramine.pipeline import export
from contramine.pipeline.storage import atomic
from contramine.pipeline.export import FORMATS, export_run
from train_helpers import sentences_rows, write_table

ROOT = Path(__file__).resolve().parent.parent

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
    write_table(run, "sentences", sents[::-1], parts=2)
    write_table(run, "embeddings", [{"sid": r["sid"], "emb": [float(i), 1.0, 0.5]} for i, r in enumerate(sents)
                                    if i != 3])  # the fourth sentence has no embedding: zeros in `dclr`
    (run / "pairs" / "_manifest.json").write_text('{"config": {"ipw": {"m_neg": 3}}, "shards": 3}')
    (run / "triplets" / "_manifest.json").write_text('{"config": {"negate": {"rules": "root"}}, "shards": 2}')
    return run, pairs, trip, sents


def direct(fmt, pairs, trip, sents=None):
    """Each format straight from its definition, row by row."""
    from contramine.trainer.objectives.osscse import OssCSE

    t1, t2 = OssCSE.Settings().templates
    if fmt == "sentences":
        return [{"anchor": r["text"]} for r in sorted(sents, key=lambda r: r["sid"])]
    if fmt == "dclr":
        return [{"anchor": r["text"], "label": [0.0, 0.0, 0.0] if i == 3 else [float(i), 1.0, 0.5]}
                for i, r in enumerate(sorted(sents, key=lambda r: r["sid"]))]
    if fmt == "debcse":
        m = max(len(p["negatives"]) for p in pairs)
        return [{"anchor": p["anchor"], "positive": (p["positives"] or [p["anchor"]])[0],
                 **{f"negative_{j + 1}": p["negatives"][j] for j in range(m)}} for p in pairs if len(p["negatives"]) >= m]
    if fmt == "osscse-prompt":
        return [{"anchor": t1.format(s=t["anchor"]), "anchor_t2": t2.format(s=t["anchor"]),
                 "paraphrase": t1.format(s=t["paraphrase"]), "negation": t1.format(s=t["negation"])} for t in trip
                if t["paraphrase"] is not None and t["negation"] is not None]
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
    run, pairs, trip, sents = mined
    folder = export_run(run, fmt, tmp_path / fmt)
    want = direct(fmt, pairs, trip, sents)
    ds = datasets.load_dataset(str(folder), split="train")
    assert ds.to_list() == want and len(ds) > 0
    card = (folder / "README.md").read_text()
    assert card.startswith("---\nconfigs:\n- config_name: default")
    pattern = re.search(r"^    path: (data/train-[0-9a-f]{16}-\*\.parquet)$", card, re.M).group(1)
    assert sorted(folder.glob(pattern)) == sorted((folder / "data").iterdir())  # the card names every data file
    assert "batch_sampler=BatchSamplers.NO_DUPLICATES" in card
    assert f"{len(want):,} rows" in card
    if FORMATS[fmt][0] != "sentences":
        assert ('"rules": "root"' if FORMATS[fmt][0] == "triplets" else '"m_neg": 3') in card  # the settings behind it
    assert all(f"`{c}`" in card for c in FORMATS[fmt][2])
    # the papers whose method mined the rows, as BibTeX (pairs: DebCSE's IPW; triplets: OssCSE; dclr: DCLR's vectors)
    cited = {"pairs": "miao-etal-2023-debcse", "triplets": "shi-etal-2023-osscse", "sentences": None}[FORMATS[fmt][0]]
    cited = "zhou-etal-2022-debiased" if fmt == "dclr" else cited
    assert (f"```bibtex\n@inproceedings{{{cited}," in card) if cited else "## Citation" not in card, card[-600:]


def test_make_export_command_and_bad_format(mined, capsys):
    run, *_ = mined
    assert cli(["export", "--run", run.name, "--set", f"run.root={run.parent}", "--format", "triplet",
                "labeled-pair"]) == 0
    assert (run / "export" / "triplet" / "README.md").is_file() and (run / "export" / "labeled-pair").is_dir()
    with pytest.raises(SystemExit):
        cli(["export", "--run", run.name, "--format", "quadruplet"])
    assert "invalid choice: 'quadruplet'" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f not in export.LOSS_OF])  # the others: test_st_losses.py
def test_sentence_transformers_trains_on_each_export(mined, fmt, bert, tmp_path):
    """The README's recipe: MNRL with NO_DUPLICATES batches. An anchor has a row per positive (and, in `triplet`, per
    negative); the batches the trainer draws never hold one anchor twice, which the default sampler's do here."""
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer import losses, modules as models
    from sentence_transformers.sentence_transformer.training_args import BatchSamplers

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
                                                logging_steps=1, seed=0, batch_sampler=BatchSamplers.NO_DUPLICATES)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train,
                                         loss=losses.MultipleNegativesRankingLoss(model))
    anchor = train.column_names[0]
    drawn = anchors_per_batch(trainer, anchor)
    assert sum(map(len, drawn)) == len(train)  # one epoch: every row once
    assert not repeats(drawn), f"batches holding one anchor twice: {repeats(drawn)}"
    out = trainer.train()
    assert out.global_step == 3 and out.training_loss > 0
    assert any(not (a == b).all() for a, b in zip(before, model.parameters()))
    if len(set(train[anchor])) < len(train):  # the fixture repeats anchors: without NO_DUPLICATES they would collide
        trainer.args.batch_sampler = BatchSamplers.BATCH_SAMPLER
        assert repeats(anchors_per_batch(trainer, anchor))


def repeats(batches: list[list[str]]) -> list[list[str]]:
    return [b for b in batches if len(set(b)) < len(b)]


def anchors_per_batch(trainer, column: str) -> list[list[str]]:
    """One epoch of the batches trainer.get_train_dataloader() draws, as their `column` texts: a spy on the data
    collator, which gets each batch's rows before tokenizing."""
    inner, seen = trainer.data_collator, []

    class Spy:
        def __call__(self, rows):
            seen.append([r[column] for r in rows])
            return inner(rows)

        def __getattr__(self, name):
            return getattr(inner, name)

    trainer.data_collator = Spy()
    try:
        for _ in trainer.get_train_dataloader():
            pass
    finally:
        trainer.data_collator = inner
    return seen


def test_the_readme_and_card_recipes_use_no_duplicates():
    """The README trains as the test above does; the card's snippet is the same recipe (test_export_equals_...)."""
    page = ROOT / "docs" / "training.md" if (ROOT / "docs" / "training.md").is_file() else ROOT / "README.md"
    section = page.read_text(encoding="utf-8").split("## Training with sentence-transformers")[1]
    recipe = re.search(r"^```python\n(.*?)^```", section, re.S | re.M).group(1)
    compile(recipe, "README recipe", "exec")
    assert "from sentence_transformers.sentence_transformer.training_args import BatchSamplers" in recipe
    assert "batch_sampler=BatchSamplers.NO_DUPLICATES" in recipe and "MultipleNegativesRankingLoss(model)" in recipe
    for fmt in FORMATS:
        compile("\n".join(export.usage(fmt)), f"{fmt} card recipe", "exec")


# ------------------------------------------------------------------------------- each folder loads its own rows
def mine_pairs(run: Path, n: int, tag: str) -> list[dict]:
    """A `pairs` table whose every text names `tag`, so a load of another run's or an older export's rows shows."""
    pairs = [{"sid": r["sid"], "anchor": f"{tag} {r['text']}", "positives": [f"{tag} {r['text']} too"],
              "negatives": [f"{tag} neg {i} {j}" for j in range(2)]} for i, r in enumerate(sentences_rows(n, seed=n))]
    write_table(run, "pairs", pairs)
    return pairs


def load_recipe(folder: Path) -> list[dict]:
    return datasets.load_dataset(str(folder), split="train").to_list()  # the README's call


def test_the_suite_keeps_out_of_the_users_hugging_face_caches():
    home = Path(os.environ["HF_HOME"])
    assert home.name.startswith("contramine-test-hf-") and Path(datasets.config.HF_DATASETS_CACHE).parent == home


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_each_export_loads_its_own_current_rows(tmp_path, monkeypatch, exchange):
    """Two runs exported in one format (one folder name, `n-tuple`), then one mined again and re-exported, all loaded
    in this one process: each load gives that folder's rows now. `datasets` caches by folder name and card, so a
    card naming a fixed `data/train-*.parquet` gave all three the first one's rows."""
    if not exchange:  # a system without renameat2: the re-export swaps with two renames
        monkeypatch.setattr(atomic, "_exchange", lambda folder, a, b: False)
    runs = {"a": mine_pairs(tmp_path / "a", 12, "a"), "b": mine_pairs(tmp_path / "b", 5, "b")}
    folders = {name: export_run(tmp_path / name, "n-tuple") for name in runs}
    for name, pairs in runs.items():
        assert load_recipe(folders[name]) == direct("n-tuple", pairs, [])
    old_files = sorted((folders["a"] / "data").iterdir())

    runs["a"] = mine_pairs(tmp_path / "a", 7, "a2")  # mined again: other rows, same folder
    assert export_run(tmp_path / "a", "n-tuple") == folders["a"]
    assert load_recipe(folders["a"]) == direct("n-tuple", runs["a"], []) and len(runs["a"]) == 7
    assert load_recipe(folders["b"]) == direct("n-tuple", runs["b"], [])
    new_files = sorted((folders["a"] / "data").iterdir())
    assert len(new_files) == 1 and not any(p.exists() for p in old_files)  # the replaced data files are gone
    assert sorted(p.name for p in (tmp_path / "a" / "export").iterdir()) == [".n-tuple.lock", "n-tuple"]  # no temp


def test_a_failed_re_export_leaves_the_previous_one(tmp_path, monkeypatch):
    """Writing the new files fails (a full disk): the folder keeps the old card and data, and loads as before."""
    pairs = mine_pairs(tmp_path / "r", 6, "r")
    folder = export_run(tmp_path / "r", "n-tuple")
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    mine_pairs(tmp_path / "r", 9, "r2")

    def broken(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(export.pq, "write_table", broken)
    with pytest.raises(OSError, match="disk full"):
        export_run(tmp_path / "r", "n-tuple")
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    assert load_recipe(folder) == direct("n-tuple", pairs, [])
    assert sorted(p.name for p in (tmp_path / "r" / "export").iterdir()) == [".n-tuple.lock", "n-tuple"]


def _dim(bert) -> int:
    import json

    return json.loads((bert / "config.json").read_text())["hidden_size"]
