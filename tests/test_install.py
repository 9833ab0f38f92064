"""What `make` installs: the CUDA builds on a machine with an NVIDIA GPU, the CPU ones elsewhere, never both faiss
packages. Checked with make's dry run (nothing is installed) and a fake `nvidia-smi` on PATH."""
from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from flows.doctor import faiss_problem

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
    assert f"flows.doctor --accel {accel}" in plan
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
    r = subprocess.run([sys.executable, "-m", "flows.doctor", "--accel", "cpu"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("environment: torch ") and "faiss-cpu 1.15.1" in r.stdout
