"""The host bench's worker (bench/host/bench.py runs it): the four GPU jobs of the 1M path on one checkout's code, with
each model's arithmetic removed, timed on this CPU. What is left is what the host does for the card.

    python -P bench/host/jobs.py --checkout PATH --data DIR --sizes JSON [--set JOB.KEY=VALUE ...] encode search ...

It runs as a script with PYTHONPATH=<checkout> and `-P`, so `pipeline` and `trainer` are that checkout's (today's
code from a git export, or this one) while the hollow models and the jobs are those of this file's folder
(use_this_bench), the same on both sides. It uses only the calls both sides share: `Encoder(model, tokenizer, ...)`
+ `encode`, `Translator(name, tokenizer, model, cfg, device)` + `translate`, `band_neighbours(...)` with any object
that has `search(x, k)`, an objective's `collate` + `forward` in trainer/train.py's step. It prints one line
`HOSTBENCH {json}` with, per job, the host seconds per unit (wall and CPU, best of `repeats` passes after a
warm-up) and, from one more pass under a counting dispatch mode, the torch ops (~ kernel launches on a GPU) and
the ops that make a GPU wait for its host to read a value (`.item()`, `bool(t)`, `nonzero`, `torch.equal`, ...) per
unit. On a CPU a host read costs nothing, so the time cannot show what a sync costs a GPU: the count does. Copies
back to the host (`.cpu()`, `.numpy()`, `.tolist()`) are no ops on a CPU tensor and are not counted.

The jobs: bench/host/model_jobs.py (encode, generate, train) and bench/host/search_jobs.py (search, resolve), on the
hollow models of bench/host/hollow.py, measured as bench/host/measure.py does.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # bench/


def use_this_bench() -> None:
    """`bench` from this file's folder: PYTHONPATH names the measured checkout (its `pipeline` and `trainer`), whose
    own bench/ may be older or lack the worker's modules; these are this checkout's on both sides."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench", HERE / "__init__.py", submodule_search_locations=[str(HERE)])
    package = importlib.util.module_from_spec(spec)
    sys.modules["bench"] = package
    spec.loader.exec_module(package)


class _Alias:
    """A loader whose module is one already imported (or a new empty package): two names, one module object."""

    def __init__(self, module):
        self.module = module

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        pass


def alias_old_names(checkout: Path) -> None:
    """A checkout from before the one import name (no contramine/ folder: its code imports `pipeline`, `trainer`):
    `contramine.pipeline.x` is then that checkout's `pipeline.x`, the same module object, so the jobs run on it."""
    import importlib
    import importlib.abc
    import importlib.util
    import types

    if (checkout / "contramine" / "__init__.py").is_file():
        return

    class OldNames(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[:2][-1] in ("pipeline", "trainer", "flows") and name.startswith("contramine."):
                module = importlib.import_module(name.removeprefix("contramine."))
                return importlib.util.spec_from_loader(name, _Alias(module), is_package=hasattr(module, "__path__"))
            return None

    top = types.ModuleType("contramine")
    top.__path__ = []
    sys.modules["contramine"] = top
    sys.meta_path.insert(0, OldNames())


_M = "contramine.pipeline.models."
# The modules pipeline/models/ moved into packages by job (encode/, translate/): new name -> a checkout's from before
MOVED = {_M + new: _M + old for new, old in {
    "encode.encoder": "encoder", "encode.batches": "encode_batches", "encode.resource": "encoder_resource",
    "encode.unpad": "unpad", "encode.precomputed": "precomputed", "translate.chains": "chains",
    "translate.settings": "translation", "translate.engines.hf": "translator", "translate.engines.ct2": "ct2",
    "translate.engines.bergamot": "bergamot", "translate.decode.loop": "decode_loop",
    "translate.decode.steps": "decode_steps", "translate.decode.beam": "beam_loop",
    "translate.decode.tokens": "fast_tokens", "translate.decode.mt19937": "mt19937"}.items()}
MOVED["contramine.pipeline.codeversion"] = "contramine.pipeline.engine.codeversion"


def alias_moved_modules(checkout: Path) -> None:
    """A checkout from before models/ was split by job: the jobs' new module names are its old modules (the same
    module objects), and the new packages are empty ones."""
    import importlib
    import importlib.abc
    import importlib.util
    import types

    if (checkout / "pipeline" / "models" / "encode").is_dir():
        return
    packages = {new.rsplit(".", i)[0] for new in MOVED for i in (1, 2)} - {"contramine.pipeline", _M[:-1]}

    class Moved(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name in MOVED:
                return importlib.util.spec_from_loader(name, _Alias(importlib.import_module(MOVED[name])))
            if name in packages:
                package = types.ModuleType(name)
                package.__path__ = []
                return importlib.util.spec_from_loader(name, _Alias(package), is_package=True)
            return None

    sys.meta_path.insert(0, Moved())


def run_workers(calls: list[tuple], together: bool = False) -> list[tuple[dict, float]]:
    """What bench/host/bench.py runs: this worker in a subprocess for each (checkout, data, sizes, jobs, settings), on
    that checkout's code: one after another, or all started at once (`together`); each one's ({job: measurements},
    seconds)."""
    import subprocess
    import tempfile

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "false")}

    def start(checkout: Path, data: Path, sizes: dict, jobs: list[str], settings: list[str]):
        cmd = [sys.executable, "-P", str(Path(__file__).resolve()), "--checkout", str(checkout), "--data", str(data),  # jobs before --set,
               "--sizes", json.dumps(sizes), *jobs, *(["--set", *settings] if settings else [])]  # which takes the rest
        out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")  # files: no pipe fills while waiting
        proc = subprocess.Popen(cmd, cwd=checkout, env=env | {"PYTHONPATH": str(checkout)}, stdout=out, stderr=err)
        return time.perf_counter(), proc, out, err, checkout

    def finish(t0: float, proc, out, err, checkout: Path) -> tuple[dict, float]:
        proc.wait()
        stdout, stderr = (f.seek(0) or f.read() for f in (out, err))
        found = [line for line in stdout.splitlines() if line.startswith("HOSTBENCH ")]
        if proc.returncode != 0 or not found:
            tail = (stderr or stdout).strip().splitlines()[-12:]
            raise RuntimeError(f"host bench worker on {checkout} failed (exit {proc.returncode}):\n" + "\n".join(tail))
        return json.loads(found[-1].removeprefix("HOSTBENCH "))["jobs"], time.perf_counter() - t0

    return [finish(*p) for p in [start(*c) for c in calls]] if together else [finish(*start(*c)) for c in calls]


