"""`mine --for <objective>` (the setting mine.for) runs only the stages whose tables that objective trains on and
exports, with the stages those read from: a DebCSE user pays for no negations. The stages are derived from what
each stage reads and writes and what each objective reads (no hand-kept list)."""
from __future__ import annotations

import json

import pytest

from contramine.flows.cli import main
from contramine.flows.mine import stages_to_mine
from contramine.pipeline.config import OBJECTIVE_NAMES, load_config
from contramine.pipeline.engine.discovery import load_stages
from contramine.pipeline.storage.verify import WRITERS
from contramine.trainer.objectives import get_objective

from train_helpers import read_metrics, write_profile

pytestmark = pytest.mark.usefixtures("prefect_harness")

# stand-in models (no weights): the point is which stages run, not what the models say
STANDIN = ["encoder.model=standin:encoder-32", "encoder.max_length=32", "neighbours.pool_size=8",
           "noise.n_variants=2", "run.shards=2", 'backtranslate.chains=[["standin:shuffle-de", "standin:shuffle-en"]]']


@pytest.mark.parametrize("objective", OBJECTIVE_NAMES)
def test_a_mine_for_an_objective_runs_what_its_tables_need_and_nothing_else(objective):
    stages = load_stages()
    chosen = stages_to_mine(load_config("default", [f"mine.for={objective}"]))
    written = {t for s in chosen for t in stages[s].writes}
    assert set(get_objective(objective).mined_tables()) <= written  # what it trains on and exports
    for name in chosen:  # every table a chosen stage reads is written by a chosen stage: the mine can run
        assert set(stages[name].inputs) <= written, (name, set(stages[name].inputs) - written)
    assert chosen == [s for s in stages if s in chosen]  # in the run order
    # and nothing else: each chosen stage writes a table the objective's tables are computed from
    needed = set(get_objective(objective).mined_tables())
    for name in reversed(chosen):
        if set(stages[name].writes) & needed:
            needed |= set(stages[name].inputs)
    assert all(set(stages[name].writes) & needed for name in chosen), chosen
    assert stages_to_mine(load_config("default")) == list(stages)  # the default: every stage


def test_debcse_and_osscse_leave_out_each_others_stages():
    debcse = stages_to_mine(load_config("default", ["mine.for=debcse"]))
    osscse = stages_to_mine(load_config("default", ["mine.for=osscse"]))
    assert not {"negate", "paraphrases", "triplets"} & set(debcse) and "pairs" in debcse
    assert not {"embeddings", "neighbours", "scores", "ipw", "pairs"} & set(osscse) and "triplets" in osscse


def test_mine_for_debcse_writes_no_negations_and_train_trains_on_what_it_wrote(small_corpus, tmp_path, bert,
                                                                                senteval, capsys):
    corpus = tmp_path / "c24.txt"
    corpus.write_text("".join(small_corpus.read_text(encoding="utf-8").splitlines(keepends=True)[:24]),
                      encoding="utf-8")
    root = tmp_path / "runs"
    # `--for`, not `--force debcse` (argparse's abbreviations took it so before)
    assert main(["mine", "--for", "debcse", "--run", "r", "--corpus", str(corpus), "--set", *STANDIN,
                 f"run.root={root}"]) == 0
    mined = capsys.readouterr().out
    run = root / "r"
    tables = {p.name for p in run.iterdir() if (p / "_manifest.json").is_file()}
    assert {"sentences", "embeddings", "neighbours", "variants", "backtranslations", "scores", "candidates",
            "pairs"} <= tables
    assert not {"negations", "paraphrases", "triplets"} & tables, tables
    assert "negate" not in mined and "  pairs " in mined  # the summary lists the stages that ran

    profile = write_profile(tmp_path / "p.toml", root, "r", bert, senteval, objective="debcse", max_steps=3,
                            eval_every=2)
    assert main(["train", "--profile", str(profile)]) == 0  # what `make train` runs
    out = root / "r" / "train" / "debcse"
    losses = [m["loss"] for m in read_metrics(out / "metrics.jsonl") if "loss" in m]
    assert len(losses) == 3
    assert json.loads((out / "best" / "train_config.json").read_text())["objective"] == "debcse"

    # OssCSE's export of that run: one line naming the stage that writes what it lacks, in a fresh `contramine
    # export` process too, which has loaded no stage (was "written by a mining stage")
    saved = dict(WRITERS)
    WRITERS.clear()
    try:
        assert main(["export", "--run", "r", "--format", "osscse-triplet", "--set", f"run.root={root}"]) == 2
    finally:
        WRITERS.update(saved)
    assert "it is written by the `triplets` stage" in capsys.readouterr().err


def test_the_setting_in_a_profile_does_what_for_does(tmp_path):
    profile = tmp_path / "for.toml"
    profile.write_text('inherit = "default"\n[mine]\nfor = "osscse"\n')
    cfg = load_config(str(profile))
    assert cfg.mine.for_objective == ["osscse"] and "pairs" not in stages_to_mine(cfg)
    assert load_config(str(profile), ["mine.for=debcse"]).mine.for_objective == ["debcse"]  # --set over the profile


def test_several_objectives_mine_what_either_needs():
    """`--for debcse osscse` (or `--for` twice, or `for = ["debcse", "osscse"]`): the union of their stages, in run
    order; before, a second `--for` silently replaced the first."""
    debcse = stages_to_mine(load_config("default", ["mine.for=debcse"]))
    osscse = stages_to_mine(load_config("default", ["mine.for=osscse"]))
    both = stages_to_mine(load_config("default", ['mine.for=["debcse", "osscse"]']))
    assert set(both) == set(debcse) | set(osscse) and both == [s for s in load_stages() if s in both]
    assert stages_to_mine(load_config("default", ['mine.for=["simcse", "osscse"]'])) == osscse  # simcse's ⊂ osscse's
    assert load_config("default", ['mine.for=["osscse", "osscse"]']).mine.for_objective == ["osscse"]


@pytest.mark.parametrize("argv", [["--for", "debcse", "osscse"], ["--for", "debcse", "--for", "osscse"]],
                         ids=["one-option", "repeated"])
def test_the_cli_passes_every_objective_named(monkeypatch, argv):
    import contramine.flows.cli as cli

    seen = {}

    def configure(profile, run, corpus, overrides):
        seen["cfg"] = load_config(profile, overrides)
        raise SystemExit(0)  # what was asked is all this test reads: no mine

    monkeypatch.setattr(cli, "configure", configure)
    with pytest.raises(SystemExit):
        cli.main(["mine", *argv, "--run", "r"])
    assert seen["cfg"].mine.for_objective == ["debcse", "osscse"]
