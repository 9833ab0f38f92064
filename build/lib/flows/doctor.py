"""What this environment runs on, checked at the end of `make install` (and by hand: `python -m flows.doctor`).

    $ .venv/bin/python -m flows.doctor --accel gpu
    environment: torch 2.13.0+cu128 (CUDA 12.8, 1 GPU: NVIDIA H100 80GB HBM3), faiss-gpu 1.15.1 (1 GPU), hub https://huggingface.co

Exit 1, with one line saying what to do, when the environment cannot work as asked: both faiss packages installed
(they provide the same module, and whichever was installed last silently wins), or `--accel gpu` with a torch or
faiss that sees no GPU.
"""
from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version


def installed(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def faiss_problem(versions: dict[str, str | None], accel: str | None) -> str | None:
    """Why the faiss install is wrong for `accel` (cpu | gpu | None = either), else None."""
    have = {d: v for d, v in versions.items() if v}
    if len(have) > 1:
        return (f"both {' and '.join(f'{d} {v}' for d, v in have.items())} are installed: they provide the same "
                f"`faiss` module; `pip uninstall -y faiss-cpu faiss-gpu` then `make install`")
    if not have:
        return "no faiss package is installed: run `make install` (faiss-cpu, or faiss-gpu on an NVIDIA machine)"
    if accel and f"faiss-{accel}" not in have:
        return f"{next(iter(have))} is installed but ACCEL={accel}: run `make install ACCEL={accel}`"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flows.doctor", description=__doc__.split("\n\n")[0])
    ap.add_argument("--accel", choices=("cpu", "gpu"), default=None, help="what `make install` was asked for")
    args = ap.parse_args(argv)
    problem = faiss_problem({d: installed(d) for d in ("faiss-cpu", "faiss-gpu")}, args.accel)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    import faiss
    import torch

    from pipeline.models.hub import hub_endpoint, hub_offline

    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    faiss_gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(n_gpu))
    dist = "faiss-gpu" if installed("faiss-gpu") else "faiss-cpu"
    print(f"environment: torch {torch.__version__} ("
          + (f"CUDA {torch.version.cuda}, {n_gpu} GPU: {names}" if n_gpu else
             f"{'CUDA ' + torch.version.cuda + ' build, ' if torch.version.cuda else ''}CPU") + "), "
          f"{dist} {installed(dist)} ({faiss_gpus} GPU), hub {hub_endpoint()}"
          + (" (HF_HUB_OFFLINE set: local models only)" if hub_offline() else ""))
    if args.accel == "gpu" and (not n_gpu or not faiss_gpus):
        print(f"error: ACCEL=gpu but torch sees {n_gpu} GPU and faiss {faiss_gpus}: check the NVIDIA driver, or set "
              f"TORCH_INDEX to a CUDA wheel index (make install ACCEL=gpu TORCH_INDEX=...)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
