"""The sections of `make gpu-check` (bench/gpu/check.py has what they measure and how to run it): each takes the
shared models, the device and the sizes, and returns rows. Standard library at import time; each section imports
what it uses (torch, transformers, the project's modules), and none imports FAISS, Prefect, DuckDB or spaCy itself.
"""
from __future__ import annotations

import resource
import time
from contextlib import contextmanager
from pathlib import Path

BAND = dict(lo=0.25, hi=0.75, pool_size=64, slack=8, max_block_elems=1 << 24)  # NeighboursCfg's defaults


def row(name: str, device: str, value, unit: str, ok: bool | None = None, note: str = "", **work) -> dict:
    """One result. `work` (speed rows): what bench/gpu/limits.py's summary reads, e.g. flop, seconds, precision."""
    return {"name": name, "device": device, "value": value, "unit": unit, "ok": ok, "note": note, **work}


# A row setting of the encode and translation rows: True runs the row with SDPA free to pick cuDNN's attention, as
# torch does by default (first on sm90 / sm100), instead of the pipeline's choice without it
# (pipeline/models/attention_kernels.py): the "*_cudnn" rows, the contrast that shows what that choice is worth.
CUDNN_ATTENTION = "cudnn_attention"


@contextmanager
def attention_setting(settings: dict):
    """The row's settings without CUDNN_ATTENTION, with cuDNN's attention allowed while the row runs where it asks
    (a checkout without attention_kernels fails such a row in one line: it has no choice to contrast)."""
    rest = {k: v for k, v in settings.items() if k != CUDNN_ATTENTION}
    if not settings.get(CUDNN_ATTENTION):
        yield rest
        return
    from contramine.pipeline.models import attention_kernels

    before, attention_kernels.ALLOW_CUDNN = attention_kernels.ALLOW_CUDNN, True
    try:
        yield rest
    finally:
        attention_kernels.ALLOW_CUDNN = before


