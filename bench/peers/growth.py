"""What a grown corpus, another shard count and another run pay with the row memo (pipeline/memo/rows.py).

    python -m bench.peers.growth [--n 2000]

The default profile (MiniLM, the Bergamot en-pt chain, spaCy) on the first n wiki1m lines, every stage in order
through the runner's own driver (`run_stage`, no Prefect), the memo in a folder of its own:
1. run `a` on n lines (the first run: every row to the models);
2. run `a` again with the corpus grown by 1% (the next n/100 lines appended);
3. run `a` again on the grown corpus with `run.shards` + 3 (another layout);
4. run `b` on the grown corpus (another run under the same root).
Printed: each stage's seconds in each step (its manifest's wall_seconds_last_run) and the rows it sent to the
model / took from the memo. The peer is the first run: the issue's bound is backtranslate + embeddings after 1%
growth at most 15% of their first-run time (before the memo: 101% and 110%, a shard recomputed whole).

    python -m bench.peers.growth --audit [--n 11914] [--set backtranslate.chains=[]] [--repeat 2] [--shares 0.001]

What the memo's audit (`runner.memo_verify`, memo.py) costs: a first run through `negate` on n lines (the memo
filled), then, `repeat` times, another run name with the memo warm, with the audit off and at each share (in
alternating order). Per memo stage: its first-run seconds, the warm runs' seconds off / on, and the audit's seconds
(on - off) against the first run (the bound: 5%) and against the warm run.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from contramine.pipeline.config import SHARED_DATA

GOAL = 0.15
MODEL_STAGES = ("backtranslate", "embeddings")
# bench/smoke.py: the same four mines through the same memo, with the stand-in encoder (pipeline/models/standin.py):
# what is checked is that the memo's rows are reused, not a model's speed
SMOKE_SETTINGS = ["backtranslate.chains=[]", "encoder.model=standin:encoder-384", "neighbours.pool_size=8"]


def mine(corpus: Path, root: Path, run: str, *extra: str) -> dict:
    from contramine.pipeline.config import configure
    from contramine.pipeline.engine.runner import load_stages, run_stage

    cfg = configure("default", run, str(corpus), [f"run.root={root}", *extra])
    out = {}
    for name in load_stages():
        m = run_stage(name, cfg, log=lambda line: None)
        memo = {k: (e["rows_computed"], e["rows_reused"]) for k, e in (m.get("memo") or {}).items()}
        out[name] = {"seconds": m["wall_seconds_last_run"], "memo": memo}
    return out


def run(n: int = 2000, work: Path | None = None) -> list[dict]:
    from bench import smoke

    n, shards = smoke.cap(n, 24), smoke.cap(4, 1)  # the default profile's run.shards is 4
    toy = smoke.cap([], [*SMOKE_SETTINGS, f"run.shards={shards}"])
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
        steps[f"run.shards={shards + 3}"] = mine(grown, root, "a", *toy, f"run.shards={shards + 3}")
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


AUDIT_STAGES = ("embeddings", "backtranslate", "negate")


def audit_cost(n: int = 2000, sets: tuple[str, ...] = (), repeat: int = 2, shares: tuple[float, ...] = (0.01,),
               work: Path | None = None) -> dict:
    """{share: {stage: {first, off: [s], on: [s], audited, cost_of_first, cost_of_warm}}} (see the module doc); the
    runs stop after `negate`. The warm runs with the audit off and at each share alternate, `repeat` rounds."""
    from contramine.pipeline.config import configure
    from contramine.pipeline.engine.runner import load_stages, run_stage

    lines = (SHARED_DATA / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()
    tmp = Path(work or tempfile.mkdtemp(prefix="audit-"))
    corpus, root = tmp / f"c{n}.txt", tmp / "runs"
    corpus.write_text("\n".join(lines[:n]) + "\n", encoding="utf-8")

    def mine(run: str, share: float) -> dict:
        cfg = configure("default", run, str(corpus), [f"run.root={root}", *sets, f"runner.memo_verify={share}"])
        out = {}
        for name in load_stages():
            m = run_stage(name, cfg, log=lambda line: None)
            out[name] = (m["wall_seconds_last_run"], sum(e.get("rows_audited", 0) for e in (m.get("memo") or {})
                                                          .values()))
            if name == AUDIT_STAGES[-1]:
                return out
        return out

    modes = (0.0, *shares)
    try:
        first = mine("first", 0.0)
        runs: dict[float, list] = {m: [] for m in modes}
        for i in range(repeat):
            for mode in (modes if i % 2 == 0 else modes[::-1]):
                runs[mode].append(mine(f"warm{i}-{mode}", mode))
    finally:
        if work is None:
            shutil.rmtree(tmp, ignore_errors=True)
    out: dict = {}
    for share in shares:
        out[share] = {}
        for stage in AUDIT_STAGES:
            off, on = [r[stage][0] for r in runs[0.0]], [r[stage][0] for r in runs[share]]
            cost = sum(on) / len(on) - sum(off) / len(off)
            e = out[share][stage] = {"first": first[stage][0], "off": off, "on": on,
                                     "audited": runs[share][0][stage][1],
                                     "cost_of_first": cost / max(first[stage][0], 1e-9),
                                     "cost_of_warm": cost / max(sum(off) / len(off), 1e-9)}
            print(f"memo_verify={share:g} {stage:<14} first {e['first']:7.1f} s | warm, audit off {off} s, on {on} s "
                  f"({e['audited']} rows audited) | audit: {cost:+.2f} s = {e['cost_of_first']:.1%} of the first "
                  f"run's stage, {e['cost_of_warm']:.0%} of the warm stage")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False,
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--audit", action="store_true", help="what the memo's audit costs (see above)")
    ap.add_argument("--set", nargs="*", default=[], help="config overrides for the --audit runs")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--shares", type=float, nargs="+", default=[0.01], help="runner.memo_verify values (--audit)")
    a = ap.parse_args(argv)
    if a.audit:
        audit_cost(a.n, tuple(a.set), a.repeat, tuple(a.shares))
        return
    for r in run(a.n):
        print(f"{r['name']}: {r['ours']} s against {r['peer']} s on the first run: {r['ratio']:.3f} (goal <= {GOAL})")


if __name__ == "__main__":
    main()
