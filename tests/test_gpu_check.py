"""`make gpu-check`'s CPU twin (bench/gpu/check.py --twin: the same code at toy sizes on the CPU) runs to the end in
a child process, gives every row, and every equality check in it holds; no section imports FAISS, Prefect or DuckDB
(the GPU machine has none of them), and only the stage section (every stage module, through `load_stages`) spaCy."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu.check import SECTION_NAMES
from bench.gpu.generate import COMPILED_ROWS, GENERATE_ROWS, NOT_IN_CHECKOUT
from bench.gpu.speeds import ENCODE_ROWS, PROFILED_SEARCH, SEARCH_ROWS, ST_ROWS, TRAIN_ROWS
from child_env import CHILD_PYTHONPATH

ROOT = Path(__file__).resolve().parent.parent


def has_decoder_setting() -> bool:
    """Whether this checkout has issue 51's decode loop (`backtranslate.decoder`): else generate_ours has no value."""
    from contramine.pipeline.config.backtranslation import BacktranslateCfg

    return "decoder" in BacktranslateCfg.model_fields


# every row the variant tables name (a variant added there is a row here too)
ENCODE, DIMS = list(ENCODE_ROWS), list(dict.fromkeys(s["d"] for s in SEARCH_ROWS.values()))
TRAIN = [f"{name}_steps_per_s" for name in TRAIN_ROWS]
UNMEASURED = set() if has_decoder_setting() else {"generate_ours_tokens_per_s"}
GENERATE = [f"{name}_tokens_per_s" for name in GENERATE_ROWS]
COMPILED = [f"{name}_tokens_per_s" for name in COMPILED_ROWS]


def search_rows() -> list[str]:
    """Each search row's three rows; after the first search at a dimension, the GEMM rates at its block."""
    out, seen = [], set()
    for name, settings in SEARCH_ROWS.items():
        out += [f"{name}_{what}" for what in ("seconds", "queries_per_s", "peak_memory")]
        if name == PROFILED_SEARCH:
            out.append("profile_search_busy")
        if settings["d"] not in seen:
            seen.add(settings["d"])
            out += [f"gemm_search_d{settings['d']}_{p}" for p in ("bf16", "tf32", "fp32")]
    return out


SPEEDS = [*ENCODE, *ST_ROWS, *(f"{s}_seconds" for s in SEARCH_ROWS),
          "generate_hf_tokens_per_s", *(g for g in GENERATE if g not in UNMEASURED), "generate_user_hf_tokens_per_s",
          *TRAIN, *COMPILED]
