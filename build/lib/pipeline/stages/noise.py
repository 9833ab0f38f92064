"""Stage `noise`: DebCSE's noise injection before back-translation (METHODS §3).

Each sentence gets `n_variants` noised copies: either insert one or two of the corpus' most frequent words at
random positions, or drop one or two random words (the paper: "one or two"). Seeded per (sentence, variant).
Until a translation model is configured these variants are themselves the positive candidates.
"""
from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path

import pyarrow as pa

from pipeline.engine.spec import Ctx, package_versions, stage
from pipeline.schema import SCHEMAS
from pipeline.seeding import row_rng


def frequent_words(texts: list[str], top: int) -> list[str]:
    """The corpus' `top` most frequent alphabetic words (lower-cased), ties broken alphabetically."""
    counts = Counter(w for t in texts for w in t.lower().split() if w.isalpha())
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]]


def noise_variant(words: list[str], vocab: list[str], rng, op: str, n_ops: int) -> tuple[list[str], str]:
    words = list(words)
    if op == "drop" and len(words) > n_ops + 1:
        for _ in range(n_ops):
            words.pop(int(rng.integers(len(words))))
        return words, f"drop{n_ops}"
    for _ in range(n_ops):  # insert (also the fallback when the sentence is too short to drop from)
        words.insert(int(rng.integers(len(words) + 1)), vocab[int(rng.integers(len(vocab)))])
    return words, f"insert{n_ops}"


def noise_sentences(sentences: pa.Table, vocab: list[str], cfg, seed: int) -> pa.Table:
    sids, texts = sentences.column("sid").to_pylist(), sentences.column("text").to_pylist()
    out = {"sid": [], "variant": [], "text": [], "ops": []}
    if not vocab:
        return pa.table(out, schema=SCHEMAS["variants"])
    for sid, text in zip(sids, texts):
        words = text.split()
        for v in range(1, cfg.n_variants + 1):
            rng = row_rng(seed, "noise", sid, v)
            op = cfg.ops[int(rng.integers(len(cfg.ops)))]
            n_ops = int(rng.integers(cfg.min_ops, cfg.max_ops + 1))
            noised, ops = noise_variant(words, vocab, rng, op, n_ops)
            out["sid"].append(sid)
            out["variant"].append(v)
            out["text"].append(" ".join(noised))
            out["ops"].append(ops)
    return pa.table(out, schema=SCHEMAS["variants"])


@functools.lru_cache(maxsize=1)
def _vocab(run_dir: str, n: int, table_hash: str, top: int) -> tuple[str, ...]:
    from pipeline.engine.store import Store

    texts = Store(Path(run_dir)).read("sentences", n).column("text").to_pylist()
    return tuple(frequent_words(texts, top))


# numpy: its Generator draws every insertion and drop (a numpy that changed its streams would change the variants)
@stage(reads=("sentences",), reads_whole=("sentences",), writes=("variants",), settings=("noise",),
       facts=lambda cfg: package_versions("numpy"))
def noise(ctx: Ctx) -> dict[str, pa.Table]:
    """The vocabulary is the whole corpus' most frequent words; each shard noises its own sentences."""
    vocab = _vocab(str(ctx.store.root), ctx.n, ctx.store.table_hash("sentences", ctx.n), ctx.cfg.noise.top_words)
    return {"variants": noise_sentences(ctx.shard("sentences"), list(vocab), ctx.cfg.noise, ctx.cfg.run.seed)}
