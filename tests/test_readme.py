"""The README's commands (and its docs pages') run as written: every command in their code blocks names a make
target, profile, setting, stage, objective, deployment and module that exist, with values the config accepts; the
SQL runs on a real (small) mined run, and the cheap commands run for real through the Makefile."""
from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from contramine.pipeline.config import CONFIG_DIR, ConfigError, load_config, split_overrides

ROOT = Path(__file__).resolve().parent.parent
# The README and the docs pages it links: every command and query in them must hold (the generated settings
# reference and the benchmark history hold none)
DOCS = ["mining.md", "backtranslation.md", "scale-and-clusters.md", "training.md", "papers.md", "architecture.md"]
README = "\n".join(p.read_text(encoding="utf-8") for p in [ROOT / "README.md", *(ROOT / "docs" / d for d in DOCS)]
                   if p.is_file())
# make variables a user may set on the command line (the Makefile's `?=` ones)
MAKE_VARS = set(re.findall(r"^([A-Z_]+)\s*\?=", (ROOT / "Makefile").read_text(), re.M))
MAKE_TARGETS = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
PROGRAMS = {"make", "prefect", "python", "torchrun", "export", "hf", "pip", "cd", "git", "duckdb", "curl",
            "contramine"}


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README, re.S | re.M)


def commands() -> list[str]:
    """Every shell command of the README's ```bash blocks, comments removed, continuation lines joined."""
    out = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError as e:
                raise AssertionError(f"README: unparsable command {line!r}: {e}") from None
            if words:
                out.append(words)
    return out


def test_the_readme_has_commands_and_queries():
    statements = [q for block in blocks("sql") for q in re.split(r";\s*\n", block) if q.strip()]
    assert len(commands()) >= 15 and len(statements) >= 5
    assert {"mine", "test", "train", "eval", "sql", "stage"} <= {w[1] for w in commands() if w[0] == "make"}


@pytest.mark.parametrize("words", commands(), ids=lambda w: " ".join(w)[:60])
def test_command_names_what_exists(words):
    prog = os.path.basename(words[0])  # .venv/bin/python is python
    assert prog in PROGRAMS, f"README command {' '.join(words)!r}: unknown program {prog!r}"
    if prog == "make":
        check_make(words[1:])
    elif prog == "prefect" and words[1:3] == ["deployment", "run"]:
        check_deployment(words[3])
    elif prog == "contramine":
        check_contramine(words[1:])
    elif prog in ("python", "torchrun"):
        module = words[words.index("-m") + 1]
        assert importlib.util.find_spec(module) is not None, f"README: no module {module}"
        if "--profile" in words:
            assert (CONFIG_DIR / f"{words[words.index('--profile') + 1]}.toml").is_file()


def check_make(args: list[str]) -> None:
    target, assignments = args[0], dict(a.split("=", 1) for a in args[1:] if "=" in a)
    assert target in MAKE_TARGETS, f"README: no make target {target!r}"
    unknown = set(assignments) - MAKE_VARS
    assert not unknown, f"README: make {target} sets unknown variable(s) {unknown}"
    profile = assignments.get("PROFILE", "default")
    assert (CONFIG_DIR / f"{profile}.toml").is_file(), f"README: no profile {profile!r}"
    sets = split_overrides(assignments["SET"]) if "SET" in assignments else []
    if "FOR" in assignments:  # FOR=: objectives the config knows (FOR="debcse osscse": --for's two words)
        sets += ["mine.for=[" + ", ".join(f'"{name}"' for name in assignments["FOR"].split()) + "]"]
    try:
        load_config(profile, sets)
    except ConfigError as e:
        raise AssertionError(f"README: make {' '.join(args)}: {e}") from None
    if "STAGE" in assignments:
        from contramine.pipeline.engine.discovery import load_stages
        assert assignments["STAGE"] in load_stages(), f"README: no stage {assignments['STAGE']!r}"
    if "OBJECTIVE" in assignments:
        from contramine.pipeline.config import OBJECTIVE_NAMES
        assert assignments["OBJECTIVE"] in OBJECTIVE_NAMES


def check_contramine(args: list[str]) -> None:
    """`contramine <command> ...` (the installed script): a command it has, a profile that exists, settings the
    config accepts."""
    from contramine.flows.cli import DELEGATED

    assert args[0] in {"mine", "stage", "sql", "report", "export", "cache", *DELEGATED}, f"README: contramine {args[0]}"
    option = lambda name, default=None: args[args.index(name) + 1] if name in args else default  # noqa: E731
    profile = option("--profile", "default")
    assert (CONFIG_DIR / f"{profile}.toml").is_file(), f"README: no profile {profile!r}"
    try:
        load_config(profile, args[args.index("--set") + 1:] if "--set" in args else [])
    except ConfigError as e:
        raise AssertionError(f"README: contramine {' '.join(args)}: {e}") from None


