"""A shard is reused only when everything that decides its bytes is unchanged: the code it runs (derived from its
imports, never a hand list), the device and precision it ran at, the model files, the library versions."""
from __future__ import annotations

import shutil

import torch

from contramine.pipeline.config import load_config
from contramine.pipeline.codeversion import PIPELINE, code_version, module_closure
from contramine.pipeline.engine.runner import load_stages, resolve_plan, stage_facts
from contramine.pipeline.models.translate import chains
from contramine.pipeline.models.encode import resource as encoder_resource
from contramine.pipeline.models import hub as models

OFFLINE = ["backtranslate.chains=[]"]
STANDIN = ['backtranslate.chains=[["standin:shuffle-de", "standin:shuffle-en"]]']  # HF-engine models, no weights
BERGAMOT = ['backtranslate.chains=[["bergamot:en-pt", "bergamot:pt-en"]]']
STAGES = load_stages()


def extra_key(stage, cfg) -> str:
    """What the stage's key holds beyond inputs and settings: its facts and its resources as resolved for the run."""
    return stage_facts(stage, cfg, resolve_plan(stage.name, cfg))


def test_code_version_follows_every_module_a_stage_imports(tmp_path):
    src = tmp_path / "pipeline"
    shutil.copytree(PIPELINE, src, ignore=shutil.ignore_patterns("__pycache__"))
    versions = lambda: {s: code_version(STAGES[s].module, root=src) for s in STAGES}  # noqa: E731
    before = versions()
    assert "contramine.pipeline.seeding" in module_closure((STAGES["noise"].module,))  # listed nowhere by hand
    (src / "seeding.py").write_text((src / "seeding.py").read_text() + "\n# a change to per-row seeding\n")
    code_version.cache_clear()  # a new process
    after = versions()
    changed = {s for s in STAGES if before[s] != after[s]}
    assert {"noise", "ipw", "backtranslate"} <= changed  # the stages that draw per-row random numbers
    assert not changed & {"sentences", "embeddings", "neighbours", "negate", "pairs", "triplets"}
    (src / "models" / "encode" / "unpad.py").write_text((src / "models" / "encode" / "unpad.py").read_text() + "\n# the forward\n")
    code_version.cache_clear()
    again = versions()
    assert {s for s in STAGES if again[s] != after[s]} == {"embeddings", "pool_embeddings", "scores"}  # they embed


def test_code_version_covers_the_code_that_ran_and_no_other(tmp_path):
    """Editing a module a run did not execute recomputes nothing: the training settings, an engine the chains did
    not run on. The engines are reached through the chains' plan (its `code`), never through a stage's imports."""
    src = tmp_path / "pipeline"
    shutil.copytree(PIPELINE, src, ignore=shutil.ignore_patterns("__pycache__"))
    versions = lambda: {s: code_version(STAGES[s].module, root=src) for s in STAGES}  # noqa: E731
    engines = lambda: {m: code_version(m, root=src) for m in (e.module for e in chains.ENGINES.values())}  # noqa: E731
    before, engines_before = versions(), engines()
    for closure in (module_closure((STAGES[s].module,)) for s in STAGES):
        assert not {"contramine.pipeline.config.training", "contramine.pipeline.config.root", "contramine.pipeline.config.loading",
                    *(e.module for e in chains.ENGINES.values())} & set(closure)
    for module in ("config/training.py", "models/translate/engines/ct2.py", "models/translate/engines/hf.py", "models/translate/engines/bergamot.py"):
        (src / module).write_text((src / module).read_text() + "\n\ndef added():\n    return 1\n")
    code_version.cache_clear()
    assert versions() == before  # no stage's own code version moves ...
    moved = {m for m, v in engines().items() if v != engines_before[m]}
    assert moved == {e.module for e in chains.ENGINES.values()}  # ... the engines' do, and a run's plan names only its own
    plan = chains.chains_plan(load_config("default", BERGAMOT))
    assert set(plan["code"]) == {"bergamot"} and plan["code"]["bergamot"] == code_version("contramine.pipeline.models.translate.engines.bergamot")
    encoder_py = src / "models" / "encode" / "encoder.py"
    encoder_py.write_text(encoder_py.read_text() + "\n\ndef added():\n    pass\n")
    code_version.cache_clear()
    after = versions()
    assert {s for s in STAGES if after[s] != before[s]} == {"embeddings", "pool_embeddings", "scores"}
    code_version.cache_clear()


