"""The card's limits in `make gpu-check` (bench/gpu/check.py has what they measure and how to run it): its own GEMM
rate at the jobs' shapes, a profile of a few encode and generate batches, and the summary that sets every job
against its peer, its limit and the 1M path. Standard library at import time; each section imports what it uses.

Arithmetic of a job (FLOP, multiply-adds counted twice), as the summary divides it by the job's time:
- BERT over sentences of L tokens, per layer: 2 (4 d^2 + 2 d f) per token (Q, K, V, O, the FFN) + 4 d L^2 per
  sentence (scores and their weighted sum); a training step is three times its forward (backward: twice);
- Marian: the encoder as BERT over the source, plus the cross-attention's K, V (4 d^2 a source token a layer);
  per target token per layer 2 (6 d^2 + 2 d f) + 4 d (S + t) (self-attention over t earlier tokens, cross over S),
  and the output layer 2 d V;
- the band search: 2 q n d (the score GEMM; the top-k is not counted).
"""
from __future__ import annotations

import json
import time

from bench.gpu.sections import Models, row, sync, texts_for

PRECISIONS = ("bf16", "tf32", "fp32")
# the translation rate the projection takes: our decode loop's, else the stage's old path's (the loop not merged)
GENERATE_PROJECTED = ("generate_default_tokens_per_s", "generate_ours_tokens_per_s", "generate_old_tokens_per_s")
# The 1M DebCSE path (configs/debcse-paper.toml), as BENCHMARKS.md's projection counts it: 1M sentences embedded,
# ~4M positive candidates embedded by `scores`, 1M x 1M exact band search, back-translation of 5 texts a sentence
# (the sentence + its 4 noised copies, role "positives") x 2 hops x ~30 target tokens, the CPU stages (negate, noise,
# ipw, pairs: 942 + 159 + 335 + 43 s measured at 1M on 2 cores, docs/scale-and-clusters.md; run on `runner.workers`
# cores, default 1: not on every core of the machine), and one epoch of DebCSE at batch 64.
PATH_1M = dict(embedded=1_000_000, scored=4_000_000, queries=1_000_000, base=1_000_000,
               target_tokens=1_000_000 * 5 * 2 * 30, cpu_core_seconds=2 * (942 + 159 + 335 + 43),
               train_steps=1_000_000 // 64)


# ------------------------------------------------------------------------------------------------------ arithmetic
def bert_flop(cfg: dict, tokens: int, squares: int = 0, passes: int = 1) -> float:
    """FLOP of `passes` x a BERT forward over `tokens` real tokens whose sentence lengths squared sum to `squares`."""
    d, f, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    return passes * layers * (tokens * 2 * (4 * d * d + 2 * d * f) + 4 * d * squares)


def marian_flop(cfg: dict, src: list[int], tgt: list[int]) -> float:
    """FLOP of translating rows of src[i] source tokens into tgt[i] target tokens (module docstring)."""
    d, f, v = cfg["d_model"], cfg["decoder_ffn_dim"], cfg["vocab_size"]
    enc = bert_flop({"hidden_size": d, "intermediate_size": cfg["encoder_ffn_dim"],
                     "num_hidden_layers": cfg["encoder_layers"]}, sum(src), sum(s * s for s in src))
    cross_kv = cfg["decoder_layers"] * 4 * d * d * sum(src)
    dec = sum(cfg["decoder_layers"] * (t * 2 * (6 * d * d + 2 * d * f) + 4 * d * (s * t + t * t / 2)) + 2 * d * v * t
              for s, t in zip(src, tgt))
    return enc + cross_kv + dec


def sig(x: float) -> float:
    """x to 4 significant digits (a rate of 0.00021 keeps its digits)."""
    return float(f"{x:.4g}")


def config_of(path) -> dict:
    return json.loads((path / "config.json").read_text())


# ------------------------------------------------------------------------------------------------------ GEMM
def gemm_shapes(models: Models, sizes: dict) -> dict[str, tuple[int, int, int]]:
    """(M, K, N) of each job's largest matmul at the check's sizes: encode (tokens of a batch x hidden x FFN),
    generate (batch x d_model x vocabulary), and a square `gemm_peak` one (the card's best case). The search's
    (query block x d x base) is measured by the search section, at the block each search took (gemm_rows)."""
    bert = config_of(models.bert())
    _, _, marian = models.marian()
    return {"encode": (sizes["encode_batch"] * 22, bert["hidden_size"], bert["intermediate_size"]),
            "generate": (sizes["gen_batch"], marian["d_model"], marian["vocab_size"]),
            "peak": (sizes["gemm_peak"],) * 3}


def mm_rate(m: int, k: int, n: int, precision: str, device: str, seconds: float = 0.25, least: int = 3) -> float:
    """TFLOP/s of torch.mm [m, k] x [k, n] in `precision` (bf16 inputs; float32 with TF32 passes; full float32):
    two untimed, then at least `least` and as many as fit in `seconds` (at most 200)."""
    import torch

    from contramine.trainer.precision import restored_float32_settings

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    with restored_float32_settings(), torch.inference_mode():
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
        g = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(m, k, generator=g, device=device, dtype=dtype)
        b = torch.randn(k, n, generator=g, device=device, dtype=dtype)
        for _ in range(min(2, least)):
            torch.mm(a, b)
        sync(device)
        iters, t0 = 0, time.perf_counter()
        while iters < least or (time.perf_counter() - t0 < seconds and iters < 200):
            torch.mm(a, b)
            iters += 1
            if iters % 5 == 0:
                sync(device)
        sync(device)
        s = time.perf_counter() - t0
        del a, b
    return 2 * m * k * n * iters / s / 1e12


INPUTS = {"bf16": "bf16 inputs", "tf32": "float32 inputs, TF32 passes", "fp32": "float32, TF32 off"}


def gemm_rows(job: str, shape: tuple[int, int, int], device: str, why: str = "") -> list[dict]:
    """gemm_<job>_<precision>: torch.mm's TFLOP/s at `shape` (M, K, N) in each of PRECISIONS."""
    m, k, n = shape
    rows = []
    for precision in PRECISIONS:
        rate = mm_rate(m, k, n, precision, device, *((0.25, 3) if device.startswith("cuda") else (0.0, 1)))
        rows.append(row(f"gemm_{job}_{precision}", device, sig(rate), "TFLOP/s", None,
                        f"torch.mm [{m}, {k}] x [{k}, {n}], {precision} ({INPUTS[precision]})"
                        + (f"; {why}" if why else "")))
    return rows


def section_gemm(models: Models, device: str, sizes: dict) -> list[dict]:
    return [r for job, shape in gemm_shapes(models, sizes).items() for r in gemm_rows(job, shape, device)]


# ------------------------------------------------------------------------------------------------------ profile
def _profiled(fn, device: str, trace, label: str) -> tuple[float, str, float]:
    """(wall seconds, top-ops table, share of the wall the device (CPU twin: the ops) was busy) of `fn` under
    torch.profiler; its Chrome trace written to `trace`."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        wall = time.perf_counter() - t0
    prof.export_chrome_trace(str(trace))
    events = prof.key_averages()
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    busy = sum(getattr(e, attr, getattr(e, "self_cuda_time_total", 0)) or 0 for e in events) / 1e6
    table = events.table(sort_by=key, row_limit=15)
    head = f"== {label}: {wall:.3f} s wall, {'device' if cuda else 'op'} busy {busy:.3f} s; {slow_host_ops(prof)}"
    return wall, f"{head}\n{table}\n", busy / wall


def slow_host_ops(prof, over_us: float = 1000.0) -> str:
    """The ops whose own host time passed `over_us` in one call, by name: one-off host work hiding in a loop (the
    H200's 2026-11-28 trace: 139 of 1,548 cuDNN attention calls built a plan, ~49 ms each, 6.8 s of 8.0 s)."""
    slow: dict[str, list[float]] = {}
    for e in prof.events():
        if e.self_cpu_time_total > over_us:
            slow.setdefault(e.name, []).append(e.self_cpu_time_total / 1e6)
    if not slow:
        return f"no host op over {over_us / 1000:g} ms"
    top = sorted(slow.items(), key=lambda kv: -sum(kv[1]))[:3]
    return f"host ops over {over_us / 1000:g} ms: " + ", ".join(
        f"{name} {len(t)} calls {sum(t):.3f} s" for name, t in top)


def section_profile(models: Models, device: str, sizes: dict) -> list[dict]:
    """Two short profiles under torch.profiler, at the pipeline's defaults: `profile_batches` encode batches and
    translation batches (Translator.translate: the stage's decoder, our loop): profile_encode.json.gz,
    profile_generate.json.gz (Chrome traces: chrome://tracing, ui.perfetto.dev) and profile.txt (top ops by self
    device time; CPU time on the twin) beside results.json. Each is a row of its own (a time budget each)."""
    from bench.gpu.sections import guarded

    out = models.out
    out.mkdir(parents=True, exist_ok=True)
    tables: list[str] = []
    return [*guarded("profile_encode_busy", "of wall", device, lambda: profile_encode(models, device, sizes, tables)),
            *guarded("profile_generate_busy", "of wall", device,
                     lambda: profile_generate(models, device, sizes, tables))]


def profile_encode(models: Models, device: str, sizes: dict, tables: list[str]) -> list[dict]:
    from contramine.pipeline.models.encode.encoder import Encoder, resolve_precision

    out = models.out
    enc = Encoder.load(str(models.bert()), pooler="mean", max_length=sizes["max_length"], device=device,
                       precision=resolve_precision("auto", device))
    bs = sizes["encode_batch"]
    texts = texts_for(bs * sizes["profile_batches"])
    enc.encode(texts[:bs], batch_size=bs)  # warm-up
    wall, table, busy = _profiled(lambda: enc.encode(texts, batch_size=bs), device, out / "profile_encode.json.gz",
                                  f"encode: {len(texts)} sentences, batch {bs}")
    del enc
    return _profile_row("profile_encode_busy", device, out, tables, table, busy, wall,
                        f"{len(texts)} sentences; {out / 'profile_encode.json.gz'}, {out / 'profile.txt'}")


def profile_generate(models: Models, device: str, sizes: dict, tables: list[str]) -> list[dict]:
    from bench.gpu.sections import marian_texts, translator

    out = models.out
    tr = translator(models, device, {})
    rows = min(tr.cfg.batch_size, sizes["gen_batch"]) * sizes["profile_batches"]  # twin: a few short rows
    src = marian_texts(models, rows, seed=5, max_words=2 * sizes["gen_src"])
    tr.translate(src[:tr.cfg.batch_size])
    decoder = getattr(tr.cfg, "decoder", "generate")
    wall, table, busy = _profiled(lambda: tr.translate(src), device, out / "profile_generate.json.gz",
                                  f"generate (Translator.translate, decoder {decoder}): {len(src)} rows, batch_size "
                                  f"{tr.cfg.batch_size}")
    del tr
    return _profile_row("profile_generate_busy", device, out, tables, table, busy, wall,
                        f"{len(src)} rows, decoder {decoder}; {out / 'profile_generate.json.gz'}")


def _profile_row(name: str, device: str, out, tables: list[str], table: str, busy: float, wall: float,
                 what_ran: str) -> list[dict]:
    """A profile's table added to profile.txt (rewritten whole: a killed check keeps what it profiled) and its row."""
    tables.append(table)
    (out / "profile.txt").write_text("".join(tables))
    what = "device" if device.startswith("cuda") else "ops (CPU twin)"
    return [row(name, device, round(busy, 3), "of wall", None, f"{what} busy {busy:.0%} of {wall:.2f} s: {what_ran}")]


# ------------------------------------------------------------------------------------------------------ summary
def peers(r: dict) -> list[str]:
    """The rows a peer row is set against (`peer_of`: one name or a list)."""
    names = r.get("peer_of") or []
    return [names] if isinstance(names, str) else list(names)


def summary(rows: list[dict], device: str, facts: dict) -> list[dict]:
    """Each job against its peer (rows with `peer_of`), against the card's GEMM rate at its shape and precision
    (rows with flop, seconds, job, precision), and the 1M path projected from the measured rates: translation at our
    decode loop's rate (generate_ours; the stage's old path where the loop did not run, said so), the search at
    d = 768 (debcse-paper's encoder), the CPU stages on `runner.workers` cores (facts["workers"], default 1)."""
    by = {r["name"]: r for r in rows}
    out = []
    for r in rows:
        for name in peers(r):
            ours = by.get(name)
            if ours is not None and ours["value"] and r["value"]:
                out.append(row(f"vs_peer_{name}", device, sig(ours["value"] / r["value"]), "x", None,
                               f"{name} {ours['value']:,} / {r['name']} {r['value']:,} {r['unit']} (same work)"))
    for r in rows:
        gemm = by.get(f"gemm_{r.get('job')}_{r.get('precision')}")
        if "flop" in r and r.get("seconds") and gemm is not None and gemm["value"]:
            achieved = r["flop"] / r["seconds"] / 1e12
            out.append(row(f"vs_limit_{r['name']}", device, sig(achieved / gemm["value"]), "of torch.mm rate",
                           None, f"{achieved:.3g} TFLOP/s of the job's arithmetic vs {gemm['value']:.3g} TFLOP/s "
                                 f"({gemm['name']}: {gemm['note']})"))
    auto = "bf16" if device.startswith("cuda") else "float32"
    generate = next((n for n in GENERATE_PROJECTED if (by.get(n) or {}).get("value")), GENERATE_PROJECTED[0])
    need = {"encode": f"encode_{auto}", "search": "band_search_d768_seconds", "generate": generate,
            "train": "train_debcse_steps_per_s"}
    missing = [name for name in need.values() if not (by.get(name) or {}).get("value")]
    if missing:
        return out + [row("projection_1m_hours", device, None, "h", None, f"not computed: no {', '.join(missing)}")]
    p, search = PATH_1M, by[need["search"]]
    # the per-query part scaled to 1M x 1M; what a search pays once (setup_seconds: the base to the device, the
    # precision check) counted once, not scaled with the queries (rows before 2026-11-28's fourth session: none)
    setup = min(search.get("setup_seconds") or 0.0, search["value"])
    search_1m = setup + (search["value"] - setup) * p["queries"] * p["base"] / (search["queries"] * search["base"])
    workers = max(1, min(int(facts.get("workers", 1)), int(facts.get("cpus", 1))))
    from bench.gpu.projection import project  # the pipeline's stage graph: imported when the summary is made

    encode = by[need["encode"]]["value"]
    device_s = {"embeddings": p["embedded"] / encode, "scores": p["scored"] / encode, "neighbours": search_1m,
                "backtranslate": p["target_tokens"] / by[need["generate"]]["value"]}
    timeline, path = project(device_s, p["train_steps"] / by[need["train"]]["value"], workers)
    hours = timeline.wall / 3600
    twin = "" if device.startswith("cuda") else "; CPU twin: toy models, not a projection"
    old = "" if generate == GENERATE_PROJECTED[0] else f"; translation at {generate} ({GENERATE_PROJECTED[0]} not measured)"
    spans = ", ".join(f"{k} {a / 60:.1f}-{b / 60:.1f} min" for k, (a, b) in path["stages"].items())
    out.append(row("projection_1m_hours", device, sig(hours), "h", None,
                   f"the mine's graph and training on {workers} worker{'s' * (workers > 1)} and one card (bench/gpu/"
                   f"projection.py): device busy {timeline.device_busy / 60:.1f} min of {timeline.wall / 60:.1f}; "
                   f"{spans}; goal < 45 min: {'met' if hours < 0.75 else 'not met'}{old}{twin}"))
    out.append(row("projection_1m_wall_over_device_busy", device, sig(path["wall_over_device_busy"] or 0), "x", None,
                   "the simulated wall over the card's busy time (goal <= 1.1: the CPU stages add nothing)"))
    # issue 63's goals on one H100, as fractions (>= 1: met); the encoding's peer: sentence-transformers without
    # cuDNN's attention (encode_st_bf16_nocudnn), so the ratio compares kernels, not plans
    peer = next((r for r in out if r["name"] == "vs_peer_encode_bf16"), None)
    goals = [("goal_encode_50k_per_s", by[need["encode"]]["value"] / 50_000, f"{need['encode']} >= 50,000 sentences/s"),
             ("goal_search_1m_10s", 10 / search_1m, f"1M x 1M band search at d = 768 <= 10 s ({search_1m:.1f} s)"),
             ("goal_generate_300k_per_s", by[need["generate"]]["value"] / 300_000, f"{generate} >= 300,000 tokens/s"),
             ("goal_train_debcse_15_per_s", by[need["train"]]["value"] / 15, "DebCSE >= 15 steps/s"),
             ("goal_projection_45min", 0.75 / hours, "the 1M path projected < 45 min"),
             ("goal_projection_30min", 0.5 / hours, "the 1M path projected < 30 min (the goal after it)")]
    if peer is not None:
        goals.insert(1, ("goal_encode_vs_st_1_5x", peer["value"] / 1.5, f"{peer['name']} >= 1.5x (ST without cuDNN)"))
    user = next((r for r in out if r["name"] == f"vs_peer_{GENERATE_PROJECTED[0]}"), None)
    if user is not None:
        goals.insert(4, ("goal_generate_vs_hf_3x", user["value"] / 3, f"{user['name']} >= 3x HF generate at batch 64"))
    out += [row(name, device, sig(v), "of goal", None, f"{what}: {'met' if v >= 1 else 'not met'}{twin}")
            for name, v, what in goals]
    return out