def jobs() -> dict:
    from bench.host.model_jobs import job_encode, job_generate, job_train
    from bench.host.search_jobs import job_resolve, job_search

    return {"encode": job_encode, "generate": job_generate, "search": job_search, "resolve": job_resolve,
            "train": job_train}


def main(argv: list[str] | None = None) -> int:
    run = jobs()
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkout", required=True, help="the code measured: PYTHONPATH must name it")
    ap.add_argument("--data", required=True, help="the folder bench/host/bench.py prepared")
    ap.add_argument("--sizes", required=True, help="JSON: the sizes")
    ap.add_argument("--set", nargs="*", default=[], metavar="JOB.KEY=JSON", help="a setting of one job")
    ap.add_argument("jobs", nargs="+", choices=sorted(run))
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # the host's work is one Python thread; no CPU thread pool waits on another
    checkout = Path(args.checkout).resolve()
    alias_old_names(checkout)
    alias_moved_modules(checkout)
    import contramine.pipeline as pipeline

    if not Path(pipeline.__file__).resolve().is_relative_to(checkout):
        raise SystemExit(f"host bench: `pipeline` comes from {pipeline.__file__}, not from {checkout}: run with "
                         f"PYTHONPATH={checkout} and python -P")
    settings: dict[str, dict] = {job: {} for job in run}
    for item in args.set:
        key, _, value = item.partition("=")
        job, _, name = key.partition(".")
        if job not in run or not name:
            raise SystemExit(f"host bench: --set {item}: expected JOB.KEY=VALUE with JOB one of {', '.join(run)}")
        try:
            settings[job][name] = json.loads(value)
        except json.JSONDecodeError:
            settings[job][name] = value
    sizes, out = json.loads(args.sizes), {}
    for job in args.jobs:
        t0 = time.perf_counter()
        result = run[job](Path(args.data), sizes, settings[job])
        result.pop("table", None)  # the resolve's pools: for job_search, not for the report
        out[job] = result | {"wall_s": round(time.perf_counter() - t0, 1)}
        print(f"host bench worker ({checkout.name}): {job} {json.dumps(out[job])}", file=sys.stderr, flush=True)
    print("HOSTBENCH " + json.dumps({"checkout": str(checkout), "pid": os.getpid(), "jobs": out}), flush=True)
    return 0


if __name__ == "__main__":
    use_this_bench()
    raise SystemExit(main())
