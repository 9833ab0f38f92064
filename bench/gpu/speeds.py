"""The speed sections of `make gpu-check` (bench/gpu/check.py has what they measure and how to run it): encoding,
the band search, training steps (translation: bench/gpu/generate.py). Standard library at import time; each section
imports what it uses.
"""
from __future__ import annotations

import time
from contextlib import nullcontext

from bench.gpu.limits import bert_flop, config_of
from bench.gpu.sections import (BAND, CUDNN_ATTENTION, Models, apply_settings, attention_setting, guarded,
                                mem_unit, peak_mib, reset_peak, row, simcse_like_vectors, sync, texts_for,
                                topic_vectors)

# The rows each speed section measures: row name -> settings. A variant is one line (name: settings); after a change
# that adds a setting, add its row here. Settings of
# - ENCODE_ROWS: an `Encoder.encode` keyword, else an Encoder attribute (precision, ...);
# - SEARCH_ROWS: a `band_neighbours` keyword, else a TorchExact attribute (at 1M each row costs the full search);
# - TRAIN_ROWS: TrainCfg fields (objective, ...).
# The goal's row first (the deadline takes the last rows first): encode_bf16 is the stage's way on a GPU (precision
# auto = bf16, the Encoder's token budget); "encode_bf16_cudnn": encode_bf16 with SDPA free to pick cuDNN's
# attention (sections.CUDNN_ATTENTION), as before 2026-11-28's attention_kernels: on the H200 a cuDNN plan built a
# batch made bf16 slower than float32.
ENCODE_ROWS = {"encode_bf16": {"precision": "bf16"}, "encode_bf16_cudnn": {"precision": "bf16", CUDNN_ATTENTION: True},
               "encode_float32": {"precision": "float32"},
               "encode_bf16_tokens65536": {"precision": "bf16", "batch_tokens": 65536}}
# The peer, sentence-transformers in bf16 weights: row name -> (cuDNN's attention allowed, the row it is the peer of).
# Without cuDNN (the pipeline's kernels) it is issue 63's goal's peer: the ratio compares kernels, not plans; with
# it, what a user gets by default, set against our row that allows it too.
ST_ROWS = {"encode_st_bf16_nocudnn": (False, "encode_bf16"), "encode_st_bf16": (True, "encode_bf16_cudnn")}
# SEARCH_ROWS: `d` (debcse-paper's bert-base encoder: 768), `vectors` ("dense": sections.simcse_like_vectors, where
# the band is dense and rows widen, as on real sentences; "topics": sections.topic_vectors, sparse bands, the
# vectors of the H200's 2026-11-28 rows), `share` (the row searches search_queries / share queries against the whole
# base; the projection scales it to 1M x 1M) + settings. A row without "precision" scores as the stage does
# (neighbours.score_precision = "auto": bf16 on a GPU, float32 on the CPU twin).
SEARCH_ROWS = {"band_search_d768": {"d": 768, "vectors": "dense", "share": 4},
               "band_search_d768_float32": {"d": 768, "vectors": "dense", "share": 16, "precision": "float32"},
               "band_search_d768_topics": {"d": 768, "vectors": "topics", "share": 8}}
TRAIN_ROWS = {f"train_{o}": {"objective": o} for o in ("debcse", "simcse", "osscse", "whitenedcse", "dclr")}
PROFILED_SEARCH = "band_search_d768"  # after it, two of its blocks under torch.profiler (profile_search)
PRECISION = {"float32": "fp32", "tf32": "tf32", "bf16": "bf16", "fp16": "bf16"}  # a row's precision -> its gemm_* row


