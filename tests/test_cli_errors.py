"""Config, corpus and model errors: exit code 2, one line on stderr naming the key / path / model, and nothing
written under the run root."""
from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contramine.pipeline.corpus import CorpusError, split_sentences

from hostile import plain_rows, wiki_lines, write_corpus



from mining_helpers import ROOT, SMALL, _cli_env, _cli_error

pytestmark = pytest.mark.usefixtures("prefect_harness")


# ---------------------------------------------------------------- config, corpus and model errors: exit 2, one line

CONFIG_ERRORS = [
    (["neighbours.pool_sise=8"], "neighbours.pool_sise: unknown key"),
    (["nieghbours.pool_size=8"], "nieghbours: unknown key"),
    (["neighbours.pool_size=eight"], "neighbours.pool_size: Input should be a valid integer"),
    (["run.shards=[1,2]"], "run.shards: Input should be a valid integer"),
    (["neighbours.lo=0.8", "neighbours.hi=0.2"], "neighbours.lo (0.8) > neighbours.hi (0.2)"),
    (["neighbours.lo=0.8 neighbours.hi=0.2"], "neighbours.lo (0.8) > neighbours.hi (0.2)"),  # make's SET="a b"
    (["neighbours.lo=1.5"], "neighbours.lo: Input should be less than or equal to 1"),
    (["ipw.m_neg=9"], "ipw.m_neg (9) > neighbours.pool_size (8)"),
    (["ipw.temperature=0"], "ipw.temperature: Input should be greater than 0"),
    (["ipw.temperature=-0.5"], "ipw.temperature: Input should be greater than 0"),
    (["ipw.lambda_neg=1.2"], "ipw.lambda_neg: Input should be less than or equal to 1"),
    (["paraphrases.mer_lo=0.9", "paraphrases.mer_hi=0.1"], "paraphrases.mer_lo (0.9) > paraphrases.mer_hi (0.1)"),
    (["sentences.min_words=9", "sentences.max_words=4"], "sentences.min_words (9) > sentences.max_words (4)"),
    (["noise.min_ops=3"], "noise.min_ops (3) > noise.max_ops (2)"),
    (["run.shards=0"], "run.shards: Input should be greater than or equal to 1"),
    (["encoder.max_length=2"], "encoder.max_length: Input should be greater than or equal to 4"),
    (["runner.kind=dask"], "runner.address is required"),
    (["run.name=../escape"], "run.name '../escape': a run name is one folder inside run.root"),
    (["neighbours.pool_size"], "'neighbours.pool_size': expected key=value"),
]


@pytest.mark.parametrize("sets,message", CONFIG_ERRORS, ids=[s[0] for s, _ in CONFIG_ERRORS])
def test_config_error_is_one_line_naming_the_key(capsys, tmp_path, sets, message):
    line = _cli_error(capsys, tmp_path / "runs", ["mine", "--corpus", str(tmp_path / "c.txt")], sets)
    assert message in line


