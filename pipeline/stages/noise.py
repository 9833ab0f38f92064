"""Stage `noise`: DebCSE's noise injection before back-translation (METHODS §3).

Each sentence gets `n_variants` noised copies: either insert one or two of the corpus' most frequent words at
random positions, or drop one or two random words (the paper: "one or two"). Seeded per (sentence, variant).
Until a translation model is configured these variants are themselves the positive candidates.

Which frequent word an insertion takes is uniform over the `top_words`, as in the paper, but drawn by rendezvous
hashing (`pick_word`: the word whose hash mixed with the row's draw is highest), not by its rank in the list: a
corpus grown by 1% moves a fifth of the words' ranks (wiki1m at 2,000-10,000 lines: 21-38 of the top 100) and
almost never the set, so with a rank-indexed draw ~10% of the old sentences' variants changed, and their
back-translations and vectors with them (the row memo, pipeline/memo/rows.py, would recompute them); now a variant
changes only when its own word leaves the set or a new word wins its draw.
"""
from __future__ import annotations

import functools
import hashlib
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa

from contramine.pipeline.engine.spec import Ctx, package_versions, stage
from contramine.pipeline.schema import SCHEMAS
from contramine.pipeline.seeding import row_rng


def frequent_words(texts: list[str], top: int) -> list[str]:
    """The corpus' `top` most frequent alphabetic words (lower-cased), ties broken alphabetically."""
    counts = Counter(w for t in texts for w in t.lower().split() if w.isalpha())
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]]


def word_hashes(vocab: list[str]) -> np.ndarray:
    """A uint64 per word (blake2b of the word): its fixed part in every rendezvous draw."""
    return np.array([int.from_bytes(hashlib.blake2b(w.encode("utf-8"), digest_size=8).digest(), "little")
                     for w in vocab], np.uint64)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every input bit moves every output bit (uint64 arithmetic wraps)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def pick_words(vocab: list[str], hashes: np.ndarray, draws: np.ndarray, chunk: int = 65_536) -> list[str]:
    """Uniform draws from `vocab` that depend on the set, never on its order: for each draw, the word maximising
    mix(hash(word) ^ draw) (rendezvous hashing), a chunk of draws at a time."""
    picked = [np.argmax(_mix(hashes[None, :] ^ draws[a:a + chunk, None]), axis=1)
              for a in range(0, len(draws), chunk)]
    return [vocab[i] for i in (np.concatenate(picked) if picked else [])]


def draw(rng) -> int:
    """The row's draw for one inserted word (what `pick_words` resolves)."""
    return int(rng.integers(0, 2**63, dtype=np.int64))


def noise_variant(words: list[str], vocab: list[str], rng, op: str, n_ops: int,
                  pick=None) -> tuple[list, str]:
    """The noised words and the op. An inserted word is `pick(rng)`: by default the word itself (one draw);
    `noise_sentences` passes a collector that keeps the draw and resolves every draw of a shard at once."""
    words = list(words)
    if op == "drop" and len(words) > n_ops + 1:
        for _ in range(n_ops):
            words.pop(int(rng.integers(len(words))))
        return words, f"drop{n_ops}"
    pick = pick or (lambda r: pick_words(vocab, word_hashes(vocab), np.array([draw(r)], np.uint64))[0])
    for _ in range(n_ops):  # insert (also the fallback when the sentence is too short to drop from)
        words.insert(int(rng.integers(len(words) + 1)), pick(rng))
    return words, f"insert{n_ops}"


class _Slot(int):
    """An inserted word not resolved yet: the number of its draw."""


def noise_sentences(sentences: pa.Table, vocab: list[str], cfg, seed: int) -> pa.Table:
    sids, texts = sentences.column("sid").to_pylist(), sentences.column("text").to_pylist()
    out: dict[str, list] = {"sid": [], "variant": [], "text": [], "ops": []}
    if not vocab:
        return pa.table(out, schema=SCHEMAS["variants"])
    draws: list[int] = []

    def collect(rng) -> _Slot:
        draws.append(draw(rng))
        return _Slot(len(draws) - 1)

    for sid, text in zip(sids, texts):
        words = text.split()
        for v in range(1, cfg.n_variants + 1):
            rng = row_rng(seed, "noise", sid, v)
            op = cfg.ops[int(rng.integers(len(cfg.ops)))]
            n_ops = int(rng.integers(cfg.min_ops, cfg.max_ops + 1))
            noised, ops = noise_variant(words, vocab, rng, op, n_ops, collect)
            out["sid"].append(sid)
            out["variant"].append(v)
            out["text"].append(noised)
            out["ops"].append(ops)
    picked = pick_words(vocab, word_hashes(vocab), np.array(draws, np.uint64))
    out["text"] = [" ".join(picked[w] if type(w) is _Slot else w for w in noised) for noised in out["text"]]
    return pa.table(out, schema=SCHEMAS["variants"])


@functools.lru_cache(maxsize=1)
def _vocab(run_dir: str, n: int, table_hash: str, top: int) -> tuple[str, ...]:
    from contramine.pipeline.storage.store import Store

    texts = Store(Path(run_dir)).read("sentences", n).column("text").to_pylist()
    return tuple(frequent_words(texts, top))


# numpy: its Generator draws every insertion and drop (a numpy that changed its streams would change the variants)
@stage(reads=("sentences",), reads_whole=("sentences",), writes=("variants",), settings=("noise",),
       facts=lambda cfg: package_versions("numpy"))
def noise(ctx: Ctx) -> dict[str, pa.Table]:
    """The vocabulary is the whole corpus' most frequent words; each shard noises its own sentences."""
    vocab = _vocab(str(ctx.store.root), ctx.n, ctx.store.table_hash("sentences", ctx.n), ctx.cfg.noise.top_words)
    return {"variants": noise_sentences(ctx.shard("sentences"), list(vocab), ctx.cfg.noise, ctx.cfg.run.seed)}
