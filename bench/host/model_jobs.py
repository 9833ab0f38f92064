"""The host bench's model jobs (bench/host/jobs.py runs them): the encoder's `encode`, the translator's greedy
`translate`, and one DebCSE step of trainer/train.py's loop, each on a hollow model (bench/host/hollow.py).
"""
from __future__ import annotations

import time
from pathlib import Path

from bench.host.hollow import hollow_bert, hollow_marian
from bench.host.measure import apply_settings, best_of, count_ops, from_config, lines


def job_encode(data: Path, sizes: dict, settings: dict) -> dict:
    """`Encoder.encode` over wiki1m lines at the encoder's default batch size, the GPU's precision (bf16)."""
    from transformers import AutoTokenizer

    from contramine.pipeline.config.mining import EncoderCfg
    from contramine.pipeline.models.encode.encoder import Encoder

    tok = AutoTokenizer.from_pretrained(data / "bert")
    model = hollow_bert(len(tok)).eval()
    enc = Encoder(model, tok, pooler="mean", max_length=128, precision="bf16")
    texts = lines(data, sizes["encode_n"])
    call = {**from_config(EncoderCfg(), enc.encode), **apply_settings(enc, enc.encode, settings)}
    rules = gpu_rules(enc, call)
    encode = rules or enc.encode
    encode(texts[: max(64, len(texts) // 20)], **call)  # warm-up
    model.calls = 0
    timing = best_of(lambda: encode(texts, **call), sizes["repeats"])
    calls = model.calls // sizes["repeats"]
    tokenise = best_of(pipeline_tokenising(enc, texts), sizes["repeats"])["cpu_s"]
    # the host's work with tokenising apart (on a GPU machine it runs on other cores: this box has two): the same
    # calls answered from a memo filled by one untimed pass. Where the checkout tokenises in background threads
    # (`_token_arrays`: the tokenizer call and the id arrays), that is what is remembered; before, the tokenizer call
    arrays = getattr(enc, "_token_arrays", None)
    if arrays is not None:
        enc._token_arrays = Remembered(arrays)
    else:
        enc.tokenizer = Remembered(tok)
    encode(texts, **call)
    untokenised = best_of(lambda: encode(texts, **call), sizes["repeats"])["seconds"]  # the ceiling's time
    enc.tokenizer = tok
    if arrays is not None:
        del enc._token_arrays
    sample = texts[: max(64, len(texts) // 10)]
    counts = count_ops(lambda: encode(sample, **call), len(sample), sizes)
    return {"units": len(texts), **timing, "tokenise_s": tokenise, "untokenised_s": untokenised,
            "ceiling_s": untokenised,
            "model_calls": calls, "call": repr(call),
            "rules": "gpu" if rules else "device", **counts}


def pipeline_tokenising(enc, texts: list[str]):
    """A call that tokenises `texts` as the checkout's `encode` does: where it has them, its tokenising threads
    (encode_batches.tokenized_chunks over `Encoder._token_arrays`: its own copy of the fast tokenizer's backend,
    `encode_batch`, the padded id arrays), at tokenize_threads() threads; before issue 46, the one tokenizer call
    encode made over all its texts."""
    if hasattr(enc, "_token_arrays"):
        from contramine.pipeline.models.encode.batches import tokenize_threads, tokenized_chunks

        def tokenise():
            chunks = tokenized_chunks(texts, lambda rows, part: enc._token_arrays(rows, part, None, enc.max_length),
                                      tokenize_threads())
            for _ in chunks:
                pass

        return tokenise

    return lambda: enc.tokenizer(list(texts), truncation=True, max_length=enc.max_length)


class Remembered:
    """A callable (a tokenizer, an encoder's `_token_arrays`) whose calls are answered from a memo after the first,
    keyed by the arguments' values; every other attribute is the callable's, so the encoder calls it as before."""

    def __init__(self, fn):
        self.fn, self.memo = fn, {}

    def __call__(self, *args, **kwargs):
        key = (tuple(a.tobytes() if hasattr(a, "tobytes") else tuple(a) if isinstance(a, list) else a for a in args),
               repr(sorted(kwargs.items())))
        if key not in self.memo:
            self.memo[key] = self.fn(*args, **kwargs)
        return self.memo[key]

    def __getattr__(self, name):
        return getattr(self.fn, name)


def gpu_rules(enc, call: dict):
    """`encode` under a GPU's batching and precision rules where the checkout can run them on CPU tensors
    (`Encoder._encode(..., kind="cuda")`: token-budget batches, weights held in bf16), else None (the code before
    issue 46 had one set of rules for every device). On a GPU these are the rules that run; on this CPU `encode`
    keeps the CPU's batch-independent ones, so timing `encode` here would time the wrong host path."""
    import inspect

    if "kind" not in inspect.signature(getattr(enc, "_encode", lambda: None)).parameters:
        return None

    def encode(texts, batch_size=128, normalize=True, progress=False, template=None, batch_tokens=None):
        return enc._encode(texts, batch_size, normalize, progress, template, batch_tokens, "cuda")

    return encode


def gpu_batch() -> dict:
    """The batching a GPU runs where the checkout has one of its own (`backtranslate.batch_tokens = "auto"` on a GPU:
    AUTO_BATCH_TOKENS' HF budget), else nothing (before issue 46 every device decoded `batch_size` rows a batch). On
    this CPU "auto" is a CPU's budget, so timing the default here would time the wrong host path, as for encode."""
    try:
        from contramine.pipeline.models.translate.settings import AUTO_BATCH_TOKENS
    except ImportError:
        return {}
    return {"batch_tokens": AUTO_BATCH_TOKENS[("hf", "cuda")]}


def job_generate(data: Path, sizes: dict, settings: dict) -> dict:
    """`Translator.translate` (greedy, the stage's defaults under a GPU's batching rules) of wiki1m lines, the
    hollow rows emitting a translation's length (host_hollow.target_lengths, cap included). Its ceiling is the
    measured time of that run (the hollow model's own CPU work at thousands of rows a batch counts against it),
    the target tokens the rows emit over it; the batches are the 1M path's (~3,000 rows under the GPU's budget)."""
    from transformers import AutoTokenizer

    from bench.host.hollow import hollow_steps, target_lengths
    from contramine.pipeline.config.backtranslation import BacktranslateCfg
    from contramine.pipeline.models.translate.engines.hf import Translator

    tok = AutoTokenizer.from_pretrained(data / "marian")
    model = hollow_marian(tok.pad_token_id, tok.eos_token_id)
    cfg = BacktranslateCfg(**{**gpu_batch(), **settings})
    tr = Translator("Helsinki-NLP/opus-mt-en-de", tok, model, cfg, "cpu")
    loop = getattr(tr, "loop", None)  # our decode loop, where the checkout has one and the settings use it
    if loop is not None:
        loop.steps_model = hollow_steps(model)
        loop.free_reads = False  # read the done flags as on a GPU (a CPU's free reads end a batch's tail sooner)
    texts = lines(data, sizes["gen_n"])
    emitted = emitted_tokens(tok, texts, cfg, target_lengths)
    tr.translate(texts[: max(2, len(texts) // 8)])  # warm-up
    model.steps = 0
    if loop is not None:
        loop.steps = 0
    timing = best_of(lambda: tr.translate(texts), sizes["repeats"])
    steps = (loop.steps if loop is not None else model.steps) // sizes["repeats"]
    lengths = sorted((len(x) for x in tok(texts, truncation=True, max_length=cfg.max_length)["input_ids"]),
                     reverse=True)
    batches = [len(b) for b in tr.batches(lengths, 1)] if hasattr(tr, "batches") else [cfg.batch_size]
    sample = texts[: max(8, len(texts) // 8)]
    counts = count_ops(lambda: tr.translate(sample), emitted_tokens(tok, sample, cfg, target_lengths), sizes)
    return {"units": emitted, **timing, "steps": steps, "rows": len(texts), "batch_size": cfg.batch_size,
            "batch_tokens": getattr(cfg, "batch_tokens", 0), "batches": batches[:6],
            "decoder": "loop" if loop is not None else "generate", "ceiling_s": timing["seconds"], **counts}


def emitted_tokens(tok, texts: list[str], cfg, target_lengths) -> int:
    """The target tokens the hollow Marian emits for `texts`: each row's length, capped by its length limit (+ the
    eos forced there)."""
    import torch

    from contramine.pipeline.models.translate.settings import row_limit

    lengths = [len(x) for x in tok(texts, truncation=True, max_length=cfg.max_length)["input_ids"]]
    want = target_lengths(torch.tensor(lengths)).tolist()
    return sum(min(w, row_limit(n, cfg) + 1) for w, n in zip(want, lengths))


def job_train(data: Path, sizes: dict, settings: dict) -> dict:
    """One DebCSE step as trainer/train.py's loop runs it on a GPU (bf16 autocast, fused AdamW, clipping, the
    scheduler, the metrics read as the checkout's loop reads them), the batch collated beforehand as the DataLoader's
    workers do."""
    import torch
    from transformers import AutoTokenizer

    from contramine.pipeline.config import TrainCfg
    from contramine.pipeline.models.encode.encoder import Encoder
    from contramine.trainer.objectives import OBJECTIVES

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(data / "bert")
    tc = TrainCfg(**{"objective": "debcse", "batch_size": 64, "max_length": 32, **settings})
    cls = OBJECTIVES[tc.objective]
    enc = Encoder(hollow_bert(len(tok), dropout=tc.dropout), tok, pooler=cls.pooler or "cls_before_pooler",
                  max_length=64)
    enc.unpad = tc.unpad
    obj = cls(enc, tc).train()
    params = [p for p in obj.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": tc.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=tc.lr, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    bs, n = tc.batch_size, sizes["train_warmup"] + sizes["train_steps"]
    texts = lines(data, bs * n * 4)
    rows = [{"sid": i, "text": texts[4 * i], "positives": [texts[4 * i + 1]], "negatives": texts[4 * i + 2:4 * i + 4],
             "paraphrase": texts[4 * i + 1], "negation": texts[4 * i] + " not", "emb": None} for i in range(bs * n)]
    t0 = time.perf_counter()
    batches = [obj.collate(rows[i * bs:(i + 1) * bs]) for i in range(n)]
    collate = (time.perf_counter() - t0) / n

    try:  # the loop since issue 46: the step's numbers stay on the device, read once per `log_every` steps
        from contramine.trainer.metrics_log import MetricWindow
        window, log_every = MetricWindow(), tc.log_every
    except ImportError:  # the loop before: the loss and the grad norm read every step
        window, log_every = None, 1
    done = [0]

    def step(batch):  # trainer/train.py's loop body on a GPU (bf16: no loss scaling)
        batch = {k: v.to("cpu", non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, metrics = obj(batch)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        done[0] += 1
        if window is None:
            float(grad_norm), float(loss.item())
            return
        window.add({"loss": loss.detach(), "grad_norm": grad_norm, **metrics})
        if done[0] % log_every == 0:
            window.read()

    for b in batches[:sizes["train_warmup"]]:
        step(b)
    timed = batches[sizes["train_warmup"]:]
    timing = best_of(lambda: [step(b) for b in timed], sizes["repeats"])
    return {"units": len(timed), **timing, "collate_s": collate, "params": len(params),
            "objective": tc.objective, **count_ops(lambda: step(timed[0]), 1, sizes)}
