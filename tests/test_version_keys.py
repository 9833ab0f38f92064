"""Versions that shape bytes without being code of ours: Python's Unicode tables (NFC in identity.normalise) are in
the keys of the stages that normalise text, and a CTranslate2 conversion is kept per ctranslate2 version."""
from __future__ import annotations

import unicodedata

import pytest

from contramine.pipeline.config import load_config
from contramine.pipeline.engine.runner import load_stages, stage_facts
from contramine.pipeline.identity import normalise

STAGES = load_stages()


def test_unicode_tables_are_in_the_keys_of_the_stages_that_normalise(tmp_path, monkeypatch):
    candidates = tmp_path / "candidates.txt"
    candidates.write_text("a candidate sentence of the pool\n", encoding="utf-8")
    cfg = load_config("default", [f"run.root={tmp_path}", f"data.candidates={candidates}"])
    # each stage's declared facts (a stage's models are keyed apart: their files, device, versions)
    keys = lambda: {s: stage_facts(STAGES[s], cfg) for s in STAGES}  # noqa: E731
    before = keys()
    assert f"unicodedata={unicodedata.unidata_version}" in before["sentences"]
    monkeypatch.setattr(unicodedata, "unidata_version", "99.0.0")
    after = keys()
    assert {s for s in STAGES if after[s] != before[s]} == {"sentences", "pool_sentences"}
    assert normalise("Cafe\u0301  au lait") == "Café au lait"  # what those tables decide


def test_a_new_ctranslate2_converts_again(tmp_path, monkeypatch):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from contramine.pipeline.models.translate.engines import ct2

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    now = ct2.converted_dir("standin:shuffle-de", "standin:shuffle-de", "int8")
    assert now.parent == tmp_path / "hf" / "ctranslate2" and now.name.endswith(f"--ct2-{ctranslate2.__version__}")
    monkeypatch.setattr(ctranslate2, "__version__", "9.0.0")
    later = ct2.converted_dir("standin:shuffle-de", "standin:shuffle-de", "int8")
    assert later != now and later.name.endswith("--int8--ct2-9.0.0")
    (now / "model.bin").parent.mkdir(parents=True)
    (now / "model.bin").write_bytes(b"an old conversion")
    assert not (later / "model.bin").exists()  # so convert() converts again instead of loading it
