"""`make gpu-check`: one command that says what a lent GPU machine does with this project's own code: speeds at
the papers' model sizes, each against the peer a user would reach for and against the card's own GEMM rate, all
in the same run; the 1M path projected from them; and whether the GPU's results agree with the CPU's. Nothing
downloads: every model is built here with random weights (bench/fixtures/shapes.py), and Prefect is not used.

    make gpu-check                                  # here: the venv's python (on a CPU: the CPU twin, below)
    PYTHONPATH=. python3 -m bench.gpu.check         # THE command on the lent GPU machine (it has no .venv), from
                                                    # the repository root (budget: 8 minutes on a bare H100,
                                                    # the wheels' install included: BUDGET below)
    python3 -m bench.gpu.check --size search_queries=200000 train_steps=5   # any size below, smaller or larger
    python3 -m bench.gpu.check --twin               # the CPU twin's toy sizes, whatever the machine has

It prints one table (name, device, value, unit, ok) and writes artifacts/gpu-check/results.json (`--out DIR` to
write elsewhere): the machine, the sizes, and one row per number: {"name", "device", "value", "unit", "ok", "note"}
(speed rows add what the summary reads: job, flop, seconds, precision, peer_of). Beside it: profile.txt and two
Chrome traces (profile_encode.json.gz, profile_generate.json.gz, profile_loop.json.gz, profile_search.json.gz;
chrome://tracing or ui.perfetto.dev); each table's first line names any host op that took over 1 ms in one call.
`ok` is true/false for each equality check and null for a measurement. Exit status: 1 when a check fails, a
section stops with an error, or (strict: on a CUDA machine, under `--strict`, and always in `make gpu-rehearsal`) a
section is skipped for a missing package; else 0. A lease is minutes long and comes rarely, so on the GPU every
section has to run the first time: a skip there is named as a failure (`failures`). The one exception is
CTranslate2's known CUDA-12 link under a CUDA-13 driver (cuBLAS 12 not found by pipeline/models/cublas.py):
generate_ct2's row then has no value and one line of reason, and that is not a failure (the HF rows still measure
translation); so is a generate row whose setting this checkout lacks (`decoder`, before issue 51's loop is
merged). Elsewhere (`--twin` on this box without `--strict`) a skip is one line, not a failure.

What it measures (GPU sizes; `--size KEY=VALUE` changes any of SIZES["gpu"]; the sections' code is in
bench/gpu/speeds.py, bench/gpu/generate.py, bench/gpu/limits.py and bench/gpu/sections.py, the models in
bench/fixtures/shapes.py). The speed sections measure one row per entry of a table at the top of bench/gpu/speeds.py
(ENCODE_ROWS, SEARCH_ROWS, TRAIN_ROWS) and bench/gpu/generate.py (GENERATE_ROWS, COMPILED_ROWS): row name ->
settings; a variant (a static cache, a token budget, ...) is one line there.
- gemm_<job>_<precision>: the card's own rate, torch.mm TFLOP/s in bf16, TF32 and full float32, at each job's
  largest matmul: encode (`encode_batch` x 22 tokens x 768 x 3072), generate (`gen_batch` x 512 x 58,101: the
  output layer), and peak (`gemm_peak` cubed); the search's, at its real block, come with the search rows.
- encode_<precision>: `contramine.pipeline.models.encode.encoder.Encoder.encode` sentences/s with a bert-base-shaped BertModel
  (12 layers, hidden 768, 12 heads, WordPiece vocabulary trained on wiki1m lines), `encode_n` sentences (wiki1m
  lines, repeated past the file's 11k; seeded sentences of common words where ../shared/data is absent), batch
  `encode_batch`, max length 128, mean pooling, float32 (TF32 off) and bf16 autocast; one warm-up pass on a
  twentieth of them, then one timed pass each. encode_st_<precision>: the peer, sentence-transformers `encode`
  (preinstalled on the GPU machine) on the same model folder (a plain HF folder: mean pooling) and sentences, same
  batch size, normalised, float32 and bf16 weights; the note has its max |difference| from our vectors.
  encode_bf16_cudnn: encode_bf16 with SDPA free to pick cuDNN's attention, torch's default order on sm90 / sm100
  (the pipeline runs without it: pipeline/models/attention_kernels.py); the contrast says what that choice is worth.
- band_search_d<d>[_<precision>]: `contramine.pipeline.search.band.band_neighbours` with `contramine.pipeline.search.torch_exact.TorchExact`
  on the GPU (exact inner-product k-NN in torch; the stage's `neighbours.engine = "torch"`), per SEARCH_ROWS: at
  d = 768 (debcse-paper's bert-base encoder: the projection's row) in float32 on all `search_queries` queries, TF32
  and bf16 scores on an eighth of them, and at d = 384 (the default MiniLM) on an eighth, each against `search_n`
  unit vectors of that d (seeded, ~100 per topic, so every query has in-band neighbours as on real sentences), the
  neighbours defaults (band 0.25-0.75, pool 64); seconds, queries/s, pool rows, GPU peak memory. After the first
  search at each d, gemm_search_d<d>_<precision>: torch.mm at [the block of queries that search took
  (`TorchExact.band_rows`, read as band() reads it: 2,147 on an 80 GB card against 1M), d, `search_n`].
  profile_search_busy: two blocks of the band_search_d768 search under torch.profiler (profile_search.json.gz and
  profile_search.txt beside results.json): where a block's time goes besides its GEMM.
- train_<objective>: one training step of each objective (trainer/objectives/) on the bert-base shape, as
  trainer/train.py's loop runs it on a GPU: bf16 autocast, TF32 matmuls, fused AdamW, gradient clipping at 1.0,
  padding-free encoder (train.unpad), batch `train_batch` x `train_max_length` tokens of pre-collated rows (the loop
  collates in DataLoader workers); `train_warmup` steps, then `train_steps` timed: steps/s and peak memory.
- generate_hf: HF `generate` target tokens/s on an opus-mt-shaped Marian (6+6 layers, d_model 512, vocabulary
  58,101), greedy, exactly `gen_tokens` new tokens per row (eos suppressed until then), `gen_fixed_n` rows of
  `gen_src` random ids, batch `gen_batch`, in the dtype the pipeline translates with on that device (bf16 on a GPU
  that supports it, float32 on a CPU). The rows below are in bench/gpu/generate.py.
- generate_ours / generate_old / generate_static: the stage's way, `Translator.translate` (loaded by the stage's
  `load_engine`) at the stage's defaults + GENERATE_ROWS' settings, on `gen_n` (8,192) rows of real sentences'
  lengths: wiki1m lines (bench/data/wiki1m_sample.txt.gz, carried in the repository: the GPU machine has no
  ../shared), each as many placeholder tokens as it has words and punctuation marks, length-sorted and batched by
  the Translator itself (on a GPU the 262,144-token budget: ~3,000 rows a batch, the 1M path's batches), each row
  decoding to its own length cap (the random model rarely ends a row itself). generate_ours is our decode loop
  (`backtranslate.decoder = "loop"`, issue 51; where this checkout's config has no such setting: no value and one
  line, not a failure), generate_old the old path (`decoder = "generate"`: HF generate). generate_user_hf: the peer
  on the same rows and model, plain HF generate as a user writes it: `tokenizer(texts, padding=True)`,
  `model.generate(**inputs)`, batch `gen_batch` (64) in input order, max_new_tokens the batch's largest row cap;
  tokens counted up to each row's eos, at most its cap. generate_ours_cudnn: generate_ours with SDPA free to pick
  cuDNN's attention (as encode_bf16_cudnn): a cuDNN plan built for each new key length is what the H200's 18,169
  tokens/s for the loop paid (2026-11-28).
- generate_ct2: the same rows through CTranslate2 as the pipeline loads it (pipeline/models/translate/engines/ct2.py `load_engine`:
  converted once, CUDA 12's cuBLAS loaded first on a GPU by pipeline/models/cublas.py), float16 on a GPU, int8 on a
  CPU; where its wheel or cuBLAS 12 is missing there, no value and the one-line reason (not a failure).
- generate_static_compile (the `compiled` section, the check's last: a compile can take minutes or break the
  process, so everything else is measured and written first): `kv_cache = "static"` + `compile`, on
  `gen_compile_n` rows, warmed up on every row (each batch shape compiles), then timed.
Every speed row is guarded: an exception is that row failed (ok false, the error in one line), and the next row
runs.
- profile_<job>_busy: torch.profiler over `profile_batches` encode batches and generate batches (Translator, the
  stage's defaults): the share of the wall time the device was busy (the CPU twin: the ops), the top ops by self
  device time in profile.txt, the Chrome traces beside results.json.
And the summary, from the rows above (bench/gpu/limits.py's docstring says how a job's arithmetic is counted):
- vs_peer_<row>: ours / the peer on the same work (encode vs sentence-transformers, generate_ours and generate_old
  vs generate_user_hf);
- vs_limit_<row>: the job's arithmetic per second / gemm_<job>_<precision> at its shape and precision;
- projection_1m_hours: the 1M DebCSE path (debcse-paper profile's work, bench/gpu/limits.py's PATH_1M) from the
  measured rates (encode_bf16, band_search_d768 scaled to 1M x 1M, generate_ours, else generate_old and the note
  says so, train_debcse), the CPU stages on `runner.workers` cores (default 1: the run's, not the machine's), with
  each stage's minutes; goal_*: issues 46 and 51's goals on one H100 as fractions (>= 1: met).

BUDGET on a bare H100 (estimates from the 2026-11-26 run, BENCHMARKS.md, and the issue's figures; not measured):
carried wheels' install ~15 s, imports ~10 s; checks ~10 s; gemm ~5 s; encode ~25 s (20,000 sentences x 3 rows + 2
peers, the BERT's vocabulary built first); search ~75 s (1M x 768 vectors ~10 s, the d = 768 float32 search
~45 s, TF32 / bf16 at an eighth ~10 s, d = 384 at an eighth ~5 s with its vectors, GEMM rows ~3 s); generate
~110 s (model ~5 s, generate_hf ~5 s; three Translator rows on 8,192 rows, ~22 tokens each, in 4 budget batches of
682-7,281 rows and 412 decode steps in all, ~8 s each; the user's batch-64 generate ~65 s: 128 batches, 16,192
decode steps at the ~4 ms a step measured on 2026-11-26; CTranslate2 ~10 s where it loads); stages ~15 s; train
~20 s; profile ~10 s; compiled ~60 s (512 rows: one budget batch, one shape compiled). About 6 minutes; the results' `section_seconds` show
each section's own time.

And checks, on tiny models built here (float32, TF32 off):
- check_encoder_cpu_vs_<device>: the same 64 sentences encoded on the CPU and on the device: max |difference|.
- check_batch_<precision>: one row's vector encoded alone, in a batch of 7 and of 64 sentences of its token
  length: max |difference| (0 on a CPU, where the pipeline promises it; on a GPU the measured difference).
- check_band_pools: band pools of `check_n` vectors with TorchExact on the device = the float64 brute force
  (`exact_band_neighbours`) = TorchExact on the CPU.
- check_stage_*: the pipeline's stages through `contramine.pipeline.engine.runner.run_stage` (no Prefect) on
  `stage_lines` wiki1m lines with a tiny encoder saved to a temporary folder (`encoder.model=<folder>`):
  sentences, pool_sentences, embeddings, pool_embeddings, neighbours on the device, then on the CPU; the
  embeddings within 1e-5, and the neighbours stage run on the CPU over the device run's embeddings gives the same
  table.

The CPU twin: where torch sees no CUDA device (or with `--twin`), the same code runs at SIZES["twin"] (toy models,
seconds each, the compiled row's CPU compile the longest; ~1 minute on a quiet 2-core box, up to 5 beside other
work) and must exit 0 with every row and no failed check
(tests/test_gpu_check.py).

Imports: the standard library at import time; each section imports what it uses, and none imports FAISS, Prefect,
DuckDB or spaCy itself (the GPU machine has none of them; importing the stages imports none of them either). The
config and the objectives need pydantic and the stages rapidfuzz, which that machine lacks: `make gpu-wheels`
downloads them (and CTranslate2) into .gpu-wheels/ for Python 3.12; carry that folder, and the check installs them
there with the machine's pip, no index (`use_carried_wheels`). Without them those sections say "skipped: missing
module pydantic" in one line, which fails the check on a CUDA machine.

The machine's package versions and the carried wheels are listed in one place, bench/gpu/machine.py (PREINSTALLED,
CARRIED). `make gpu-rehearsal` (bench/gpu/rehearsal.py) builds a throwaway venv with those versions and only the
carried wheels (cp311 here) and runs the twin there with `--strict`: run it whenever the imports of the stages, the
models or the trainer change, before a lease finds out.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

from bench.gpu.sections import Models, row

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "artifacts" / "gpu-check"
HEAVY = ("faiss", "prefect", "duckdb", "spacy")  # never imported by a section (the stage section excepted: below)

SIZES = {
    "gpu": dict(bert="base", marian="opus-mt", encode_n=20_000, encode_batch=256, max_length=128,
                search_n=1_000_000, search_queries=1_000_000, search_d=384,
                train_batch=64, train_max_length=32, train_warmup=2, train_steps=10,
                gen_n=8192, gen_batch=64, gen_fixed_n=1024, gen_src=32, gen_tokens=64, gen_compile_n=512,
                check_n=2000, stage_lines=300, gemm_peak=8192, profile_batches=2),
    "twin": dict(bert="toy", marian="toy", encode_n=64, encode_batch=16, max_length=64,
                 search_n=3000, search_queries=3000, search_d=384,
                 train_batch=8, train_max_length=16, train_warmup=1, train_steps=2,
                 gen_n=8, gen_batch=4, gen_fixed_n=8, gen_src=8, gen_tokens=8, gen_compile_n=4,
                 check_n=500, stage_lines=120, gemm_peak=256, profile_batches=1),
}

# ------------------------------------------------------------------------------------------------------ driver
def sections() -> list:
    from bench.gpu.generate import section_compiled, section_generate
    from bench.gpu.limits import section_gemm, section_profile
    from bench.gpu.sections import section_checks, section_stages
    from bench.gpu.speeds import section_encode, section_search, section_train

    return [("checks", section_checks), ("gemm", section_gemm), ("encode", section_encode),
            ("search", section_search), ("generate", section_generate), ("stages", section_stages),
            ("train", section_train), ("profile", section_profile), ("compiled", section_compiled)]


SECTION_NAMES = ("checks", "gemm", "encode", "search", "generate", "stages", "train", "profile", "compiled")


def _where(exc: BaseException) -> str:
    """The project file whose import failed (`pipeline/stages/negate.py`), for the one-line reason."""
    files = [Path(f.filename).resolve() for f in traceback.extract_tb(exc.__traceback__)]  # the file, not the link
    files = [f for f in files if f.is_relative_to(ROOT)]
    return str(files[-1].relative_to(ROOT)) if files else "?"


def run_section(name: str, fn, models: Models, device: str, sizes: dict) -> tuple[list[dict], float, list[str]]:
    before = {m.split(".")[0] for m in sys.modules if m.split(".")[0] in HEAVY}
    t0 = time.perf_counter()
    try:
        rows = fn(models, device, sizes)
    except ModuleNotFoundError as e:  # a package the machine lacks: one line, not a failure
        rows = [row(f"{name}_skipped", device, None, "-", None,
                    f"skipped: missing module {e.name} (imported by {_where(e)})")]
    except Exception as e:
        traceback.print_exc()
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        rows = [row(f"{name}_error", device, None, "-", False, f"{type(e).__name__}: {msg}")]
    heavy = sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in HEAVY} - before)
    return rows, time.perf_counter() - t0, heavy


def failures(rows: list[dict], strict: bool) -> list[str]:
    """The rows that fail the check: a false equality check, a section that stopped with an error, and, when strict,
    a section skipped for a missing package (`<section>_skipped`)."""
    return [r["name"] for r in rows
            if r["ok"] is False or (strict and r["name"].endswith("_skipped"))]


def summarise(rows: list[dict], device: str, facts: dict) -> list[dict]:
    """bench/gpu/limits.py's summary rows (peers, limits, the 1M projection); a failure there is one error row."""
    from bench.gpu.limits import summary

    print("== summary", flush=True)
    try:
        got = summary(rows, device, facts)
    except Exception as e:
        traceback.print_exc()
        got = [row("summary_error", device, None, "-", False, f"{type(e).__name__}: {str(e).strip()[:200]}")]
    for r in got:
        print(f"   {r['name']}: {fmt(r['value'])} {r['unit']}  {r['note']}", flush=True)
    return got


