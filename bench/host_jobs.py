"""The host bench's worker (bench/host_bench.py runs it): the four GPU jobs of the 1M path on one checkout's code, with
each model's arithmetic removed, timed on this CPU. What is left is what the host does for the card.

    python -P bench/host_jobs.py --checkout PATH --data DIR --sizes JSON [--set JOB.KEY=VALUE ...] encode search ...

It runs as a script with PYTHONPATH=<checkout> and `-P`, so `pipeline` and `trainer` are that checkout's (today's
code from a git export, or this one) while the hollow models below are this file's, the same on both sides. It
uses only the calls both sides share: `Encoder(model, tokenizer, ...)` + `encode`, `Translator(name, tokenizer,
model, cfg, device)` + `translate`, `band_neighbours(...)` with any object that has `search(x, k)`, an objective's
`collate` + `forward` in trainer/train.py's step. It prints one line `HOSTBENCH {json}` with, per job, the host
seconds per unit (wall and CPU, best of `repeats` passes after a warm-up) and, from one more pass under a counting
dispatch mode, the torch ops (~ kernel launches on a GPU) and the ops that make a GPU wait for its host to read a
value (`.item()`, `bool(t)`, `nonzero`, `torch.equal`, ...) per unit. On a CPU a host read costs nothing, so the time cannot show
what a sync costs a GPU: the count does. Copies back to the host (`.cpu()`, `.numpy()`, `.tolist()`) are no ops
on a CPU tensor and are not counted.

The hollow models (the feature width cut to WIDTH, so no op has arithmetic to speak of on this CPU, while the batch
and sequence shapes stay the jobs' own):
- HollowBert: bert-base's `model(**batch)` (config: model_type "bert", so the trainer's padding-free path runs as on
  the real model). Its output is a lookup of [B, L, WIDTH]; and every call runs a real 12-layer BertModel of width
  4 on one token, so the model's own Python and op dispatch (~ its kernel launches) is paid per call, as on a GPU,
  with no arithmetic. Gradients reach every weight of both: the optimiser steps over ~200 tensors, as for
  bert-base.
- HollowMarian: a real MarianMTModel of opus-mt's layout (6 + 6 layers, Marian's tokenizer and generation config)
  at width 4 and a 64-entry output vocabulary, so HF `generate` runs its real per-step decoder, cache and logits
  processors; the encoder pass is hollow like HollowBert's. Each row emits as many tokens as its source has (its
  last one eos), the length a translation has.
- HollowIndex: TorchExact's part on the card (the score GEMM and the top-k) done before the clock starts: `search`
  returns the exact top-k of the queries from a table computed once with TorchExact, found by a key of each
  query's first coordinates (bench/host_bench.py builds it); a k past the table is searched exactly in numpy.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

WIDTH = 8  # the hollow models' output width (bert-base: 768): pooling, normalising, BatchNorm, cosines stay cheap
THIN = 4  # width of the real layers run on one token (the models' own dispatch) and of the hollow Marian
MARIAN_VOCAB = 64  # the hollow Marian's output vocabulary (opus-mt: 58,101): logits processors over 64 columns
# ops after which a GPU's host waits for the device (a value read back, or an output whose size depends on values)
SYNC_OPS = {"_local_scalar_dense", "nonzero", "equal", "is_nonzero", "masked_select", "_unique2", "unique_dim",
            "unique_consecutive", "repeat_interleave", "allclose", "item"}


# ------------------------------------------------------------------------------------------------- hollow models
def hollow_bert(vocab_size: int, dropout: float = 0.1, layers: int = 12):
    """HollowBert (module docstring) for a tokenizer of `vocab_size` entries."""
    import torch
    from transformers import BertConfig, BertModel, BertPreTrainedModel
    from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions

    class HollowBert(BertPreTrainedModel):
        def __init__(self, config: BertConfig):
            super().__init__(config)
            thin = BertConfig(vocab_size=8, hidden_size=THIN, num_hidden_layers=config.num_hidden_layers,
                              num_attention_heads=1, intermediate_size=THIN, hidden_dropout_prob=dropout,
                              attention_probs_dropout_prob=dropout)
            self.shadow = BertModel(thin, add_pooling_layer=True)  # real layers, run on one token per call
            self.table = torch.nn.Embedding(config.vocab_size, config.hidden_size)
            self.register_buffer("one_token", torch.ones((1, 1), dtype=torch.long), persistent=False)
            self.calls = 0
            self.post_init()

        def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                    output_hidden_states=False, return_dict=True, **kwargs):
            self.calls += 1
            shadow = self.shadow(input_ids=self.one_token).pooler_output  # the model's dispatch, no arithmetic
            last = self.table(input_ids) + shadow.mean()
            hidden = (last,) * (self.config.num_hidden_layers + 1) if output_hidden_states else None
            return BaseModelOutputWithPoolingAndCrossAttentions(last_hidden_state=last, pooler_output=last[:, 0],
                                                               hidden_states=hidden)

    config = BertConfig(vocab_size=vocab_size, hidden_size=WIDTH, num_hidden_layers=layers, num_attention_heads=1,
                        intermediate_size=WIDTH, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    return HollowBert(config)


def hollow_marian(pad_id: int, eos_id: int, layers: int = 6):
    """HollowMarian (module docstring): token ids pad_id / eos_id as the tokenizer has them (both < MARIAN_VOCAB)."""
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel
    from transformers.modeling_outputs import BaseModelOutput

    class HollowEncoder(torch.nn.Module):
        """The encoder pass: the real (thin) encoder run on one token, its output spread to [B, S, d]."""

        main_input_name = "input_ids"

        def __init__(self, real):
            super().__init__()
            self.real = real
            self.register_buffer("one_token", torch.full((1, 1), eos_id, dtype=torch.long), persistent=False)

        def get_input_embeddings(self):
            return self.real.get_input_embeddings()

        def forward(self, input_ids=None, attention_mask=None, **kwargs):
            self.owner.decode_step = 0  # generate runs the encoder once per batch, then decodes: step 0 next
            h = self.real(input_ids=self.one_token, return_dict=True).last_hidden_state
            return BaseModelOutput(last_hidden_state=h.expand(input_ids.shape[0], input_ids.shape[1], -1))

    class HollowMarian(MarianMTModel):
        def forward(self, *args, attention_mask=None, **kwargs):
            out = super().forward(*args, attention_mask=attention_mask, **kwargs)
            step, self.decode_step, self.steps = self.decode_step, self.decode_step + 1, self.steps + 1
            # content tokens while the row has source tokens left, then eos: a row's output is as long as its source
            # (its </s> included); the row's own length limit, forced by the Translator, is at least that
            due = attention_mask.sum(1) - 1 <= step
            out.logits = torch.where(due[:, None, None], self.eos_logits, self.words[step % len(self.words)])
            return out

    config = MarianConfig(vocab_size=MARIAN_VOCAB, decoder_vocab_size=MARIAN_VOCAB, d_model=THIN,
                          encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=1,
                          decoder_attention_heads=1, encoder_ffn_dim=THIN, decoder_ffn_dim=THIN, pad_token_id=pad_id,
                          eos_token_id=eos_id, decoder_start_token_id=pad_id, forced_eos_token_id=eos_id,
                          max_position_embeddings=512, activation_function="swish", scale_embedding=True,
                          share_encoder_decoder_embeddings=True, dropout=0.1, attention_dropout=0.0,
                          activation_dropout=0.0)
    model = HollowMarian(config)
    model.model.encoder = HollowEncoder(model.model.encoder)
    object.__setattr__(model.model.encoder, "owner", model)  # not a submodule: no cycle in the module tree
    words = [i for i in range(MARIAN_VOCAB) if i not in (pad_id, eos_id) and i > 2]
    model.register_buffer("words", torch.nn.functional.one_hot(torch.tensor(words), MARIAN_VOCAB).float() * 10,
                          persistent=False)
    model.register_buffer("eos_logits", torch.nn.functional.one_hot(torch.tensor(eos_id), MARIAN_VOCAB).float() * 10,
                          persistent=False)
    model.decode_step = model.steps = 0
    model.generation_config = GenerationConfig(decoder_start_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id,
                                               bad_words_ids=[[pad_id]], num_beams=1, do_sample=False)
    return model.eval()


class HollowIndex:
    """HollowIndex (module docstring): `search(x, k)` like TorchExact's, from the exact table D, I of `base`."""

    def __init__(self, base, D, I):
        import numpy as np

        self.base, self.D, self.I = base, D, I
        keys = self.key(base)
        self.order = np.argsort(keys, kind="stable")
        self.sorted_keys = keys[self.order]
        if len(keys) and (self.sorted_keys[1:] == self.sorted_keys[:-1]).any():
            raise ValueError("HollowIndex: two base rows share their first two coordinates; draw the vectors again")

    @staticmethod
    def key(x):
        import numpy as np

        return np.ascontiguousarray(x[:, :2], dtype=np.float32).view(np.int64).ravel()

    def search(self, x, k: int):
        import numpy as np

        x = np.ascontiguousarray(x, dtype=np.float32)
        rows = self.order[np.searchsorted(self.sorted_keys, self.key(x))]
        if k <= self.D.shape[1]:
            return self.D[rows, :k], self.I[rows, :k]
        n = len(self.base)  # wider than the table (a query whose pool needs more): exact, in numpy
        scores = x @ self.base.T
        idx = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # descending, ties by ascending row: TorchExact's
        D = np.full((len(x), k), np.finfo(np.float32).min, dtype=np.float32)
        I = np.full((len(x), k), -1, dtype=np.int64)
        D[:, :min(k, n)] = np.take_along_axis(scores, idx, axis=1)
        I[:, :min(k, n)] = idx
        return D, I


