"""Names that become folders stay one folder inside their root: a run name (`RUN=..` once wrote tables into the
repository root), a compare variant, an export format, the run `FROM=` names. Each refusal is one line naming the
setting and the value; names that look like numbers or dates are names (`RUN=2024` was a pydantic type error)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contramine.flows.cli import main as cli_main
from contramine.flows.cli import reuse_source
from contramine.pipeline.config import ConfigError, configure, load_config
from contramine.pipeline.config.names import inside
from child_env import CHILD_PYTHONPATH

ROOT = Path(__file__).resolve().parent.parent
BAD_NAMES = ["..", ".", ".hidden", "a/b", "../x", "a\\b", "/etc", "x" * 129]


def _files_under(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*")) if folder.exists() else []


@pytest.mark.parametrize("argv", [["mine", "--run", ".."], ["stage", "sentences", "--set", "run.name=.."]],
                         ids=["RUN=..", "--set run.name=.."])
def test_cli_refuses_a_run_name_outside_the_root_in_one_line(tmp_path, argv):
    """The real command line (what `make mine RUN=..` runs): exit 2, one line naming run.name, nothing written."""
    root = tmp_path / "runs" / "root"
    env = {**os.environ, "PYTHONPATH": CHILD_PYTHONPATH, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "contramine.flows.cli", *argv, "--set", f"run.root={root}"], capture_output=True,
                       text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: config error: run.name '..': a run name is one folder inside run.root"), r.stderr
    assert _files_under(tmp_path) == []  # not root's parent, not root itself


@pytest.mark.parametrize("name", BAD_NAMES)
def test_run_names_are_one_folder(name):
    with pytest.raises(ConfigError) as e:
        configure("default", run=name)
    assert str(e.value).startswith(f"config error: run.name {name!r}: a run name is one folder inside run.root")
    assert "\n" not in str(e.value)


def test_a_path_built_from_an_unchecked_name_is_refused_too(tmp_path):
    """model_copy skips validation: the run folder is still checked when it is built."""
    cfg = load_config("default", [f"run.root={tmp_path}"])
    with pytest.raises(ConfigError, match=r"^run.name '\.\.': .* is not inside "):
        cfg.run.model_copy(update={"name": ".."}).dir
    for escape in ("..", "../x", "/etc", "a/../.."):
        with pytest.raises(ConfigError, match="is not inside"):
            inside(tmp_path, escape, setting="test")
    assert inside(tmp_path, "a", "seed-0", setting="test") == tmp_path / "a" / "seed-0"


def test_compare_variant_keys_and_mined_runs_are_one_folder(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config("default", ['compare.variants={"../../x" = {objective = "simcse"}}'])
    assert str(e.value).startswith("config error: compare.variants key '../../x': a variant name is one folder "
                                   "inside <run>/compare/")
    with pytest.raises(ConfigError, match=r"^config error: compare.mined_runs '\.\.': a run name is one folder"):
        load_config("default", ["compare.mined_runs=[..]"])
    # in a profile too, and the row's folder is checked where it is built
    profile = tmp_path / "p.toml"
    profile.write_text('inherit = "default"\n[compare.variants."../../x"]\nobjective = "simcse"\n')
    with pytest.raises(ConfigError, match="compare.variants key '../../x'"):
        load_config(str(profile))
    from contramine.trainer.compare import run_overrides

    cfg = load_config("default", [f"run.root={tmp_path}", "run.name=r"])
    assert f"train.output={tmp_path}/r/compare/simcse-x/seed-1" in run_overrides(
        cfg, {"name": "simcse-x", "objective": "simcse", "sets": [], "run": None}, 1, 10)
    with pytest.raises(ConfigError, match="is not inside"):
        run_overrides(cfg, {"name": "../../x", "objective": "simcse", "sets": [], "run": None}, 0, 10)


@pytest.mark.parametrize("fmt", ["../x", "a/b", ".."])
def test_export_names_stay_in_the_runs_export_folder(tmp_path, capsys, fmt):
    from contramine.pipeline.export import export_run

    with pytest.raises(ConfigError, match=f"export format {fmt!r}: one of triplet"):
        export_run(tmp_path / "r", fmt)
    with pytest.raises(SystemExit) as e:  # the command line offers the formats only
        cli_main(["export", "--run", "r", "--set", f"run.root={tmp_path}", "--format", fmt])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err
    assert _files_under(tmp_path) == []


def _finished_run(folder: Path) -> None:
    (folder / "sentences").mkdir(parents=True)
    (folder / "sentences" / "part-00000-of-00001.parquet").write_bytes(b"shard")
    (folder / "sentences" / "_manifest.json").write_text(json.dumps({"shards": 1}))


@pytest.mark.parametrize("source", ["../x", "ABSOLUTE", "new", ".."])
def test_reuse_from_names_another_run_of_the_same_root(tmp_path, capsys, small_corpus, source):
    root = tmp_path / "root"
    _finished_run(tmp_path / "x")  # a finished run outside the root: never brought in
    source = str(tmp_path / "x") if source == "ABSOLUTE" else source
    code = cli_main(["mine", "--run", "new", "--reuse-from", source, "--corpus", str(small_corpus),
                     "--set", f"run.root={root}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    if source == "new":
        assert err[0] == "error: --reuse-from 'new' is this run (run.name 'new'): name the run to start from"
    else:
        assert err[0].startswith(f"error: --reuse-from {source!r}: the run to start from is one folder inside "
                                 f"run.root ({root}/): letters, digits")
    assert _files_under(root) == []


def test_reuse_from_takes_a_run_of_the_root_by_name_or_by_its_path(tmp_path):
    cfg = load_config("default", [f"run.root={tmp_path}", "run.name=new"])
    assert reuse_source("old", cfg) == tmp_path / "old"
    assert reuse_source(str(tmp_path / "old") + "/", cfg) == tmp_path / "old"
    with pytest.raises(ConfigError, match="is this run"):
        reuse_source(str(tmp_path / "new"), cfg)


@pytest.mark.parametrize("sets,name", [(["run.name=2024"], "2024"), (["run.name=2024-01-01"], "2024-01-01"),
                                       (["run.name=2024.10"], "2024.10"), (['run.name="2024"'], "2024"),
                                       (["run.name=1979-05-27T07:32:00"], None)])
def test_numbers_and_dates_are_names_as_written(sets, name):
    if name is None:  # a TOML datetime's text has ':', which no run name has: refused as a name, not as a type
        with pytest.raises(ConfigError, match="run.name '1979-05-27T07:32:00': a run name is one folder"):
            load_config("default", sets)
        return
    assert load_config("default", sets).run.name == name


def test_run_flag_and_other_text_settings_take_the_text_as_written():
    assert configure("default", run="2024").run.name == "2024"
    assert configure("default", run="2024-01-01").run.name == "2024-01-01"
    cfg = load_config("default", ["train.model=2024", "data.corpus=2024-01-01", "encoder.device=0",
                                  "neighbours.pool_size=32", "ipw.temperature=0.5"])
    assert cfg.train.model == "2024" and cfg.data.corpus == "2024-01-01" and cfg.encoder.device == "0"
    assert cfg.neighbours.pool_size == 32 and cfg.ipw.temperature == 0.5  # numbers stay numbers where they are


@pytest.mark.usefixtures("prefect_harness")
def test_a_numeric_run_name_mines_into_its_folder(tmp_path, small_corpus):
    """`make stage STAGE=sentences RUN=2024`, the real command line (its own process: an in-process flow after the
    capsys tests above would log to their closed stderr)."""
    from mining_helpers import _cli_env

    root = tmp_path / "root"
    r = subprocess.run([sys.executable, "-m", "contramine.flows.cli", "stage", "sentences", "--run", "2024", "--corpus",
                        str(small_corpus), "--set", f"run.root={root}", "run.shards=1"], capture_output=True,
                       text=True, cwd=ROOT, env=_cli_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    assert (root / "2024" / "sentences" / "_manifest.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["root"]
