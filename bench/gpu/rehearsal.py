"""`make gpu-rehearsal`: the GPU check's CPU twin in an environment built like the lent GPU machine's, so that a
section that would be skipped or break there fails here first, at no device time.

    make gpu-rehearsal            # = python -m bench.gpu.rehearsal: the venv (built once: 3-5 min here), the twin (~1 min)
    python -m bench.gpu.rehearsal --fresh    # the venv and the wheels built anew, whatever the last rehearsal left

1. A throwaway venv in artifacts/gpu-rehearsal/venv, from the system Python (3.11 here; the machine has 3.12), with
   bench/gpu/machine.py's PREINSTALLED versions: transformers, sentence-transformers, tokenizers, ...
   torch is this box's (TORCH_HERE, CPU build): the registry's torch 2.11 for Python 3.12 is a multi-GB CUDA build.
   Nothing of the project's own requirements goes in; a CARRIED package that a dependency pulled in here (the
   registry's newest typer needs pydantic, the machine's does not) is removed again. The next rehearsal reuses it
   (and the wheels of step 2) while they were built from the same Python and versions (built-from.txt beside them;
   the check installs the carried wheels into a folder of their own, never into the venv); else, or with
   `--fresh`, everything is removed and built again.
2. CARRIED (what `make gpu-wheels` takes to the machine) downloaded as wheels for this Python into
   artifacts/gpu-rehearsal/wheels: the cp311 equivalents of the cp312 wheels in .gpu-wheels/.
3. A check that the venv lacks what the machine lacks (ABSENT: FAISS, Prefect, DuckDB, spaCy, jiwer).
4. `python -m bench.gpu.check --twin --strict --wheels artifacts/gpu-rehearsal/wheels` in that venv, from the
   repository root: the carried wheels go in through the same `use_carried_wheels` the GPU run takes, and a
   skipped section is a failure, as on the GPU.

Exit status: the check's (0: every section ran, no failed check), or 1 when the venv could not be built or has a
package it must not. The venv is left in place for a look and removed by the next rehearsal or `make clean`.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.gpu.machine import ABSENT, ALSO_THERE, CARRIED, PREINSTALLED, TORCH_HERE, requirements

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "artifacts" / "gpu-rehearsal"


def preinstalled_here() -> list[str]:
    """PREINSTALLED as requirement lines for this box: torch at this box's pin, the rest as on the machine."""
    return requirements({**PREINSTALLED, "torch": TORCH_HERE})


def step(what: str, cmd: list[str], **kw) -> None:
    print(f"gpu-rehearsal: {what}", flush=True)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, **kw)
    if r.returncode != 0:
        raise SystemExit(f"gpu-rehearsal: {what} failed (exit {r.returncode}): {' '.join(cmd)}")
    print(f"gpu-rehearsal: {what}: {time.perf_counter() - t0:.0f} s", flush=True)


def what_builds(base: str) -> str:
    """What the venv and the wheels are built from (the base Python, PREINSTALLED here, CARRIED): while it is the
    same, the next rehearsal reuses them (removing ~1 GB of venv took 109 s on this box, loaded; building it 3 min)."""
    return "\n".join([os.path.realpath(shutil.which(base) or base), *preinstalled_here(), "--", *requirements(CARRIED)])


def main() -> int:
    venv, wheels = WORK / "venv", WORK / "wheels"
    fresh = "--fresh" in sys.argv[1:]
    check_args = [a for a in sys.argv[1:] if a != "--fresh"]
    base = os.environ.get("GPU_REHEARSAL_PYTHON", sys.executable if sys.prefix == sys.base_prefix else "python3")
    py = str(venv / "bin" / "python")
    t0 = time.perf_counter()
    built_from, marker = what_builds(base), WORK / "built-from.txt"
    if not fresh and marker.is_file() and marker.read_text() == built_from and Path(py).is_file():
        shutil.rmtree(WORK / "check", ignore_errors=True)
        print(f"gpu-rehearsal: the venv and wheels of the last rehearsal (built from the same versions; "
              f"--fresh builds them anew) in {WORK}", flush=True)
    else:
        shutil.rmtree(WORK, ignore_errors=True)
        WORK.mkdir(parents=True)
        print(f"gpu-rehearsal: the last rehearsal removed: {time.perf_counter() - t0:.0f} s", flush=True)
        step("venv", [base, "-m", "venv", str(venv)])
        step("the machine's packages: " + " ".join(preinstalled_here()),
             [py, "-m", "pip", "install", "-q", *preinstalled_here()])
        # a PREINSTALLED package's newer release here may pull in what the machine lacks (typer -> pydantic): out
        step("remove what the machine lacks but a dependency pulled in here",
             [py, "-m", "pip", "uninstall", "-q", "-y", *(m for m in CARRIED if m not in ALSO_THERE)],
             stderr=subprocess.DEVNULL)
        step("the carried wheels, for this Python: " + " ".join(requirements(CARRIED)),
             [py, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(wheels),
              *requirements(CARRIED)])
        marker.write_text(built_from)
    probe = "import importlib.util as u; print(' '.join(m for m in %r if u.find_spec(m)))" % (ABSENT,)
    present = subprocess.run([py, "-c", probe], capture_output=True, text=True, cwd=WORK).stdout.split()
    if present:
        print(f"gpu-rehearsal: the venv has {', '.join(present)}, which the GPU machine lacks (a dependency of "
              f"{' or '.join(PREINSTALLED)} pulled it in): the rehearsal would hide a skip", flush=True)
        return 1
    carried_too = subprocess.run([py, "-c", probe.replace(repr(ABSENT), repr(("rapidfuzz", "pydantic", "ctranslate2")))],
                                 capture_output=True, text=True, cwd=WORK).stdout.split()
    if carried_too:
        print(f"gpu-rehearsal: the venv already has {', '.join(carried_too)} before the carried wheels go in (a "
              f"dependency pulled it in): then a missing carried wheel would go unseen", flush=True)
        return 1
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    print("gpu-rehearsal: the CPU twin, strict, in that venv", flush=True)
    t1 = time.perf_counter()
    r = subprocess.run([py, "-m", "bench.gpu.check", "--twin", "--strict", "--wheels", str(wheels),
                        "--out", str(WORK / "check"), *check_args], cwd=ROOT, env=env)
    print(f"gpu-rehearsal: the CPU twin: {time.perf_counter() - t1:.0f} s (its own start and imports included); "
          f"{'passed' if r.returncode == 0 else 'FAILED'} (results: {WORK / 'check' / 'results.json'}); "
          f"{time.perf_counter() - t0:.0f} s in all", flush=True)
    return r.returncode


if __name__ == "__main__":
    raise SystemExit(main())
