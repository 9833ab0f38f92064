"""`make gpu-check`: one command that says what a lent GPU machine does with this project's own code: speeds at
the papers' model sizes, each against the peer a user would reach for and against the card's own GEMM rate, all
in the same run; the 1M path projected from them; and whether the GPU's results agree with the CPU's. Nothing
downloads: every model is built here with random weights (bench/fixtures/shapes.py), and Prefect is not used.

On the lent GPU machine (it has no .venv), from the repository root, .gpu-wheels carried (`make gpu-wheels`):

    PYTHONPATH=. python3 -m bench.gpu.check                   # THE check: <= 6 min on a bare H100, installs included
    PYTHONPATH=. python3 -m bench.gpu.check --rerun-failed    # just the rows that failed or did not run, into the same
                                                              # results.json (`--rerun-failed FILE`: another run's)
Here: `make gpu-check` (the venv's python; on a CPU the twin, below); `--size KEY=VALUE` changes any of SIZES, e.g.
`--size deadline_s=500 search_queries=200000`; `--twin`: the CPU twin's toy sizes whatever the machine has.

The time it may take (issue 63: a lease is 15 minutes of device time, start-up included, one call at most 10):
`deadline_s` (SIZES: 330 s from the start on a GPU, the carried wheels' install included) and a budget per row
(`row_s`, longer for the rows bench/gpu/budget.py's ROW_S names); a row past its budget is one failed row, one the
deadline leaves no time for is one row "not run", and every row is written to results.json as it is measured, so a
run killed from outside leaves what it measured. The rows that decide issue 63's goals come first in each section;
the compiled rows are optional and last: they start only with `compiled_s` seconds left, and not running is not a
failure there. `--rerun-failed` reads results.json, runs again only the sections with a row that failed or did not
run (skipping, inside them, the rows already measured), and writes the merged rows and a new summary.

It prints one table (name, device, value, unit, ok) and writes artifacts/gpu-check/results.json (`--out DIR`): the
machine, the sizes, `sections_done`, `failed`, and one row per number: {"name", "device", "value", "unit", "ok",
"note", "section"} (speed rows add what the summary reads: job, flop, seconds, precision, peer_of; a row the deadline
stopped: "not_run": true). Beside it: profile.txt, profile_search.txt and Chrome traces (profile_encode.json.gz,
profile_generate.json.gz, profile_search.json.gz). `ok` is true/false for each equality check and null for a
measurement. Exit status 1 when a check fails, a row fails or times out, a row or section did not run (the compiled
ones excepted), or (strict: on a CUDA machine, under `--strict`, and always in `make gpu-rehearsal`) a section is
skipped for a missing package; else 0. CTranslate2's known CUDA-12 link under a CUDA-13 driver is no failure
(generate_ct2's row: no value and one line of reason), nor is a generate row whose setting this checkout lacks.

The rows (GPU sizes; the tables of rows: ENCODE_ROWS, ST_ROWS, SEARCH_ROWS, TRAIN_ROWS in bench/gpu/speeds.py,
GENERATE_ROWS, COMPILED_ROWS in bench/gpu/generate.py; a variant is one line there):
- checks (tiny models, float32, TF32 off): check_encoder_cpu_vs_<device>, check_batch_<precision> (a row's vector
  alone and in batches of 7 and 64), check_band_pools and check_band_pools_dense (band pools of `check_n` topic /
  SimCSE-like vectors with TorchExact on the device = the float64 brute force = TorchExact on the CPU).
- gemm_<job>_<precision>: torch.mm TFLOP/s at each job's largest matmul (bf16, TF32, float32).
- encode_*: `Encoder.encode` sentences/s, bert-base shape, `encode_n` (40,960) wiki1m sentences (the carried
  sample, repeated), the stage's GPU way first (encode_bf16: bf16, the Encoder's token budget), then with cuDNN's
  attention allowed (encode_bf16_cudnn), float32, a 65,536-token budget; the peer encode_st_bf16_nocudnn
  (sentence-transformers on the same folder and sentences, bf16 weights, without cuDNN's attention as the pipeline
  runs: issue 63's peer) and encode_st_bf16 (its default, cuDNN allowed).
- band_search_d768*: `band_neighbours` + TorchExact (the stage's `neighbours.engine = "torch"`), band 0.25-0.75,
  pool 64, against `search_n` (1M) base vectors: on SimCSE-like vectors (sections.simcse_like_vectors: a shared mean
  direction and a low-rank part; ~93% of pairs in band, so rows widen) at the stage's precision on a quarter of the
  queries (the 1M x 1M goal's row, scaled), in float32 on a sixteenth, and on topic vectors (sparse bands, the
  H200's 2026-11-28 vectors) on an eighth; each row times one block first and takes as many of its queries as fit
  `search_s` (30 s for the goal row, less for a smaller share), so rows that widen more than expected cost queries,
  not the lease; gemm_search_d768_* at the block it took; profile_search_busy (two blocks under torch.profiler).
- generate_*: translation on an opus-mt-shaped Marian: generate_hf (HF generate, fixed lengths), the stage's
  Translator on `gen_n` (8,192) real-length rows in the 1M path's batches (262,144-token budget): generate_default
  (the stage's defaults: our loop), generate_ours, generate_old (HF generate, dynamic cache), generate_static (its
  static cache), generate_ours_cudnn; generate_user_hf (plain HF generate at batch 64 as a user writes it, every 4th
  row); generate_ct2 (CTranslate2 through the pipeline's loader, where it loads).
- check_stage_*: the stages sentences -> neighbours through `run_stage` on the device and on the CPU: equal.
- train_<objective>: one training step as trainer/train.py runs it (bf16, TF32, fused AdamW, padding-free), DebCSE
  first: steps/s and peak memory.
- profile_encode_busy, profile_generate_busy: two short profiles (the stage's encode and translation).
- generate_static_compile (optional, last): the static cache compiled, on `gen_compile_n` rows.
- The summary: vs_peer_<row> (ours / the peer's), vs_limit_<row> (the job's arithmetic per second / its GEMM rate),
  projection_1m_hours (the 1M DebCSE path as one graph, bench/gpu/projection.py: the mine's stages and training
  simulated on `runner.workers` workers and one card, fed encode_bf16, band_search_d768 scaled to 1M x 1M, the
  translation row (generate_default, else the old path, said so) and train_debcse), goal_* (issue 63's goals as
  fractions, >= 1: met).

The budget on a bare H100 (estimates, not measured: the 2026-11-26 H100 and 2026-11-28 H200 runs, BENCHMARKS.md):
wheels ~15 s, imports ~10 s, checks ~10 s, gemm ~6 s, encode ~40 s (ST at ~3.5k sentences/s: ~12 s a row),
search ~45 s (vectors ~3 s a kind, the dense quarter ~10-25 s), generate ~60 s (user_hf ~15-25 s), stages ~5 s,
train ~15 s, profile ~10 s, summary ~5 s: ~4 minutes, then the compiled row where time is left.
`section_seconds` in results.json has each section's own time.

The CPU twin: where torch sees no CUDA device (or with `--twin`), the same code at SIZES["twin"] (toy models,
seconds a row) must exit 0 with every row and no failed check (tests/test_gpu_check.py). Imports: the standard
library at import time; each section imports what it uses, and none imports FAISS, Prefect, DuckDB or spaCy itself
(the GPU machine has none of them). The config and the objectives need pydantic and the stages rapidfuzz, which that
machine lacks: `make gpu-wheels` downloads them (and CTranslate2) into .gpu-wheels/ for its Python 3.12, and the
check installs them there with the machine's pip, no index (`use_carried_wheels`); without them those sections are
skipped in one line, which fails the check on a CUDA machine. The machine's package versions and the carried wheels
are listed in one place, bench/gpu/machine.py (PREINSTALLED, CARRIED). `make gpu-rehearsal`
(bench/gpu/rehearsal.py) builds a throwaway venv with those versions and only the carried wheels (cp311 here) and
runs the twin there with `--strict`: run it whenever the imports of the stages, the models or the trainer change.
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

from bench.gpu.budget import OPTIONAL, failures
from bench.gpu.sections import Models, row

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "artifacts" / "gpu-check"
HEAVY = ("faiss", "prefect", "duckdb", "spacy")  # never imported by a section (the stage section excepted: below)

SIZES = {
    "gpu": dict(bert="base", marian="opus-mt", encode_n=40_960, encode_batch=256, max_length=128,
                search_n=1_000_000, search_queries=1_000_000, search_d=384, search_s=30.0, search_block=0,
                train_batch=64, train_max_length=32, train_warmup=2, train_steps=10,
                gen_n=8192, gen_batch=64, gen_fixed_n=1024, gen_src=32, gen_tokens=64, gen_compile_n=512,
                check_n=2000, stage_lines=300, gemm_peak=8192, profile_batches=2,
                deadline_s=330.0, row_s=90.0, compiled_s=100.0),
    "twin": dict(bert="toy", marian="toy", encode_n=64, encode_batch=16, max_length=64,
                 search_n=2000, search_queries=2000, search_d=384, search_s=0.05, search_block=128,
                 train_batch=8, train_max_length=16, train_warmup=1, train_steps=2,
                 gen_n=8, gen_batch=4, gen_fixed_n=8, gen_src=8, gen_tokens=8, gen_compile_n=4,
                 check_n=400, stage_lines=120, gemm_peak=256, profile_batches=1,
                 deadline_s=600.0, row_s=240.0, compiled_s=0.0),
}
TIME_KEYS = ("deadline_s", "row_s", "compiled_s")  # the time budget: a rerun's own, not the earlier run's
TWIN_ROW_SCALE = 2.0  # the twin's ROW_S budgets (bench/gpu/budget.py) against a GPU's: a shared 2-core CPU


# ------------------------------------------------------------------------------------------------------ driver
def sections() -> list:
    from bench.gpu.generate import section_compiled, section_generate
    from bench.gpu.limits import section_gemm, section_profile
    from bench.gpu.sections import section_checks, section_stages
    from bench.gpu.speeds import section_encode, section_search, section_train

    return [("checks", section_checks), ("gemm", section_gemm), ("encode", section_encode),
            ("search", section_search), ("generate", section_generate), ("train", section_train),
            ("stages", section_stages), ("profile", section_profile), ("compiled", section_compiled)]


SECTION_NAMES = ("checks", "gemm", "encode", "search", "generate", "train", "stages", "profile", "compiled")


def _where(exc: BaseException) -> str:
    """The project file whose import failed (`pipeline/stages/negate.py`), for the one-line reason."""
    files = [Path(f.filename).resolve() for f in traceback.extract_tb(exc.__traceback__)]  # the file, not the link
    files = [f for f in files if f.is_relative_to(ROOT)]
    return str(files[-1].relative_to(ROOT)) if files else "?"


def run_section(name: str, fn, models: Models, device: str, sizes: dict,
                live: list[dict] | None = None) -> tuple[list[dict], float, list[str], bool]:
    """(the section's rows, its seconds, the heavy modules it imported, whether it ran to its end). A section the
    check's deadline stops keeps the rows it had written down (`live`: what `guarded` emitted) and adds one row
    `<name>_not_run`."""
    from bench.gpu.budget import DEADLINE, OutOfTime, clock

    before = {m.split(".")[0] for m in sys.modules if m.split(".")[0] in HEAVY}
    t0, finished = time.perf_counter(), True
    try:
        if clock().left() <= 1.0:
            raise OutOfTime(DEADLINE, clock().deadline_s)
        with clock().deadline():
            rows = fn(models, device, sizes)
    except ModuleNotFoundError as e:  # a package the machine lacks: one line, not a failure
        rows = [row(f"{name}_skipped", device, None, "-", None,
                    f"skipped: missing module {e.name} (imported by {_where(e)})")]
    except OutOfTime as e:
        finished = False
        what = f"{e} ({clock().deadline_s:.0f} s)" if e.what == DEADLINE else str(e)
        rows = [*(live or []), row(f"{name}_not_run", device, None, "-", None if e.what == DEADLINE else False,
                                   f"stopped before its end: {what}" if live else f"not run: {what}", not_run=True)]
    except Exception as e:
        traceback.print_exc()
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        rows = [*(live or []), row(f"{name}_error", device, None, "-", False, f"{type(e).__name__}: {msg}")]
    heavy = sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in HEAVY} - before)
    return rows, time.perf_counter() - t0, heavy, finished


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
    t_start = time.perf_counter()  # the deadline counts from here: the carried wheels' install included
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--twin", action="store_true", help="the CPU twin's toy sizes on the CPU, whatever the machine")
    ap.add_argument("--size", nargs="*", default=[], metavar="KEY=VALUE", help="override a size (see SIZES)")
    ap.add_argument("--only", nargs="*", default=None, choices=SECTION_NAMES)
    ap.add_argument("--out", default=str(OUT), help="folder for results.json (default artifacts/gpu-check)")
    ap.add_argument("--rerun-failed", nargs="?", const="", default=None, metavar="RESULTS",
                    help="run again only what failed or did not run in RESULTS (default: --out's results.json)")
    ap.add_argument("--wheels", default=str(WHEELS), help="folder of carried wheels (default .gpu-wheels)")
    ap.add_argument("--strict", action="store_true",
                    help="a section skipped for a missing package fails the check (always so on a CUDA machine)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    previous = None
    if args.rerun_failed is not None:
        earlier = Path(args.rerun_failed or out / "results.json")
        if not earlier.is_file():
            ap.error(f"--rerun-failed: no results at {earlier} (run the check first)")
        previous = json.loads(earlier.read_text())
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing downloads: every model is built here
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    wheels = Path(args.wheels).resolve()
    print(use_carried_wheels(wheels, SITE if wheels == WHEELS else wheels.parent / SITE.name), flush=True)
    import torch

    from bench.gpu import budget

    device = "cuda" if torch.cuda.is_available() and not args.twin else "cpu"
    mode = "gpu" if device == "cuda" else "twin"
    if mode == "twin":  # toy sizes on a shared CPU: two OpenMP threads wait on each other while others hold the cores
        torch.set_num_threads(1)
    if previous is not None and previous.get("mode") != mode:
        ap.error(f"--rerun-failed: those results are the {previous.get('mode')} run's, this is the {mode} one")
    # a rerun measures at the first run's sizes, with a time budget of its own
    sizes = dict(SIZES[mode]) | {k: v for k, v in (previous or {}).get("sizes", {}).items() if k not in TIME_KEYS}
    for kv in args.size:
        key, _, value = kv.partition("=")
        if key not in SIZES[mode]:
            ap.error(f"--size {kv}: unknown size {key!r}; one of {', '.join(SIZES[mode])}")
        sizes[key] = type(SIZES[mode][key])(value)
    facts = machine(device)
    print(f"gpu-check ({'GPU' if mode == 'gpu' else 'CPU twin: no CUDA device' if not args.twin else 'CPU twin'}"
          f"{', rerunning what failed or did not run' if previous else ''}): {json.dumps(facts)}", flush=True)
    strict = args.strict or mode == "gpu"
    kept, done = budget.settled(previous, strict, OPTIONAL, args.only) if previous else ([], set())
    rows: list[dict] = []
    live: list[dict] = []  # the running section's rows as `guarded` emits them
    timings = dict((previous or {}).get("section_seconds", {}))
    imported = dict((previous or {}).get("heavy_imports_by_section", {}))
    out.mkdir(parents=True, exist_ok=True)

    def write(done_now: bool) -> dict:
        """results.json after every row, so a run stopped from outside still leaves what it measured."""
        every = budget.merged(kept, rows + live)
        result = {"date": dt.datetime.now().astimezone().isoformat(timespec="seconds"), "mode": mode,
                  "machine": facts, "complete": done_now, "strict": strict, "failed": failures(every, strict),
                  "sizes": sizes, "seconds": round(time.perf_counter() - t_start, 1), "section_seconds": timings,
                  "sections_done": sorted(done), "heavy_imports_by_section": imported, "rows": every,
                  **({"rerun_of": previous.get("date")} if previous else {})}
        tmp = out / "results.json.tmp"
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out / "results.json")
        return result

    def show(got: list[dict]) -> None:
        for r in got:
            verdict = "" if r["ok"] is None else "ok" if r["ok"] else "FAILED"
            print(f"   {r['name']}: {fmt(r['value'])} {r['unit']} {verdict}  {r['note']}", flush=True)

    section = ""

    def emit(got: list[dict]) -> None:
        live.extend(r | {"section": section} for r in got)
        show(got)
        write(False)

    clock = budget.use(budget.Clock(sizes["deadline_s"], sizes["row_s"], 1.0 if mode == "gpu" else TWIN_ROW_SCALE,
                                    t_start, frozenset(r["name"] for r in kept), emit))
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        os.environ["HF_HUB_CACHE"] = str(Path(tmp) / "hub")  # CTranslate2's conversions (ct2.py) go beside it
        models = Models(sizes, Path(tmp), out)
        for section, fn in sections():
            if (args.only is not None and section not in args.only) or section in done:
                continue
            print(f"== {section} ({clock.left():.0f} s left of {sizes['deadline_s']} s)", flush=True)
            if section in OPTIONAL and clock.left() < sizes[f"{section}_s"]:
                got = [row(f"{section}_not_run", device, None, "-", None, f"not run (optional): {clock.left():.0f} s "
                           f"left of the check's deadline, under the {sizes[f'{section}_s']} s it needs",
                           not_run=True)]
                seconds, heavy, finished = 0.0, [], False
            else:
                live.clear()
                got, seconds, heavy, finished = run_section(section, fn, models, device, sizes, live)
            emitted = {r["name"] for r in live}
            show([r for r in got if r["name"] not in emitted])
            rows.extend(r | {"section": section} for r in got)
            live.clear()
            timings[section], imported[section] = round(seconds, 1), heavy
            if finished and not any(r["name"] in failures(got, strict) for r in got):
                done.add(section)
            write(done_now=False)
    budget.use(budget.Clock())  # the summary and the table: no timer
    rows, kept = budget.merged(kept, rows), []
    rows += [r | {"section": "summary"} for r in summarise(rows, device, facts)]
    result = write(done_now=True)
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