# ------------------------------------------------------------------------------------------------- counting
def op_counter():
    """A dispatch mode counting every torch op (`ops`) and the ops in SYNC_OPS (`syncs`) run under it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops, self.syncs = 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            if func._overloadpacket.__name__ in SYNC_OPS:
                self.syncs += 1
            return func(*args, **(kwargs or {}))

    return Count()


def count_ops(fn, units: int, sizes: dict) -> dict:
    """{"ops", "syncs"} per unit of one more, untimed pass of `fn` under `op_counter` (only where sizes["count"]:
    the first round; a dispatch mode is slow)."""
    if not sizes.get("count"):
        return {}
    with op_counter() as count:
        fn()
    return {"ops": count.ops / units, "syncs": count.syncs / units}


def from_config(cfg, fn) -> dict:
    """The keywords of `fn` (those with a default) that the config section `cfg` has a field of the same name for,
    at the section's defaults: what a stage passes from its settings (batch_size, slack, ...), a new one included."""
    import inspect

    return {name: getattr(cfg, name) for name, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty and name in type(cfg).model_fields}


def best_of(fn, repeats: int) -> dict:
    """{"seconds": the fastest wall time of `repeats` passes of fn, "cpu_s": the least CPU time this process spent
    in one (every thread; beside other work on a shared box it moves less than the wall time)}."""
    wall = cpu = float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    return {"seconds": wall, "cpu_s": cpu}


