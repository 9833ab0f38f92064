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
