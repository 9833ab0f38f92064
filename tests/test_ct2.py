"""The CTranslate2 engine (`backtranslate.engine`): conversion offline from a local folder, cached and atomic; the
same texts as HF generate where that holds (float32 greedy), int8 running; the engine switch recomputing shards."""
from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest

from contramine.pipeline.config import BacktranslateCfg, ConfigError, load_config
from contramine.pipeline.engine.runner import run_shard, run_stage
from contramine.pipeline.storage.store import Store
from contramine.pipeline.models.translate.engines import ct2
from contramine.pipeline.models.translate.settings import row_limit
from contramine.pipeline.config import chain_name
from contramine.pipeline.models.translate.chains import backtranslate, load_chain, load_translator
from contramine.pipeline.schema import SCHEMAS
from contramine.pipeline.models.translate.chains import chains_plan, generator_notes
from bench.fixtures.tiny_mt import build_tiny_fsmt, build_tiny_m2m100, build_tiny_marian, corpus_lines

SMALL = dict(max_new_tokens_factor=1.0, max_new_tokens_min=4, max_length=48)
LINES = corpus_lines(400)[:300]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_ct2")
    return {"en-xx": str(build_tiny_marian(out / "marian-en-xx", seed=1)),
            "xx-en": str(build_tiny_marian(out / "marian-xx-en", seed=2)),
            "m2m": str(build_tiny_m2m100(out / "m2m100", seed=4)),
            "fsmt": str(build_tiny_fsmt(out / "fsmt", seed=3))}


@pytest.fixture(autouse=True)
def hf_cache(tmp_path_factory, monkeypatch):
    """Conversions go beside the HF cache: one per module, never the user's."""
    cache = tmp_path_factory.getbasetemp() / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache.parent / "ctranslate2"


def cfg(**kw) -> BacktranslateCfg:
    return BacktranslateCfg(**{**SMALL, "batch_size": 64, **kw})


def test_float32_greedy_equals_hf_token_for_token(tiny):
    import torch

    threads = torch.get_num_threads()
    hf = load_translator(tiny["en-xx"], cfg()).translate(LINES)
    fast = load_translator(tiny["en-xx"], cfg(engine="ctranslate2", compute_type="float32"))
    assert isinstance(fast, ct2.CT2Translator)
    # CPU: one-thread workers, one per torch thread, not OpenMP threads (ct2 module doc: libgomp shared with torch),
    # and torch keeps its thread count (creating the Translator set the shared OpenMP count to 1)
    assert fast.translator.num_translators == torch.get_num_threads() == threads
    assert fast.translate(LINES) == hf
    assert len({h[0] for h in hf}) > 50, "outputs should depend on the input, else equality says little"
    # any batch composition: alone, in small batches, reversed
    assert [fast.translate([s])[0] for s in LINES[:40]] == hf[:40]
    assert load_translator(tiny["en-xx"], cfg(engine="ctranslate2", compute_type="float32", batch_size=3,
                                              )).translate(LINES[::-1]) == hf[::-1]
    assert load_translator(tiny["en-xx"], cfg(engine="ctranslate2", compute_type="float32", batch_tokens=256,
                                              )).translate(LINES) == hf


class CountingCalls:
    """A CTranslate2 translator that counts its translate_batch calls."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def translate_batch(self, *args, **kw):
        self.calls += 1
        return self.inner.translate_batch(*args, **kw)


@pytest.mark.parametrize("model", ["en-xx", "m2m"])
def test_greedy_in_one_call_cut_per_row_equals_decoding_each_cap_apart(tiny, model):
    """Greedy decodes all rows in one call to the largest cap and cuts each row at its own: the same texts as one
    call per cap and as HF's per-row caps, on rows of many caps, many of them cut (for M2M100 the forced language
    token counts towards the cap, as HF's max_new_tokens counts it)."""
    langs = dict(target_lang={tiny["m2m"]: "de"}, source_lang={tiny["m2m"]: "en"}) if model == "m2m" else {}
    caps = dict(max_new_tokens_factor=0.5, max_new_tokens_min=1, batch_size=8, **langs)
    hf = load_translator(tiny[model], cfg(**caps)).translate(LINES)
    fast = load_translator(tiny[model], cfg(engine="ctranslate2", compute_type="float32", **caps))
    fast.translator = counting = CountingCalls(fast.translator)
    one_call = fast.translate(LINES)
    assert counting.calls == 1
    fast.group_greedy_by_cap = True
    grouped = fast.translate(LINES)
    assert one_call == grouped == hf
    ids = fast.tokenizer([fast.prefix + t for t in LINES], truncation=True, max_length=fast.cfg.max_length)
    limits = [row_limit(len(x), fast.cfg) for x in ids["input_ids"]]
    assert counting.calls > 1 + 10 and len(set(limits)) > 10  # one call per cap when grouped
    full = counting.inner.translate_batch([fast.tokenizer.convert_ids_to_tokens(x) for x in ids["input_ids"]],
                                          target_prefix=[fast.target_prefix] * len(LINES) if fast.target_prefix
                                          else None, beam_size=1, max_decoding_length=max(limits))
    cut = sum(len(r.hypotheses[0]) > n for r, n in zip(full, limits))
    assert cut > 30, f"only {cut} rows outgrow their cap: the cut is barely exercised"
    assert len({h[0] for h in hf}) > 25  # outputs depend on the input