def apply_settings(obj, fn, settings: dict) -> dict:
    """Settings of a job: a keyword of `fn` goes to the call (returned), any other key must be an attribute of
    `obj`, set there (a misspelt key stops the bench). The rule of bench/gpu_sections.py's apply_settings, written
    again: this worker imports nothing from bench/, which under the base's PYTHONPATH is the base's."""
    import inspect

    params = set(inspect.signature(fn).parameters)
    call = {}
    for key, value in settings.items():
        if key in params:
            call[key] = value
        elif hasattr(obj, key):
            setattr(obj, key, value)
        else:
            raise SystemExit(f"host bench: unknown setting {key!r} for {type(obj).__name__} / {fn.__name__}")
    return call


# ------------------------------------------------------------------------------------------------- the jobs
def job_encode(data: Path, sizes: dict, settings: dict) -> dict:
    """`Encoder.encode` over wiki1m lines at the encoder's default batch size, the GPU's precision (bf16)."""
    import torch
    from transformers import AutoTokenizer

    from pipeline.config.mining import EncoderCfg
    from pipeline.models.encoder import Encoder

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
    tokenise = best_of(lambda: tok(list(texts), truncation=True, max_length=128), sizes["repeats"])["cpu_s"]
    sample = texts[: max(64, len(texts) // 10)]
    counts = count_ops(lambda: encode(sample, **call), len(sample), sizes)
    return {"units": len(texts), **timing, "tokenise_s": tokenise, "model_calls": calls, "call": repr(call),
            "rules": "gpu" if rules else "device", **counts}


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


def job_generate(data: Path, sizes: dict, settings: dict) -> dict:
    """`Translator.translate` (greedy, the stage's defaults: batch_size rows a batch) of wiki1m lines."""
    from transformers import AutoTokenizer

    from pipeline.config.backtranslation import BacktranslateCfg
    from pipeline.models.translator import Translator

    tok = AutoTokenizer.from_pretrained(data / "marian")
    model = hollow_marian(tok.pad_token_id, tok.eos_token_id)
    cfg = BacktranslateCfg(**settings)
    tr = Translator("Helsinki-NLP/opus-mt-en-de", tok, model, cfg, "cpu")
    texts = lines(data, sizes["gen_n"])
    target = sum(len(ids) for ids in tok(texts, truncation=True, max_length=cfg.max_length)["input_ids"])
    tr.translate(texts[: max(2, len(texts) // 8)])  # warm-up
    model.steps = 0
    timing = best_of(lambda: tr.translate(texts), sizes["repeats"])
    steps = model.steps // sizes["repeats"]
    sample = texts[: max(8, len(texts) // 8)]
    sample_target = sum(len(ids) for ids in tok(sample, truncation=True, max_length=cfg.max_length)["input_ids"])
    counts = count_ops(lambda: tr.translate(sample), sample_target, sizes)
    return {"units": target, **timing, "steps": steps, "rows": len(texts), "batch_size": cfg.batch_size,
            "batch_tokens": getattr(cfg, "batch_tokens", 0), **counts}


SEARCH_BASE = 128  # the base of the per-block measurement: each block's score GEMM and top-k shrunk to a sliver
SEARCH_PROBE_ROWS = 8  # queries a block in that measurement: the rows' own arithmetic negligible, the block's ops whole
GPU_MEMORY = 76e9  # bytes free on an 80 GB card with the 1M x 384 base loaded: what sizes a GPU's blocks


def gpu_block_rows(n_base: int = 1_000_000) -> int:
    """Queries per block that the checkout's torch engine takes on an 80 GB GPU against a 1M base: band()'s memory
    rule where the checkout has it, else search()'s fixed block of scores (the code before issue 46)."""
    from pipeline.search import torch_exact as te

    if hasattr(te, "BAND_MAX_ELEMS"):
        return max(1, min(te.BAND_MAX_ELEMS, int(GPU_MEMORY * te.BAND_MEMORY_SHARE) // 12) // n_base)
    return max(1, te.BLOCK_ELEMS["cuda"] // n_base)


def job_search(data: Path, sizes: dict, settings: dict) -> dict:
    """The band search with the torch engine (TorchExact) as it runs on a GPU against a 1M base. The host's time per
    query has two parts, each measured on this CPU:
    - per block: the ops a block launches and the Python around them, paid once per block of the rows the checkout
      takes on an 80 GB card (gpu_block_rows): measured as CPU time per block with SEARCH_PROBE_ROWS queries a block
      against a SEARCH_BASE-row base of WIDTH coordinates, where the rows' arithmetic is negligible (it still counts:
      an upper bound), divided by those rows;
    - per query: what the host does for each query whatever the blocks. Where the engine hands the pools' resolve to
      the host (before issue 46: `search` returns the top-k, numpy ranks and rescores them), that is the resolve of
      the real queries (job_resolve's measurement: 384-d topic vectors, the neighbours defaults); where the engine
      resolves on its device (`TorchExact.band`), the host only copies the finished pools back and builds the table
      (band.Pools.put + table over the same queries' pools)."""
    import numpy as np

    from pipeline.config.mining import NeighboursCfg
    from pipeline.search import band
    from pipeline.search.torch_exact import TorchExact

    z = np.load(data / "search.npz")
    x = np.ascontiguousarray(z["base"][:, :WIDTH], dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    c = NeighboursCfg()
    base, sids = x[:SEARCH_BASE], np.arange(len(x), dtype=np.int64)
    probe = x[:min(len(x), 256 * SEARCH_PROBE_ROWS)]
    index = TorchExact(base, "cpu", block_rows=SEARCH_PROBE_ROWS, **settings)

    def blocks():
        band.band_neighbours(probe, sids[:len(probe)], base, sids[:SEARCH_BASE], index, index, c.lo, c.hi,
                             c.pool_size, **from_config(c, band.band_neighbours))

    blocks()  # warm-up
    n_blocks = -(-len(probe) // SEARCH_PROBE_ROWS)
    per_block = {k: v / n_blocks for k, v in best_of(blocks, sizes["repeats"]).items()}
    rows = gpu_block_rows()
    if hasattr(TorchExact, "band"):  # the resolve runs on the device: the host copies pools and builds the table
        real = job_resolve(data, dict(sizes, count=False), {})  # its pools: the real queries' (not timed here)
        table = real.pop("table")
        q = np.asarray(table.column("sid"))
        n_q = len(z["base"])
        counts = np.bincount(q, minlength=n_q)
        cand = np.full((n_q, c.pool_size), -1, np.int64)
        cos = np.zeros((n_q, c.pool_size), np.float64)
        rank = np.asarray(table.column("rank")) - 1
        cand[q, rank], cos[q, rank] = np.asarray(table.column("cand_sid")), np.asarray(table.column("cos"))

        def per_query_host():
            pools = band.Pools(n_q, c.pool_size)
            for a in range(0, n_q, rows):
                pools.put(slice(a, a + rows), cand[a:a + rows].copy(), cos[a:a + rows].copy(), counts[a:a + rows])
            pools.table(np.arange(n_q))

        host = {k: v / n_q for k, v in best_of(per_query_host, sizes["repeats"]).items()}
        where = "the pools copied back and the table built"
    else:  # the host resolves every block: the resolve job's time per query on the real queries
        real = job_resolve(data, dict(sizes, count=False), {})
        real.pop("table")
        host = {"seconds": real["seconds"] / real["units"], "cpu_s": real["cpu_s"] / real["units"]}
        where = "numpy's resolve of every block"
    per_query = {k: per_block[k] / rows + host[k] for k in ("seconds", "cpu_s")}
    n = len(z["base"])  # stated per query: the units the row divides by
    return {"units": n, "seconds": per_query["seconds"] * n, "cpu_s": per_query["cpu_s"] * n,
            "block_rows": rows, "block_ms": per_block["cpu_s"] * 1e3, "host_query_us": host["cpu_s"] * 1e6,
            "host_part": where, "pool_rows": real["pool_rows"], "base": SEARCH_BASE,
            **count_ops(blocks, n_blocks * rows, sizes)}  # ops a block over the queries a GPU block holds


def job_resolve(data: Path, sizes: dict, settings: dict) -> dict:
    """`band_neighbours` over the HollowIndex at the neighbours stage's defaults, every base row a query: the host's
    resolve of an index that only has `search(x, k)` (FAISS on a CPU or a GPU), the GEMM and top-k done beforehand."""
    import inspect

    import numpy as np

    from pipeline.config.mining import NeighboursCfg
    from pipeline.search.band import band_neighbours

    z = np.load(data / "search.npz")
    base, index = z["base"], HollowIndex(z["base"], z["D"], z["I"])
    sids = np.arange(len(base), dtype=np.int64)
    c = NeighboursCfg()
    params = inspect.signature(band_neighbours).parameters
    kw = from_config(c, band_neighbours)  # slack, max_block_elems, skip_top, ... as the stage passes them
    unknown = set(settings) - set(params)
    if unknown:
        raise SystemExit(f"host bench: unknown setting(s) {sorted(unknown)} for band_neighbours")
    kw |= settings
    def run(q: int):
        return band_neighbours(base[:q], sids[:q], base, sids, index, index, c.lo, c.hi, c.pool_size, **kw)

    run(max(1, len(base) // 20))  # warm-up
    table = None

    def timed():
        nonlocal table
        table = run(len(base))

    timing = best_of(timed, sizes["repeats"])
    sample = max(1, len(base) // 10)
    return {"units": len(base), **timing, "pool_rows": table.num_rows, "base": len(base),
            "k_table": int(z["D"].shape[1]), **count_ops(lambda: run(sample), sample, sizes), "table": table}


def job_train(data: Path, sizes: dict, settings: dict) -> dict:
    """One DebCSE step as trainer/train.py's loop runs it on a GPU (bf16 autocast, fused AdamW, clipping, the
    scheduler, the metrics read as the checkout's loop reads them), the batch collated beforehand as the DataLoader's
    workers do."""
    import torch
    from transformers import AutoTokenizer

    from pipeline.config import TrainCfg
    from pipeline.models.encoder import Encoder
    from trainer.objectives import OBJECTIVES

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
        from trainer.metrics_log import MetricWindow
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


JOBS = {"encode": job_encode, "generate": job_generate, "search": job_search, "resolve": job_resolve,
        "train": job_train}


def lines(data: Path, n: int) -> list[str]:
    base = (data / "lines.txt").read_text(encoding="utf-8").splitlines()
    return [base[i % len(base)] for i in range(n)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkout", required=True, help="the code measured: PYTHONPATH must name it")
    ap.add_argument("--data", required=True, help="the folder bench/host_bench.py prepared")
    ap.add_argument("--sizes", required=True, help="JSON: the sizes")
    ap.add_argument("--set", nargs="*", default=[], metavar="JOB.KEY=JSON", help="a setting of one job")
    ap.add_argument("jobs", nargs="+", choices=sorted(JOBS))
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # the host's work is one Python thread; no CPU thread pool waits on another
    import pipeline

    checkout = Path(args.checkout).resolve()
    if not Path(pipeline.__file__).resolve().is_relative_to(checkout):
        raise SystemExit(f"host bench: `pipeline` comes from {pipeline.__file__}, not from {checkout}: run with "
                         f"PYTHONPATH={checkout} and python -P")
    settings: dict[str, dict] = {job: {} for job in JOBS}
    for item in args.set:
        key, _, value = item.partition("=")
        job, _, name = key.partition(".")
        if job not in JOBS or not name:
            raise SystemExit(f"host bench: --set {item}: expected JOB.KEY=VALUE with JOB one of {', '.join(JOBS)}")
        try:
            settings[job][name] = json.loads(value)
        except json.JSONDecodeError:
            settings[job][name] = value
    sizes, out = json.loads(args.sizes), {}
    for job in args.jobs:
        t0 = time.perf_counter()
        result = JOBS[job](Path(args.data), sizes, settings[job])
        result.pop("table", None)  # the resolve's pools: for job_search, not for the report
        out[job] = result | {"wall_s": round(time.perf_counter() - t0, 1)}
        print(f"host bench worker ({checkout.name}): {job} {json.dumps(out[job])}", file=sys.stderr, flush=True)
    print("HOSTBENCH " + json.dumps({"checkout": str(checkout), "pid": os.getpid(), "jobs": out}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
