"""Two checkouts' `make mine` walls, paired: the default profile on its default corpus (wiki1m_head.txt, real
models), each mine in its own process from its own checkout, alternating between the checkouts (base first in even
rounds, new first in odd ones), each in a fresh run root (no shard, no memo row and no Prefect database kept from
before). After each round the two mines' tables are compared byte for byte. On a shared machine only such ratios
mean anything.

    python -m bench.mine_paired --base /path/to/base-checkout --new . --rounds 2 --out /tmp/mine-paired
    python -m bench.mine_paired ... --corpus /tmp/wiki2k.txt       # the default mine on fewer lines
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from bench.scale_paired import same_files

RUN = "mine-paired"


def mine(root: Path, out: Path, extra: list[str], corpus: Path | None = None) -> dict:
    """`make mine` of the checkout at `root` as `make` runs it (its .venv, its environment), its run root `out`:
    wall and CPU seconds of the process and its children."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(root), "PREFECT_HOME": str(out / ".prefect"), "DO_NOT_TRACK": "1",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "TOKENIZERS_PARALLELISM": "false",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120", "CONTRAMINE_VIA": "make"}
    env.pop("PREFECT_API_URL", None)  # each mine starts its own server, as `make mine` does
    cmd = [str(root / ".venv" / "bin" / "python"), "-m", "contramine.flows.cli", "mine", "--profile", "default",
           "--run", RUN, *(["--corpus", str(corpus)] if corpus else []),
           "--set", f"run.root={out}", f"runner.memo_dir={out / '.memo'}", *extra]
    load = os.getloadavg()[0]
    with open(out / "mine.log", "wb") as log:
        t0 = time.perf_counter()
        child = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"the mine of {root} failed; see {out / 'mine.log'}")
    return {"seconds": round(wall, 1), "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
            "load_before_after": [round(load, 2), round(os.getloadavg()[0], 2)]}


def identical_tables(a: Path, b: Path) -> dict[str, bool]:
    """Each table folder of run `a` against `b`'s: byte-equal shards."""
    tables = sorted(p.name for p in a.iterdir() if p.is_dir() and any(p.glob("*.parquet")))
    return {t: same_files(a / t, b / t) for t in tables}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--base", type=Path, required=True, help="the base checkout (with its .venv)")
    ap.add_argument("--new", type=Path, required=True, help="the new checkout (with its .venv)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("/tmp/mine-paired"), help="the run roots, one per mine")
    ap.add_argument("--set", nargs="*", default=[], help="settings for both sides (none: the default mine)")
    ap.add_argument("--corpus", type=Path, help="another corpus for both sides (default: the profile's)")
    ap.add_argument("--results", type=Path, default=Path("artifacts/mine-paired.json"))
    a = ap.parse_args(argv)
    sides = {"base": a.base.resolve(), "new": a.new.resolve()}
    rows: list[dict] = []
    for r in range(a.rounds):
        for side in ("base", "new") if r % 2 == 0 else ("new", "base"):
            row = {"round": r, "side": side, **mine(sides[side], a.out / f"{r}-{side}", a.set, a.corpus)}
            rows.append(row)
            print(f"round {r} {side:4s} {row['seconds']:8.1f} s  cpu {row['cpu_seconds']:7.1f} s  "
                  f"load {row['load_before_after']}", flush=True)
        same = identical_tables(a.out / f"{r}-base" / RUN, a.out / f"{r}-new" / RUN)
        rows.append({"round": r, "identical": same})
        print(f"round {r} tables identical: {all(same.values())} {same}", flush=True)
        a.results.parent.mkdir(parents=True, exist_ok=True)
        a.results.write_text(json.dumps(rows, indent=1))
    walls = {s: sum(x["seconds"] for x in rows if x.get("side") == s) for s in sides}
    print(f"summed walls: base {walls['base']:.1f} s, new {walls['new']:.1f} s, "
          f"new/base {walls['new'] / walls['base']:.3f}")
    for r in range(a.rounds):
        w = {x["side"]: x["seconds"] for x in rows if x.get("round") == r and "side" in x}
        print(f"round {r}: new/base {w['new'] / w['base']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
