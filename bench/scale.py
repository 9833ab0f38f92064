"""`make scale [N=1000000]`: N synthetic sentences through every real stage with stand-in models, per-stage cost.

    python -m bench.scale --n 1000000            # sizes N/8, N/4, N/2, N -> artifacts/scale/results.json
    python -m bench.scale --n 80000 --keep       # keep the run folders (to look at them with make sql)

Only the two models are stand-ins (pipeline/models/standin.py: a deterministic random unit vector per text, a
word-shuffling "translator"), so what is measured is the pipeline's own cost: sentences, FAISS, noise, spaCy,
edit distances, IPW, Parquet, Prefect. Each stage runs as its own child process, `python -m contramine.flows.cli stage
<name>` (the same flow a cluster runs), against one Prefect server; its wall seconds come from the table's
manifest (the work itself) and the child's (start-up included), its peak RSS from `os.wait4` (ru_maxrss).

Corpus (`--corpus`): the real sentences first (default `wiki1m+tatoeba`: the 11,914 wiki1m lines and the 187,692
Tatoeba sentences, 199,240 of them distinct), then new sentences made of the first half of one line and the second
half of another (seeded, duplicates skipped), so spaCy parses English and the noise/negation rules fire as on real
text.
`--corpus wiki1m` recombines the wiki1m lines alone, as the simulation did until 2026-11-25 (then with wiki1m's 366
repeated lines kept; now its 11,548 distinct lines): at 1M each half is then shared by ~170 sentences, a crowd of
near-equal cosines around every query that no approximate index separates (HNSW found 0.899 of the exact pool at
efSearch 4,096, so `neighbours` searches exactly, ~2 h on 2 cores). From 199,240 lines each half is shared by ~10,
and HNSW finds 0.910 at efSearch 128 (BENCHMARKS.md, "Scale simulation with the defaults").
Growth per doubling = seconds(2n) / seconds(n): 2.0 is linear. Results: a list of {"n", "stage", "seconds",
"child_seconds", "peak_rss_mb", "rows", "shards"} rows, one per (size, stage), written after every stage.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from contramine.pipeline.config import ROOT, SHARED_DATA

OUT = ROOT / "artifacts" / "scale"
OUT.mkdir(parents=True, exist_ok=True)  # PREFECT_HOME below lives under artifacts/, which a fresh clone lacks
for _k, _v in (("PREFECT_SERVER_ANALYTICS_ENABLED", "false"), ("DO_NOT_TRACK", "1"), ("TOKENIZERS_PARALLELISM", "false"),
               ("PREFECT_HOME", str(ROOT / "artifacts" / ".prefect-scale"))):
    os.environ.setdefault(_k, _v)  # as the Makefile sets them: no telemetry, nothing sent beyond this machine
STANDIN_SETTINGS = [
    "encoder.model=standin:encoder-384",
    'backtranslate.chains=[{models=["standin:shuffle-zh", "standin:shuffle-en"], role="positives"}, '
    '{models=["standin:shuffle-de", "standin:shuffle-en"], role="paraphrases"}]',
    "backtranslate.fallback=false",
]


CORPORA = {"wiki1m+tatoeba": ("wiki1m_head.txt", "tatoeba_en.txt"), "wiki1m": ("wiki1m_head.txt",)}
DEFAULT_CORPUS = "wiki1m+tatoeba"


def synthetic_corpus(n: int, dst: Path, seed: int = 0, corpus: str = DEFAULT_CORPUS) -> Path:
    """n distinct lines: the corpus' real lines (in file order, duplicates dropped), then half-and-half
    recombinations of them."""
    lines = list(dict.fromkeys(x for f in CORPORA[corpus]
                               for x in (SHARED_DATA / f).read_text(encoding="utf-8").splitlines() if x.strip()))
    words = [x.split() for x in lines]
    out, seen = lines[:n], set(lines[:n])
    rng = np.random.default_rng(seed)
    while len(out) < n:
        for i, j in rng.integers(len(lines), size=(max(1024, n - len(out)), 2)):
            a, b = words[i], words[j]
            if i == j or len(a) < 2 or len(b) < 2:
                continue
            s = " ".join(a[: len(a) // 2] + b[len(b) // 2:])
            if s not in seen:
                seen.add(s)
                out.append(s)
                if len(out) == n:
                    break
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("\n".join(out) + "\n", encoding="utf-8")
    return dst


def run_stage(stage: str, run: str, corpus: Path, sets: list[str], env: dict, log: Path) -> tuple[float, int, float]:
    """One stage as its own process: (wall seconds, peak RSS in MB, CPU seconds of the process and its workers).
    CPU seconds hardly move when something else shares the cores; wall seconds do (2x under a second job)."""
    cmd = [sys.executable, "-m", "contramine.flows.cli", "stage", stage, "--run", run, "--corpus", str(corpus), "--set", *sets]
    with open(log, "ab") as f:
        t0 = time.perf_counter()
        child = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"stage {stage} at {run} failed; see {log}")
    return time.perf_counter() - t0, round(usage.ru_maxrss / 1024), usage.ru_utime + usage.ru_stime


SHORT_S = 20.0  # stages shorter than this are measured `--repeat` times, the fastest kept
READER_TABLES = [("pairs",), ("sentences", "triplets")]  # DebCSE's rows; OssCSE's (SimCSE's are a subset)
READER = ("import sys, time, numpy as np; from contramine.trainer.data import MinedRows; t = time.perf_counter(); "
          "r = MinedRows(sys.argv[1], sys.argv[2].split(',')); r.rows(np.arange(min(len(r), 64))); "
          "print('reader seconds', time.perf_counter() - t, 'rows', len(r))")


def reader_cost(run_dir: Path, tables: tuple[str, ...], env: dict, log: Path) -> dict:
    """The trainer's reader (trainer/data.py MinedRows) over the run's tables in its own process: seconds and peak
    RSS, torch's import included (~0.4 GB), so the bound on what training holds before its first step is measured."""
    with open(log, "ab") as f:
        t0 = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", READER, str(run_dir), ",".join(tables)], cwd=ROOT, stdout=f,
                                 stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"the trainer's reader failed on {run_dir} {tables}; see {log}")
    seconds = round(time.perf_counter() - t0, 2)
    return {"seconds": seconds, "child_seconds": seconds, "peak_rss_mb": round(usage.ru_maxrss / 1024)}