def test_input_errors_name_the_path_or_model(capsys, tmp_path):
    corpus = write_corpus(tmp_path / "c.txt", plain_rows(wiki_lines(3)))
    root = tmp_path / "runs"
    missing = tmp_path / "no-such-dir" / "corpus.txt"
    assert str(missing) in _cli_error(capsys, root, ["mine", "--corpus", str(missing)])
    (tmp_path / "empty-dir").mkdir()  # a folder is a corpus of its files: one with none is refused, named
    assert f"{tmp_path / 'empty-dir'}: no corpus files" in _cli_error(capsys, root, ["mine", "--corpus",
                                                                                    str(tmp_path / "empty-dir")])
    assert "profile 'no-such-profile' not found" in _cli_error(capsys, root, ["mine", "--profile", "no-such-profile"])
    no_text, int_text, fake = tmp_path / "no-text.parquet", tmp_path / "int-text.parquet", tmp_path / "fake.parquet"
    pq.write_table(pa.table({"sentence": ["one two three"]}), no_text)
    pq.write_table(pa.table({"text": [1, 2, 3]}), int_text)
    fake.write_bytes(corpus.read_bytes())  # a text file named .parquet
    utf16 = tmp_path / "utf16.txt"  # what "Unicode" in some editors' save dialogs writes
    utf16.write_text("\n".join(wiki_lines(3)), encoding="utf-16")
    for path, message in [(no_text, "string column `text`"), (int_text, "column `text` is int64"),
                          (fake, "Parquet magic bytes not found"), (utf16, "UTF-16/UTF-32 text")]:
        line = _cli_error(capsys, root, ["mine", "--corpus", str(path)])
        assert str(path) in line and message in line, line
    with pytest.raises(CorpusError, match="convert it to UTF-8"):  # in-process callers of the stage too
        split_sentences(utf16, 3, 128, 2000)
    (tmp_path / "not-a-model").mkdir()
    assert os.environ["HF_HUB_OFFLINE"] == "1"  # conftest: the hub id below must fail fast, offline
    cases = [
        (["encoder.model=/nonexistent/path"], "encoder /nonexistent/path: no such directory"),
        (["encoder.model=contramine-test/no-such-model"], "encoder 'contramine-test/no-such-model' is not available"),
        ([f"encoder.model={tmp_path / 'not-a-model'}"], "not-a-model: directory has no config.json"),
        ([f"encoder.model={corpus}"], f"encoder {corpus}: a file, not a model directory"),
        (["negate.model=xx_no_such_pipeline"], "spaCy pipeline 'xx_no_such_pipeline' is not installed"),
        (['backtranslate.chains=[["contramine-test/no-mt", "contramine-test/no-mt-back"]]',
          "backtranslate.fallback=false"],
         "translation model 'contramine-test/no-mt'"),
    ]
    for sets, message in cases:
        line = _cli_error(capsys, root, ["mine", "--corpus", str(corpus)], sets)
        assert message in line, (sets, line)