def test_no_stage_module_imports_another():
    """What two stages share lives below them (models/, roles.py, identity.py), so a stage's code version is its
    own code and what it runs."""
    stage_modules = {s.module for s in STAGES.values()}
    for s in STAGES.values():
        others = stage_modules - {s.module}
        imported = {m for m in module_closure((s.module,))} - {s.module}
        assert not imported & others, f"{s.module} imports {sorted(imported & others)}"


def test_device_and_precision_are_part_of_the_key(monkeypatch):
    cfg = load_config("default", STANDIN)
    stages = ("embeddings", "scores", "backtranslate")
    cpu = {s: extra_key(STAGES[s], cfg) for s in stages}
    assert all('"device":"cpu"' in cpu[s] for s in stages)
    assert '"precision":"float32"' in cpu["embeddings"] and '"dtype":"float32"' in cpu["backtranslate"]
    assert '"weights":"float32"' in cpu["embeddings"]
    # the same run on a GPU with bf16: no shard of the CPU float32 run may be reused
    cuda = lambda setting="auto": "cuda" if setting == "auto" else setting  # noqa: E731
    monkeypatch.setattr(encoder_resource, "pick_device", cuda)
    monkeypatch.setattr(chains, "pick_device", cuda)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    gpu = {s: extra_key(STAGES[s], cfg) for s in stages}
    for s in stages:
        assert gpu[s] != cpu[s] and '"device":"cuda"' in gpu[s], s
    assert '"precision":"bf16"' in gpu["embeddings"] and '"dtype":"bfloat16"' in gpu["backtranslate"]
    assert '"weights":"bfloat16"' in gpu["embeddings"]  # a GPU's bf16 is weights held in bf16, not autocast
    fp16 = extra_key(STAGES["embeddings"], load_config("default", STANDIN + ["encoder.precision=fp16"]))
    assert '"precision":"fp16"' in fp16 and fp16 != gpu["embeddings"]
    # Bergamot runs on the CPU whatever the flow's host has: mining from a GPU host recomputes nothing of it
    bergamot = load_config("default", BERGAMOT)
    on_gpu_host = extra_key(STAGES["backtranslate"], bergamot)
    assert '"device":"cpu"' in on_gpu_host and "dtype" not in on_gpu_host
    monkeypatch.undo()
    assert extra_key(STAGES["backtranslate"], bergamot) == on_gpu_host


def test_device_settings_are_not_in_the_section_hashes():
    """The plan records the resolved device kind (and precision, dtype, engine where they matter): the settings
    themselves would only change keys when nothing that shapes the bytes changed."""
    base = load_config("default")
    for sets in (["encoder.device=cpu"], ["encoder.precision=float32"], ["backtranslate.device=cpu"],
                 ["backtranslate.dtype=float32"], ["backtranslate.engine=auto"], ["neighbours.gpu=never"]):
        other = load_config("default", sets)
        assert all(base.section_hash(*st.settings) == other.section_hash(*st.settings) for st in STAGES.values()), sets
    assert base.section_hash("encoder") != load_config("default", ["encoder.pooler=cls"]).section_hash("encoder")


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

    from contramine.pipeline.storage.store import Store
    from contramine.pipeline.schema import vectors_table

    cfg = load_config("default", OFFLINE + [f"run.root={tmp_path}", "run.shards=1"])
    vecs = np.eye(4, dtype=np.float32)  # the index is resolved against the run's vectors
    Store(cfg.run.dir).write_table("embeddings", [vectors_table(np.arange(4), vecs)], "k")
    Store(cfg.run.dir).write_table("pool_embeddings", [vectors_table(np.arange(0), vecs[:0])], "k")
    assert f"faiss-cpu={version('faiss-cpu')}" in extra_key(STAGES["neighbours"], cfg)
    assert f"spacy={version('spacy')}" in extra_key(STAGES["negate"], cfg)
    assert f"torch={version('torch')}" in extra_key(STAGES["embeddings"], cfg)


def test_hf_static_cache_and_compile_are_in_the_key_where_hf_runs():
    """kv_cache / compile stay out of the section hash; the chains' plan records them where HF generate runs and
    they depart from the plain dynamic cache (a run with the defaults keeps the key it had). Bergamot ignores them."""
    base = load_config("default", STANDIN)
    static = load_config("default", STANDIN + ["backtranslate.kv_cache=static"])
    compiled = load_config("default", STANDIN + ["backtranslate.kv_cache=static", "backtranslate.compile=true"])
    assert base.section_hash("backtranslate") == static.section_hash("backtranslate") == \
        compiled.section_hash("backtranslate")
    keys = [extra_key(STAGES["backtranslate"], c) for c in (base, static, compiled)]
    assert len(set(keys)) == 3 and "decoding" not in keys[0] and '"kv_cache":"static"' in keys[1]
    bergamot = [extra_key(STAGES["backtranslate"], load_config("default", BERGAMOT + sets))
                for sets in ([], ["backtranslate.kv_cache=static", "backtranslate.compile=true"])]
    assert bergamot[0] == bergamot[1]