def measure(name, spec, n, run, corpus, sets, env, out, shards, settings, repeat) -> dict:
    """One stage's row. A stage that took under SHORT_S seconds is measured `repeat` times and the fastest kept
    (as timeit does): at 1-10 s, a scheduler hiccup or a cold page cache is a large part of the figure, and the
    growth per doubling divides two such figures."""
    from contramine.pipeline.storage.store import Store

    rows = []
    for _ in range(repeat):
        for table in spec.writes:  # a stage cut off mid-way (or measured again): measure it whole
            shutil.rmtree(out / run / table, ignore_errors=True)
        shutil.rmtree(memo_dir(out, run) / name, ignore_errors=True)  # ... its rows too: none from the memo
        load = os.getloadavg()[0]
        child_s, rss, cpu_s = run_stage(name, run, corpus, sets, env, out / f"{run}.log")
        manifest = Store(out / run).manifest(spec.writes[0])
        row = {"n": n, "stage": name, "settings": settings, "seconds": round(manifest["wall_seconds_last_run"], 2),
               "child_seconds": round(child_s, 2), "cpu_seconds": round(cpu_s, 1),
               "shard_seconds": manifest.get("seconds"), "peak_rss_mb": rss, "shards": shards,
               "rows": manifest["rows"], "load_before_after": [round(load, 2), round(os.getloadavg()[0], 2)]}
        if manifest.get("exact") is False or "fallback" in manifest:  # past exact_threshold on a CPU: what it chose
            row["index"] = {k: manifest[k] for k in ("index", "nlist", "nprobe", "hnsw_m", "ef_search", "recall",
                                                     "recall_sample", "recall_by_nprobe", "recall_by_ef_search",
                                                     "fallback") if k in manifest}
        rows.append(row)
        if row["seconds"] >= SHORT_S:
            break
    best = min(rows, key=lambda r: r["seconds"])
    return {**best, "attempts": [r["seconds"] for r in rows]}


def memo_dir(out: Path, run: str) -> Path:
    """The size's own row memo (runner.memo stays as set, on by default): the sizes' corpora share their first
    lines, and a stage measured again would take its rows from the memo; each measurement starts it empty."""
    return out / f".memo-{run}"


def results_file(out: Path, corpus: str) -> Path:
    """Each corpus keeps its own results: sizes of one corpus are never merged with another's."""
    return out / ("results.json" if corpus == DEFAULT_CORPUS else f"results-{corpus.replace('+', '-')}.json")


