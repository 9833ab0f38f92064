"""The README's recipe "mine with your own SimCSE model" end to end on the tiny BERT: mine a corpus with the start,
train SimCSE from the start on it, mine again with that checkpoint (a copy of the first run: only what the encoder
decides is recomputed), train DebCSE from the start on those pairs, and compare it with DebCSE on the start's pairs
(a row 'debcse@<run>'). A run mined with a checkpoint of this project records the checkpoint's fingerprint."""
from __future__ import annotations

import json

import pytest

from contramine.flows.cli import main as cli_main
from contramine.flows.mine import mine_flow
from contramine.pipeline.storage.store import Store
from contramine.pipeline.models.hub import model_fingerprint, resolve_model
from contramine.trainer import compare as cmp
from contramine.trainer.train import main as train_main

pytestmark = pytest.mark.usefixtures("prefect_harness")

SMALL = ["encoder.max_length=32", "neighbours.pool_size=8", "noise.n_variants=2", "run.shards=2",
         "backtranslate.chains=[]"]


def test_mine_with_your_own_simcse_checkpoint_then_debcse_on_its_pairs(small_corpus, tmp_path, bert, senteval):
    root = tmp_path / "runs"
    common = [f"run.root={root}", f"encoder.model={bert}", f"data.senteval_dir={senteval}",
              f"data.probe={tmp_path / 'no-probe.tsv'}", "train.batch_size=8", "train.eval_every=2",
              "train.num_workers=0", "train.final_eval=false"]
    # make mine
    mine_flow(profile="default", run="default", corpus=str(small_corpus), overrides=SMALL + common)
    # make train RUN=default OBJECTIVE=simcse: SimCSE from the start on the corpus
    assert train_main(["--run", "default", "--objective", "simcse", "--set", *common, "train.max_steps=4"]) == 0
    ckpt = root / "default" / "train" / "simcse" / "best"
    assert json.loads((ckpt / "train_config.json").read_text())["pooler"] == "mean"
    # make mine RUN=simcse-mined FROM=default SET="encoder.model=<checkpoint>"
    before = {f.relative_to(root): f.read_bytes() for f in (root / "default").glob("*/part-*.parquet")}
    assert cli_main(["mine", "--run", "simcse-mined", "--reuse-from", "default", "--corpus", str(small_corpus),
                     "--set", *SMALL, *common, f"encoder.model={ckpt}"]) == 0
    first, mined = Store(root / "default"), Store(root / "simcse-mined")
    # the default run's tables came in as hard links, not train/; mining the new run changed none of the old one's
    shard = first.shard_path("sentences", 0, 2).relative_to(root / "default")
    assert (root / "simcse-mined" / shard).stat().st_ino == (root / "default" / shard).stat().st_ino
    assert not (root / "simcse-mined" / "train").exists()
    assert {f.relative_to(root): f.read_bytes() for f in (root / "default").glob("*/part-*.parquet")} == before
    # what the encoder does not decide is reused; what it decides is computed with the checkpoint, keyed by its bytes
    assert mined.manifest("sentences")["shards_computed"] == 0 and mined.manifest("negations")["shards_computed"] == 0
    assert mined.manifest("embeddings")["shards_computed"] == 2
    fp = model_fingerprint(resolve_model(str(ckpt)))
    assert mined.manifest("embeddings")["resources"]["encoder"]["model"] == fp
    assert first.manifest("embeddings")["resources"]["encoder"]["model"] == model_fingerprint(resolve_model(str(bert)))
    assert fp != first.manifest("embeddings")["resources"]["encoder"]["model"]
    assert cmp.mined_with(root / "simcse-mined") == {"model": str(ckpt), "pooler": "mean", "fingerprint": fp}
    # make train RUN=simcse-mined OBJECTIVE=debcse: from the start (encoder.model of the profile), on those pairs
    assert train_main(["--run", "simcse-mined", "--objective", "debcse", "--set", *common,
                       "train.max_steps=2"]) == 0
    meta = json.loads((root / "simcse-mined" / "train" / "debcse" / "best" / "train_config.json").read_text())
    assert meta["model"] == str(bert)

    # make compare RUN=default OBJECTIVES="simcse debcse" SET="compare.mined_runs=simcse-mined"
    rep = cmp.compare("default", "default", [*SMALL, *common, "compare.steps=2", "compare.bootstrap=50",
                                             "compare.mined_runs=simcse-mined"], ["simcse", "debcse"], 1)
    assert list(rep["runs"]) == ["simcse", "debcse", "debcse@simcse-mined"]
    keys = {n: rs[0]["key"] for n, rs in rep["runs"].items()}
    assert len(set(keys.values())) == 3  # another run's tables: another key
    assert rep["mined_with"]["debcse@simcse-mined"]["fingerprint"] == fp
    assert rep["mined_with"]["debcse"]["model"] == str(bert)
    rows = {line.split("|")[1].strip(): line for line in rep["table"].splitlines()[2:]}
    assert f"pairs (mined with {ckpt})" in rows["debcse@simcse-mined"]
    assert f"pairs (mined with {bert})" in rows["debcse"]
    assert "--run simcse-mined" in rep["runs"]["debcse@simcse-mined"][0]["command"]