def apply_settings(obj, fn, settings: dict) -> dict:
    """A row's settings (the variant tables of bench/gpu/speeds.py): a keyword of `fn` is returned for the call,
    any other key must be an attribute of `obj` and is set there; anything else stops the section in one line."""
    import inspect

    params, call = set(inspect.signature(fn).parameters), {}
    for key, value in settings.items():
        if key in params:
            call[key] = value
        elif hasattr(obj, key):
            setattr(obj, key, value)
        else:
            raise ValueError(f"setting {key!r}: neither a keyword of {fn.__qualname__} nor an attribute of "
                             f"{type(obj).__name__}")
    return call


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_mib(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        return round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # process peak RSS (KiB on Linux)


def reset_peak(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def mem_unit(device: str) -> str:
    return "MiB" if device.startswith("cuda") else "MiB (process peak RSS)"


def texts_for(n: int) -> list[str]:
    from bench.fixtures.shapes import SAMPLE_LINES, sentences

    base = sentences(min(n, SAMPLE_LINES))  # the lines the GPU machine has too (the carried sample)
    return [base[i % len(base)] for i in range(n)]


def guarded(name: str, unit: str, device: str, measure) -> list[dict]:
    """A row's measurement `measure()` -> its rows, under the check's clock (bench/gpu/budget.py): an exception is
    one failed row (`name`, ok false, the error in one line) and the section goes on with its next row; so is a row
    past its time budget; a row the check's deadline leaves no time for is one row "not run" (`not_run`), and one an
    earlier run measured (`--rerun-failed`) is not run again (no rows: the earlier one stays). Every row goes to the
    clock's `emit` as soon as it is measured (results.json is written at once)."""
    import traceback

    from bench.gpu.budget import DEADLINE, OutOfTime, clock

    c = clock()
    if name in c.skip:
        return []
    try:
        if c.left() <= 1.0:
            raise OutOfTime(DEADLINE, c.deadline_s)
        with c.row(name):
            rows = measure()
    except OutOfTime as e:
        rows = [row(name, device, None, unit, None, f"not run: {DEADLINE} ({c.deadline_s:.0f} s) came first",
                    not_run=True) if e.what == DEADLINE else row(name, device, None, unit, False, str(e))]
    except Exception as e:
        traceback.print_exc()
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        rows = [row(name, device, None, unit, False, f"{type(e).__name__}: {msg[:300]}")]
    if c.emit is not None:
        c.emit(rows)
    c.resume()  # the deadline's timer over the section's own work again (may fire at once: after the emit)
    return rows


# ------------------------------------------------------------------------------------------------------ models
class Models:
    """The models every section shares, built once into a temporary folder."""

    def __init__(self, sizes: dict, tmp: Path, out: Path | None = None):
        self.sizes, self.tmp, self._bert, self._tiny, self._marian = sizes, tmp, None, None, None
        self.out = out or tmp  # where files beside results.json go (the profiles)

    def bert(self) -> Path:
        from bench.fixtures.shapes import BERT_BASE, TOY_BERT, build_bert

        if self._bert is None:
            self._bert = build_bert(self.tmp / "bert", BERT_BASE if self.sizes["bert"] == "base" else TOY_BERT)
        return self._bert

    def tiny_bert(self) -> Path:
        from bench.fixtures.shapes import TOY_BERT, build_bert, sentences

        if self._tiny is None:
            self._tiny = build_bert(self.tmp / "tiny-bert", TOY_BERT, texts=sentences(2000), dropout=0.0)
        return self._tiny

    def marian(self) -> tuple[Path, list[str], dict]:
        from bench.fixtures.shapes import OPUS_MT, TOY_MARIAN, build_marian

        if self._marian is None:
            shape = OPUS_MT if self.sizes["marian"] == "opus-mt" else TOY_MARIAN
            self._marian = (*build_marian(self.tmp / "marian", shape), shape)
        return self._marian


# ------------------------------------------------------------------------------------------------------ checks
def same_length_texts(tokenizer, n: int, words: int = 12, seed: int = 0) -> list[str]:
    """n distinct sentences of `words` words that are one token each: all of one token length."""
    import random

    vocab = [w for w in sorted(tokenizer.get_vocab()) if w.isalpha() and len(w) > 2
             and len(tokenizer(w, add_special_tokens=False)["input_ids"]) == 1]
    rng = random.Random(seed)
    out: dict[str, None] = {}
    while len(out) < n:
        out[" ".join(rng.choice(vocab) for _ in range(words))] = None
    texts = list(out)
    lengths = {len(ids) for ids in tokenizer(texts)["input_ids"]}
    assert len(lengths) == 1, f"same_length_texts: token lengths {lengths}"
    return texts


def section_checks(models: Models, device: str, sizes: dict) -> list[dict]:
    import numpy as np
    import torch

    from bench.fixtures.shapes import sentences
    from contramine.pipeline.models.encode.encoder import Encoder
    from contramine.trainer.precision import strict_float32

    rows = []
    path = str(models.tiny_bert())
    with strict_float32():
        cpu = Encoder.load(path, pooler="mean", max_length=64, device="cpu")
        dev = Encoder.load(path, pooler="mean", max_length=64, device=device)
        texts = sentences(64, skip=2000)
        diff = float(np.abs(cpu.encode(texts) - dev.encode(texts)).max())
        rows.append(row(f"check_encoder_cpu_vs_{device}", device, diff, "max |diff|", diff <= 1e-5,
                        "64 wiki1m sentences, tiny BERT, float32, TF32 off; tolerance 1e-5"))
        same = same_length_texts(dev.tokenizer, 64)
        width = len(dev.tokenizer(same[0])["input_ids"])
        for precision in ["float32"] + (["bf16"] if device.startswith("cuda") else []):
            dev.precision = precision
            one, seven, many = dev.encode(same[:1])[0], dev.encode(same[:7])[0], dev.encode(same)[0]
            d = float(max(np.abs(one - seven).max(), np.abs(one - many).max()))
            tol = 0.0 if device == "cpu" else (1e-5 if precision == "float32" else 2e-2)
            rows.append(row(f"check_batch_{precision}", device, d, "max |diff|", d <= tol,
                            f"row 0 alone vs in batches of 7 and 64 sentences of {width} tokens (encode repeats a "
                            f"small batch's rows up to 256 tokens); bitwise equal: {'yes' if d == 0 else 'no'}; "
                            f"tolerance {tol:g}"))
        dev.precision = "float32"
    torch.set_float32_matmul_precision("highest")
    for name, x in (("check_band_pools", topic_vectors(sizes["check_n"], sizes["search_d"], seed=1)),
                    ("check_band_pools_dense", simcse_like_vectors(sizes["check_n"], sizes["search_d"], seed=1))):
        rows.append(band_pools_check(name, x, device))
    return rows


def band_pools_check(name: str, x, device: str) -> dict:
    """Band pools of `x` (each vector a query) with TorchExact on the device = the float64 brute force = TorchExact
    on the CPU."""
    import numpy as np

    from contramine.pipeline.search.band import band_neighbours, exact_band_neighbours
    from contramine.pipeline.search.torch_exact import TorchExact

    sids = np.arange(len(x), dtype=np.int64) * 7 + 3
    b = BAND
    ref = exact_band_neighbours(x, sids, x, sids, b["lo"], b["hi"], b["pool_size"])
    index = TorchExact(x, device)
    on_dev = band_neighbours(x, sids, x, sids, index, index, b["lo"], b["hi"], b["pool_size"],
                             b["slack"], b["max_block_elems"])
    host = TorchExact(x, "cpu")
    on_cpu = band_neighbours(x, sids, x, sids, host, host, b["lo"], b["hi"], b["pool_size"], b["slack"],
                             b["max_block_elems"])
    keys = ("sid", "cand_sid", "rank")
    same_ref = on_dev.num_rows == ref.num_rows and all(on_dev.column(k).equals(ref.column(k)) for k in keys)
    cos_diff = float(np.abs(on_dev.column("cos").to_numpy() - ref.column("cos").to_numpy()).max()) \
        if on_dev.num_rows == ref.num_rows and on_dev.num_rows else 0.0
    same_cpu = on_dev.equals(on_cpu)
    ok = same_ref and same_cpu and cos_diff <= 1e-6
    return row(name, device, on_dev.num_rows, "pool rows", ok,
               f"{len(x)} vectors: TorchExact on {device} = float64 brute force: {same_ref} (max |cos diff| "
               f"{cos_diff:.1e}); = TorchExact on cpu: {same_cpu}")


def topic_vectors(n: int, d: int, per_topic: int = 100, seed: int = 0):
    """n unit vectors in topics of ~per_topic members (cosines within a topic ~0.35-0.85, across ~0): every
    vector has in-band neighbours, as real sentences do (bench/peers/neighbours.py's recipe)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((max(1, n // per_topic), d), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    x = centres[rng.integers(len(centres), size=n)]
    x += rng.uniform(0.45, 1.3, size=(n, 1)).astype(np.float32) * rng.standard_normal((n, d), dtype=np.float32) \
        / np.float32(np.sqrt(d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def simcse_like_vectors(n: int, d: int, seed: int = 0, device: str = "cpu", rank: int = 48, per_topic: int = 100):
    """n unit vectors shaped like a SimCSE encoder's: a mean direction every vector shares, a low-rank part (`rank`
    directions, variance falling as 1/j) and a little isotropic noise, in topics of ~per_topic members. Random pairs'
    cosines are ~0.46 +- 0.13, so ~93% of pairs fall in the default band 0.25-0.75 (topic_vectors': ~0) and a
    row's best in-band scores crowd the band's top edge: at 1M vectors thousands lie within bf16's rounding of a
    row's 64th, so rows widen, as on real sentences. Made with torch on `device` (seconds at 1M x 768 on a GPU)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    mean = torch.randn(d, generator=g, device=device)
    basis = torch.linalg.qr(torch.randn(d, rank, generator=g, device=device))[0]  # orthonormal columns
    spectrum = torch.arange(1, rank + 1, device=device, dtype=torch.float32).rsqrt()
    spectrum *= (0.9 / spectrum.square().sum()).sqrt()  # the low-rank part's variance 0.9, the mean's 1
    topics = torch.randn(max(1, n // per_topic), rank, generator=g, device=device)
    z = topics[torch.randint(len(topics), (n,), generator=g, device=device)] * 0.75 ** 0.5 \
        + torch.randn(n, rank, generator=g, device=device) * 0.25 ** 0.5
    x = mean / mean.norm() + (z * spectrum) @ basis.T
    x += torch.randn(n, d, generator=g, device=device) * (0.3 / d) ** 0.5
    return torch.nn.functional.normalize(x, dim=1).cpu().numpy()


# ------------------------------------------------------------------------------------------------------ stages
STAGES = ("sentences", "pool_sentences", "embeddings", "pool_embeddings", "neighbours")


def section_stages(models: Models, device: str, sizes: dict) -> list[dict]:
    import shutil

    import numpy as np

    from bench.fixtures.shapes import sentences
    from contramine.pipeline.config import load_config
    from contramine.pipeline.engine.runner import run_stage
    from contramine.pipeline.storage.tables import RunTables
    from contramine.pipeline.schema import table_vectors

    work = models.tmp / "runs"
    corpus = work / "corpus.txt"
    corpus.parent.mkdir(parents=True, exist_ok=True)
    corpus.write_text("\n".join(sentences(sizes["stage_lines"])) + "\n", encoding="utf-8")
    common = [f"run.root={work}", f"data.corpus={corpus}", "run.shards=2", f"encoder.model={models.tiny_bert()}",
              "encoder.pooler=mean", "encoder.precision=float32", "neighbours.engine=torch", "neighbours.index=flat",
              "neighbours.lo=-1.0", "neighbours.hi=1.0",  # a random encoder's vectors sit close together: every
              "backtranslate.chains=[]"]                  # other sentence is in band, the pools are full
    cfg = {"dev": load_config("default", [*common, "run.name=on-device", f"encoder.device={device}"]),
           "cpu": load_config("default", [*common, "run.name=on-cpu", "encoder.device=cpu", "neighbours.gpu=never"])}
    seconds = {}
    for side, c in cfg.items():
        t0 = time.perf_counter()
        for stage in STAGES:
            run_stage(stage, c, force=True)
        seconds[side] = time.perf_counter() - t0
    tables = {side: RunTables(c.run.dir) for side, c in cfg.items()}
    (sa, va), (sb, vb) = (table_vectors(tables[s].read("embeddings")) for s in ("dev", "cpu"))
    diff = float(np.abs(va - vb).max()) if len(va) == len(vb) and np.array_equal(sa, sb) else float("inf")
    rows = [row("check_stage_embeddings", device, diff, "max |diff|", diff <= 1e-5,
                f"run_stage x {len(STAGES)} stages on {len(sa)} sentences: {seconds['dev']:.1f} s on {device}, "
                f"{seconds['cpu']:.1f} s on cpu; tolerance 1e-5")]
    # the neighbours stage on the CPU over the device run's vectors: the same table (exact search)
    again = load_config("default", [*common, "run.name=cpu-over-device", "encoder.device=cpu", "neighbours.gpu=never"])
    for table in ("sentences", "rejected", "pool_sentences", "pool_rejected", "embeddings", "pool_embeddings"):
        if (cfg["dev"].run.dir / table).is_dir():
            shutil.copytree(cfg["dev"].run.dir / table, again.run.dir / table)
    run_stage("neighbours", again, force=True)
    a, b = tables["dev"].read("neighbours"), RunTables(again.run.dir).read("neighbours")
    rows.append(row("check_stage_neighbours", device, a.num_rows, "pool rows", a.equals(b),
                    f"neighbours stage (neighbours.engine = torch) on {device} vs on cpu over the same embeddings: "
                    f"equal tables: {a.equals(b)} ({a.num_rows} vs {b.num_rows} rows)"))
    return rows


# ------------------------------------------------------------------------------------------------------ translation
WORD_OR_MARK = r"\w+|[^\w\s]"  # a source token of marian_texts: a word or a punctuation mark (SentencePiece: >=)


def marian_texts(models: Models, n: int, seed: int = 0, max_words: int = 250) -> list[str]:
    """n source rows for the opus-mt-shaped Marian (its vocabulary is placeholder words, bench/fixtures/shapes.py), of real
    sentences' lengths: row i has as many placeholder words as the i-th sentence of `texts_for` (wiki1m lines: the
    carried sample on the GPU machine) has words and punctuation marks, at most `max_words` (a real tokenizer splits
    some words further: a lower bound of opus-mt's pieces)."""
    import random
    import re

    _, tokens, _ = models.marian()
    rng = random.Random(seed)
    words = tokens[2:-1]  # not </s>, <unk>, <pad>
    return [" ".join(rng.choice(words) for _ in range(min(max_words, max(1, len(re.findall(WORD_OR_MARK, t))))))
            for t in texts_for(n)]


def translator(models: Models, device: str, settings: dict):
    """The pipeline's HF engine (`load_engine`, the backtranslate stage's loader) on the opus-mt-shaped Marian, in
    the dtype the stage picks on that device, with the stage's defaults + `settings` (BacktranslateCfg fields)."""
    import torch

    from contramine.pipeline.config.backtranslation import BacktranslateCfg
    from contramine.pipeline.models.translate.engines.hf import load_engine

    cuda = device.startswith("cuda")
    dtype = ("bfloat16" if torch.cuda.is_bf16_supported() else "float16") if cuda else "float32"
    path, _, _ = models.marian()
    return load_engine("opus-mt-shape", str(path), BacktranslateCfg(**settings), device, dtype)
