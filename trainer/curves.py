"""`make tensorboard RUN=<run>`: TensorBoard over a run's training curves (every train/ and compare/ run below it).

    python -m trainer.curves --run default [--port 6006] [--profile default]

The run name is checked as every target checks it (pipeline/config/names.py): one folder inside run.root
(artifacts/), so RUN=.. or RUN=/etc is refused in one line. The event files are written by trainer/metrics_log.py
beside each metrics.jsonl.
"""
from __future__ import annotations

import argparse
import os
import sys

from pipeline.config import load_config
from pipeline.errors import ExpectedError


def command(run_dir, port: int) -> list[str]:
    return [sys.executable, "-m", "tensorboard.main", "--logdir", str(run_dir), "--port", str(port)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.curves", description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="run name: artifacts/<run>")
    ap.add_argument("--profile", default="default")
    ap.add_argument("--port", type=int, default=6006)
    args = ap.parse_args(argv)
    try:
        run_dir = load_config(args.profile, [f"run.name={args.run}"]).run.dir
    except ExpectedError as e:
        print("error: " + " ".join(str(e).splitlines()), file=sys.stderr)
        return 2
    if not run_dir.is_dir():
        print(f"error: no run folder {run_dir}", file=sys.stderr)
        return 2
    cmd = command(run_dir, args.port)
    print(" ".join(cmd), flush=True)
    os.execv(cmd[0], cmd)  # TensorBoard in this process: Ctrl-C stops it


if __name__ == "__main__":
    sys.exit(main())
