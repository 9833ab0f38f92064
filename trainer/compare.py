"""`make compare`: every objective from the same start, on the same mined run, with the same budget, for several seeds.

    python -m contramine.trainer.compare --run default [--objectives simcse debcse] [--seeds 2] [--set compare.steps=200]
    python -m contramine.trainer.compare --run default --set compare.mined_runs=simcse-mined    # + debcse on those pairs

The rows: each objective; each of its variants (`compare.variants`: the objective under other settings of its own,
by default OssCSE under the start's own pooler beside the paper's [MASK] templates); and, for each run of
`compare.mined_runs` (the same corpus mined with another encoder, e.g. your own SimCSE checkpoint), each objective
that reads `pairs` trained on that run's pairs ("debcse@<run>").

For each (row, seed) it runs the ordinary trainer (trainer/train.py, nothing re-implemented) into
artifacts/<run>/compare/<row>/seed-<k>/ with `train.max_steps` = the budget, evaluates that run's best/
checkpoint once (trainer/evaluate.py, the numbers `make eval` prints), and writes `run.json` there last: a run
with a `run.json` of the same key (run_key: the configuration, and by content the start weights, the mined tables,
the evaluation data and code, trainer/keys.py) is reused, any other one is (re)trained — and the trainer itself
resumes a half-done run from its last/ — so a killed compare continues where it stopped. The start model is
evaluated once under every pooler/prompt a row trains with (trainer/train_setup.py's run_pooling: mean for most, the
[MASK] of T1 for OssCSE's paper form) into start.json (the configured pooler) and start-<pooler>-<h>.json (any
other), each reused under the same start_key. Then, under artifacts/<run>/compare/: table.md (mean ± std over
seeds, one start row per pooler/prompt first), paired bootstraps of each row against its own start and against
the baseline on STS-B test (same resampled sentence pairs for both, per seed and pooled over seeds; bootstrap.md),
dev_curves.png, sts_bars.png, delta_stsb.png (each row's Δ against the baseline with its interval) and compare.json
with everything and the command that reproduces each run.

Same for every objective: the start model, batch size, steps, learning rate and schedule, dev selection
(`train.eval_every`) and seeds. Each keeps its own published extras ([train.<objective>], listed in the table).
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from contramine.pipeline.arguments import whole_number
from contramine.pipeline.config import Config, ConfigError, load_config
from contramine.pipeline.config.names import inside
from contramine.pipeline.storage.atomic import atomic_write_bytes, atomic_write_json
from contramine.pipeline.hints import command as hint_command, via_make
from contramine.pipeline.storage.lock import run_lock
from contramine.pipeline.storage.safe_paths import open_folder
from contramine.pipeline.errors import ExpectedError
from contramine.pipeline.storage.tables import RunTables
from contramine.trainer.compare_report import bootstrap_markdown, paired_bootstrap, plots, summarise, table_markdown
from contramine.trainer.keys import checked_dataset, checked_files

KEEP_COSINES = ("STSBenchmark",)  # per-pair cosines kept for the paired bootstrap


# ------------------------------------------------------------------------------------------------ plan
def budget_steps(cfg: Config) -> int:
    """`compare.steps`, or one epoch of the run's mined pairs (DebCSE's rows) at `train.batch_size`."""
    if cfg.compare.steps:
        return cfg.compare.steps
    n = checked_dataset(cfg.run.dir, "pairs").count_rows()  # a missing run or table: one line naming its fix
    return max(1, n // cfg.train.batch_size)


def entries(cfg: Config, objectives: Sequence[str]) -> list[dict]:
    """The rows to train, in table order: each objective, then its variants (compare.variants), then that objective
    on each other mined run (compare.mined_runs) where it reads `pairs`. name: the row and its folder under
    compare/; sets: the train.* overrides of a variant; run: the mined run it trains on (None: the compare's)."""
    from contramine.trainer.objectives import get_objective

    cc, out = cfg.compare, []
    for objective in objectives:
        if objective in cc.variants:  # a variant named alone: that row only
            v = cc.variants[objective]
            out.append({"name": objective, "objective": v.objective, "sets": list(v.set), "run": None})
            continue
        get_objective(objective)  # an unknown name stops here, with the known ones
        out.append({"name": objective, "objective": objective, "sets": [], "run": None})
        out += [{"name": name, "objective": v.objective, "sets": list(v.set), "run": None}
                for name, v in cc.variants.items() if v.objective == objective]
        if "pairs" in get_objective(objective).tables:
            out += [{"name": f"{objective}@{run}", "objective": objective, "sets": [], "run": run}
                    for run in cc.mined_runs if run != cfg.run.name]
    return list({e["name"]: e for e in out}.values())  # a variant named beside its objective: one row


def check_inputs(base: Config, cfgs: dict[str, Config], plan: list[dict]) -> None:
    """Before anything trains: each row's run has every table its objective reads (TableMissing, one line naming the
    folder and the stage that writes it), and each run of compare.mined_runs holds the compare run's sentences (same
    sids, same texts): a row on another corpus, or on other sentence filters, would compare corpora, not encoders."""
    from contramine.trainer.objectives import get_objective

    own = RunTables(base.run.dir)
    ours = own.read("sentences", ["sid", "text"]) if own.files_if_any("sentences") else None
    for e in plan:
        tables = RunTables(cfgs[e["name"]].run.dir)
        for table in get_objective(e["objective"]).tables:
            checked_files(tables.dir, table)
        if e["run"] and ours is not None and tables.files_if_any("sentences"):
            theirs = tables.read("sentences", ["sid", "text"])
            if not ours.equals(theirs):
                a = dict(zip(ours["sid"].to_pylist(), ours["text"].to_pylist()))
                b = dict(zip(theirs["sid"].to_pylist(), theirs["text"].to_pylist()))
                differ = sorted(s for s in a.keys() | b.keys() if a.get(s) != b.get(s))
                raise ConfigError(
                    f"compare.mined_runs: run {e['run']!r} ({tables.dir}) does not hold the sentences of run "
                    f"{base.run.name!r} ({own.dir}): {len(differ)} sid(s) differ or are missing, the first sid "
                    f"{differ[0]} — it was mined from another corpus or with other [sentences] filters, so row "
                    f"{e['name']!r} would compare corpora, not encoders. Mine it from the same corpus and settings "
                    f"(only encoder.* changed).")


def run_overrides(cfg: Config, entry: dict | str, k: int, steps: int) -> list[str]:
    """The overrides of one compare run: the row's objective and settings, then seed, budget and folder."""
    entry = {"name": entry, "objective": entry, "sets": [], "run": None} if isinstance(entry, str) else entry
    out = inside(cfg.run.dir / "compare", entry["name"], f"seed-{k}", setting="compare row")  # names: config checks
    return [f"train.objective={entry['objective']}", *entry["sets"], f"train.seed={cfg.train.seed + k}",
            f"train.max_steps={steps}", f"train.output={out}", "train.final_eval=false"]


def run_key(cfg: Config) -> str:
    """What decides a compare run's result: the whole train section (start model, budget, seed, extras), and by
    content (trainer/keys.py) the start weights, the run's tables, the evaluation data and the evaluation code. A
    key that changes only by the evaluation retrains nothing: the trainer resumes its finished last/."""
    from contramine.pipeline.models.hub import model_fingerprint, resolve_model
    from contramine.trainer.keys import eval_code_version, eval_data_hash, fingerprint
    from contramine.trainer.objectives import get_objective

    start = cfg.train.model or cfg.encoder.model
    blob = {"train": cfg.train.model_dump(mode="json"), "encoder": cfg.encoder.model_dump(mode="json"),
            "weights": model_fingerprint(resolve_model(start, "model")),
            "data": fingerprint(cfg.run.dir, get_objective(cfg.train.objective).tables),
            "eval_data": eval_data_hash(cfg.data.senteval_dir, _probe(cfg)), "eval_code": eval_code_version()}
    return _digest(blob)


def start_key(model: str, settings: dict) -> str:
    """What decides the start model's evaluation (start.json): its weights' content, how it is evaluated (pooler,
    prompt where the pooler reads one, max length, precision), the evaluation data's content and the evaluation
    code. Not the model's name alone: a folder saved again, another pooler or an edited STS file is a new start."""
    from contramine.pipeline.models.hub import model_fingerprint
    from contramine.trainer.keys import eval_code_version, eval_data_hash

    blob = {"model": model, "weights": model_fingerprint(settings["path"]), "pooler": settings["pooler"],
            "prompt": settings["prompt"] if settings["pooler"] == "mask" else None,
            "max_length": settings["max_length"], "precision": settings["precision"],
            "eval_data": eval_data_hash(settings["senteval_dir"], settings["probe"]),
            "eval_code": eval_code_version(), "keep_cosines": list(KEEP_COSINES)}
    return _digest(blob)


def _digest(blob: dict) -> str:
    return hashlib.blake2b(json.dumps(blob, sort_keys=True).encode(), digest_size=12).hexdigest()


def _probe(cfg: Config) -> Path | None:
    """The probe file the evaluation reads, None when there is none (evaluate_all skips it then)."""
    return cfg.data.probe if Path(cfg.data.probe).is_file() else None


def command(profile: str, run: str, user_sets: list[str], overrides: list[str]) -> str:
    """The commands that reproduce one compare run (`run`: the mined run it trains on), as the user runs them:
    make targets under make, the `contramine` command line elsewhere (pipeline/hints.py)."""
    value = dict(o.split("=", 1) for o in overrides)
    sets = " ".join([*user_sets, *(o for o in overrides if not o.startswith("train.objective="))])
    if not via_make():
        return (f"contramine train --profile {shlex.quote(profile)} --run {shlex.quote(run)} --objective "
                f"{value['train.objective']} --set {sets} && contramine eval --model {value['train.output']}/best")
    return (f"make train PROFILE={profile} RUN={run} OBJECTIVE={value['train.objective']} SET={shlex.quote(sets)} "
            f"&& make eval MODEL={value['train.output']}/best")


# ------------------------------------------------------------------------------------------------ one run
def eval_settings(model: str, cfg: Config) -> dict:
    """How a model is evaluated: a checkpoint with its own pooler/prompt/length (as `make eval`), the starting
    model with the config's. One function for evaluate_checkpoint and start_key, so the key is what ran."""
    from contramine.pipeline.models.encode.encoder import DEFAULT_PROMPT
    from contramine.pipeline.models.hub import resolve_model
    from contramine.trainer.evaluate import checkpoint_settings, default_max_length

    path = resolve_model(model, "model")
    trained = checkpoint_settings(path)
    return {"path": path, "pooler": trained.get("pooler") or cfg.train.pooler or cfg.encoder.pooler,
            "prompt": trained.get("prompt") or cfg.encoder.prompt or DEFAULT_PROMPT,
            "max_length": trained.get("max_length") or default_max_length(path),
            "precision": cfg.train.eval_precision, "senteval_dir": cfg.data.senteval_dir, "probe": _probe(cfg)}


def evaluate_checkpoint(model: str, cfg: Config) -> dict:
    """evaluate_all on a checkpoint or the starting model, with eval_settings."""
    from contramine.pipeline.models.encode.encoder import Encoder
    from contramine.pipeline.models.hub import pick_device
    from contramine.trainer.evaluate import evaluate_all

    s = eval_settings(model, cfg)
    enc = Encoder.load(model, pooler=s["pooler"], prompt=s["prompt"], max_length=s["max_length"],
                       device=pick_device(cfg.train.device), precision=s["precision"])
    res = evaluate_all(enc, s["senteval_dir"], probe_path=s["probe"], progress=False, keep_cosines=KEEP_COSINES)
    del enc
    return res


def start_results(cfg: Config, path: Path, pooling: tuple[str, str] | None = None) -> dict:
    """The start model's evaluation (under `pooling` = (pooler, prompt) when given, else the configured pooler):
    `path` when it was computed under the same start_key, else computed now (and `path` rewritten). The key is taken
    before evaluating: data edited meanwhile is evaluated next time."""
    if pooling is not None:
        cfg = pooled_config(cfg, *pooling)
    model = cfg.train.model or cfg.encoder.model
    s = eval_settings(model, cfg)
    key = start_key(model, s)
    prev = json.loads(path.read_text()) if path.is_file() else None
    if prev is not None and prev.get("key") == key:
        return prev
    start = {"model": model, "key": key, "pooler": s["pooler"],
             "prompt": s["prompt"] if s["pooler"] == "mask" else None, "results": evaluate_checkpoint(model, cfg)}
    atomic_write_json(path, start, indent=1)
    return start


def pooled_config(cfg: Config, pooler: str, prompt: str) -> Config:
    """cfg with the start read under `pooler` (and `prompt`, for "mask"): what eval_settings gives the start."""
    return cfg.model_copy(update={"train": cfg.train.model_copy(update={"pooler": pooler}),
                                  "encoder": cfg.encoder.model_copy(update={"prompt": prompt})})


def pooling_label(pooler: str, prompt: str | None) -> str:
    return f"{pooler} · {prompt}" if pooler == "mask" else pooler


def start_file(cfg: Config, pooler: str, prompt: str) -> str:
    """start.json for the configured pooler (and prompt); start-<pooler>[-<prompt hash>].json for another."""
    if (pooler, prompt if pooler == "mask" else None) == (cfg.train.pooler or cfg.encoder.pooler,
                                                          cfg.encoder.prompt if pooler == "mask" else None):
        return "start.json"
    tail = "-" + hashlib.blake2b(prompt.encode(), digest_size=4).hexdigest() if pooler == "mask" else ""
    return f"start-{pooler}{tail}.json"


def mined_with(run_dir: Path) -> dict | None:
    """The encoder a run was mined with (its `embeddings` manifest): the configured name and the fingerprint of its
    files (a checkpoint of this project is fingerprinted like any model); None without a manifest."""
    path = Path(run_dir) / "embeddings" / "_manifest.json"
    if not path.is_file():
        return None
    m = json.loads(path.read_text())
    enc = (m.get("config") or {}).get("encoder") or {}
    src = ((m.get("config") or {}).get("embeddings") or {}).get("source")
    return {"model": src or enc.get("model"), "pooler": enc.get("pooler"),
            "fingerprint": ((m.get("resources") or {}).get("encoder") or {}).get("model")}


def dev_curve(metrics: Path) -> list[list[float]]:
    rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
    return [[r["step"], r["dev_score"]] for r in rows if "dev_score" in r]


def train_and_evaluate(profile: str, overrides: list[str], user_sets: list[str], run: str) -> dict:
    """One compare run: reused when its run.json has the same key, else trained (resuming last/) and evaluated."""
    from contramine.trainer.data import MinedRows
    from contramine.trainer.objectives import get_objective
    from contramine.trainer.checkpoint import output_dir
    from contramine.trainer.train import train

    cfg = load_config(profile, [*user_sets, f"run.name={run}", *overrides])
    out = Path(cfg.train.output)
    key, done = run_key(cfg), out / "run.json"
    if done.is_file():
        prev = json.loads(done.read_text())
        if prev.get("key") == key:
            return prev
    t0 = time.perf_counter()
    cls = get_objective(cfg.train.objective)
    notes = list(cls.data_notes(MinedRows(cfg.run.dir, cls.tables)))
    res = train(cfg, resume=True)
    results = evaluate_checkpoint(res["best_dir"], cfg)
    gc.collect()
    row = {"key": key, "objective": cfg.train.objective, "seed": cfg.train.seed, "out": str(out),
           "command": command(profile, run, user_sets, overrides), "steps": res["steps"],
           "best_step": res["best_step"], "best_dev": res["best_dev"], "dev_curve": dev_curve(out / "metrics.jsonl"),
           "inputs": list(cls.tables), "data_notes": notes,
           "extras": cls.Settings.model_validate(getattr(cfg.train, cls.name) or {}).model_dump(mode="json"),
           "results": results, "wall_s": round(time.perf_counter() - t0, 1)}
    atomic_write_json(done, row, indent=1, root=output_dir(cfg)[1])  # no link from the run folder down
    return row


# ------------------------------------------------------------------------------------------------ statistics
def compare(profile: str, run: str | None, user_sets: list[str], objectives: Sequence[str] | None = None,
            seeds: int | None = None) -> dict:
    from contramine.trainer.train_setup import run_pooling

    t0 = time.perf_counter()
    base = load_config(profile, [*user_sets, *([f"run.name={run}"] if run else [])])
    cc = base.compare
    objectives, seeds = objectives or cc.objectives, seeds or cc.seeds
    if cc.baseline not in objectives:
        objectives = [cc.baseline, *objectives]  # the paired test needs it
    steps, out = budget_steps(base), base.run.dir / "compare"
    plan = entries(base, objectives)
    # each row's configuration (seed 0): which start it trains from, read under which pooler and prompt
    cfgs = {e["name"]: load_config(profile, [*user_sets, f"run.name={e['run'] or base.run.name}",
                                             *run_overrides(base, e, 0, steps)]) for e in plan}
    pooling = {n: run_pooling(c) for n, c in cfgs.items()}
    check_inputs(base, cfgs, plan)
    # compare/ is a folder of this run, not a link to somewhere else (one line if it is), one compare at a time in
    # it, and written through the folder as opened (each training checks and locks its own folder below it)
    with run_lock(out, hint_command("compare", run=base.run.dir.name), root=base.run.dir, hint="compare again when it is done"), \
            open_folder(base.run.dir, out) as folder:
        here = folder.at()
        print(f"[compare] run {base.run.name}: {', '.join(e['name'] for e in plan)} x {seeds} seed(s), {steps} steps "
              f"each (batch {base.train.batch_size}, lr {base.train.lr}, dev every {base.train.eval_every}) -> {out}")
        start_model = base.train.model or base.encoder.model
        starts, start_of = {}, {}
        labels: dict[tuple[str, str | None], str] = {}  # (pooler, prompt) -> its start row
        for name, (pooler, prompt) in pooling.items():
            pk = (pooler, prompt if pooler == "mask" else None)
            if pk not in labels:
                same = sum(p == pooler for p, _ in labels)  # another prompt under the same pooler: numbered
                labels[pk] = f"start ({pooler}{f' {same + 1}' if same else ''})"
                print(f"[compare] start model {start_model} under {pooling_label(*pk)}", flush=True)
                starts[labels[pk]] = start_results(base, here / start_file(base, pooler, prompt), (pooler, prompt))
            start_of[name] = labels[pk]
        rows: dict[str, list[dict]] = {}
        for e in plan:
            for k in range(seeds):
                print(f"[compare] {e['name']} seed {k + 1}/{seeds}", flush=True)
                rows.setdefault(e["name"], []).append(
                    train_and_evaluate(profile, run_overrides(base, e, k, steps), user_sets, e["run"] or base.run.name))
        gold = _stsb_gold(base)
        stsb = lambda res: res["cosines"]["STSBenchmark"]  # noqa: E731
        tests = {o: paired_bootstrap(gold, [stsb(r["results"]) for r in rs],
                                     [stsb(r["results"]) for r in rows[cc.baseline]], cc.bootstrap)
                 for o, rs in rows.items() if o != cc.baseline}
        vs_start = {o: paired_bootstrap(gold, [stsb(r["results"]) for r in rs],
                                        [stsb(starts[start_of[o]]["results"])] * len(rs), cc.bootstrap)
                    for o, rs in rows.items()}
        summaries = {o: summarise(rs) for o, rs in rows.items()}
        start_summaries = {label: summarise([s]) for label, s in starts.items()}
        mined = {e["name"]: mined_with(cfgs[e["name"]].run.dir) for e in plan}
        meta = {**{label: {"pooling": pooling_label(s["pooler"] or "", s["prompt"])} for label, s in starts.items()},
                **{n: {"start": start_of[n], "pooling": pooling_label(*pooling[n]), "mined": mined[n]} for n in rows}}
        table = table_markdown(start_summaries, summaries, tests, rows, cc.baseline, vs_start, meta)
        pngs = plots(rows, start_summaries, summaries, here, start_of, tests, cc.baseline)
        report = {"run": base.run.name, "profile": profile, "set": user_sets, "objectives": objectives, "seeds": seeds,
                  "entries": plan,
                  "budget": {"steps": steps, "batch_size": base.train.batch_size, "lr": base.train.lr,
                             "warmup_steps": base.train.warmup_steps, "eval_every": base.train.eval_every,
                             "start_model": start_model, "base_seed": base.train.seed},
                  "starts": starts, "start_of": start_of, "start": starts[start_of[cc.baseline]], "runs": rows,
                  "pooling": {n: {"pooler": p, "prompt": q if p == "mask" else None} for n, (p, q) in pooling.items()},
                  "mined_with": mined, "summary": summaries, "start_summaries": start_summaries,
                  "start_summary": start_summaries[start_of[cc.baseline]],
                  "paired_bootstrap": tests, "paired_bootstrap_vs_start": vs_start, "baseline": cc.baseline,
                  "table": table, "plots": pngs, "wall_s": round(time.perf_counter() - t0, 1),
                  # train + evaluate time of every run, whichever invocation ran it (reused runs keep theirs)
                  "runs_wall_s": round(sum(r["wall_s"] for rs in rows.values() for r in rs), 1)}
        atomic_write_json(here / "compare.json", report, indent=1)
        atomic_write_bytes(here / "table.md", (table + "\n").encode())
        atomic_write_bytes(here / "bootstrap.md", (bootstrap_markdown(rows, tests, vs_start, start_of, cc.baseline,
                                                                     cc.bootstrap) + "\n").encode())
        print("\n" + table + f"\n\nwrote {out / 'compare.json'}, table.md, bootstrap.md, {', '.join(pngs)} "
              f"({report['wall_s']:.0f} s this invocation; {report['runs_wall_s']:.0f} s of training and evaluation "
              "in all)")
        return report


def _stsb_gold(cfg: Config) -> np.ndarray:
    from contramine.trainer.sts import load_stsb

    return np.asarray(load_stsb(cfg.data.senteval_dir, "test").gold, np.float64)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, prog="contramine compare", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train every objective from one start on a run's tables under one step budget and seeds:\n"
                    "a table with paired bootstrap intervals, and plots.",
        epilog="example:\n  contramine compare --run default --objectives simcse debcse --seeds 2 "
               "--set compare.steps=200")
    ap.add_argument("--profile", default="default", help="a profile's name or a path to a .toml")
    ap.add_argument("--run", help="the mining run whose tables every objective trains on (artifacts/<run>)")
    ap.add_argument("--objectives", nargs="+", help="default: compare.objectives (all five); each brings its "
                    "compare.variants and its rows on compare.mined_runs; a variant's name: that row alone")
    ap.add_argument("--seeds", type=whole_number(1), help="default: compare.seeds")
    ap.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                    help="overrides for every run, e.g. compare.steps=200 train.lr=1e-5")
    a = ap.parse_args(argv)
    try:
        compare(a.profile, a.run, a.set, a.objectives, a.seeds)
    except (ExpectedError, ValueError) as e:  # a setting, a table, a link in the run, a compare already running
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
