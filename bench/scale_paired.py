"""Two checkouts' stage seconds, paired: `bench.scale`'s measurement of each stage, alternating between the checkouts
(base first in even rounds, new first in odd ones), each on its own copy of one kept run folder; after every stage
the two checkouts' table files are compared byte for byte. On a shared machine only such ratios mean anything.

    python -m bench.scale --n 50000 --steps 1 --keep --out /tmp/base-out     # from the base checkout
    cp -a /tmp/base-out /tmp/new-out
    python -m bench.scale_paired --base /path/to/base --base-out /tmp/base-out --new . --new-out /tmp/new-out \\
        --n 50000 --rounds 2 --stages noise,backtranslate,paraphrases,ipw,pairs,triplets
"""
from __future__ import annotations

import argparse
import filecmp
import json
import os
from pathlib import Path


def same_files(a: Path, b: Path) -> bool:
    """The two table folders hold byte-equal Parquet shards (shard files sorted by name: part index first)."""
    fa, fb = sorted(a.glob("*.parquet")), sorted(b.glob("*.parquet"))
    return len(fa) == len(fb) and all(filecmp.cmp(x, y, shallow=False) for x, y in zip(fa, fb))


def main(argv: list[str] | None = None) -> int:
    import bench.scale as scale
    from prefect.testing.utilities import prefect_test_harness

    from contramine.pipeline.config import configure
    from contramine.pipeline.engine.runner import load_stages

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    for side in ("base", "new"):
        ap.add_argument(f"--{side}", type=Path, required=True, help=f"the {side} checkout")
        ap.add_argument(f"--{side}-out", type=Path, required=True, help=f"its copy of the kept `bench.scale` output")
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--stages", required=True, help="comma-separated, in run order")
    ap.add_argument("--results", type=Path, default=Path("artifacts/scale/paired.json"))
    a = ap.parse_args(argv)
    sides = {"base": (a.base.resolve(), a.base_out), "new": (a.new.resolve(), a.new_out)}
    run, stages, results = f"scale-{a.n}", load_stages(), []
    with prefect_test_harness(server_startup_timeout=120):
        import prefect.settings

        for r in range(a.rounds):
            for name in a.stages.split(","):
                for side in ("base", "new") if r % 2 == 0 else ("new", "base"):
                    root, out = sides[side]
                    scale.ROOT = root  # the stage's child process runs in that checkout
                    env = {**os.environ, "PREFECT_API_URL": prefect.settings.PREFECT_API_URL.value(),
                           "PYTHONPATH": str(root)}
                    text = out / "corpora" / f"{scale.DEFAULT_CORPUS}-{a.n}.txt"
                    sets = [*scale.STANDIN_SETTINGS, f"run.root={out}", f"runner.memo_dir={scale.memo_dir(out, run)}"]
                    shards = configure("default", run, str(text), sets).run.shards
                    row = {**scale.measure(name, stages[name], a.n, run, text, sets, env, out, shards, [], 1),
                           "side": side, "round": r}
                    row["identical"] = {t: same_files(a.base_out / run / t, a.new_out / run / t)
                                        for t in stages[name].writes}
                    results.append(row)
                    print(f"round {r} {side:4s} {name:14s} {row['seconds']:8.2f} s  cpu {row['cpu_seconds']:6.1f} s  "
                          f"load {row['load_before_after']}  identical {row['identical']}", flush=True)
                    a.results.parent.mkdir(parents=True, exist_ok=True)
                    a.results.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
