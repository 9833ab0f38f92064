"""The speed sections of `make gpu-check` (bench/gpu_check.py has what they measure and how to run it): encoding,
the band search, training steps, generation. Standard library at import time; each section imports what it uses.
"""
from __future__ import annotations

import time

from bench.gpu_limits import bert_flop, config_of, marian_flop
from bench.gpu_sections import (BAND, Models, apply_settings, mem_unit, peak_mib, reset_peak, row, sync, texts_for,
                                topic_vectors)

# The rows each speed section measures: row name -> settings. A variant is one line (name: settings); after a change
# that adds a setting, add its row here. Settings of
# - ENCODE_ROWS: an `Encoder.encode` keyword, else an Encoder attribute (precision, ...);
# - SEARCH_ROWS: a `band_neighbours` keyword, else a TorchExact attribute (at 1M each row costs the full search);
# - GENERATE_ROWS: BacktranslateCfg fields on top of the stage's defaults (Translator.translate, the pipeline's way);
# - TRAIN_ROWS: TrainCfg fields (objective, ...).
ENCODE_ROWS = {"encode_float32": {"precision": "float32"}, "encode_bf16": {"precision": "bf16"},
               "encode_bf16_tokens65536": {"precision": "bf16", "batch_tokens": 65536}}
SEARCH_ROWS = {"band_search": {}, "band_search_tf32": {"precision": "tf32"}, "band_search_bf16": {"precision": "bf16"}}
GENERATE_ROWS = {"generate_ours": {}, "generate_rows32": {"batch_tokens": 0}, "generate_static": {"kv_cache": "static"},
                 "generate_static_compile": {"kv_cache": "static", "compile": True}}
TRAIN_ROWS = {f"train_{o}": {"objective": o} for o in ("simcse", "debcse", "osscse", "whitenedcse", "dclr")}
VARIANT_SHARE = 8  # SEARCH_ROWS past the first search this share of the queries (the 1M check's time: 5 minutes)
PRECISION = {"float32": "fp32", "tf32": "tf32", "bf16": "bf16", "fp16": "bf16"}  # a row's precision -> its gemm_* row