def test_on_a_gpu_the_batch_budgets_are_keyed_and_on_a_cpu_they_are_not(monkeypatch):
    """encoder.batch_tokens and backtranslate's budgets are execution settings (out of the section hash): on a CPU a
    row's bytes never depend on its batch (tests/test_execution_settings.py), so the key ignores them there; on a GPU
    they may, so the plans record them and another budget recomputes the shards (the precision is keyed already)."""
    stages = ("embeddings", "scores", "backtranslate")
    sets = {"default": [], "other": ["encoder.batch_tokens=4096", "backtranslate.batch_tokens=65536"],
            "rows": ["backtranslate.batch_tokens=0", "backtranslate.batch_size=16"]}
    configs = {name: load_config("default", STANDIN + extra) for name, extra in sets.items()}
    cpu = {name: {s: extra_key(STAGES[s], c) for s in stages} for name, c in configs.items()}
    assert cpu["default"] == cpu["other"] == cpu["rows"]  # a CPU: the keys of today
    assert all("batch" not in k for k in cpu["default"].values())
    cuda = lambda setting="auto": "cuda" if setting == "auto" else setting  # noqa: E731
    monkeypatch.setattr(encoder_resource, "pick_device", cuda)
    monkeypatch.setattr(chains, "pick_device", cuda)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    gpu = {name: {s: extra_key(STAGES[s], c) for s in stages} for name, c in configs.items()}
    assert '"batch_tokens":32768' in gpu["default"]["embeddings"] and '"batch_tokens":4096' in gpu["other"]["scores"]
    assert '"batching":{"hf":{"tokens":262144}}' in gpu["default"]["backtranslate"]
    assert '"batching":{"hf":{"tokens":65536}}' in gpu["other"]["backtranslate"]
    assert '"batching":{"hf":{"rows":16}}' in gpu["rows"]["backtranslate"]
    for s in stages:
        assert gpu["default"][s] != gpu["other"][s], s
    assert gpu["default"]["backtranslate"] != gpu["rows"]["backtranslate"]
    assert gpu["default"]["embeddings"] == gpu["rows"]["embeddings"]  # translation's budget is not the encoder's
    assert configs["default"].section_hash("encoder", "backtranslate") == \
        configs["other"].section_hash("encoder", "backtranslate")  # still execution settings in the hash
    # the row memo of vectors on a GPU is keyed with the plan too
    plan = {"encoder": encoder_resource.encoder_plan(configs["other"])}
    assert encoder_resource.encode_memo_facts(configs["other"], plan)["encoder"]["batch_tokens"] == 4096


def test_on_a_gpu_the_decoder_is_keyed_and_on_a_cpu_it_is_not(monkeypatch):
    """backtranslate.decoder is an execution setting where the loop's tokens equal generate's (a CPU in float32,
    tests/test_decode_loop.py); a GPU's kernels make no such promise, so there the plan records it. kv_cache "auto"
    is the dynamic cache (the loop) on both."""
    configs = {d: load_config("default", STANDIN + [f"backtranslate.decoder={d}"]) for d in ("loop", "generate")}
    cpu = {d: extra_key(STAGES["backtranslate"], c) for d, c in configs.items()}
    assert cpu["loop"] == cpu["generate"] and "decoding" not in cpu["loop"]
    cuda = lambda setting="auto": "cuda" if setting == "auto" else setting  # noqa: E731
    monkeypatch.setattr(chains, "pick_device", cuda)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    gpu = {d: extra_key(STAGES["backtranslate"], c) for d, c in configs.items()}
    assert gpu["loop"] != gpu["generate"]
    assert '"decoding":{"decoder":"loop"}' in gpu["loop"] and '"decoder":"generate"' in gpu["generate"]
    static = extra_key(STAGES["backtranslate"], load_config("default", STANDIN + ["backtranslate.kv_cache=static"]))
    assert '"kv_cache":"static"' in static and static != gpu["loop"]
