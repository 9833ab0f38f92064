"""A shard is reused only when everything that decides its bytes is unchanged: the code it runs (derived from its
imports, never a hand list), the device and precision it ran at, the model files, the library versions."""
from __future__ import annotations

import shutil

import torch

from pipeline.config import load_config
from pipeline.engine.codeversion import PIPELINE, code_version, module_closure
from pipeline.engine.runner import load_stages, resolve_plan, stage_facts
from pipeline.models import hub as models
from pipeline.stages import backtranslate, embeddings

OFFLINE = ["backtranslate.chains=[]"]
STAGES = load_stages()


def extra_key(stage, cfg) -> str:
    """What the stage's key holds beyond inputs and settings: its facts and its resources as resolved for the run."""
    return stage_facts(stage, cfg, resolve_plan(stage.name, cfg))


def test_code_version_follows_every_module_a_stage_imports(tmp_path):
    src = tmp_path / "pipeline"
    shutil.copytree(PIPELINE, src, ignore=shutil.ignore_patterns("__pycache__"))
    versions = lambda: {s: code_version(STAGES[s].module, root=src) for s in STAGES}  # noqa: E731
    before = versions()
    assert "pipeline.seeding" in module_closure((STAGES["noise"].module,))  # listed nowhere by hand
    (src / "seeding.py").write_text((src / "seeding.py").read_text() + "\n# a change to per-row seeding\n")
    code_version.cache_clear()  # a new process
    after = versions()
    changed = {s for s in STAGES if before[s] != after[s]}
    assert {"noise", "ipw", "backtranslate"} <= changed  # the stages that draw per-row random numbers
    assert not changed & {"sentences", "embeddings", "neighbours", "negate", "pairs", "triplets"}
    (src / "models" / "unpad.py").write_text((src / "models" / "unpad.py").read_text() + "\n# the forward\n")
    code_version.cache_clear()
    again = versions()
    assert {s for s in STAGES if again[s] != after[s]} == {"embeddings", "pool_embeddings", "scores"}  # they embed


def test_device_and_precision_are_part_of_the_key(monkeypatch):
    cfg = load_config("default", OFFLINE)
    stages = ("embeddings", "scores", "backtranslate")
    cpu = {s: extra_key(STAGES[s], cfg) for s in stages}
    assert all('"device":"cpu"' in cpu[s] for s in stages)
    assert '"precision":"float32"' in cpu["embeddings"] and '"dtype":"float32"' in cpu["backtranslate"]
    # the same run on a GPU with bf16: no shard of the CPU float32 run may be reused
    cuda = lambda setting="auto": "cuda" if setting == "auto" else setting  # noqa: E731
    monkeypatch.setattr(embeddings, "pick_device", cuda)
    monkeypatch.setattr(backtranslate, "pick_device", cuda)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    gpu = {s: extra_key(STAGES[s], cfg) for s in stages}
    for s in stages:
        assert gpu[s] != cpu[s] and '"device":"cuda"' in gpu[s], s
    assert '"precision":"bf16"' in gpu["embeddings"] and '"dtype":"bfloat16"' in gpu["backtranslate"]
    fp16 = extra_key(STAGES["embeddings"], load_config("default", OFFLINE + ["encoder.precision=fp16"]))
    assert '"precision":"fp16"' in fp16 and fp16 != gpu["embeddings"]


def test_model_files_are_part_of_the_key(tmp_path):
    from tiny_bert import build_tiny_bert

    path = build_tiny_bert(tmp_path / "enc", seed=1)
    cfg = load_config("default", OFFLINE + [f"encoder.model={path}"])
    first = extra_key(STAGES["embeddings"], cfg)
    shutil.copytree(path, tmp_path / "copy")  # the same files elsewhere: the same key
    assert extra_key(STAGES["embeddings"], load_config("default", OFFLINE + [f"encoder.model={tmp_path / 'copy'}"])) \
        == first
    sizes = sorted((f.name, f.stat().st_size) for f in path.iterdir())
    config = (path / "config.json").read_text()
    build_tiny_bert(path, seed=2)  # retrained and saved in place: other weights, same config and file sizes
    assert sorted((f.name, f.stat().st_size) for f in path.iterdir()) == sizes
    assert (path / "config.json").read_text() == config
    models.clear_cache()
    assert extra_key(STAGES["embeddings"], cfg) != first
    assert models.model_fingerprint(tmp_path / "hf" / "models--org--m" / "snapshots" / ("a" * 40)) == f"hub:org/m@{'a' * 40}"


def test_library_versions_are_part_of_the_key(tmp_path):
    from importlib.metadata import version

    import numpy as np

    from pipeline.engine.store import Store
    from pipeline.schema import vectors_table

    cfg = load_config("default", OFFLINE + [f"run.root={tmp_path}", "run.shards=1"])
    vecs = np.eye(4, dtype=np.float32)  # the index is resolved against the run's vectors
    Store(cfg.run.dir).write_shard("embeddings", 0, 1, vectors_table(np.arange(4), vecs), "k")
    Store(cfg.run.dir).write_shard("pool_embeddings", 0, 1, vectors_table(np.arange(0), vecs[:0]), "k")
    assert f"faiss-cpu={version('faiss-cpu')}" in extra_key(STAGES["neighbours"], cfg)
    assert f"spacy={version('spacy')}" in extra_key(STAGES["negate"], cfg)
    assert f"torch={version('torch')}" in extra_key(STAGES["embeddings"], cfg)