def section_encode(models: Models, device: str, sizes: dict) -> list[dict]:
    """`Encoder.encode` per ENCODE_ROWS, then the peer: sentence-transformers `encode` on the same model folder and
    sentences (a plain HF folder loads with mean pooling), same batch size, float32 and bf16 weights."""
    from pipeline.models.encoder import Encoder, resolve_precision

    enc = Encoder.load(str(models.bert()), pooler="mean", max_length=sizes["max_length"], device=device)
    texts = texts_for(sizes["encode_n"])
    lengths = [len(ids) for ids in enc.tokenizer(texts, truncation=True, max_length=sizes["max_length"])["input_ids"]]
    cfg = config_of(models.bert())
    flop = bert_flop(cfg, sum(lengths), sum(n * n for n in lengths))
    what = f"{sizes['bert']} BERT, {len(texts)} sentences ({sum(lengths) / len(texts):.1f} tokens each)"
    rows, ours = [], {}
    for name, settings in ENCODE_ROWS.items():
        before = {k: getattr(enc, k) for k in settings if hasattr(enc, k)}  # put back after the row
        call = {"batch_size": sizes["encode_batch"], **apply_settings(enc, enc.encode, settings)}
        enc.encode(texts[: max(64, len(texts) // 20)], **call)  # warm-up: kernels, caches
        reset_peak(device)
        sync(device)
        t0 = time.perf_counter()
        ours[name] = enc.encode(texts, **call)
        sync(device)
        s = time.perf_counter() - t0
        rows.append(row(name, device, round(len(texts) / s, 1), "sentences/s", None,
                        f"{what}, {settings} {call}, {s:.2f} s, peak {peak_mib(device)} {mem_unit(device)}",
                        job="encode", flop=flop, seconds=s,
                        precision=PRECISION.get(resolve_precision(enc.precision, device), "fp32")))
        for k, v in before.items():
            setattr(enc, k, v)
    del enc
    import sentence_transformers
    import torch

    st = sentence_transformers.SentenceTransformer(str(models.bert()), device=device)
    st.max_seq_length = sizes["max_length"]
    for precision, dtype in (("float32", torch.float32), ("bf16", torch.bfloat16)):
        st.to(dtype)
        kw = dict(batch_size=sizes["encode_batch"], normalize_embeddings=True, convert_to_numpy=True,
                  show_progress_bar=False)
        st.encode(texts[: max(64, len(texts) // 20)], **kw)
        reset_peak(device)
        sync(device)
        t0 = time.perf_counter()
        vecs = st.encode(texts, **kw)
        sync(device)
        s = time.perf_counter() - t0
        same = f"encode_{precision}"
        diff = float(abs(vecs.astype("float32") - ours[same]).max()) if same in ours else float("nan")
        rows.append(row(f"encode_st_{precision}", device, round(len(texts) / s, 1), "sentences/s", None,
                        f"sentence-transformers {sentence_transformers.__version__} encode, same model "
                        f"and sentences, batch {sizes['encode_batch']}, {precision} weights, {s:.2f} s; max |vector "
                        f"diff| vs {same}: {diff:.2g}", job="encode", flop=flop, seconds=s,
                        precision=PRECISION[precision], peer_of=same))
    del st
    return rows


def section_search(models: Models, device: str, sizes: dict) -> list[dict]:
    import numpy as np
    import torch

    from pipeline.search.band import band_neighbours
    from pipeline.search.torch_exact import TorchExact

    b = dict(BAND)
    try:  # the stage's defaults where the config imports (it needs pydantic); else the same numbers, written above
        from pipeline.config import NeighboursCfg

        c = NeighboursCfg()
        b = dict(lo=c.lo, hi=c.hi, pool_size=c.pool_size, slack=c.slack, max_block_elems=c.max_block_elems)
    except ImportError:
        pass
    n, q, d = sizes["search_n"], min(sizes["search_queries"], sizes["search_n"]), sizes["search_d"]
    t0 = time.perf_counter()
    x = topic_vectors(n, d)
    sids = np.arange(n, dtype=np.int64)
    made = time.perf_counter() - t0
    torch.set_float32_matmul_precision("highest")  # TorchExact refuses TF32 scores (the band search's error bound)
    rows, full = [], q
    for name, settings in SEARCH_ROWS.items():
        q = full if not rows else max(1, full // VARIANT_SHARE)  # a variant: a share of the queries, the whole base
        reset_peak(device)
        t0 = time.perf_counter()
        index = TorchExact(x, device)
        call = apply_settings(index, band_neighbours, settings)
        table = band_neighbours(x[:q], sids[:q], x, sids, index, index, b["lo"], b["hi"], b["pool_size"],
                                **{"slack": b["slack"], "max_block_elems": b["max_block_elems"], **call})
        s = time.perf_counter() - t0
        peak = peak_mib(device)
        del index
        note = (f"{q} queries x {n} base x {d}, band {b['lo']}-{b['hi']}, pool {b['pool_size']}, {settings}: "
                f"{table.num_rows} pool rows ({table.num_rows / q:.1f}/query); vectors made in {made:.1f} s "
                f"(not timed)")
        rows += [row(f"{name}_seconds", device, round(s, 2), "s", None, note, job="search", flop=2.0 * q * n * d,
                     seconds=s, precision=PRECISION[settings.get("precision", "float32")], queries=q, base=n),
                 row(f"{name}_queries_per_s", device, round(q / s, 1), "queries/s", None, note),
                 row(f"{name}_peak_memory", device, peak, mem_unit(device), None, "base on the device + one block")]
    return rows


def section_train(models: Models, device: str, sizes: dict) -> list[dict]:
    import numpy as np
    import torch

    from pipeline.config import TrainCfg
    from pipeline.models.encoder import Encoder
    from trainer.metrics_log import MetricWindow
    from trainer.objectives import OBJECTIVES
    from trainer.precision import restored_float32_settings

    cuda = device.startswith("cuda")
    amp = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else (torch.float16 if cuda else None)
    texts = texts_for(sizes["train_batch"] * 4 * (sizes["train_warmup"] + sizes["train_steps"]))
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((len(texts), 384)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    n = len(texts) // 4
    data = [{"sid": i, "text": texts[i], "positives": [texts[n + i]], "negatives": [texts[2 * n + i], texts[3 * n + i]],
             "paraphrase": texts[n + i], "negation": texts[i] + " not", "emb": emb[i]} for i in range(n)]
    rows = []
    with restored_float32_settings():
        if cuda:  # as trainer/train.py on a GPU
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        bert = config_of(models.bert())
        dim = bert["hidden_size"]
        for row_name, settings in TRAIN_ROWS.items():
            name = settings.get("objective", "debcse")
            cls = OBJECTIVES[name]
            own = {"groups": 128 if dim % 128 == 0 else 8} if name == "whitenedcse" else {}
            tc = TrainCfg(**{"batch_size": sizes["train_batch"], "max_length": sizes["train_max_length"],
                             **({name: own} if own else {}), **settings})
            reset_peak(device)
            torch.manual_seed(0)
            enc = Encoder.load(str(models.bert()), pooler=cls.pooler or "cls_before_pooler", max_length=64,
                               device=device, hidden_dropout_prob=tc.dropout, attention_probs_dropout_prob=tc.dropout)
            enc.unpad = tc.unpad
            obj = cls(enc, tc).to(device).train()
            params = [p for p in obj.parameters() if p.requires_grad]
            opt = torch.optim.AdamW(params, lr=tc.lr, fused=True)
            scaler = torch.amp.GradScaler(device.split(":")[0], enabled=amp is torch.float16)
            bs = sizes["train_batch"]
            n_batches = sizes["train_warmup"] + sizes["train_steps"]
            batches = [obj.collate(data[i * bs:(i + 1) * bs]) for i in range(n_batches)]
            tokens = [0]  # real tokens through the encoder in the timed steps (packed: exact; padded: with pads)

            def count(module, args, kwargs):
                ids = kwargs.get("input_ids", args[0] if args else None)
                if t0 is not None and ids is not None:
                    tokens[0] += ids.numel()

            hook = enc.model.register_forward_pre_hook(count, with_kwargs=True)
            t0, window, last = None, MetricWindow(), {}
            for step, batch in enumerate(batches):
                if step == sizes["train_warmup"]:
                    sync(device)
                    t0 = time.perf_counter()
                batch = {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
                with torch.autocast(device.split(":")[0], dtype=amp, enabled=amp is not None):
                    loss, metrics = obj(batch)
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                grad_norm = torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
                scaler.step(opt)
                scaler.update()
                opt.zero_grad(set_to_none=True)
                window.add({"loss": loss.detach(), "grad_norm": grad_norm, **metrics})  # on the device, as
                if (step + 1) % tc.log_every == 0:                                     # trainer/train.py keeps
                    last = window.read()[0]                                            # them: one read a row
            sync(device)
            last = window.read()[0] if window.steps else last
            s = time.perf_counter() - t0
            hook.remove()
            note = (f"{sizes['bert']} BERT, batch {bs} x <= {sizes['train_max_length']} tokens, "
                    f"{'bf16' if amp is torch.bfloat16 else 'fp16' if amp else 'float32'}"
                    f"{' + TF32' if cuda else ''}, {settings}, {sizes['train_steps']} steps after "
                    f"{sizes['train_warmup']}, {tokens[0] / sizes['train_steps']:.0f} tokens a step through the "
                    f"encoder; loss {last.get('loss', float('nan')):.3f}, grad norm {last.get('grad_norm', float('nan')):.3g} "
                    f"(the last row's means); the step's numbers read once every {tc.log_every} steps, as "
                    f"trainer/train.py reads them")
            rows.append(row(f"{row_name}_steps_per_s", device, round(sizes["train_steps"] / s, 3), "steps/s", None,
                            note, job="encode", flop=bert_flop(bert, tokens[0], passes=3), seconds=s,
                            precision="bf16" if amp is not None else "fp32"))  # job "encode": its matmuls' shapes
            rows.append(row(f"{row_name}_peak_memory", device, peak_mib(device), mem_unit(device), None, note))
            del obj, enc, opt, batches, params
    return rows


def marian_texts(models: Models, n: int, seed: int = 0, max_words: int = 64) -> list[str]:
    """n source rows for the opus-mt-shaped Marian (its vocabulary is placeholder words, bench/shapes.py), as many
    words each as the sentences of `texts_for` (ragged, as real sentences), 4 to `max_words`."""
    import random

    _, tokens, shape = models.marian()
    rng = random.Random(seed)
    words = tokens[2:-1]  # not </s>, <unk>, <pad>
    return [" ".join(rng.choice(words) for _ in range(min(max_words, max(4, len(t.split())))))
            for t in texts_for(n)]


def translator(models: Models, device: str, settings: dict):
    """The pipeline's HF engine (`load_engine`, the backtranslate stage's loader) on the opus-mt-shaped Marian, in
    the dtype the stage picks on that device, with the stage's defaults + `settings` (BacktranslateCfg fields)."""
    import torch

    from pipeline.config.backtranslation import BacktranslateCfg
    from pipeline.models.translator import load_engine

    cuda = device.startswith("cuda")
    dtype = ("bfloat16" if torch.cuda.is_bf16_supported() else "float16") if cuda else "float32"
    path, _, _ = models.marian()
    return load_engine("opus-mt-shape", str(path), BacktranslateCfg(**settings), device, dtype)


def section_generate(models: Models, device: str, sizes: dict) -> list[dict]:
    """Raw HF generate on token ids (generate_hf, as measured since 2026-11-26), the pipeline's Translator per
    GENERATE_ROWS, plain HF generate as a user writes it (generate_user_hf), and CTranslate2."""
    import torch
    from transformers import MarianMTModel

    from bench.shapes import source_ids

    path, tokens, shape = models.marian()
    cuda = device.startswith("cuda")
    dtype = (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16) if cuda else torch.float32
    prec = "bf16" if cuda else "fp32"
    model = MarianMTModel.from_pretrained(path, dtype=dtype).to(device).eval()
    n, bs, length = sizes["gen_n"], sizes["gen_batch"], sizes["gen_tokens"]
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
    assert {len(r) for r in out} == {length}, "generate_hf: not every row decoded exactly gen_tokens tokens"
    what = (f"{sizes['marian']} Marian, {str(dtype).removeprefix('torch.')}, {n} rows of {sizes['gen_src']} tokens, "
            f"exactly {length} new tokens each, greedy, batch {bs}")
    rows = [row("generate_hf_tokens_per_s", device, round(n * length / s, 1), "tokens/s", None,
                f"{what}; {n / s:.1f} sentences/s; peak {peak_mib(device)} {mem_unit(device)}", job="generate",
                flop=marian_flop(shape, [sizes["gen_src"]] * n, [length] * n), seconds=s, precision=prec)]
    del model
    rows += generate_pipeline_and_user(models, device, sizes, prec)
    compute = "float16" if cuda else "int8"
    try:
        import ctranslate2

        folder = path.parent / f"ct2-{compute}"
        if not folder.is_dir():
            ctranslate2.converters.TransformersConverter(str(path)).convert(str(folder), quantization=compute)
        threads = torch.get_num_threads()
        kw = {} if cuda else dict(inter_threads=threads, intra_threads=1)  # the pipeline's CPU setting (ct2.py)
        tr = ctranslate2.Translator(str(folder), device="cuda" if cuda else "cpu", compute_type=compute, **kw)
        torch.set_num_threads(threads)
        src = [[tokens[i] for i in r] for r in ids.tolist()]
        opts = dict(max_batch_size=bs, batch_type="examples", beam_size=1, min_decoding_length=length,
                    max_decoding_length=length)
        tr.translate_batch(src[:bs], **opts)
        t0 = time.perf_counter()
        res = tr.translate_batch(src, **opts)
        s2 = time.perf_counter() - t0
        assert {len(r.hypotheses[0]) for r in res} == {length}, "generate_ct2: not every row decoded gen_tokens"
        rows.append(row(f"generate_ct2_{compute}_tokens_per_s", device, round(n * length / s2, 1), "tokens/s", None,
                        f"CTranslate2 {ctranslate2.__version__} {compute}, same rows; {n / s2:.1f} sentences/s; "
                        f"x{s / s2:.2f} HF generate"))
    except Exception as e:  # the one-line reason (not installed, or its CUDA 12 libraries missing under CUDA 13)
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        print(f"generate_ct2: not measured: {reason}", flush=True)
        rows.append(row(f"generate_ct2_{compute}_tokens_per_s", device, None, "tokens/s", None,
                        f"not measured: {reason}"))
    return rows


def generate_pipeline_and_user(models: Models, device: str, sizes: dict, prec: str) -> list[dict]:
    """`Translator.translate` per GENERATE_ROWS (the stage's defaults: its batch size, each row's own length cap),
    then the peer on the same rows and model: plain HF generate at batch `gen_batch` as a user writes it
    (`tokenizer(texts, padding=True)`, `model.generate(**inputs)`), max_new_tokens its batch's largest row cap. The
    random model never ends a row itself: every row decodes to its cap, the same target tokens on both sides."""
    import torch

    from pipeline.models.translation import batch_token_budget, row_limit

    _, _, shape = models.marian()
    texts = marian_texts(models, sizes["gen_n"], seed=1)
    rows, first = [], None
    for name, settings in GENERATE_ROWS.items():
        tr = translator(models, device, settings)
        src = [len(x) for x in tr.tokenizer(texts, truncation=True, max_length=tr.cfg.max_length)["input_ids"]]
        budget = batch_token_budget(getattr(tr.cfg, "batch_tokens", 0), device, "hf")
        batching = f"batch_tokens {budget}" if budget else f"batch_size {tr.cfg.batch_size}"
        # warm-up; a compiled step compiles for each batch shape: every shape of the timed pass, compiled here
        tr.translate(texts if settings.get("compile") else texts[:tr.cfg.batch_size])
        reset_peak(device)
        sync(device)
        t0 = time.perf_counter()
        out = tr.translate(texts)
        sync(device)
        s = time.perf_counter() - t0
        made = [len(o[0].split()) for o in out]
        rows.append(row(f"{name}_tokens_per_s", device, round(sum(made) / s, 1), "tokens/s", None,
                        f"Translator.translate, {len(texts)} rows of {sum(src) / len(src):.1f} tokens, {settings}: "
                        f"{batching}, {sum(made)} target tokens in {s:.2f} s, "
                        f"{len(texts) / s:.1f} sentences/s; peak {peak_mib(device)} {mem_unit(device)}",
                        job="generate", flop=marian_flop(shape, src, made), seconds=s, precision=prec))
        first = first or (tr, src, rows[-1])
        if len(GENERATE_ROWS) > 1:
            del tr
    tr, src, ours = first
    tok, model, bs = tr.tokenizer, tr.model, sizes["gen_batch"]
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
    for b, seq in enumerate(seqs):  # a row's useful tokens: up to its eos, at most its cap
        for r, ids in enumerate(seq[:, 1:].tolist()):
            n = ids.index(eos) if eos in ids else len(ids)
            made.append(min(n, limits[b * bs + r]))
    rows.append(row("generate_user_hf_tokens_per_s", device, round(sum(made) / s, 1), "tokens/s", None,
                    f"plain HF generate as a user writes it: tokenizer(..., padding=True), model.generate(**inputs), "
                    f"greedy, batch {bs} in input order, same model and rows, max_new_tokens the batch's largest row "
                    f"cap; {sum(made)} useful target tokens in {s:.2f} s", job="generate",
                    flop=marian_flop(shape, src, made), seconds=s, precision=prec, peer_of=ours["name"]))
    del tr, model
    return rows