def check_deployment(name: str) -> None:
    flow, _, deployment = name.partition("/")
    deployments = {d["name"]: d for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]}
    assert deployment in deployments, f"README: no deployment {deployment!r} in prefect.yaml"
    entry = deployments[deployment]["entrypoint"]
    assert entry.endswith(f":{flow}_flow"), f"README: deployment {deployment} runs {entry}, not flow {flow!r}"


# ------------------------------------------------------------------------------------------------ for real
@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    from contramine.pipeline.config import configure
    from contramine.pipeline.engine.runner import load_stages, run_stage

    # 24 lines: every README query still returns rows (a fifth of the sentences get no negation, and why)
    lines = (ROOT.parent / "shared" / "data" / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()[:24]
    corpus = tmp_path_factory.mktemp("readme") / "c.txt"
    corpus.write_text("\n".join(lines + ["", "too short", lines[3]]) + "\n", encoding="utf-8")
    root = tmp_path_factory.mktemp("runs")
    sets = ["encoder.max_length=32", "neighbours.pool_size=8", "noise.n_variants=2", "run.shards=2",
            f"run.root={root}"]  # the default chain (bundled Bergamot): the README's back-translation queries
    # every stage in order through the runner's own driver (what `make mine`'s flow maps; the flow itself:
    # tests/test_mine_flow.py): the README's queries read the tables, whatever ran the stages
    cfg = configure("default", "readme", str(corpus), sets)
    for stage in load_stages():
        run_stage(stage, cfg, log=lambda line: None)
    return root


def test_readme_sql_runs_on_a_mined_run(small_run):
    from contramine.flows.sql import connect

    con = connect(small_run / "readme")
    statements = [s.strip() for block in blocks("sql") for s in re.split(r";\s*\n", block) if s.strip()]
    statements = ["\n".join(ln for ln in s.splitlines() if not ln.strip().startswith("--")) for s in statements]
    assert len(statements) >= 5
    for sql in statements:
        rows = con.sql(sql.rstrip(";")).fetchall()
        assert rows, f"README query returned nothing on a mined run:\n{sql}"


def test_cheap_commands_through_the_makefile(small_run):
    env = {**os.environ}
    import pyarrow.parquet as pq

    kept = sum(pq.ParquetFile(p).metadata.num_rows for p in (small_run / "readme" / "sentences").glob("*.parquet"))
    rejected = sum(pq.ParquetFile(p).metadata.num_rows for p in (small_run / "readme" / "rejected").glob("*.parquet"))
    assert kept + rejected == 27 and kept > 20  # every line of the corpus is in one of the two
    r = subprocess.run(["make", "--no-print-directory", "sql", "RUN=readme", f"SET=run.root={small_run}",
                        "Q=SELECT count(*) AS n FROM sentences"], cwd=ROOT, capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.findall(r"\b\d+\b", r.stdout.split("--query")[-1].split("int64")[-1]) == [str(kept)], r.stdout
    r = subprocess.run(["make", "--no-print-directory", "report", "RUN=readme", f"SET=run.root={small_run}"],
                       cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert (small_run / "readme" / "report" / "index.md").is_file()


def test_the_makefile_passes_a_path_glob_or_query_as_one_word():
    """CORPUS='data/*.txt' reached the shell unquoted (expanded into extra arguments: `unrecognized arguments`), a
    path with spaces became several words, and a query's backquotes were the shell's: each variable that holds one
    value is one word of the command make runs (`make -n` prints it; the shell splits it as it would run it)."""
    import shlex

    values = {"CORPUS": "/data/my corpus/*.txt", "PROFILE": "/profiles/it's mine.toml", "RUN": "r1",
              "Q": "SELECT `date` AS \"h\", 'it''s' AS s"}
    r = subprocess.run(["make", "--no-print-directory", "-n", "-o", ".venv/.installed-x", "sql",
                        *(f"{k}={v}" for k, v in values.items())], cwd=ROOT, capture_output=True, text=True, timeout=60)
    argv = shlex.split(r.stdout.strip().splitlines()[-1])
    for option, key in (("--corpus", "CORPUS"), ("--profile", "PROFILE"), ("--run", "RUN"), ("--query", "Q")):
        assert argv[argv.index(option) + 1] == values[key], (option, argv)
    r = subprocess.run(["make", "--no-print-directory", "-n", "eval", "MODEL=/models/My Model"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    argv = shlex.split(r.stdout.strip().splitlines()[-1])
    assert argv[argv.index("--model") + 1] == "/models/My Model"
