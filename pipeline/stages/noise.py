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
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa

from contramine.pipeline.engine.spec import Ctx, package_versions, stage
from contramine.pipeline.row_streams import RowStreams, matches_numpy
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
    """splitmix64's finaliser: every input bit moves every output bit (uint64 arithmetic wraps). In place: `z` is
    the caller's scratch array (fewer temporaries: 2.7x faster with pick_words' chunks)."""
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


def pick_words(vocab: list[str], hashes: np.ndarray, draws: np.ndarray, chunk: int = 4096) -> list[str]:
    """Uniform draws from `vocab` that depend on the set, never on its order: for each draw, the word maximising
    mix(hash(word) ^ draw) (rendezvous hashing), a chunk of draws at a time (4,096 x 100 words: 3 MB, which stays in
    the cache; 65,536 was 4x slower)."""
    picked = [np.argmax(_mix(hashes[None, :] ^ draws[a:a + chunk, None]), axis=1)
              for a in range(0, len(draws), chunk)]
    return [vocab[i] for i in (np.concatenate(picked) if picked else [])]


def draw(rng) -> int:
    """The row's draw for one inserted word (what `pick_words` resolves)."""
    return int(rng.integers(0, 2**63, dtype=np.int64))


def noise_variant(words: list[str], vocab: list[str], rng, op: str, n_ops: int,
                  pick=None) -> tuple[list, str]:
    """The noised words and the op. An inserted word is `pick(rng)`: by default the word itself (one draw)."""
    words = list(words)
    if op == "drop" and len(words) > n_ops + 1:
        for _ in range(n_ops):
            words.pop(int(rng.integers(len(words))))
        return words, f"drop{n_ops}"
    pick = pick or (lambda r: pick_words(vocab, word_hashes(vocab), np.array([draw(r)], np.uint64))[0])
    for _ in range(n_ops):  # insert (also the fallback when the sentence is too short to drop from)
        words.insert(int(rng.integers(len(words) + 1)), pick(rng))
    return words, f"insert{n_ops}"


def _noise_row(words: list[str], vocab: list[str], cfg, seed: int, sid: int, v: int, pick=None) -> tuple[list, str]:
    """One variant drawn from its own `row_rng` stream: the reference `noise_sentences` equals."""
    rng = row_rng(seed, "noise", sid, v)
    op = cfg.ops[int(rng.integers(len(cfg.ops)))]
    n_ops = int(rng.integers(cfg.min_ops, cfg.max_ops + 1))
    return noise_variant(words, vocab, rng, op, n_ops, pick)


