"""The torch band engine against another checkout's, paired: the same band search (`band_neighbours` with
`TorchExact` on the CPU, every vector a query against all of them, the neighbours defaults, pool 64, on
bench/peers/neighbours.py's 384-d topic vectors) in a fresh process of each checkout, the two alternated round after
round, so both see the same load on a shared machine; the tables must be equal (one hash of all their columns).

    git worktree add /tmp/before <commit>        # (or `git archive <commit> | tar -x -C /tmp/before`)
    python -m bench.band_paired --before /tmp/before [--n 50000] [--rounds 3] [--threads 1]

Prints each run (wall and CPU seconds) and the medians' ratios, before / this checkout. Not a `make bench` module
(so not under bench/peers/): it needs the second checkout. --threads sets OMP_NUM_THREADS for both sides (on a
shared 2-core CPU two torch threads wait on each other: one is the steadier measure of the work).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ONE_RUN = """
import hashlib, json, sys, time
import numpy as np
from bench.peers.neighbours import vectors
from contramine.pipeline.config import NeighboursCfg
from contramine.pipeline.search.band import band_neighbours
from contramine.pipeline.search.torch_exact import TorchExact
n = int(sys.argv[1])
x, sids, cfg = vectors(n), np.arange(n, dtype=np.int64), NeighboursCfg()
t0, c0 = time.perf_counter(), time.process_time()
index = TorchExact(x)
table = band_neighbours(x, sids, x, sids, index, index, cfg.lo, cfg.hi, 64, cfg.slack)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
digest = hashlib.sha1(b"".join(c.to_numpy().tobytes() for c in table.columns)).hexdigest()[:12]
print(json.dumps({"wall": wall, "cpu": cpu, "rows": table.num_rows, "hash": digest}))
"""


def run_once(root: Path, n: int, threads: int | None) -> dict:
    """One band search in a fresh process of the checkout at `root` (its own `contramine`, first on sys.path)."""
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))
    out = subprocess.run([sys.executable, "-c", ONE_RUN, str(n)], cwd=root, env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"band_paired: the run in {root} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--before", type=Path, required=True, help="the other checkout's root (today's code)")
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for both sides (default: as set)")
    args = ap.parse_args(argv)
    here = Path(__file__).resolve().parents[1]
    runs = {"before": [], "after": []}
    for r in range(args.rounds):
        for side, root in (("before", args.before), ("after", here)):
            runs[side].append(run_once(root, args.n, args.threads))
            print(f"round {r + 1} {side}: " + json.dumps({k: round(v, 2) if isinstance(v, float) else v
                                                        for k, v in runs[side][-1].items()}), flush=True)
    hashes = {run["hash"] for side in runs.values() for run in side}
    if len(hashes) != 1:
        raise SystemExit(f"band_paired: the tables differ between runs ({sorted(hashes)})")
    med = {side: {k: round(statistics.median(run[k] for run in runs[side]), 2) for k in ("wall", "cpu")}
           for side in runs}
    ratio = {k: med["before"][k] / med["after"][k] for k in ("wall", "cpu")}
    print(f"n = {args.n}, {args.rounds} rounds, medians: before {med['before']}, after {med['after']}; "
          f"before / after: wall {ratio['wall']:.2f}x, CPU {ratio['cpu']:.2f}x; tables equal ({hashes.pop()})")
    return {"medians": med, "ratio": ratio}


if __name__ == "__main__":
    main()