def _run_cli(args: list[str], **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "contramine.flows.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env=_cli_env(**env), timeout=300)


def test_cli_subprocess_stage_before_its_input(tmp_path, capsys):
    """The real `python -m contramine.flows.cli stage neighbours` on a fresh run, as `make stage` runs it: exit 2, one line
    saying what to run first, as a make target; the same call from the command line names the command line."""
    root = tmp_path / "runs"
    r = _run_cli(["stage", "neighbours", "--run", "fresh", "--set", *SMALL, f"run.root={root}"], CONTRAMINE_VIA="make")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: stage neighbours reads table `embeddings`, which run 'fresh' does not have")
    assert "run `make stage STAGE=embeddings RUN=fresh` (or `make mine RUN=fresh`) first" in r.stderr
    assert not root.exists() or not any(root.iterdir())
    line = _cli_error(capsys, root, ["stage", "neighbours", "--run", "fresh"])
    assert "run `contramine stage embeddings --run fresh` (or `contramine mine --run fresh`) first" in line
    assert "make" not in line


def test_one_command_line_lists_every_command_and_delegates_with_one_line_errors(capsys):
    """`contramine --help` lists training, evaluation and the compare beside mining; a delegated command's bad key
    ends as every other: one `error:` line, exit 2."""
    import pytest

    from contramine.flows.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    listing = capsys.readouterr().out
    for cmd in ("mine", "stage", "sql", "report", "export", "train", "eval", "compare"):
        assert f"    {cmd} " in listing, cmd
    assert main(["compare", "--set", "nope=1"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: config error: nope: unknown key (profile 'default')"


# ---------------------------------------------------------------- options: whole words, stages and objectives that exist

def test_an_unknown_stage_or_objective_is_one_line_naming_it_and_the_known_ones(capsys, tmp_path):
    corpus = str(tmp_path / "c.txt")
    line = _cli_error(capsys, tmp_path / "runs", ["mine", "--corpus", corpus, "--force", "negat"])
    assert "--force 'negat': no such stage; stages: " in line and "negate" in line  # not accepted and ignored
    line = _cli_error(capsys, tmp_path / "runs", ["mine", "--corpus", corpus, "--for", "debcsx"])
    assert "mine.for 'debcsx': no such objective; objectives: simcse, debcse, osscse, whitenedcse, dclr" in line
    line = _cli_error(capsys, tmp_path / "runs", ["mine", "--corpus", corpus, "--for", "debcse", "--force", "negate"])
    assert "--force 'negate': this mine does not run that stage" in line and "pairs" in line


def test_sql_refuses_an_empty_query_and_a_row_limit_below_one_in_one_line(capsys, tmp_path):
    """`sql -q ""` is a query that is empty (not the interactive shell, which waited on stdin); `--max-rows -1`
    reached DuckDB's show(), which answered with a traceback."""
    from contramine.flows.cli import main

    line = _cli_error(capsys, tmp_path / "runs", ["sql", "--run", "r", "--query", "  "])
    assert line == "error: sql: the query is empty: give --query one SQL statement, or leave --query out for the shell"
    for bad in ("-1", "0", "ten"):
        with pytest.raises(SystemExit) as e:
            main(["sql", "--run", "r", "--max-rows", bad, "--query", "SELECT 1"])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and err[-1].endswith(f"argument --max-rows: a whole number >= 1, not '{bad}'"), err


@pytest.mark.parametrize("argv, option, wanted", [
    (["eval", "--batch-size", "0"], "--batch-size", "a whole number >= 1, not '0'"),  # ran one text a batch
    (["eval", "--max-length", "-5"], "--max-length", "a whole number >= 0, not '-5'"),  # a tokenizer's OverflowError
    (["compare", "--seeds", "0"], "--seeds", "a whole number >= 1, not '0'"),
    (["cache", "--older-than", "-1"], "--older-than", "a number of days >= 0, not '-1'"),  # removed every pack
    (["cache", "--older-than", "nan"], "--older-than", "a number of days >= 0, not 'nan'"),  # removed none
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_number_out_of_range_is_argparses_one_line(capsys, argv, option, wanted):
    from contramine.flows.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[-1].endswith(f"argument {option}: {wanted}"), err


@pytest.mark.parametrize("argv", [["mine", "--forc", "negate"], ["mine", "--fo", "debcse"], ["stage", "noise", "--forc"],
                                  ["train", "--objec", "debcse"], ["sql", "--quer", "SELECT 1"]],
                         ids=lambda argv: " ".join(argv))
def test_an_abbreviated_option_is_refused_not_guessed(capsys, argv):
    """argparse's abbreviations took `mine --for debcse` as `--force debcse`: on no parser of the command line."""
    from contramine.flows.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def test_every_parser_of_the_commands_takes_whole_option_names_only():
    """Every argparse parser of the commands a user runs (the CLI, its delegated commands, the benches, the report)
    says allow_abbrev=False, the CLI's subcommands included (a subparser does not inherit it)."""
    import ast

    missing = []
    for folder in ("flows", "trainer", "bench", "pipeline/report"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("ArgumentParser", "add_parser"):
                    if not any(k.arg == "allow_abbrev" and k.value.value is False for k in node.keywords):
                        missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not missing, missing


@pytest.mark.parametrize("command", ["report", "export", "verify", "sql"])
def test_a_run_that_does_not_exist_is_one_line_and_creates_nothing(capsys, tmp_path, command):
    root = tmp_path / "runs"
    line = _cli_error(capsys, root, [command, "--run", "nosuchrun"])  # asserts nothing was written under root
    assert f"{root / 'nosuchrun'}: no such run" in line and "contramine mine --run nosuchrun" in line


def test_terminal_escapes_in_a_corpus_name_reach_the_terminal_escaped(capsys, tmp_path):
    """A corpus file named with ANSI and bidi controls: the `error:` line names it as Python writes it in a string
    (\\x1b, \\u202e), so the name cannot recolour, retitle or reorder the user's terminal."""
    missing = tmp_path / "evil\x1b]0;pwned\x07\x1b[2J\u202etxt.c"
    line = _cli_error(capsys, tmp_path / "runs", ["mine", "--corpus", str(missing)])
    assert not any(not c.isprintable() for c in line), ascii(line)
    assert "evil\\x1b]0;pwned\\x07\\x1b[2J\\u202etxt.c" in line


def test_a_prefect_server_that_does_not_answer_is_one_line(tmp_path):
    """PREFECT_API_URL naming a server that is down (a closed port here): Prefect's RuntimeError was a traceback."""
    from processes import free_port

    url = f"http://127.0.0.1:{free_port()}/api"
    corpus = write_corpus(tmp_path / "c.txt", plain_rows(wiki_lines(3)))
    r = _run_cli(["stage", "sentences", "--run", "r", "--corpus", str(corpus), "--set", *SMALL,
                  f"run.root={tmp_path / 'runs'}"], PREFECT_API_URL=url)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert lines[-1] == f"error: stage: Failed to reach API at {url}/ (PREFECT_API_URL): start that Prefect server, " \
                        "or unset PREFECT_API_URL and each command starts a temporary one", lines[-3:]