def test_empty_text_translates_to_empty_on_both_engines(tiny):
    """CTranslate2 decodes nothing from an empty source; HF would invent a sentence from a lone </s>: both give ''."""
    texts = ["", LINES[0], "   ", LINES[1]]
    for engine in (cfg(num_beams=2, num_return_sequences=2), cfg(engine="ctranslate2", compute_type="float32",
                                                                   num_beams=2, num_return_sequences=2)):
        out = load_translator(tiny["en-xx"], engine).translate(texts)
        assert out[0] == out[2] == ["", ""] and all(out[1]) and all(out[3])


def test_m2m100_with_language_codes_equals_hf(tiny):
    langs = dict(target_lang={tiny["m2m"]: "de"}, source_lang={tiny["m2m"]: "en"})
    hf = load_translator(tiny["m2m"], cfg(**langs)).translate(LINES)
    fast = load_translator(tiny["m2m"], cfg(engine="ctranslate2", compute_type="float32", **langs))
    assert fast.target_prefix == ["__de__"] and fast.translate(LINES) == hf
    with pytest.raises(ValueError, match="target_lang has no entry"):
        load_translator(tiny["m2m"], cfg(engine="ctranslate2", compute_type="float32"))


def test_beam_returns_and_int8(tiny):
    beams = load_translator(tiny["en-xx"], cfg(engine="ctranslate2", compute_type="float32", num_beams=3,
                                               num_return_sequences=2)).translate(LINES[:50])
    assert all(len(h) == 2 for h in beams) and sum(a != b for a, b in beams) > 10
    int8 = load_translator(tiny["en-xx"], cfg(engine="ctranslate2"))  # compute_type auto: int8 on CPU
    assert int8.compute_type == "int8"
    first = int8.translate(LINES)
    assert first == int8.translate(LINES) and len({h[0] for h in first}) > 50  # repeatable, and real output
    assert [int8.translate([s])[0] for s in LINES[:40]] == first[:40]  # int8 on CPU: per row, not per batch


def test_backtranslate_table_is_the_hf_table(tiny):
    rows = [(10 + i, 0, s) for i, s in enumerate(LINES[:80])]
    names = [tiny["en-xx"], tiny["xx-en"]]
    hf = backtranslate(rows, chain_name(names), load_chain(names, cfg()))
    fast = backtranslate(rows, chain_name(names), load_chain(names, cfg(engine="ctranslate2",
                                                                        compute_type="float32")))
    assert fast.equals(hf)


