"""What a grown corpus, another shard count and another run pay with the row memo (pipeline/engine/memo.py).

    python -m bench.growth_bench [--n 2000]

The default profile (MiniLM, the Bergamot en-pt chain, spaCy) on the first n wiki1m lines, every stage in order
through the runner's own driver (`run_stage`, no Prefect), the memo in a folder of its own:
1. run `a` on n lines (the first run: every row to the models);
2. run `a` again with the corpus grown by 1% (the next n/100 lines appended);
3. run `a` again on the grown corpus with `run.shards` + 3 (another layout);
4. run `b` on the grown corpus (another run under the same root).
Printed: each stage's seconds in each step (its manifest's wall_seconds_last_run) and the rows it sent to the
model / took from the memo. The peer is the first run: the issue's bound is backtranslate + embeddings after 1%
growth at most 15% of their first-run time (before the memo: 101% and 110%, a shard recomputed whole).
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from pipeline.config import SHARED_DATA

GOAL = 0.15
MODEL_STAGES = ("backtranslate", "embeddings")


def mine(corpus: Path, root: Path, run: str, *extra: str) -> dict:
    from pipeline.config import configure
    from pipeline.engine.runner import load_stages, run_stage

    cfg = configure("default", run, str(corpus), [f"run.root={root}", *extra])
    out = {}
    for name in load_stages():
        m = run_stage(name, cfg, log=lambda line: None)
        memo = {k: (e["rows_computed"], e["rows_reused"]) for k, e in (m.get("memo") or {}).items()}
        out[name] = {"seconds": m["wall_seconds_last_run"], "memo": memo}
    return out


def run(n: int = 2000, work: Path | None = None) -> list[dict]:
    from bench import smoke

    n = smoke.cap(n, 40)
    toy = smoke.cap([], ["backtranslate.chains=[]", "encoder.max_length=32", "neighbours.pool_size=8"])
    lines = (SHARED_DATA / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()
    grow = max(1, n // 100)
    tmp = Path(work or tempfile.mkdtemp(prefix="growth-"))
    small, grown = tmp / f"c{n}.txt", tmp / f"c{n + grow}.txt"
    small.write_text("\n".join(lines[:n]) + "\n", encoding="utf-8")
    grown.write_text("\n".join(lines[:n + grow]) + "\n", encoding="utf-8")
    root = tmp / "runs"
    try:
        steps = {"first": mine(small, root, "a", *toy)}
        steps["grown 1%"] = mine(grown, root, "a", *toy)
        shards = 4 + 3  # the default profile's run.shards is 4
        steps[f"run.shards={shards}"] = mine(grown, root, "a", f"run.shards={shards}", *toy)
        steps["another run"] = mine(grown, root, "b", *toy)
    finally:
        if work is None:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'stage':<16}" + "".join(f"{k:>26}" for k in steps))
    for stage in steps["first"]:
        cells = []
        for s in steps.values():
            memo = "".join(f" {c}/{r}" for c, r in s[stage]["memo"].values())
            cells.append(f"{s[stage]['seconds']:>9.1f}s{memo:>16}")
        print(f"{stage:<16}" + "".join(f"{c:>26}" for c in cells))
    first = sum(steps["first"][s]["seconds"] for s in MODEL_STAGES)
    rows = []
    for step in list(steps)[1:]:
        ours = sum(steps[step][s]["seconds"] for s in MODEL_STAGES)
        rows.append({"name": f"growth_{step.replace(' ', '_').replace('%', 'pct').replace('=', '_')}_{n}",
                     "ours": round(ours, 2), "peer": round(first, 2), "unit": "s bt+emb",
                     "ratio": round(ours / max(first, 1e-9), 3),
                     "goal": GOAL, "better": "lower", "steps": steps if step == "grown 1%" else None})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000)
    a = ap.parse_args(argv)
    for r in run(a.n):
        print(f"{r['name']}: {r['ours']} s against {r['peer']} s on the first run: {r['ratio']:.3f} (goal <= {GOAL})")


if __name__ == "__main__":
    main()