def simulate(sizes: list[int], out: Path = OUT, extra: list[str] = (), keep: bool = False,
             resume: bool = False, only: tuple[str, ...] = (), repeat: int = 3,
             corpus: str = DEFAULT_CORPUS) -> list[dict]:
    from prefect.testing.utilities import prefect_test_harness

    from contramine.pipeline.config import configure
    from contramine.pipeline.engine.runner import load_stages

    out.mkdir(parents=True, exist_ok=True)
    results_path = results_file(out, corpus)
    # sizes run in parts (largest first when time is short) merge: rows of the sizes not re-run are kept
    kept = json.loads(results_path.read_text()) if results_path.exists() else []
    # --resume (after a killed run): keep the run folder and the rows of the stages it already measured with the
    # same settings; the stage that was cut off starts again from nothing, so its seconds are a whole stage's
    done = {(r["n"], r["stage"]) for r in kept if resume and r.get("settings") == list(extra)}
    # --only: re-measure those stages; each new row takes its old row's place and every other row is kept
    results = list(kept) if only else [r for r in kept if r["n"] not in sizes or (r["n"], r["stage"]) in done]
    stages = load_stages()
    if unknown := set(only) - set(stages):
        raise SystemExit(f"--only: no stage named {sorted(unknown)}; stages: {', '.join(stages)}")
    order = list(stages)
    last_asked = max((order.index(s) for s in only), default=len(order))
    with prefect_test_harness(server_startup_timeout=120):
        import prefect.settings

        env = {**os.environ, "PREFECT_API_URL": prefect.settings.PREFECT_API_URL.value(), "PYTHONPATH": str(ROOT)}
        for n in sizes:
            run = f"scale-{n}" if corpus == DEFAULT_CORPUS else f"scale-{corpus}-{n}"
            text = synthetic_corpus(n, out / "corpora" / f"{corpus}-{n}.txt", corpus=corpus)
            sets = [*STANDIN_SETTINGS, f"run.root={out}", f"runner.memo_dir={memo_dir(out, run)}", *extra]
            if not resume:
                shutil.rmtree(out / run, ignore_errors=True)
                shutil.rmtree(memo_dir(out, run), ignore_errors=True)
            shards = configure("default", run, str(text), sets).run.shards
            print(f"scale n={n:,} ({corpus}): {shards} shards", flush=True)
            for name, spec in stages.items():
                if (n, name) in done:
                    continue
                if only and name not in only:  # not asked for: run it only when a stage asked for comes later
                    if order.index(name) > last_asked:
                        break
                    run_stage(name, run, text, sets, env, out / f"{run}.log")  # reuses its shards where they are
                    continue
                row = {**measure(name, spec, n, run, text, sets, env, out, shards, list(extra), repeat),
                       "corpus": corpus}
                results = replace_row(results, row)
                results_path.write_text(json.dumps(results, indent=1))
                print(f"  {name:14s} {row['seconds']:9.1f} s  (process {row['child_seconds']:7.1f} s)  peak RSS "
                      f"{row['peak_rss_mb']:6,} MB  rows {sum(row['rows'].values()):,}"
                      + (f"  (best of {row['attempts']})" if len(row.get("attempts", [])) > 1 else ""), flush=True)
            for tables in READER_TABLES:  # what `make train` holds in memory before its first step
                if (n, "train-reader:" + "+".join(tables)) in done or only:
                    continue
                row = {"n": n, "stage": "train-reader:" + "+".join(tables), "settings": list(extra), "shards": shards,
                       "corpus": corpus, **reader_cost(out / run, tables, env, out / f"{run}.log")}
                results.append(row)
                results_path.write_text(json.dumps(results, indent=1))
                print(f"  {row['stage']:14s} {row['seconds']:9.1f} s  peak RSS {row['peak_rss_mb']:6,} MB", flush=True)
            if not keep:
                shutil.rmtree(out / run, ignore_errors=True)
    print_growth(results)
    return results


def replace_row(results: list[dict], row: dict) -> list[dict]:
    """The row of (n, stage) in its old place (the table lists stages in the order they first appear), else last."""
    at = [i for i, r in enumerate(results) if (r["n"], r["stage"]) == (row["n"], row["stage"])]
    return results[:at[0]] + [row] + results[at[0] + 1:] if at else [*results, row]


