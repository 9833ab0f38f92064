"""The translation sections of `make gpu-check` (bench/gpu/check.py has what they measure and how to run it): the
1M path's translation on `gen_n` real-length sentences, length-sorted and batched by the stage's own Translator,
beside HF `generate` as a user writes it and CTranslate2 as the pipeline loads it; the compiled rows apart (the
check's last section: a compile that hangs or breaks the process takes nothing after it). Every row is guarded: a
failure is one failed row, and the next row runs. Standard library at import time.
"""
from __future__ import annotations

import time

from bench.gpu.limits import marian_flop
from bench.gpu.sections import (CUDNN_ATTENTION, Models, attention_setting, guarded, marian_texts, mem_unit,
                                peak_mib, reset_peak, row, sync, translator)

# Translator rows: row name -> BacktranslateCfg fields on top of the stage's defaults. `decoder` (issue 51): "loop" is
# our decode loop, the HF engine's default once merged; "generate" the stage's old path (HF generate). A checkout
# whose config has no `decoder` has only the old path: "generate" is then its default, and a "loop" row is not
# measured (one line says so, not a failure: nothing to measure).
# generate_default: the stage's defaults as they resolve on this device (kv_cache "auto": the dynamic cache, so our
# loop, on every device since 2026-11-28's attention_kernels; static on a GPU before it). The others pin what they
# measure: generate_ours against generate_static is the row pair that says whether "auto" is right on a GPU.
# generate_ours_cudnn: generate_ours with SDPA free to pick cuDNN's attention (sections.CUDNN_ATTENTION), as before
# 2026-11-28's attention_kernels: the H200's 18,169 tokens/s, a cuDNN plan built every decoding step.
GENERATE_ROWS = {"generate_default": {}, "generate_ours": {"decoder": "loop", "kv_cache": "dynamic"},
                 "generate_old": {"decoder": "generate", "kv_cache": "dynamic"},
                 "generate_static": {"decoder": "generate", "kv_cache": "static"},
                 "generate_ours_cudnn": {"decoder": "loop", "kv_cache": "dynamic", CUDNN_ATTENTION: True}}
# compiled Translator rows, run in the check's last section on `gen_compile_n` rows (each batch shape compiles)
COMPILED_ROWS = {"generate_static_compile": {"decoder": "generate", "kv_cache": "static", "compile": True}}
NOT_IN_CHECKOUT = "not measured: this checkout's BacktranslateCfg has no setting"


def checkout_settings(settings: dict) -> tuple[dict, str | None]:
    """(the settings this checkout's config takes, None), or (…, the one-line reason the row cannot run here)."""
    from contramine.pipeline.config.backtranslation import BacktranslateCfg

    fields = BacktranslateCfg.model_fields
    if "decoder" in settings and "decoder" not in fields:
        if settings["decoder"] != "generate":
            return settings, f"{NOT_IN_CHECKOUT} 'decoder' (issue 51's decode loop not merged)"
        settings = {k: v for k, v in settings.items() if k != "decoder"}  # the old path is all it has
    return settings, None


def precision_of(device: str) -> str:
    return "bf16" if device.startswith("cuda") else "fp32"


def translator_row(name: str, settings: dict, texts: list[str], models: Models, device: str,
                   warm_all: bool = False) -> list[dict]:
    """One Translator row: `Translator.translate(texts)` at the stage's defaults + settings, after a warm-up on one
    batch's rows (`warm_all`: every row, so a compiled step has compiled every batch shape of the timed pass)."""
    with attention_setting(settings) as stage_settings:
        out = translated_row(name, stage_settings, texts, models, device, warm_all)
    if settings.get(CUDNN_ATTENTION) and out[0]["value"]:
        out[0]["note"] += "; SDPA free to pick cuDNN's attention (torch's default order)"
    return out