PEERS = [*(peer_of for _, peer_of in ST_ROWS.values()), *(g for g in GENERATE[:3] if g not in UNMEASURED)]
EXPECTED = ["check_encoder_cpu_vs_cpu", "check_batch_float32", "check_band_pools", "check_band_pools_dense",
            *(f"gemm_{job}_{p}" for job in ("encode", "generate", "peak") for p in ("bf16", "tf32", "fp32")),
            *ENCODE, *ST_ROWS, *search_rows(),
            "generate_hf_tokens_per_s", *GENERATE, "generate_user_hf_tokens_per_s", "generate_ct2_int8_tokens_per_s",
            *(f"{name}_{what}" for name in TRAIN_ROWS for what in ("steps_per_s", "peak_memory")),
            "check_stage_embeddings", "check_stage_neighbours",
            "profile_encode_busy", "profile_generate_busy", *COMPILED,
            *(f"vs_peer_{name}" for name in PEERS),
            *(f"vs_limit_{name}" for name in SPEEDS), "projection_1m_hours", "projection_1m_wall_over_device_busy",
            "goal_encode_50k_per_s", "goal_encode_vs_st_1_5x", "goal_search_1m_10s", "goal_generate_300k_per_s",
            *(["goal_generate_vs_hf_3x"] if not UNMEASURED else []), "goal_train_debcse_15_per_s",
            "goal_projection_45min", "goal_projection_30min"]


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": CHILD_PYTHONPATH}
    proc = subprocess.run([sys.executable, "-m", "bench.gpu.check", "--twin", "--out", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=400)
    result = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else None
    return proc, result, out


def test_twin_exits_0_with_every_row(twin):
    proc, result, _ = twin
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert result is not None and result["mode"] == "twin" and result["machine"]["device"] == "cpu"
    names = [r["name"] for r in result["rows"]]
    assert names == EXPECTED, names
    for r in result["rows"]:
        assert r["device"] == "cpu", r
        assert r["unit"], r
        if r["name"] in UNMEASURED:  # the loop not merged in this checkout: one line, no value, not a failure
            assert r["value"] is None and r["ok"] is None and r["note"].startswith(NOT_IN_CHECKOUT), r
            continue
        assert isinstance(r["value"], (int, float)) and r["value"] == r["value"], r  # measured, not skipped
    assert result["seconds"] < 300, result["section_seconds"]  # ~1 min here, on one thread, even beside other work
    assert result["complete"] and result["failed"] == [] and not any(r.get("not_run") for r in result["rows"])
    assert result["sections_done"] == sorted(SECTION_NAMES)


def test_twin_checks_all_hold(twin):
    _, result, _ = twin
    checks = [r for r in result["rows"] if r["ok"] is not None]
    assert {r["name"] for r in checks} == {n for n in EXPECTED if n.startswith("check_")}
    assert all(r["ok"] is True for r in checks), [r for r in checks if not r["ok"]]
    pools = {r["name"]: r["value"] for r in checks}
    assert pools["check_band_pools"] > 0 and pools["check_stage_neighbours"] > 0  # the equality is not vacuous
    assert pools["check_batch_float32"] == 0.0  # on a CPU a row's vector does not depend on its batch


def test_twin_imports_nothing_the_gpu_machine_lacks(twin):
    _, result, _ = twin
    imported = result["heavy_imports_by_section"]
    assert all(not mods for section, mods in imported.items() if section != "stages"), imported
    assert set(imported["stages"]) <= {"spacy"}, imported  # load_stages imports every stage module


def test_twin_sets_each_job_against_its_peer_and_its_limit_and_writes_the_profile(twin):
    """The summary's ratios are the rows' own numbers; the profile's traces and table lie beside results.json."""
    _, result, out = twin
    by = {r["name"]: r for r in result["rows"]}
    # issue 63's encoding peer: sentence-transformers without cuDNN's attention, against the stage's bf16 row
    assert by["vs_peer_encode_bf16"]["value"] == pytest.approx(
        by["encode_bf16"]["value"] / by["encode_st_bf16_nocudnn"]["value"], rel=1e-2)
    assert "cuDNN attention off" in by["encode_st_bf16_nocudnn"]["note"]
    for name in PEERS[2:]:  # our loop and the stage's old path, each against HF generate as a user writes it
        assert by[f"vs_peer_{name}"]["value"] == pytest.approx(
            by[name]["value"] / by["generate_user_hf_tokens_per_s"]["value"], rel=1e-2)
    for name in SPEEDS:  # achieved TFLOP/s over the card's GEMM rate at the job's shape and precision
        r = by[name]
        gemm = by[f"gemm_{r['job']}_{r['precision']}"]["value"]
        assert by[f"vs_limit_{name}"]["value"] == pytest.approx(r["flop"] / r["seconds"] / 1e12 / gemm, rel=2e-2)
        assert r["flop"] > 0, r
    assert "encode" in by["vs_limit_encode_st_bf16"]["note"] and by["projection_1m_hours"]["value"] > 0
    assert all(by[n]["value"] > 0 for n in EXPECTED if n.startswith("goal_"))
    for name in ("profile_encode.json.gz", "profile_generate.json.gz", "profile_search.json.gz"):
        trace = json.loads(gzip.decompress((out / name).read_bytes()))
        assert trace["traceEvents"], name
    table = (out / "profile.txt").read_text()
    assert "== encode" in table and "== generate (Translator.translate, decoder " in table and "Self CPU" in table
    search = (out / "profile_search.txt").read_text()
    assert search.startswith("== band search") and "aten::topk" in search
    # each table's first line says which host ops took over 1 ms in one call (a cuDNN plan would be named there)
    heads = [line for line in (table + search).splitlines() if line.startswith("== ")]
    assert len(heads) == 3 and all("host op" in line for line in heads), heads


def test_summary_projects_the_1m_path_from_the_measured_rates():
    """projection_1m_hours = the mine's graph and training simulated on `workers` workers and one card
    (bench/gpu/projection.py): each device stage's work over its measured rate (the search at d = 768 scaled from its
    size to 1M x 1M), every stage's host work, translation at our loop's rate, else at the old path's (said so); more
    workers never make it longer; no projection, and one line saying why, when a rate is missing."""
    from bench.gpu.limits import PATH_1M, summary
    from bench.gpu.projection import project
    from bench.gpu.sections import row

    rows = [row("encode_bf16", "cuda", 5000.0, "sentences/s"),
            row("band_search_d384_seconds", "cuda", 1.0, "s", queries=100_000, base=1_000_000),
            row("band_search_d768_seconds", "cuda", 10.0, "s", queries=100_000, base=1_000_000),
            row("generate_default_tokens_per_s", "cuda", 100_000.0, "tokens/s"),
            row("generate_old_tokens_per_s", "cuda", 20_000.0, "tokens/s"),
            row("train_debcse_steps_per_s", "cuda", 20.0, "steps/s")]
    p = PATH_1M

    def hours(generate: float, workers: int) -> float:
        device = {"embeddings": p["embedded"] / 5000, "scores": p["scored"] / 5000, "neighbours": 10.0 * 10,
                  "backtranslate": p["target_tokens"] / generate}
        return project(device, p["train_steps"] / 20, workers)[0].wall / 3600

    got = {r["name"]: r for r in summary(rows, "cuda", {"cpus": 16, "workers": 1})}
    assert got["projection_1m_hours"]["value"] == pytest.approx(hours(100_000, 1), rel=1e-3)
    assert got["goal_search_1m_10s"]["value"] == pytest.approx(10 / 100.0, rel=1e-3)
    note = got["projection_1m_hours"]["note"]
    assert "on 1 worker and one card" in note and "backtranslate " in note and "old path" not in note
    four = {r["name"]: r for r in summary(rows, "cuda", {"cpus": 16, "workers": 4})}
    assert four["projection_1m_hours"]["value"] == pytest.approx(hours(100_000, 4), rel=1e-3)
    assert four["projection_1m_hours"]["value"] < got["projection_1m_hours"]["value"]
    assert 1.0 <= four["projection_1m_wall_over_device_busy"]["value"] < got["projection_1m_wall_over_device_busy"]["value"]
    no_loop = [r for r in rows if r["name"] != "generate_default_tokens_per_s"]
    old = {r["name"]: r for r in summary(no_loop, "cuda", {"cpus": 16})}  # workers: 1 by default
    assert old["projection_1m_hours"]["value"] == pytest.approx(hours(20_000, 1), rel=1e-3)
    assert "translation at generate_old_tokens_per_s" in old["projection_1m_hours"]["note"]
    # what a search pays once (the base to the device, the precision check) is not scaled with the queries
    setup = [dict(r, setup_seconds=2.0) if r["name"] == "band_search_d768_seconds" else r for r in rows]
    once = {r["name"]: r for r in summary(setup, "cuda", {"cpus": 16, "workers": 1})}
    assert once["goal_search_1m_10s"]["value"] == pytest.approx(10 / (2.0 + 8.0 * 10), rel=1e-3)
    missing = summary([r for r in rows if not r["name"].startswith("train")], "cuda", {"cpus": 16})
    assert missing[-1]["value"] is None and "train_debcse_steps_per_s" in missing[-1]["note"]


def test_a_failing_row_is_one_failed_row_and_the_next_row_runs():
    """A generate row that raises (the loop breaking, say) is one row with ok false and its error in one line;
    the rows after it in the section are measured."""
    from bench.gpu.sections import guarded, row

    def broken():
        raise RuntimeError("CUDA error: an illegal memory access\nmore lines")

    got = [*guarded("generate_ours_tokens_per_s", "tokens/s", "cuda", broken),
           *guarded("generate_old_tokens_per_s", "tokens/s", "cuda",
                    lambda: [row("generate_old_tokens_per_s", "cuda", 5.0, "tokens/s")])]
    assert [(r["name"], r["value"], r["ok"]) for r in got] == [("generate_ours_tokens_per_s", None, False),
                                                              ("generate_old_tokens_per_s", 5.0, None)]
    assert got[0]["note"] == "RuntimeError: CUDA error: an illegal memory access"


def test_a_row_past_its_budget_fails_one_past_the_deadline_does_not_run_and_each_is_written_at_once():
    """Under the check's clock (bench/gpu/budget.py): a row that outlasts its budget is one failed row and the next
    row runs; a row the deadline leaves no time for is one row "not run" and takes no time; a row an earlier run
    measured is not run again; every row reaches `emit` (results.json) as soon as it exists."""
    import time

    from bench.gpu import budget
    from bench.gpu.sections import guarded, row

    emitted = []
    clock = budget.use(budget.Clock(row_s=0.3, skip=frozenset({"measured_before"}), emit=emitted.extend))
    try:
        t0 = time.perf_counter()
        slow = guarded("slow_row", "s", "cuda", lambda: time.sleep(30))  # interrupted by its budget
        took = time.perf_counter() - t0
        fast = guarded("fast_row", "s", "cuda", lambda: [row("fast_row", "cuda", 1.0, "s")])
        assert guarded("measured_before", "s", "cuda", lambda: [row("measured_before", "cuda", 2.0, "s")]) == []
        clock.deadline_s = time.perf_counter() - clock.start  # the deadline is now
        late = guarded("late_row", "s", "cuda", lambda: [row("late_row", "cuda", 3.0, "s")])
    finally:
        budget.use(budget.Clock())
    assert took < 5
    assert [(r["name"], r["value"], r["ok"]) for r in slow] == [("slow_row", None, False)]
    assert slow[0]["note"] == "timed out after 0.3 s (the row's budget)"
    assert fast[0]["value"] == 1.0
    assert late[0]["value"] is None and late[0]["ok"] is None and late[0]["not_run"]
    assert late[0]["note"].startswith("not run: the check's deadline")
    assert [r["name"] for r in emitted] == ["slow_row", "fast_row", "late_row"]


def test_rerun_failed_runs_again_only_what_failed_or_did_not_run(tmp_path):
    """A run whose deadline came before its sections leaves them "not run" (exit 1); `--rerun-failed` runs just
    those, into the same results.json, and then only the section whose row failed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": CHILD_PYTHONPATH}
    cmd = [sys.executable, "-m", "bench.gpu.check", "--twin", "--only", "gemm", "profile", "--out", str(tmp_path)]
    results = tmp_path / "results.json"
    late = subprocess.run([*cmd, "--size", "deadline_s=0"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert late.returncode == 1, (late.stdout + late.stderr)[-3000:]
    first = json.loads(results.read_text())
    assert first["failed"] == ["gemm_not_run", "profile_not_run"] and first["sections_done"] == []
    again = subprocess.run([*cmd, "--rerun-failed"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    second = json.loads(results.read_text())
    names = [r["name"] for r in second["rows"] if r["section"] != "summary"]
    assert names == [*(f"gemm_{job}_{p}" for job in ("encode", "generate", "peak") for p in ("bf16", "tf32", "fp32")),
                     "profile_encode_busy", "profile_generate_busy"]
    assert second["failed"] == [] and second["sections_done"] == ["gemm", "profile"]
    assert second["rerun_of"] == first["date"]
    # a failed row: only its section runs again; the other section's rows stay as they were
    second["rows"] = [dict(r, ok=False) if r["name"] == "profile_generate_busy" else r for r in second["rows"]]
    results.write_text(json.dumps(second))
    third = subprocess.run([*cmd, "--rerun-failed"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, (third.stdout + third.stderr)[-3000:]
    assert "== profile" in third.stdout and "== gemm" not in third.stdout
    final = {r["name"]: r for r in json.loads(results.read_text())["rows"]}
    assert final["profile_generate_busy"]["ok"] is None and final["profile_encode_busy"] == next(
        r for r in second["rows"] if r["name"] == "profile_encode_busy")  # measured before: not run again
    assert final["gemm_peak_bf16"] == next(r for r in second["rows"] if r["name"] == "gemm_peak_bf16")


def test_the_compiled_rows_wait_for_time_left_and_their_absence_fails_nothing(tmp_path):
    """The compiled section starts only with `compiled_s` seconds left before the deadline; without them it is one
    row "not run (optional)" and the check still passes (everything else measured first)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": CHILD_PYTHONPATH}
    proc = subprocess.run([sys.executable, "-m", "bench.gpu.check", "--twin", "--only", "compiled", "--size",
                           "compiled_s=100000", "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    result = json.loads((tmp_path / "results.json").read_text())
    got = [r for r in result["rows"] if r["section"] == "compiled"]
    assert [(r["name"], r["ok"], r["not_run"]) for r in got] == [("compiled_not_run", None, True)]
    assert got[0]["note"].startswith("not run (optional)") and result["failed"] == []


def test_the_search_rows_vectors_put_most_pairs_in_the_band():
    """band_search_d768's SimCSE-like vectors: most pairs' cosines fall in the default band 0.25-0.75 (a row's
    best in-band scores crowd the band's top, so rows widen), where the topic vectors put almost none there."""
    import numpy as np

    from bench.gpu.sections import BAND, simcse_like_vectors, topic_vectors

    def in_band(x):
        cos = x[:500] @ x.T
        return float(((cos >= BAND["lo"]) & (cos <= BAND["hi"])).mean())

    dense = simcse_like_vectors(4000, 768)
    assert dense.shape == (4000, 768) and np.allclose(np.linalg.norm(dense, axis=1), 1, atol=1e-5)
    assert in_band(dense) > 0.8 and in_band(topic_vectors(4000, 768)) < 0.05


def test_a_row_variant_is_settings_a_keyword_or_an_attribute():
    """The speed sections' variant tables: a setting is a keyword of the call or an attribute of the object; a
    misspelt one stops the section naming it."""
    from bench.gpu.sections import apply_settings

    class Engine:
        precision = "float32"

        def encode(self, texts, batch_size=8):
            return batch_size

    engine = Engine()
    assert apply_settings(engine, engine.encode, {"batch_size": 64, "precision": "bf16"}) == {"batch_size": 64}
    assert engine.precision == "bf16"
    with pytest.raises(ValueError, match="'batch_tokenz'"):
        apply_settings(engine, engine.encode, {"batch_tokenz": 1})


# ------------------------------------------------------------------------------- strictness and the machine's versions
def test_a_skipped_section_fails_when_strict_and_ct2s_cuda_reason_never_does():
    from bench.gpu.check import failures

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
    cmd = [sys.executable, "-m", "bench.gpu.check", "--twin", "--only", "stages", "--wheels", str(tmp_path / "none"),
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
    """`make gpu-wheels` downloads bench/gpu/machine.py's CARRIED, at pyproject's pins; the rehearsal takes the
    machine's PREINSTALLED versions with this box's torch; the check's docstring names the file."""
    import re

    from bench.gpu import check as gpu_check
    from bench.gpu import machine as gpu_machine
    from bench.gpu import rehearsal as gpu_rehearsal

    listed = subprocess.run([sys.executable, "-m", "bench.gpu.machine", "wheels"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    assert listed == gpu_machine.requirements(gpu_machine.CARRIED)
    assert {"pydantic", "rapidfuzz", "ctranslate2"} <= set(gpu_machine.CARRIED)
    makefile = (ROOT / "Makefile").read_text()
    assert "$(PY) -m bench.gpu.machine wheels" in makefile and "bench.gpu.rehearsal" in makefile
    pins = dict(re.findall(r'"([A-Za-z0-9_.-]+)==([^"]+)"', (ROOT / "pyproject.toml").read_text()))
    for name, version in gpu_machine.CARRIED.items():
        if name in pins and version:
            assert version == pins[name], (name, version, pins[name])
    assert gpu_machine.TORCH_HERE == pins["torch"]
    here = gpu_rehearsal.preinstalled_here()
    assert f"torch=={pins['torch']}" in here and "transformers==5.17.0" in here and "sentence-transformers==6.0.1" in here
    assert not set(gpu_machine.CARRIED) & set(gpu_machine.PREINSTALLED) - set(gpu_machine.ALSO_THERE)
    assert "bench/gpu/machine.py" in gpu_check.__doc__ and "make gpu-rehearsal" in gpu_check.__doc__


def test_the_gpu_machine_gets_real_sentences_from_the_carried_sample(monkeypatch, tmp_path):
    """Without ../shared (the GPU machine gets the working tree only) the check's sentences are the carried wiki1m
    sample's, the same lines as the shared file's first 8,192, not the seeded fallback words."""
    from bench.fixtures import shapes

    here = shapes.sentences(shapes.SAMPLE_LINES)
    monkeypatch.setattr(shapes, "WIKI", tmp_path / "absent.txt")
    there = shapes.sentences(shapes.SAMPLE_LINES)
    assert len(there) == shapes.SAMPLE_LINES and len(set(there)) == len(there)
    if (ROOT.parent / "shared" / "data" / "wiki1m_head.txt").is_file():
        assert there == here
    assert shapes.sentences(10, skip=5) == there[5:15]
