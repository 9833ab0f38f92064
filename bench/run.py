"""`make bench`: run every bench module's `run()`, print one line per result, write artifacts/bench/results.json and
the generated part of BENCHMARKS.md.

    python -m bench.run                       # all modules (scaling up to $SCALE_MAX sentences, default 12000)
    python -m bench.run --only mer neighbours # just these; the other modules' last results are kept
    python -m bench.run --smoke               # every module at toy size (bench/smoke.py): checks they run; writes
                                              # results.json under $BENCH_SMOKE_DIR (else a temporary folder) only

A result is {"name", "ours", "peer", "unit", "ratio", "goal"} (+ "better": "lower" where a smaller ratio is better,
as for the scaling time ratios). ratio = our speed / the peer's speed (higher is better) unless said otherwise.
A module that fails to import or run prints one FAILED line and the others still run.
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import platform
import time
import traceback

from contramine.pipeline.config import ROOT

MODULES = ["embeddings", "mer", "neighbours", "ivf", "hardneg", "scaling", "growth", "memo_index", "negate",
           "backtranslate", "bergamot", "ct2", "marian", "translate", "train", "st_debcse", "eval", "host"]
OUT = ROOT / "artifacts" / "bench"
DOC = ROOT / "BENCHMARKS.md"
BEGIN, END = "<!-- bench:results:begin (written by `python -m bench.run`) -->", "<!-- bench:results:end -->"


def met(r: dict) -> bool | None:
    if not isinstance(r.get("goal"), (int, float)) or not isinstance(r.get("ratio"), (int, float)):
        return None  # a row without a goal (context for another row)
    return r["ratio"] <= r["goal"] if r.get("better") == "lower" else r["ratio"] >= r["goal"]


def _num(x, fmt: str) -> str:
    return format(x, fmt) if isinstance(x, (int, float)) else str(x)


def line(r: dict) -> str:
    ok = met(r)
    goal = ("<= " if r.get("better") == "lower" else ">= ") + _num(r["goal"], "g") if ok is not None else "-"
    return (f"{r['name']:<34} {_num(r.get('ours'), 'g'):>10} {_num(r.get('peer'), 'g'):>10}  {str(r.get('unit')):<12} "
            f"{_num(r.get('ratio'), '.3f'):>7}  {goal:<8} {'-' if ok is None else 'yes' if ok else 'NO'}")


HEADER = f"{'name':<34} {'ours':>10} {'peer':>10}  {'unit':<12} {'ratio':>7}  {'goal':<8} met?"


def machine() -> dict:
    import torch

    cpu = "unknown"
    try:
        cpu = next(x.split(":", 1)[1].strip() for x in open("/proc/cpuinfo") if x.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"nproc": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "cpu": cpu,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "torch": torch.__version__, "load_avg": [round(x, 2) for x in os.getloadavg()]}


def run_module(name: str) -> tuple[list[dict], str | None, float, list[float]]:
    from bench import smoke

    smoke.freeze_heap()  # toy sizes: the earlier modules' objects out of the collections the stage runner makes
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    try:
        mod = importlib.import_module("bench.host.bench" if name == "host" else f"bench.peers.{name}")
        rows = list(mod.run())
        err = None
    except Exception as e:  # one broken module must not stop the others
        traceback.print_exc()
        rows, err = [], f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return rows, err, time.perf_counter() - t0, [round(load0, 2), round(os.getloadavg()[0], 2)]


def write_doc(results: list[dict], failures: dict, facts: dict) -> None:
    lines = [BEGIN, "", f"Last run: {facts['date']}; {facts['nproc']} CPUs ({facts['cpu']}), torch threads "
             f"{facts['torch_threads']}, torch {facts['torch']}, Python {facts['python']}; load average at start "
             f"{facts['load_avg']} (anything else running on the machine shows in this load).", "", "```", HEADER]
    lines += [line(r) for r in results]
    lines += [f"{m + '_bench':<34} FAILED: {e}" for m, e in failures.items()]
    lines += ["```", "", "| module | ran at | seconds | load avg start→end |", "|---|---|---|---|"]
    lines += [f"| {r['module']} | {r['date']} | {r['seconds']} | {r['load'][0]} → {r['load'][1]} |"
              for r in {r["module"]: r for r in results}.values()]
    lines += ["", END]
    text = DOC.read_text(encoding="utf-8") if DOC.is_file() else "# Benchmarks\n\n" + BEGIN + "\n" + END + "\n"
    if BEGIN not in text or END not in text:
        text += "\n" + BEGIN + "\n" + END + "\n"
    head, rest = text.split(BEGIN, 1)
    DOC.write_text(head + "\n".join(lines) + rest.split(END, 1)[1], encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, prog="contramine bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Speed and memory against peer tools measured in the same run, one line per result (a checkout's\n"
                    "benches).",
        epilog="examples:\n  contramine bench --smoke\n  contramine bench --only mer")
    ap.add_argument("--only", nargs="*", default=None, choices=MODULES)
    ap.add_argument("--smoke", action="store_true", help="toy sizes; never touches artifacts/bench/ or BENCHMARKS.md")
    args = ap.parse_args(argv)
    from bench import smoke

    if args.smoke or smoke.on():  # BENCH_SMOKE=1 alone must not put toy numbers into the real results either
        kept_dir = bool(os.environ.get(smoke.DIR_ENV))
        args.smoke, out = True, smoke.enable()
    else:
        out = OUT
    out.mkdir(parents=True, exist_ok=True)
    facts = machine() | {"date": dt.datetime.now().astimezone().isoformat(timespec="seconds")}
    print(f"machine: {facts}", flush=True)
    path = out / "results.json"
    kept = json.loads(path.read_text()) if args.only is not None and path.is_file() else []
    todo = args.only if args.only else MODULES
    results = [r for r in kept if r.get("module") not in todo]
    failures = {}
    for name in todo:
        print(f"== {name}_bench", flush=True)
        rows, err, seconds, load = run_module(name)
        if err:
            failures[name] = err
            print(f"{name + '_bench':<34} FAILED: {err}", flush=True)
        for r in rows:
            r.update(module=name, date=facts["date"], seconds=round(seconds, 1), load=load)
            print(line(r), flush=True)
        results += rows
    order = {m: i for i, m in enumerate(MODULES)}
    results.sort(key=lambda r: order.get(r.get("module"), 99))
    path.write_text(json.dumps(results, indent=1))
    print("\n" + HEADER)
    for r in results:
        print(line(r))
    for m, e in failures.items():
        print(f"{m + '_bench':<34} FAILED: {e}")
    if args.smoke:
        print(f"\nsmoke mode: wrote {path} (not artifacts/bench/results.json, not {DOC.name})"
              + ("" if kept_dir else f"; removed at exit: set {smoke.DIR_ENV} to keep it"))
    else:
        write_doc(results, failures, facts)
        print(f"\nwrote {path} and {DOC}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