def noise_sentences(sentences: pa.Table, vocab: list[str], cfg, seed: int) -> pa.Table:
    """`n_variants` rows per sentence (sentence order, then variant). Every row's draws come from its own stream,
    all rows' at once (`RowStreams`, equal to `row_rng`); only the word lists are edited row by row."""
    if not vocab:
        return SCHEMAS["variants"].empty_table()
    split = [t.split() for t in sentences.column("text").to_pylist()]
    n_var = cfg.n_variants
    row_sid: np.ndarray = np.repeat(sentences.column("sid").to_numpy().astype(np.int64), n_var)
    row_var = np.tile(np.arange(1, n_var + 1, dtype=np.int64), len(split))
    if not matches_numpy():  # a NumPy whose streams differ from RowStreams': each row from row_rng itself
        noised = [_noise_row(split[r // n_var], vocab, cfg, seed, int(s), int(v))
                  for r, (s, v) in enumerate(zip(row_sid.tolist(), row_var.tolist()))]
        return _variants_table(row_sid, row_var, noised)
    streams, rows = RowStreams(seed, "noise", row_sid.astype(np.uint64), row_var.astype(np.uint64)), np.arange(len(row_sid))
    op, unsure = streams.integers(rows, 0, len(cfg.ops))
    n_ops, unsure_n = streams.integers(rows, cfg.min_ops, cfg.max_ops + 1)
    unsure |= unsure_n
    n_words: np.ndarray = np.repeat(np.fromiter(map(len, split), np.int64, len(split)), n_var)
    drop = (np.array(cfg.ops, dtype=object)[op] == "drop") & (n_words > n_ops + 1) if len(rows) else np.zeros(0, bool)
    # where each edit goes, in the row's order of draws: a drop's position among the words left, or an insertion's
    # position then its word's draw
    at = np.zeros((len(rows), max(cfg.max_ops, 0)), np.int64)
    word_draw = np.zeros_like(at)
    for k in range(at.shape[1]):
        dropping = np.flatnonzero((n_ops > k) & drop)
        at[dropping, k], u = streams.integers(dropping, 0, n_words[dropping] - k)
        unsure[dropping] |= u
        inserting = np.flatnonzero((n_ops > k) & ~drop)
        at[inserting, k], u = streams.integers(inserting, 0, n_words[inserting] + k + 1)
        unsure[inserting] |= u
        word_draw[inserting, k] = streams.top_half(inserting)
    inserted = (n_ops[:, None] > np.arange(at.shape[1])) & ~drop[:, None]
    words = iter(pick_words(vocab, word_hashes(vocab), word_draw[inserted].astype(np.uint64)))
    noised = []
    for r, (dropped, count, where) in enumerate(zip(drop.tolist(), n_ops.tolist(), at.tolist())):
        edited = list(split[r // n_var])
        for k in range(count):
            if dropped:
                edited.pop(where[k])
            else:
                edited.insert(where[k], next(words))
        noised.append((edited, f"drop{count}" if dropped else f"insert{count}"))
    for r in np.flatnonzero(unsure).tolist():  # a draw NumPy would have rejected and repeated: the row's own stream
        noised[r] = _noise_row(split[r // n_var], vocab, cfg, seed, int(row_sid[r]), int(row_var[r]))
    return _variants_table(row_sid, row_var, noised)


def _variants_table(row_sid: np.ndarray, row_var: np.ndarray, noised: list[tuple[list, str]]) -> pa.Table:
    return pa.table({"sid": pa.array(row_sid, pa.int64()), "variant": pa.array(row_var, pa.int32()),
                     "text": [" ".join(words) for words, _ in noised], "ops": [ops for _, ops in noised]},
                    schema=SCHEMAS["variants"])


@functools.lru_cache(maxsize=1)
def _counted_vocab(run_dir: str, n: int, table_hash: str, top: int) -> tuple[str, ...]:
    from contramine.pipeline.storage.store import Store

    texts = Store(Path(run_dir)).read("sentences", n).column("text").to_pylist()
    return tuple(frequent_words(texts, top))


_VOCAB_LOCK = threading.Lock()


def _vocab(run_dir: str, n: int, table_hash: str, top: int) -> tuple[str, ...]:
    """The corpus' vocabulary, counted once per process: the jobs that start at once on the runner's threads wait
    for the first one's count instead of each counting the whole corpus beside it (lru_cache alone does not wait)."""
    with _VOCAB_LOCK:
        return _counted_vocab(run_dir, n, table_hash, top)


# numpy: its Generator draws every insertion and drop (a numpy that changed its streams would change the variants)
@stage(reads=("sentences",), reads_whole=("sentences",), writes=("variants",), settings=("noise",),
       facts=lambda cfg: package_versions("numpy"))
def noise(ctx: Ctx) -> dict[str, pa.Table]:
    """The vocabulary is the whole corpus' most frequent words; each shard noises its own sentences."""
    vocab = _vocab(str(ctx.store.root), ctx.n, ctx.store.table_hash("sentences", ctx.n), ctx.cfg.noise.top_words)
    return {"variants": noise_sentences(ctx.shard("sentences"), list(vocab), ctx.cfg.noise, ctx.cfg.run.seed)}