def growth(results: list[dict]) -> dict[str, dict]:
    """stage -> {"per_doubling": [ratios], "worst": max ratio, "peak_rss_mb": at the largest n} (time ratios use
    the stage's own seconds; sizes double by construction)."""
    by: dict[str, dict[int, dict]] = {}
    for r in results:
        by.setdefault(r["stage"], {})[r["n"]] = r
    out = {}
    for stage, rows in by.items():
        ns = sorted(rows)
        idle = all("rows" in r and not any(r["rows"].values()) for r in rows.values())  # did nothing at any size
        ratios = [] if idle else [rows[b]["seconds"] / max(rows[a]["seconds"], 1e-3) for a, b in zip(ns, ns[1:])]
        out[stage] = {"per_doubling": [round(x, 2) for x in ratios], "worst": round(max(ratios, default=0), 2),
                      "idle": idle,
                      "seconds": rows[ns[-1]]["seconds"], "peak_rss_mb": rows[ns[-1]]["peak_rss_mb"], "n": ns[-1]}
    return out


def print_growth(results: list[dict]) -> None:
    g = growth(results)
    print(f"\n{'stage':14s} {'seconds at n':>12s} {'peak RSS MB':>12s}  growth per doubling")
    for stage, x in g.items():
        print(f"{stage:14s} {x['seconds']:12.1f} {x['peak_rss_mb']:12,}  {x['per_doubling']}")


def markdown_table(results: list[dict]) -> str:
    """Per stage: seconds and peak RSS at each size, and the growth per doubling (BENCHMARKS.md's table)."""
    sizes = sorted({r["n"] for r in results})
    by = {(r["stage"], r["n"]): r for r in results}
    stages = list(dict.fromkeys(r["stage"] for r in results))
    g = growth(results)
    head = ["stage", *(f"s at {n // 1000}k" for n in sizes), "peak RSS MB at " + " / ".join(f"{n // 1000}k" for n in sizes),
            "growth per doubling"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for st in stages:
        secs = [f"{by[(st, n)]['seconds']:.1f}" if (st, n) in by else "—" for n in sizes]
        rss = " / ".join(f"{by[(st, n)]['peak_rss_mb']:,}" if (st, n) in by else "—" for n in sizes)
        rows.append(f"| {st} | " + " | ".join(secs) + f" | {rss} | "
                    + (", ".join(f"{x:.2f}" for x in g[st]["per_doubling"]) if not g[st]["idle"]
                       else "— (wrote no rows at any size: nothing to time)") + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, prog="contramine scale", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="N synthetic sentences through every stage with stand-in models:\n"
                    "seconds and peak memory per stage and size.",
        epilog="example:\n  contramine scale --n 80000 --keep")
    ap.add_argument("--n", type=int, default=1_000_000, help="largest corpus size (N); also N/8, N/4, N/2")
    ap.add_argument("--steps", type=int, default=4, help="how many sizes, halving from N (default 4)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--keep", action="store_true", help="keep the run folders")
    ap.add_argument("--set", nargs="*", default=[], help="more config overrides, e.g. neighbours.pool_size=32")
    ap.add_argument("--largest-first", action="store_true", help="run N first (results of other sizes are kept)")
    ap.add_argument("--resume", action="store_true", help="after a killed run: skip the (size, stage) rows measured")
    ap.add_argument("--only", default="", help="re-measure these stages (comma-separated) and keep every other row; "
                    "the stages they read from run first, unrecorded")
    ap.add_argument("--repeat", type=int, default=3, help=f"measure a stage under {SHORT_S:.0f} s this many times, "
                    "keep the fastest (default 3)")
    ap.add_argument("--corpus", choices=list(CORPORA), default=DEFAULT_CORPUS,
                    help="whose real lines start the corpus and are recombined past them (default %(default)s; "
                    "wiki1m: the old corpus, wiki1m's lines alone, the worst case for approximate search)")
    ap.add_argument("--table", action="store_true", help="print the Markdown table of the corpus' results and stop")
    a = ap.parse_args(argv)
    if a.table:
        print(markdown_table(json.loads(results_file(a.out, a.corpus).read_text())))
        return 0
    sizes = sorted({max(1, a.n >> k) for k in range(a.steps)}, reverse=a.largest_first)
    simulate(sizes, a.out, a.set, a.keep, a.resume, tuple(x for x in a.only.split(",") if x), max(1, a.repeat),
             a.corpus)
    return 0


if __name__ == "__main__":
    sys.exit(main())
