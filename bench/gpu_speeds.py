"""The speed sections of `make gpu-check` (bench/gpu_check.py has what they measure and how to run it): encoding,
the band search, training steps, generation. Standard library at import time; each section imports what it uses.
"""
from __future__ import annotations

import json
import time

from bench.gpu_sections import BAND, Models, mem_unit, peak_mib, reset_peak, row, sync, texts_for, topic_vectors

def section_encode(models: Models, device: str, sizes: dict) -> list[dict]:
    from pipeline.models.encoder import Encoder

    enc = Encoder.load(str(models.bert()), pooler="mean", max_length=sizes["max_length"], device=device)
    texts = texts_for(sizes["encode_n"])
    tokens = sum(len(ids) for ids in enc.tokenizer(texts, truncation=True, max_length=sizes["max_length"])["input_ids"])
    rows = []
    for precision in ("float32", "bf16"):
        enc.precision = precision
        enc.encode(texts[: max(64, len(texts) // 20)], batch_size=sizes["encode_batch"])  # warm-up: kernels, caches
        reset_peak(device)
        sync(device)
        t0 = time.perf_counter()
        enc.encode(texts, batch_size=sizes["encode_batch"])
        sync(device)
        s = time.perf_counter() - t0
        rows.append(row(f"encode_{precision}", device, round(len(texts) / s, 1), "sentences/s", None,
                        f"{sizes['bert']} BERT, {len(texts)} sentences ({tokens / len(texts):.1f} tokens each), "
                        f"batch {sizes['encode_batch']}, {s:.2f} s, peak {peak_mib(device)} {mem_unit(device)}"))
    del enc
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
    reset_peak(device)
    t0 = time.perf_counter()
    index = TorchExact(x, device)
    table = band_neighbours(x[:q], sids[:q], x, sids, index, index, b["lo"], b["hi"], b["pool_size"], b["slack"],
                            b["max_block_elems"])
    s = time.perf_counter() - t0
    peak = peak_mib(device)
    del index
    note = (f"{q} queries x {n} base x {d}, band {b['lo']}-{b['hi']}, pool {b['pool_size']}: {table.num_rows} pool "
            f"rows ({table.num_rows / q:.1f}/query); vectors made in {made:.1f} s (not timed)")
    return [row("band_search_seconds", device, round(s, 2), "s", None, note),
            row("band_search_queries_per_s", device, round(q / s, 1), "queries/s", None, note),
            row("band_search_peak_memory", device, peak, mem_unit(device), None, "base on the device + one block")]


def section_train(models: Models, device: str, sizes: dict) -> list[dict]:
    import numpy as np
    import torch

    from pipeline.config import TrainCfg
    from pipeline.models.encoder import Encoder
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
        dim = json.loads((models.bert() / "config.json").read_text())["hidden_size"]
        for name, cls in OBJECTIVES.items():
            own = {"groups": 128 if dim % 128 == 0 else 8} if name == "whitenedcse" else {}
            tc = TrainCfg(objective=name, batch_size=sizes["train_batch"], max_length=sizes["train_max_length"],
                          **({name: own} if own else {}))
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
            t0 = None
            for step, batch in enumerate(batches):
                if step == sizes["train_warmup"]:
                    sync(device)
                    t0 = time.perf_counter()
                batch = {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
                with torch.autocast(device.split(":")[0], dtype=amp, enabled=amp is not None):
                    loss, _ = obj(batch)
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
                scaler.step(opt)
                scaler.update()
                opt.zero_grad(set_to_none=True)
            sync(device)
            s = time.perf_counter() - t0
            note = (f"{sizes['bert']} BERT, batch {bs} x <= {sizes['train_max_length']} tokens, "
                    f"{'bf16' if amp is torch.bfloat16 else 'fp16' if amp else 'float32'}"
                    f"{' + TF32' if cuda else ''}, {sizes['train_steps']} steps after {sizes['train_warmup']}; "
                    f"loss {loss.item():.3f}")
            rows.append(row(f"train_{name}_steps_per_s", device, round(sizes["train_steps"] / s, 3), "steps/s", None,
                            note))
            rows.append(row(f"train_{name}_peak_memory", device, peak_mib(device), mem_unit(device), None, note))
            del obj, enc, opt, batches, params
    return rows


def section_generate(models: Models, device: str, sizes: dict) -> list[dict]:
    import torch
    from transformers import MarianMTModel

    from bench.shapes import source_ids

    path, tokens, shape = models.marian()
    cuda = device.startswith("cuda")
    dtype = (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16) if cuda else torch.float32
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
                f"{what}; {n / s:.1f} sentences/s; peak {peak_mib(device)} {mem_unit(device)}")]
    del model
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
