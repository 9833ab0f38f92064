"""`make tensorboard RUN=<run>`: TensorBoard over a run's training curves (every train/ and compare/ run below it).

    python -m contramine.trainer.curves --run default [--port 6006] [--profile default]

The run name is checked as every target checks it (pipeline/config/names.py): one folder inside run.root
(artifacts/), so RUN=.. or RUN=/etc is refused in one line. The event files are written by trainer/metrics_log.py
beside each metrics.jsonl.

A run folder may come from someone else, with links planted in it (`train/loop -> ..`, `train/x -> /home`).
TensorBoard's own walk follows every link (and loops on `loop -> ..`), so TensorBoard runs in this process with its
two file-listing functions replaced by ours (`event_folders`, `plain_files`): the folders reached from the run
without following a link, the plain files in them. Its data server (`--load_fast`), which walks on its own, is off.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from contramine.pipeline.config import load_config
from contramine.pipeline.storage.safe_paths import walk
from contramine.pipeline.errors import ExpectedError

EVENTS = "events.out.tfevents."


def event_folders(run_dir: Path | str) -> list[str]:
    """The folders below `run_dir` (itself included) that hold an event file, reached without following a link."""
    return [str(folder) for folder, files in walk(run_dir) if any(f.startswith(EVENTS) for f in files)]


def plain_files(folder: str) -> list[str]:
    """The entries of `folder` TensorBoard may open: its plain files and folders, no link."""
    try:
        with os.scandir(folder) as it:
            return [os.path.join(folder, e.name) for e in it if not e.is_symlink()]
    except OSError:
        return []


def argv(run_dir, port: int) -> list[str]:
    return ["tensorboard", "--logdir", str(run_dir), "--port", str(port), "--load_fast", "false"]


def serve(run_dir: Path, port: int) -> int:
    """TensorBoard over `run_dir` until Ctrl-C, listing folders and files our way (see the module doc)."""
    from tensorboard import program
    from tensorboard.backend.event_processing import io_wrapper

    io_wrapper.GetLogdirSubdirectories = lambda path: tuple(event_folders(path))
    io_wrapper.ListDirectoryAbsolute = plain_files
    tb = program.TensorBoard()
    tb.configure(argv=argv(run_dir, port))
    return tb.main()


def main(argv_: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False,
                                 prog="python -m contramine.trainer.curves", description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="run name: artifacts/<run>")
    ap.add_argument("--profile", default="default")
    ap.add_argument("--port", type=int, default=6006)
    args = ap.parse_args(argv_)
    try:
        run_dir = load_config(args.profile, [f"run.name={args.run}"]).run.dir
    except ExpectedError as e:
        print("error: " + " ".join(str(e).splitlines()), file=sys.stderr)
        return 2
    if not run_dir.is_dir():
        print(f"error: no run folder {run_dir}", file=sys.stderr)
        return 2
    print(" ".join(argv(run_dir, args.port)), flush=True)
    return serve(run_dir, args.port)


if __name__ == "__main__":
    sys.exit(main())
