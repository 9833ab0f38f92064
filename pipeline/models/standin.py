"""Stand-in models for dry runs and the scale simulation (`make scale`): no weights, no download, same interfaces.

    encoder.model = "standin:encoder-384"                       # a deterministic unit vector per text
    [[backtranslate.chains]] models = ["standin:shuffle-de", "standin:shuffle-en"]   # word-shuffled copies

They let every real stage run end to end at any corpus size on a CPU box, so what is measured is the pipeline's own
cost (Arrow, FAISS, spaCy, IPW, Parquet, Prefect), not a model's. The vector of a text is the normalised mean of
random unit vectors, one per lower-cased word (seeded by blake2b of the word): a function of the text alone, so
tables are deterministic and equal whatever the batching, and texts sharing words have cosines like a real
encoder's (half the words shared: ~0.5), so the cosine band of `neighbours` fills as on real data. The shuffle of
a hop is a function of the text, the hop's model name and the row seed.

A rate after the name makes a stand-in also take a device's time, for a rehearsal of a GPU machine on a CPU
(bench/rehearsal.py): `standin:encoder-768@19983` waits 1/19,983 s a sentence, `standin:shuffle-de@86555` 1/86,555 s
a target token (the rates a lent card measured), per batch, while its stage's job holds the device lease. The outputs
are those of the name without the rate.
"""
from __future__ import annotations

import hashlib
import time

import numpy as np

PREFIX = "standin:"


def is_standin(name: str | None) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def _rate(name: str) -> tuple[str, float | None]:
    """("standin:encoder-768", 19983.0) of "standin:encoder-768@19983"; no rate: None."""
    base, at, rate = name.partition("@")
    try:
        return base, (float(rate) if at else None)
    except ValueError:
        raise ValueError(f"stand-in model {name!r}: the rate after '@' must be a number (units a second)") from None


def _device_wait(units: int, rate: float | None) -> None:
    if rate:
        time.sleep(units / rate)


def _seed(*parts) -> int:
    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(h, "little")


class StandInEncoder:
    """Encoder's interface (`encode`, `dim`, `device`): the normalised mean of seeded per-word unit vectors."""

    def __init__(self, name: str):
        base, self.rate = _rate(name)
        tail = base[len(PREFIX):].rsplit("-", 1)[-1]
        self.name, self.dim, self.device = base, int(tail) if tail.isdigit() else 384, "cpu"
        self._words: dict[str, np.ndarray] = {}

    def _word(self, w: str) -> np.ndarray:
        v = self._words.get(w)
        if v is None:
            v = np.random.default_rng(_seed(self.name, w)).standard_normal(self.dim).astype(np.float32)
            v = self._words[w] = v / np.linalg.norm(v)
        return v

    def encode(self, texts: list[str], batch_size: int = 128, normalize: bool = True, progress=False) -> np.ndarray:
        out: np.ndarray = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            words = t.lower().split() or [""]
            out[i] = np.mean([self._word(w) for w in words], axis=0)
        if normalize:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        for start in range(0, len(texts), max(1, batch_size)):  # the device's time, batch by batch
            _device_wait(len(texts[start:start + batch_size]), self.rate)
        return out


class StandInTranslator:
    """Translator's interface (`name`, `translate`): each hop returns the words of its input in a shuffled order."""

    def __init__(self, name: str, num_return_sequences: int = 1):
        (self.name, self.rate), self.num_return_sequences = _rate(name), num_return_sequences

    def translate(self, texts: list[str], seeds: list[int], progress=False,
                  num_return_sequences: int | None = None) -> list[list[str]]:
        k = num_return_sequences or self.num_return_sequences
        out = []
        for text, seed in zip(texts, seeds):
            words = text.split()
            hyps = []
            for r in range(k):
                rng = np.random.default_rng(_seed(self.name, seed, r, text))
                hyps.append(" ".join(words[j] for j in rng.permutation(len(words))))
            out.append(hyps)
        _device_wait(sum(len(h.split()) for hyps in out for h in hyps), self.rate)
        return out