def test_conversion_is_cached_atomic_and_redone_when_killed(tiny, hf_cache, monkeypatch, capsys):
    path = tiny["xx-en"]
    final = ct2.converted_dir(path, path, "int8_float32")
    assert final.parent == hf_cache and not final.exists()
    import ctranslate2.converters

    original = ctranslate2.converters.TransformersConverter.convert

    def killed(self, output_dir, **kw):  # writes part of a model, then dies
        os.makedirs(output_dir)
        open(os.path.join(output_dir, "model.bin"), "wb").write(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(ctranslate2.converters.TransformersConverter, "convert", killed)
    with pytest.raises(KeyboardInterrupt):
        ct2.convert(path, path, "int8_float32")
    assert not final.exists() and not list(hf_cache.glob(".tmp-*"))
    stale = hf_cache / f".tmp-{final.name}-999999999" / "model"  # a kill -9 leaves its temporary folder
    stale.mkdir(parents=True)
    monkeypatch.setattr(ctranslate2.converters.TransformersConverter, "convert", original)
    assert ct2.convert(path, path, "int8_float32") == final and (final / "model.bin").stat().st_size > 1000
    assert not stale.parent.exists()
    assert "converting translation model" in capsys.readouterr().err
    mtime = (final / "model.bin").stat().st_mtime_ns
    assert ct2.convert(path, path, "int8_float32") == final and (final / "model.bin").stat().st_mtime_ns == mtime


def test_weights_saved_again_in_the_same_folder_convert_again(tmp_path, hf_cache):
    """Same file names and sizes, new weights (a model retrained and saved in place): the old conversion is not used."""
    import shutil

    folder = tmp_path / "my-opus-mt"
    shutil.copytree(build_tiny_marian(tmp_path / "a", seed=1), folder)
    first = ct2.convert(str(folder), folder, "float32")
    other = build_tiny_marian(tmp_path / "b", seed=5)
    for f in ("model.safetensors",):
        shutil.copyfile(other / f, folder / f)
    assert (folder / "model.safetensors").stat().st_size == (tmp_path / "a" / "model.safetensors").stat().st_size
    second = ct2.convert(str(folder), folder, "float32")
    assert second != first and (second / "model.bin").read_bytes() != (first / "model.bin").read_bytes()
    want = load_translator(str(other), cfg()).translate(LINES[:20])
    assert load_translator(str(folder), cfg(engine="ctranslate2", compute_type="float32")).translate(LINES[:20]) == want


def test_engine_settings_that_cannot_work_are_refused(tiny):
    with pytest.raises(ConfigError, match="do_sample with engine = 'ctranslate2'"):
        load_config("default", ["backtranslate.chains=[]", "backtranslate.engine=ctranslate2",
                                "backtranslate.do_sample=true"])
    with pytest.raises(ConfigError, match="compute_type is a CTranslate2 setting and engine = 'hf'"):
        load_config("default", ["backtranslate.compute_type=int8"])
    assert load_config("default", ["backtranslate.batch_tokens=4096"]).backtranslate.batch_tokens == 4096  # both
    fsmt_chain = f'backtranslate.chains=[["{tiny["en-xx"]}", "{tiny["fsmt"]}"]]'
    strict = load_config("default", [fsmt_chain, "backtranslate.engine=ctranslate2"])
    with pytest.raises(ConfigError, match=r"fsmt.*cannot be converted by CTranslate2.*engine = 'auto'"):
        chains_plan(strict)
    auto = load_config("default", [fsmt_chain, "backtranslate.engine=auto"])
    notes = " ".join(generator_notes(auto, chains_plan(auto)))
    assert f"{tiny['en-xx']} on CTranslate2 (int8)" in notes
    assert f"{tiny['fsmt']} on Hugging Face generate (CTranslate2 does not convert" in notes


def test_engine_switch_recomputes_the_shards(tiny, tmp_path):
    store = Store(tmp_path / "r")
    sids = list(range(30))
    store.write_table("sentences", [pa.table({"sid": sids, "text": LINES[:30], "n_words": [5] * 30,
                                              "line_no": sids}, schema=SCHEMAS["sentences"])], "k")
    store.write_table("variants", [SCHEMAS["variants"].empty_table()], "k")
    # replaced shards go at once (no grace period), so the last rerun below finds the hf shard gone
    base = [f"run.root={tmp_path}", "run.name=r", "run.shards=1", "runner.keep_replaced_s=0",
            *(f"backtranslate.{k}={v}" for k, v in SMALL.items()),
            f'backtranslate.chains=[["{tiny["en-xx"]}", "{tiny["xx-en"]}"]]']
    runs = {e: load_config("default", [*base, *e]) for e in
            [(), ("backtranslate.engine=ctranslate2", "backtranslate.compute_type=float32"),
             ("backtranslate.engine=ctranslate2",)]}
    facts = [json.dumps(chains_plan(c)) for c in runs.values()]
    assert '"ctranslate2:float32"' in facts[1] and '"ctranslate2:int8"' in facts[2] and "ctranslate2=" in facts[2]
    tables = []
    for c in runs.values():
        assert run_stage("backtranslate", c)["shards_computed"] == 1  # never the other engine's shard
        tables.append(store.read("backtranslations", 1))
    assert tables[0].equals(tables[1])  # float32 greedy: the same bytes either way
    assert run_stage("backtranslate", runs[()])["shards_computed"] == 1  # the hf shard was replaced: computed again
    assert run_shard("backtranslate", runs[()], 0)["cached"] is True


def test_on_a_gpu_without_cuda_12_auto_takes_hf_and_ctranslate2_is_refused(tiny, monkeypatch, capsys):
    """What the GPU check met on the lent H100 (CUDA 13 only): CTranslate2's wheels cannot load libcublas.so.12
    there. `engine = "auto"` then plans HF generate, saying so once; an explicit "ctranslate2" is refused in one line
    before any model loads. On a CPU nothing changes."""
    from contramine.pipeline.models.translate import chains

    assert chains.ct2_cuda_problem("cpu") is None
    assert "no CUDA device" in chains.ct2_cuda_problem("cuda")  # this box's CPU-only CTranslate2
    assert chains.engine_for("en-xx", tiny["en-xx"], cfg(engine="auto")) == "ctranslate2"  # here: the CPU
    monkeypatch.setattr(chains, "pick_device", lambda setting="auto": "cuda")
    import ctranslate2

    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: 1)
    monkeypatch.setattr(chains, "CT2_CUDA_LIBRARY", "libcublas.so.0-not-here")
    assert chains.engine_for("en-xx", tiny["en-xx"], cfg(engine="auto")) == "hf"
    assert chains.engine_for("en-xx", tiny["en-xx"], cfg(engine="auto")) == "hf"
    said = capsys.readouterr().out
    assert said.count("runs on HF generate, not CTranslate2: libcublas.so.0-not-here cannot be loaded") == 1
    with pytest.raises(ValueError, match=r"engine = 'ctranslate2': model 'en-xx' cannot run on this GPU: "
                                         r"libcublas\.so\.0-not-here cannot be loaded"):
        chains.engine_for("en-xx", tiny["en-xx"], cfg(engine="ctranslate2"))
    monkeypatch.setattr(chains, "CT2_CUDA_LIBRARY", "libc.so.6")  # a library that loads: CTranslate2 it is
    assert chains.engine_for("en-xx", tiny["en-xx"], cfg(engine="auto")) == "ctranslate2"


