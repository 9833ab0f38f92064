"""`make gpu-check`'s CPU twin (bench/gpu_check.py --twin: the same code at toy sizes on the CPU) runs to the end in
a child process, gives every row, and every equality check in it holds; no section imports FAISS, Prefect or DuckDB
(the GPU machine has none of them), and only the stage section (every stage module, through `load_stages`) spaCy."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXPECTED = ["check_encoder_cpu_vs_cpu", "check_batch_float32", "check_band_pools", "encode_float32", "encode_bf16",
            "band_search_seconds", "band_search_queries_per_s", "band_search_peak_memory", "generate_hf_tokens_per_s",
            "generate_ct2_int8_tokens_per_s", "check_stage_embeddings", "check_stage_neighbours",
            *(f"train_{o}_{what}" for o in ("simcse", "debcse", "osscse", "whitenedcse", "dclr")
              for what in ("steps_per_s", "peak_memory"))]


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--twin", "--out", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    result = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else None
    return proc, result


def test_twin_exits_0_with_every_row(twin):
    proc, result = twin
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert result is not None and result["mode"] == "twin" and result["machine"]["device"] == "cpu"
    names = [r["name"] for r in result["rows"]]
    assert names == EXPECTED, names
    for r in result["rows"]:
        assert r["device"] == "cpu", r
        assert isinstance(r["value"], (int, float)) and r["value"] == r["value"], r  # measured, not skipped
        assert r["unit"], r
    assert result["seconds"] < 120, result["section_seconds"]


def test_twin_checks_all_hold(twin):
    _, result = twin
    checks = [r for r in result["rows"] if r["ok"] is not None]
    assert {r["name"] for r in checks} == {n for n in EXPECTED if n.startswith("check_")}
    assert all(r["ok"] is True for r in checks), [r for r in checks if not r["ok"]]
    pools = {r["name"]: r["value"] for r in checks}
    assert pools["check_band_pools"] > 0 and pools["check_stage_neighbours"] > 0  # the equality is not vacuous
    assert pools["check_batch_float32"] == 0.0  # on a CPU a row's vector does not depend on its batch


def test_twin_imports_nothing_the_gpu_machine_lacks(twin):
    _, result = twin
    imported = result["heavy_imports_by_section"]
    assert all(not mods for section, mods in imported.items() if section != "stages"), imported
    assert set(imported["stages"]) <= {"spacy"}, imported  # load_stages imports every stage module


# ------------------------------------------------------------------------------- strictness and the machine's versions
def test_a_skipped_section_fails_when_strict_and_ct2s_cuda_reason_never_does():
    from bench.gpu_check import failures

    skipped = {"name": "stages_skipped", "device": "cuda", "value": None, "unit": "-", "ok": None,
               "note": "skipped: missing module rapidfuzz (imported by pipeline/text_distances.py)"}
    ct2 = {"name": "generate_ct2_float16_tokens_per_s", "device": "cuda", "value": None, "unit": "tokens/s",
           "ok": None, "note": "not measured: RuntimeError: Library libcublas.so.12 is not found or cannot be loaded"}
    measured = {"name": "encode_bf16", "device": "cuda", "value": 3468.5, "unit": "sentences/s", "ok": None, "note": ""}
    broken = {"name": "train_error", "device": "cuda", "value": None, "unit": "-", "ok": False, "note": "KeyError: x"}
    assert failures([skipped, ct2, measured], strict=True) == ["stages_skipped"]
    assert failures([skipped, ct2, measured], strict=False) == []
    assert failures([ct2, measured, broken], strict=False) == ["train_error"]


BLOCK_RAPIDFUZZ = """
import importlib.abc, sys
class _Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "rapidfuzz":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _Missing())
"""


def test_strict_twin_exits_1_naming_the_section_a_missing_module_skips(tmp_path):
    """What the GPU run would do without rapidfuzz carried: the stage section is skipped, and the check fails."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCK_RAPIDFUZZ)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path / 'site'}"}
    cmd = [sys.executable, "-m", "bench.gpu_check", "--twin", "--only", "stages", "--wheels", str(tmp_path / "none"),
           "--out", str(tmp_path / "out")]
    strict = subprocess.run([*cmd, "--strict"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert strict.returncode == 1, (strict.stdout + strict.stderr)[-3000:]
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    assert result["failed"] == ["stages_skipped"] and result["strict"] and result["complete"]
    assert "missing module rapidfuzz (imported by pipeline/text_distances.py)" in strict.stdout
    assert "1 failed: stages_skipped" in strict.stdout
    lenient = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert lenient.returncode == 0, (lenient.stdout + lenient.stderr)[-3000:]  # on the twin, a skip is one line


def test_the_machines_versions_live_in_one_place():
    """`make gpu-wheels` downloads bench/gpu_machine.py's CARRIED, at pyproject's pins; the rehearsal takes the
    machine's PREINSTALLED versions with this box's torch; the check's docstring names the file."""
    import re

    from bench import gpu_check, gpu_machine, gpu_rehearsal

    listed = subprocess.run([sys.executable, "-m", "bench.gpu_machine", "wheels"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    assert listed == gpu_machine.requirements(gpu_machine.CARRIED)
    assert {"pydantic", "rapidfuzz", "ctranslate2"} <= set(gpu_machine.CARRIED)
    makefile = (ROOT / "Makefile").read_text()
    assert "$(PY) -m bench.gpu_machine wheels" in makefile and "bench.gpu_rehearsal" in makefile
    pins = dict(re.findall(r'"([A-Za-z0-9_.-]+)==([^"]+)"', (ROOT / "pyproject.toml").read_text()))
    for name, version in gpu_machine.CARRIED.items():
        if name in pins and version:
            assert version == pins[name], (name, version, pins[name])
    assert gpu_machine.TORCH_HERE == pins["torch"]
    here = gpu_rehearsal.preinstalled_here()
    assert f"torch=={pins['torch']}" in here and "transformers==5.17.0" in here and "sentence-transformers==6.0.1" in here
    assert not set(gpu_machine.CARRIED) & set(gpu_machine.PREINSTALLED) - set(gpu_machine.ALSO_THERE)
    assert "bench/gpu_machine.py" in gpu_check.__doc__ and "make gpu-rehearsal" in gpu_check.__doc__