def section_encode(models: Models, device: str, sizes: dict) -> list[dict]:
    """`Encoder.encode` per ENCODE_ROWS, then the peer: sentence-transformers `encode` on the same model folder and
    sentences (a plain HF folder loads with mean pooling), same batch size, float32 and bf16 weights."""
    from contramine.pipeline.models.encode.encoder import Encoder, resolve_precision

    enc = Encoder.load(str(models.bert()), pooler="mean", max_length=sizes["max_length"], device=device)
    texts = texts_for(sizes["encode_n"])
    lengths = [len(ids) for ids in enc.tokenizer(texts, truncation=True, max_length=sizes["max_length"])["input_ids"]]
    cfg = config_of(models.bert())
    flop = bert_flop(cfg, sum(lengths), sum(n * n for n in lengths))
    what = f"{sizes['bert']} BERT, {len(texts)} sentences ({sum(lengths) / len(texts):.1f} tokens each)"
    rows, ours = [], {}
    for name, settings in ENCODE_ROWS.items():

        def measure(name=name, settings=settings):
            before = {k: getattr(enc, k) for k in settings if hasattr(enc, k)}  # put back after the row
            try:
                with attention_setting(settings) as encode_settings:
                    call = {"batch_size": sizes["encode_batch"], **apply_settings(enc, enc.encode, encode_settings)}
                    enc.encode(texts[: max(64, len(texts) // 20)], **call)  # warm-up: kernels, caches
                    reset_peak(device)
                    sync(device)
                    t0 = time.perf_counter()
                    ours[name] = enc.encode(texts, **call)
                    sync(device)
                    s = time.perf_counter() - t0
                return [row(name, device, round(len(texts) / s, 1), "sentences/s", None,
                            f"{what}, {settings} {call}, {s:.2f} s, peak {peak_mib(device)} {mem_unit(device)}",
                            job="encode", flop=flop, seconds=s,
                            precision=PRECISION.get(resolve_precision(enc.precision, device), "fp32"))]
            finally:
                for k, v in before.items():
                    setattr(enc, k, v)

        rows += guarded(name, "sentences/s", device, measure)
    del enc
    import sentence_transformers
    import torch

    from contramine.pipeline.models.attention_kernels import without_cudnn_attention

    st = sentence_transformers.SentenceTransformer(str(models.bert()), device=device).to(torch.bfloat16)
    st.max_seq_length = sizes["max_length"]
    for name, (cudnn, same) in ST_ROWS.items():

        def peer(name=name, cudnn=cudnn, same=same):
            kw = dict(batch_size=sizes["encode_batch"], normalize_embeddings=True, convert_to_numpy=True,
                      show_progress_bar=False)
            with nullcontext() if cudnn else without_cudnn_attention(device):
                st.encode(texts[: max(64, len(texts) // 20)], **kw)
                reset_peak(device)
                sync(device)
                t0 = time.perf_counter()
                vecs = st.encode(texts, **kw)
                sync(device)
                s = time.perf_counter() - t0
            diff = float(abs(vecs.astype("float32") - ours[same]).max()) if same in ours else float("nan")
            return [row(name, device, round(len(texts) / s, 1), "sentences/s", None,
                        f"sentence-transformers {sentence_transformers.__version__} encode, same model "
                        f"and sentences, batch {sizes['encode_batch']}, bf16 weights, cuDNN attention "
                        f"{'allowed (its default)' if cudnn else 'off (the pipeline kernels)'}, {s:.2f} s; max "
                        f"|vector diff| vs {same}: {diff:.2g}", job="encode", flop=flop, seconds=s, precision="bf16",
                        peer_of=same)]

        rows += guarded(name, "sentences/s", device, peer)
    del st
    return rows


def stage_precision(device: str) -> str:
    """The score precision the neighbours stage resolves on `device` at its defaults (float32 where the checkout
    predates neighbours.score_precision or the config does not import)."""
    try:
        from contramine.pipeline.config import NeighboursCfg
        from contramine.pipeline.search.torch_exact import score_precision

        return score_precision(NeighboursCfg().score_precision, device)
    except (ImportError, AttributeError):
        return "float32"


def section_search(models: Models, device: str, sizes: dict) -> list[dict]:
    """`band_neighbours` with TorchExact per SEARCH_ROWS (each on `search_queries` / its share of queries against
    the whole base of `search_n` vectors of its kind), and after the first row at each dimension the card's GEMM rate
    at the block that search took (`TorchExact.band_rows`, read before it ran: the block band() sizes)."""
    import numpy as np
    import torch

    from bench.gpu.limits import gemm_rows
    from contramine.pipeline.search.band import band_neighbours
    from contramine.pipeline.search.torch_exact import TorchExact

    b = dict(BAND)
    try:  # the stage's defaults where the config imports (it needs pydantic); else the same numbers, written above
        from contramine.pipeline.config import NeighboursCfg

        c = NeighboursCfg()
        b = dict(lo=c.lo, hi=c.hi, pool_size=c.pool_size, slack=c.slack, max_block_elems=c.max_block_elems)
    except ImportError:
        pass
    n, full = sizes["search_n"], min(sizes["search_queries"], sizes["search_n"])
    sids = np.arange(n, dtype=np.int64)
    torch.set_float32_matmul_precision("highest")  # TorchExact refuses TF32 scores (the band search's error bound)
    rows, vectors, blocks = [], {}, {}
    for name, settings in SEARCH_ROWS.items():
        settings = dict(settings)
        d, kind, share = settings.pop("d"), settings.pop("vectors"), settings.pop("share", 1)
        settings.setdefault("precision", stage_precision(device))
        q = max(1, full // share)
        # the row's target seconds: `search_s` for the goal row, less for a row of a smaller share (a search whose
        # rows widen more than expected still leaves the check its time, at fewer queries, scaled as before)
        target = sizes["search_s"] * SEARCH_ROWS[PROFILED_SEARCH].get("share", 1) / share
        if (kind, d) not in vectors:
            vectors.clear()  # one base in memory at a time (1M x 768 float32: 3 GB)
            t0 = time.perf_counter()
            base = simcse_like_vectors(n, d, device=device) if kind == "dense" else topic_vectors(n, d)
            vectors[kind, d] = (base, time.perf_counter() - t0)
        x, made = vectors[kind, d]

        def measure(name=name, settings=settings, d=d, q=q, x=x, made=made, kind=kind, target=target):
            reset_peak(device)
            t0 = time.perf_counter()
            index = TorchExact(x, device, block_rows=sizes["search_block"] or None)  # 0: as the stage sizes it
            call = apply_settings(index, band_neighbours, settings)
            if index.precision != "float32":
                index.check_bound()  # what band() runs first: once a search, whatever its queries
            sync(device)
            setup = time.perf_counter() - t0  # the base to the device and the precision check: once, not per query
            block = min(q, index.band_rows())  # what band() takes on entry (free memory with the base loaded)
            run, sized = q, ""
            if block < q:  # one block first (a warm-up too), then as many queries as fit the row's target time
                t1 = time.perf_counter()
                band_search(index, x, sids, block, b, call)
                sync(device)
                probe = time.perf_counter() - t1
                run = min(q, max(block, int(block * target / max(probe, 1e-6))))
                sized = f" ({run} of its {q}: a {block}-query block took {probe:.2f} s; target {target:g} s)"
            t1 = time.perf_counter()
            table = band_search(index, x, sids, run, b, call)
            sync(device)
            s = setup + time.perf_counter() - t1
            peak = peak_mib(device)
            del index
            blocks.setdefault(d, block)
            note = (f"{run} queries{sized} x {n} base x {d}, {kind} vectors, band {b['lo']}-{b['hi']}, pool "
                    f"{b['pool_size']}, {settings}: {table.num_rows} pool rows ({table.num_rows / run:.1f}/query), "
                    f"blocks of {block} queries; {setup:.2f} s of it once a search (the base to the device, the "
                    f"precision check); vectors made in {made:.1f} s (not timed)")
            q = run
            return [row(f"{name}_seconds", device, round(s, 2), "s", None, note, job=f"search_d{d}",
                        flop=2.0 * q * n * d, seconds=s, precision=PRECISION[settings.get("precision", "float32")],
                        queries=q, base=n, d=d, setup_seconds=round(setup, 3)),
                    row(f"{name}_queries_per_s", device, round(q / s, 1), "queries/s", None, note),
                    row(f"{name}_peak_memory", device, peak, mem_unit(device), None,
                        "base on the device + one block")]

        rows += guarded(f"{name}_seconds", "s", device, measure)
        if name == PROFILED_SEARCH and d in blocks:
            rows += guarded("profile_search_busy", "of wall", device,
                            lambda x=x, d=d, settings=settings: profile_search(models, device, x, sids, d, blocks[d],
                                                                               settings, b))
        if d in blocks and not any(r["name"].startswith(f"gemm_search_d{d}_") for r in rows):
            rows += gemm_rows(f"search_d{d}", (blocks[d], d, n), device,
                              f"the block of queries the {name} search took (TorchExact.band_rows)")
    del vectors
    return rows


def band_search(index, x, sids, q: int, b: dict, call: dict):
    """The stage's band search of the first `q` vectors against all of `x` (both the base), with `index` (a
    TorchExact), the band settings `b` and a row's `call` keywords: its `neighbours` table."""
    from contramine.pipeline.search.band import band_neighbours

    return band_neighbours(x[:q], sids[:q], x, sids, index, index, b["lo"], b["hi"], b["pool_size"],
                           **{"slack": b["slack"], "max_block_elems": b["max_block_elems"], **call})


def profile_search(models: Models, device: str, x, sids, d: int, block: int, settings: dict, b: dict) -> list[dict]:
    """torch.profiler over two blocks of PROFILED_SEARCH's band search (the block band() took, the base and the
    precision check ready before): profile_search.json.gz and profile_search.txt beside results.json, so a lease
    shows where a block's time goes besides its GEMM (the H200's: 66 ms a block, 5 ms of it GEMM)."""
    from bench.gpu.limits import _profiled
    from contramine.pipeline.search.band import band_neighbours
    from contramine.pipeline.search.torch_exact import TorchExact

    out = models.out
    out.mkdir(parents=True, exist_ok=True)
    index = TorchExact(x, device, block_rows=block)
    call = apply_settings(index, band_neighbours, settings)
    band_search(index, x, sids, 16, b, call)  # warm-up
    q = min(len(x), 2 * block)
    wall, table, busy = _profiled(lambda: band_search(index, x, sids, q, b, call), device,
                                  out / "profile_search.json.gz",
                                  f"band search: {q} queries (2 blocks of {block}) x {len(x)} x {d}")
    (out / "profile_search.txt").write_text(table)
    del index
    what = "device" if device.startswith("cuda") else "ops (CPU twin)"
    return [row("profile_search_busy", device, round(busy, 3), "of wall", None,
                f"{what} busy {busy:.0%} of {wall:.2f} s: {q} queries, {settings}; {out / 'profile_search.json.gz'}, "
                f"{out / 'profile_search.txt'}")]


def section_train(models: Models, device: str, sizes: dict) -> list[dict]:
    import numpy as np
    import torch

    from contramine.pipeline.config import TrainCfg
    from contramine.pipeline.models.encode.encoder import Encoder
    from contramine.trainer.metrics_log import MetricWindow
    from contramine.trainer.objectives import OBJECTIVES
    from contramine.trainer.precision import restored_float32_settings

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

            def measure(row_name=row_name, settings=settings):
                name = settings.get("objective", "debcse")
                cls = OBJECTIVES[name]
                own = {"groups": 128 if dim % 128 == 0 else 8} if name == "whitenedcse" else {}
                tc = TrainCfg(**{"batch_size": sizes["train_batch"], "max_length": sizes["train_max_length"],
                                 **({name: own} if own else {}), **settings})
                reset_peak(device)
                torch.manual_seed(0)
                enc = Encoder.load(str(models.bert()), pooler=cls.pooler or "cls_before_pooler", max_length=64,
                                   device=device, hidden_dropout_prob=tc.dropout,
                                   attention_probs_dropout_prob=tc.dropout)
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
                        f"encoder; loss {last.get('loss', float('nan')):.3f}, grad norm "
                        f"{last.get('grad_norm', float('nan')):.3g} "
                        f"(the last row's means); the step's numbers read once every {tc.log_every} steps, as "
                        f"trainer/train.py reads them")
                out = [row(f"{row_name}_steps_per_s", device, round(sizes["train_steps"] / s, 3), "steps/s", None,
                           note, job="encode", flop=bert_flop(bert, tokens[0], passes=3), seconds=s,
                           precision="bf16" if amp is not None else "fp32"),  # job "encode": its matmuls' shapes
                       row(f"{row_name}_peak_memory", device, peak_mib(device), mem_unit(device), None, note)]
                del obj, enc, opt, batches, params
                return out

            rows += guarded(f"{row_name}_steps_per_s", "steps/s", device, measure)
    return rows