def test_cuda_12_cublas_is_looked_for_on_the_loader_path_then_in_the_pip_package(tmp_path):
    """pipeline/models/cublas.py: the loader's own search first; else each site folder's nvidia/cublas/lib (where
    `pip install nvidia-cublas-cu12` puts it), cuBLASLt before cuBLAS; a folder that fails to load gives way to the
    next; None when no folder has it (then ct2_cuda_problem says so)."""
    from contramine.pipeline.models.cublas import load_cublas, pip_cublas_folders

    sites = [tmp_path / name for name in ("empty", "broken", "good")]
    for site in sites[1:]:
        (site / "nvidia" / "cublas" / "lib").mkdir(parents=True)
        for lib in ("libcublas.so.12", "libcublasLt.so.12"):
            (site / "nvidia" / "cublas" / "lib" / lib).write_bytes(b"")
    loads = []

    def loader(name, mode):
        loads.append(name)
        if "/" not in name or "broken" in name:
            raise OSError(f"{name}: cannot open shared object file")

    paths = [str(s) for s in sites]
    assert pip_cublas_folders(paths) == [s / "nvidia" / "cublas" / "lib" for s in sites[1:]]
    assert load_cublas(paths=paths, load=loader) == str(sites[2] / "nvidia" / "cublas" / "lib")
    assert [n.split(str(tmp_path))[-1] for n in loads] == [
        "libcublas.so.12", "/broken/nvidia/cublas/lib/libcublasLt.so.12", "/good/nvidia/cublas/lib/libcublasLt.so.12",
        "/good/nvidia/cublas/lib/libcublas.so.12"]
    assert load_cublas(paths=paths[:1], load=loader) is None
    assert load_cublas(load=lambda name, mode: None) == "the loader path"


def test_a_pip_installed_cublas_answers_ctranslate2s_dlopen_by_name(tmp_path):
    """The loader mechanism cublas.py relies on, with real shared objects: stand-ins built here with cuBLAS's
    sonames (libcublas.so.12 needing libcublasLt.so.12, no search path to it), in a fresh process without
    LD_LIBRARY_PATH. Before load_cublas a dlopen of "libcublas.so.12" by name fails, as CTranslate2's does on a
    CUDA-13-only machine; after it, the same dlopen succeeds and calls into both."""
    import shutil
    import subprocess
    import sys

    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler here to build the stand-in libraries")
    lib = tmp_path / "site" / "nvidia" / "cublas" / "lib"
    lib.mkdir(parents=True)
    (tmp_path / "lt.c").write_text("int ltVersion(void) { return 12; }\n")
    (tmp_path / "blas.c").write_text("int ltVersion(void);\nint cublasVersion(void) { return 100 + ltVersion(); }\n")
    for src, name, extra in (("lt.c", "libcublasLt.so.12", []), ("blas.c", "libcublas.so.12",
                                                                   [f"-L{lib}", "-l:libcublasLt.so.12"])):
        subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib / name), f"-Wl,-soname,{name}", str(tmp_path / src),
                        *extra], check=True, capture_output=True)
    code = ("import ctypes, sys\n"
            "try:\n    ctypes.CDLL('libcublas.so.12')\n    sys.exit(3)\nexcept OSError:\n    pass\n"
            "from contramine.pipeline.models.cublas import load_cublas\n"
            f"print(load_cublas(paths=[{str(tmp_path / 'site')!r}]))\n"
            "print(ctypes.CDLL('libcublas.so.12').cublasVersion())\n")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if done.returncode == 3:
        pytest.skip("this machine has a libcublas.so.12 on its loader path")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(lib), "112"]