def machine(device: str) -> dict:
    import torch

    facts = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
             "device": device, "cpus": len(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(),
             "load_avg": [round(x, 2) for x in os.getloadavg()]}
    from importlib.metadata import PackageNotFoundError, version

    for name in ("transformers", "sentence_transformers"):  # the installed versions, without importing them (seconds)
        try:
            facts[name] = version(name.replace("_", "-"))
        except PackageNotFoundError:
            pass
    try:  # the projection's stages run on `runner.workers` workers (the default: auto, the machine's cores)
        from contramine.pipeline.config.mining import RunnerCfg

        facts["workers"] = RunnerCfg().workers
    except ImportError:  # no pydantic: the same default, written here
        facts["workers"] = os.cpu_count() or 1
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(device)
        facts |= {"gpu": p.name, "gpu_memory_gib": round(p.total_memory / 2**30, 1),
                  "bf16": torch.cuda.is_bf16_supported()}
    return facts


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-2 and v != 0 else f"{v:,.2f}" if abs(v) < 1e5 else f"{v:,.0f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


WHEELS = ROOT / ".gpu-wheels"
SITE = ROOT / "artifacts" / f"gpu-site-cp{sys.version_info.major}{sys.version_info.minor}"  # one per Python


def use_carried_wheels(folder: Path = WHEELS, site: Path = SITE) -> str:
    """The wheels `make gpu-wheels` put in .gpu-wheels/ (carried to the GPU machine: bench/gpu/machine.py's CARRIED),
    installed into artifacts/gpu-site with the machine's own pip, no index, and put first on sys.path (after the
    repository root). `make gpu-rehearsal` passes its own folder of cp311 wheels (`--wheels`). An installed site is
    reused only while it holds the same wheel files. Returns one line saying what it did."""
    import importlib.util
    import shutil
    import subprocess

    from bench.gpu.machine import CARRIED

    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        return f"carried wheels: none ({folder} is empty: `make gpu-wheels` fills it)"
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    if any("-cp3" in w.name and f"-{tag}-" not in w.name and "-abi3-" not in w.name for w in wheels):
        return f"carried wheels: built for another Python than this {tag}: not used"
    names = "\n".join(w.name for w in wheels)
    marker = site / ".complete"
    if not marker.is_file() or marker.read_text() != names:
        shutil.rmtree(site, ignore_errors=True)
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target",
                            str(site), *map(str, wheels)], capture_output=True, text=True)
        if r.returncode != 0:
            return f"carried wheels: pip could not install them ({' '.join(r.stderr.split())[:200]})"
        marker.write_text(names)
    sys.path.insert(1, str(site))
    importlib.invalidate_caches()
    modules = {"pydantic-core": "pydantic_core", "annotated-types": "annotated_types",
               "typing-inspection": "typing_inspection", "typing-extensions": "typing_extensions"}
    found = [modules.get(m, m) for m in CARRIED if importlib.util.find_spec(modules.get(m, m)) is not None]
    return f"carried wheels: {len(wheels)} from {folder} in {site} (importable: {', '.join(found) or 'none'})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--twin", action="store_true", help="the CPU twin's toy sizes on the CPU, whatever the machine")
    ap.add_argument("--size", nargs="*", default=[], metavar="KEY=VALUE", help="override a size (see SIZES)")
    ap.add_argument("--only", nargs="*", default=None, choices=SECTION_NAMES)
    ap.add_argument("--out", default=str(OUT), help="folder for results.json (default artifacts/gpu-check)")
    ap.add_argument("--wheels", default=str(WHEELS), help="folder of carried wheels (default .gpu-wheels)")
    ap.add_argument("--strict", action="store_true",
                    help="a section skipped for a missing package fails the check (always so on a CUDA machine)")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing downloads: every model is built here
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    t_start = time.perf_counter()
    wheels = Path(args.wheels).resolve()
    print(use_carried_wheels(wheels, SITE if wheels == WHEELS else wheels.parent / SITE.name), flush=True)
    import torch

    device = "cuda" if torch.cuda.is_available() and not args.twin else "cpu"
    mode = "gpu" if device == "cuda" else "twin"
    sizes = dict(SIZES[mode])
    for kv in args.size:
        key, _, value = kv.partition("=")
        if key not in sizes:
            ap.error(f"--size {kv}: unknown size {key!r}; one of {', '.join(sizes)}")
        sizes[key] = type(sizes[key])(value)
    facts = machine(device)
    print(f"gpu-check ({'GPU' if mode == 'gpu' else 'CPU twin: no CUDA device' if not args.twin else 'CPU twin'}): "
          f"{json.dumps(facts)}", flush=True)
    rows, timings, imported = [], {}, {}
    strict = args.strict or mode == "gpu"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def write(done: bool) -> dict:
        """results.json after every section, so a run stopped by its time limit still leaves what it measured."""
        result = {"date": dt.datetime.now().astimezone().isoformat(timespec="seconds"), "mode": mode,
                  "machine": facts, "complete": done, "strict": strict, "failed": failures(rows, strict),
                  "sizes": sizes, "seconds": round(time.perf_counter() - t_start, 1), "section_seconds": timings,
                  "heavy_imports_by_section": imported, "rows": rows}
        tmp = out / "results.json.tmp"
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out / "results.json")
        return result

    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        os.environ["HF_HUB_CACHE"] = str(Path(tmp) / "hub")  # CTranslate2's conversions (ct2.py) go beside it
        models = Models(sizes, Path(tmp), out)
        for name, fn in sections():
            if args.only is not None and name not in args.only:
                continue
            print(f"== {name}", flush=True)
            got, seconds, heavy = run_section(name, fn, models, device, sizes)
            timings[name], imported[name] = round(seconds, 1), heavy
            for r in got:
                verdict = "" if r["ok"] is None else "ok" if r["ok"] else "FAILED"
                print(f"   {r['name']}: {fmt(r['value'])} {r['unit']} {verdict}  {r['note']}", flush=True)
            rows += got
            write(done=False)
    rows += summarise(rows, device, facts)
    result = write(done=True)
    total, failed = result["seconds"], result["failed"]
    print(f"\n{'name':<40} {'device':<7} {'value':>14}  {'unit':<24} ok")
    for r in rows:
        ok = "-" if r["ok"] is None else "yes" if r["ok"] else "NO"
        print(f"{r['name']:<40} {r['device']:<7} {fmt(r['value']):>14}  {r['unit']:<24} {ok}")
    for r in rows:
        if r["name"].endswith(("_skipped", "_error")) or r["value"] is None:
            print(f"{r['name']}: {r['note']}")
    print(f"\n{len(rows)} rows, {len(failed)} failed{': ' + ', '.join(failed) if failed else ''}; {total:.0f} s "
          f"({', '.join(f'{k} {v:.0f}s' for k, v in timings.items())}); wrote {out / 'results.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