def translated_row(name: str, settings: dict, texts: list[str], models: Models, device: str,
                   warm_all: bool) -> list[dict]:
    from contramine.pipeline.models.translate.settings import batch_token_budget

    settings, why = checkout_settings(settings)
    if why:
        return [row(f"{name}_tokens_per_s", device, None, "tokens/s", None, why)]
    _, _, shape = models.marian()
    tr = translator(models, device, settings)
    src = [len(x) for x in tr.tokenizer(texts, truncation=True, max_length=tr.cfg.max_length)["input_ids"]]
    budget = batch_token_budget(getattr(tr.cfg, "batch_tokens", 0), device, "hf")
    n_batches = len(tr.batches(sorted(src, reverse=True), 1))
    batching = f"batch_tokens {budget}" if budget else f"batch_size {tr.cfg.batch_size}"
    tr.translate(texts if warm_all else texts[:max(tr.cfg.batch_size, len(texts) // n_batches)])
    reset_peak(device)
    sync(device)
    t0 = time.perf_counter()
    out = tr.translate(texts)
    sync(device)
    s = time.perf_counter() - t0
    made = [len(o[0].split()) for o in out]
    decoder = getattr(tr.cfg, "decoder", "generate (this checkout's only path)")
    del tr
    return [row(f"{name}_tokens_per_s", device, round(sum(made) / s, 1), "tokens/s", None,
                f"Translator.translate, decoder {decoder}, {len(texts)} real-length rows of {sum(src) / len(src):.1f} "
                f"tokens (longest {max(src)}), {settings}: {batching}, {n_batches} length-sorted batches; "
                f"{sum(made)} target tokens in {s:.2f} s, {len(texts) / s:.1f} sentences/s; peak "
                f"{peak_mib(device)} {mem_unit(device)}", job="generate", flop=marian_flop(shape, src, made),
                seconds=s, precision=precision_of(device))]


def section_generate(models: Models, device: str, sizes: dict) -> list[dict]:
    """Raw HF generate on token ids (generate_hf, as measured since 2026-11-26), the pipeline's Translator per
    GENERATE_ROWS on `gen_n` real-length rows, plain HF generate on those rows as a user writes it
    (generate_user_hf, batch `gen_batch`), and CTranslate2 through the pipeline's own loader."""
    texts = marian_texts(models, sizes["gen_n"], seed=1)
    rows = guarded("generate_hf_tokens_per_s", "tokens/s", device, lambda: fixed_length_hf(models, device, sizes))
    for name, settings in GENERATE_ROWS.items():
        rows += guarded(f"{name}_tokens_per_s", "tokens/s", device,
                        lambda name=name, settings=settings: translator_row(name, settings, texts, models, device))
    # the peer on every 4th row (the same length distribution; ~100 s on an H200 at all 8,192 rows, which took the
    # check past its time limit)
    rows += guarded("generate_user_hf_tokens_per_s", "tokens/s", device,
                    lambda: user_hf(models, device, sizes, texts[::4] if len(texts) > 2048 else texts))
    rows += ct2_row(models, device, texts)
    return rows


def section_compiled(models: Models, device: str, sizes: dict) -> list[dict]:
    """COMPILED_ROWS on `gen_compile_n` real-length rows: the last section of the check (torch.compile can take
    minutes or leave the process unusable; every other row is measured and written before it starts)."""
    texts = marian_texts(models, sizes["gen_compile_n"], seed=2)
    rows = []
    for name, settings in COMPILED_ROWS.items():
        rows += guarded(f"{name}_tokens_per_s", "tokens/s", device,
                        lambda name=name, settings=settings: translator_row(name, settings, texts, models, device,
                                                                             warm_all=True))
    return rows


def fixed_length_hf(models: Models, device: str, sizes: dict) -> list[dict]:
    """HF generate on `gen_fixed_n` rows of `gen_src` random token ids, exactly `gen_tokens` new tokens each (eos
    suppressed until then), batch `gen_batch`: the model's decode rate with no ragged rows."""
    import torch
    from transformers import MarianMTModel

    from bench.fixtures.shapes import source_ids

    path, _, shape = models.marian()
    cuda = device.startswith("cuda")
    dtype = (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16) if cuda else torch.float32
    model = MarianMTModel.from_pretrained(path, dtype=dtype).to(device).eval()
    n, bs, length = sizes["gen_fixed_n"], sizes["gen_batch"], sizes["gen_tokens"]
    ids = source_ids(n, sizes["gen_src"], shape["vocab_size"])

    def hf(rows):
        out = []
        with torch.inference_mode():
            for b in range(0, len(rows), bs):
                x = rows[b:b + bs].to(device)
                seq = model.generate(input_ids=x, attention_mask=torch.ones_like(x), num_beams=1, do_sample=False,
                                     min_new_tokens=length, max_new_tokens=length)
                out += seq[:, 1:].tolist()
        return out

    hf(ids[:bs])
    reset_peak(device)
    sync(device)
    t0 = time.perf_counter()
    out = hf(ids)
    s = time.perf_counter() - t0
    if {len(r) for r in out} != {length}:
        raise RuntimeError("generate_hf: not every row decoded exactly gen_tokens tokens")
    what = (f"{sizes['marian']} Marian, {str(dtype).removeprefix('torch.')}, {n} rows of {sizes['gen_src']} tokens, "
            f"exactly {length} new tokens each, greedy, batch {bs}")
    del model
    return [row("generate_hf_tokens_per_s", device, round(n * length / s, 1), "tokens/s", None,
                f"{what}; {n / s:.1f} sentences/s; peak {peak_mib(device)} {mem_unit(device)}", job="generate",
                flop=marian_flop(shape, [sizes["gen_src"]] * n, [length] * n), seconds=s,
                precision=precision_of(device))]


def user_hf(models: Models, device: str, sizes: dict, texts: list[str]) -> list[dict]:
    """The peer on the Translator rows' texts and model: plain HF generate as a user writes it
    (`tokenizer(texts, padding=True)`, `model.generate(**inputs)`), batch `gen_batch` in input order, max_new_tokens
    its batch's largest row cap (the stage's caps); a row's useful tokens are counted up to its eos, at most its cap."""
    import torch

    from contramine.pipeline.models.translate.settings import row_limit

    _, _, shape = models.marian()
    tr = translator(models, device, checkout_settings({"decoder": "generate"})[0])
    tok, model, bs = tr.tokenizer, tr.model, sizes["gen_batch"]
    src = [len(x) for x in tok(texts, truncation=True, max_length=tr.cfg.max_length)["input_ids"]]
    limits = [row_limit(n, tr.cfg) for n in src]

    def user(n=len(texts)):
        seqs = []
        with torch.inference_mode():
            for b in range(0, n, bs):
                inputs = tok(texts[b:b + bs], padding=True, truncation=True, return_token_type_ids=False,
                             return_tensors="pt").to(device)
                seqs.append(model.generate(**inputs, max_new_tokens=max(limits[b:b + bs]), num_beams=1,
                                           do_sample=False))
        return seqs

    user(bs)  # warm-up: one batch
    sync(device)
    t0 = time.perf_counter()
    seqs = user()
    sync(device)
    s = time.perf_counter() - t0
    eos = model.generation_config.eos_token_id
    made = []
    for b, seq in enumerate(seqs):
        for r, ids in enumerate(seq[:, 1:].tolist()):
            n = ids.index(eos) if eos in ids else len(ids)
            made.append(min(n, limits[b * bs + r]))
    del tr, model
    return [row("generate_user_hf_tokens_per_s", device, round(sum(made) / s, 1), "tokens/s", None,
                f"plain HF generate as a user writes it: tokenizer(..., padding=True), model.generate(**inputs), "
                f"greedy, batch {bs} in input order, {len(texts)} of the same rows and model, max_new_tokens the "
                f"batch's largest row cap; {sum(made)} useful target tokens in {s:.2f} s", job="generate",
                flop=marian_flop(shape, src, made), seconds=s, precision=precision_of(device),
                peer_of=[f"{name}_tokens_per_s" for name in ("generate_default", "generate_ours", "generate_old")])]


def ct2_row(models: Models, device: str, texts: list[str]) -> list[dict]:
    """CTranslate2 on the same rows through the pipeline's loader (pipeline/models/translate/engines/ct2.py `load_engine`: the model
    converted once, CUDA 12's cuBLAS loaded first on a GPU as the stage loads it, pipeline/models/cublas.py), at the
    pipeline's compute type (float16 on a GPU, int8 on a CPU) and batching. Where its wheel or its CUDA 12 libraries
    are missing: no value and the one-line reason, not a failure."""
    cuda = device.startswith("cuda")
    compute = "float16" if cuda else "int8"
    name = f"generate_ct2_{compute}_tokens_per_s"
    try:
        from contramine.pipeline.config.backtranslation import BacktranslateCfg
        from contramine.pipeline.models.translate.engines import ct2
        from contramine.pipeline.models.cublas import load_cublas

        cublas = load_cublas() if cuda else "not needed on a CPU"
        path, _, _ = models.marian()
        tr = ct2.load_engine("opus-mt-shape", path, BacktranslateCfg(engine="ctranslate2"), device, compute)
        tr.translate(texts[:64])
        t0 = time.perf_counter()
        out = tr.translate(texts)
        s = time.perf_counter() - t0
        made = sum(len(o[0].split()) for o in out)
        import ctranslate2

        return [row(name, device, round(made / s, 1), "tokens/s", None,
                    f"CTranslate2 {ctranslate2.__version__} {compute} through pipeline/models/translate/engines/ct2.py load_engine "
                    f"(cuBLAS 12: {cublas or 'not found'}), the same {len(texts)} rows; {made} target tokens in "
                    f"{s:.2f} s, {len(texts) / s:.1f} sentences/s")]
    except Exception as e:  # the one-line reason (not installed, or its CUDA 12 libraries missing under CUDA 13)
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        print(f"generate_ct2: not measured: {reason}", flush=True)
        return [row(name, device, None, "tokens/s", None, f"not measured: {reason}")]
