"""Back-translation on CTranslate2 (`backtranslate.engine = "ctranslate2" | "auto"`), beside HF generate.

    tr = load_engine(name, path, cfg, device, compute_type)   # translate/chains.py decides engine and compute type

    tr.translate(texts, seeds)             # same interface and outputs layout as translator.Translator

CTranslate2 runs the same Marian / M2M100 / NLLB weights through its own C++ decoder: at the same BLEU, 4.7x the
tokens/s of transformers on 4 CPU threads (int8) and 9.1x on an A10G (float16), opus-mt en-de (PEERS.md). Its
converter does not cover FSMT (facebook/wmt19-*): those stay on HF generate ("auto" says so once).

Conversion happens on first use into `<HF cache>/../ctranslate2/<model>--<files>--<compute type>--ct2-<ctranslate2
version>/`: into a temporary folder beside it, renamed into place when complete, so a killed conversion leaves
nothing that looks finished and the next run converts again; a new ctranslate2 converts again.

What holds (measured on the tests' tiny models, CPU; tests/test_ct2.py):
- float32 greedy output equals HF greedy token for token, rows of any batch composition;
- each row gets the HF engine's per-row length cap: greedy decodes each call's rows together to the largest cap
  and cuts every row at its own (one call per 4,096 rows; the same tokens as decoding each row to its cap, tested
  on rows of many caps), beam search decodes the rows of one cap together;
- int8 greedy on CPU: a row's text does not depend on its batch (300/300 alone = in batches of 3 = of 64;
  activations are quantized per row), and differs from float32 on 33/300 rows of a random tiny model;
- not measured (no GPU here): float16 / bfloat16 on a GPU, where kernels may depend on the batch shape;
- beam search may rank hypotheses at the length cap differently from HF (HF counts a forced eos there).
Sampling is refused (config): CTranslate2 draws from per-thread generators that per-row seeds cannot reach.

Threads on CPU: `inter_threads` = torch's thread count, `intra_threads` = 1 (workers decode different batches of a
call side by side, one thread each), not one worker with OpenMP threads. Imported after torch (as here), CTranslate2
runs its OpenMP regions on the libgomp torch loaded (imported first, it keeps its own and is not affected): once any
torch op has run in the process (the embeddings stage, HF generate), torch's idle OpenMP threads count against the
cores, libgomp stops spinning between parallel regions, and every decoding step waits on thread wake-ups. On 2
cores, one hop of the benches' tiny copy model went from 2,100 to 290 sentences/s (float32) and 180 (int8) after one
torch matmul, while 2 one-thread workers give 2,800 / 2,600 either way (batch 32, 2026-11-25). Outputs are the same
bits either way (a row decodes alone). Creating the Translator sets the calling thread's OpenMP thread count to
intra_threads in that shared libgomp, which is torch's thread count too: it is set back right after.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

# torch first: CTranslate2 imported after it runs on torch's libgomp, as in a mining process (above)
import torch
import ctranslate2
import ctranslate2.converters.transformers as ct2t
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from contramine.pipeline.config.backtranslation import BacktranslateCfg, chain_name
from contramine.pipeline.models.cublas import load_cublas
from contramine.pipeline.models.hub import hub_cache_dir, model_fingerprint
from contramine.pipeline.models.translate.settings import batch_token_budget, language_settings, model_type, row_limit

def converted_dir(name: str, path: str | Path, compute_type: str) -> Path:
    """Where the converted model lives: keyed by model id, its files (hub commit or content), compute type and the
    ctranslate2 version (its converter and model format change between releases: a new one converts again rather
    than load an old conversion)."""
    files = model_fingerprint(path).split("@")[-1].split(":")[-1][:16]
    safe = re.sub(r"[^A-Za-z0-9._-]+", "--", name.strip("/"))[-80:]
    version = re.sub(r"[^A-Za-z0-9._-]+", "-", ctranslate2.__version__)
    return hub_cache_dir().parent / "ctranslate2" / f"{safe}--{files}--{compute_type}--ct2-{version}"


def _install_m2m100_vocabulary_fix() -> None:
    """CTranslate2 4.8 takes M2M100/NLLB language tokens from the tokenizer's `additional_special_tokens`, which
    transformers 5 no longer lists, and then stops on a vocabulary size mismatch. The vocabulary by id is what the
    model's embedding rows mean, so read it that way."""
    class M2M100ById(ct2t.M2M100Loader):
        def get_vocabulary(self, model, tokenizer):
            tokens = tokenizer.convert_ids_to_tokens(list(range(model.config.vocab_size)))
            return [t if t != tokenizer.unk_token or i == tokenizer.unk_token_id else f"madeupword{i}"
                    for i, t in enumerate(tokens)]

    ct2t._MODEL_LOADERS["M2M100Config"] = M2M100ById()


def convert(name: str, path: str | Path, compute_type: str) -> Path:
    """The converted model folder, converting it first (atomically) when it is not there yet."""
    final = converted_dir(name, path, compute_type)
    if (final / "model.bin").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".tmp-{final.name}-*"):  # left by a killed conversion
        pid = stale.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or not Path(f"/proc/{pid}").exists():
            shutil.rmtree(stale, ignore_errors=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"note: converting translation model {name} to CTranslate2 ({compute_type}) into {final} (once)",
          file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    _install_m2m100_vocabulary_fix()
    try:
        ctranslate2.converters.TransformersConverter(str(path)).convert(str(tmp / "model"), quantization=compute_type)
        try:
            os.rename(tmp / "model", final)
        except OSError:  # another process finished first: theirs is as good
            if not (final / "model.bin").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"note: converted {name} in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return final


class CT2Translator:
    """One converted model with the generation settings of a BacktranslateCfg (greedy or beam, k returns)."""

    def __init__(self, name: str, tokenizer, translator, cfg: BacktranslateCfg, compute_type: str,
                 device: str = "cpu"):
        self.name, self.tokenizer, self.translator, self.cfg = name, tokenizer, translator, cfg
        self.compute_type, self.device = compute_type, device
        self.prefix, target_token = language_settings(name, tokenizer, cfg, model_type(tokenizer.name_or_path))
        self.target_prefix = [target_token] if target_token else None  # M2M100 / NLLB: the decoder's first token

    # greedy: every row of a call decodes to the call's largest cap and is cut at its own (a row's greedy tokens do
    # not depend on its batch); beam search decodes rows of one cap together (a beam's ranking depends on its cap)
    group_greedy_by_cap = False

    def translate(self, texts: list[str], seeds: list[int] | None = None, progress: bool = False,
                  num_return_sequences: int | None = None) -> list[list[str]]:
        """num_return_sequences (default: the config's) translations per text, in input order. `seeds` are
        accepted for the interface; greedy and beam search draw no random numbers."""
        c, k = self.cfg, num_return_sequences or self.cfg.num_return_sequences
        if not texts:
            return []
        ids = self.tokenizer([self.prefix + t for t in texts], truncation=True, max_length=c.max_length)["input_ids"]
        tokens = [self.tokenizer.convert_ids_to_tokens(x) for x in ids]
        limits = [row_limit(len(x), c) for x in ids]
        out: list[list[str] | None] = [[""] * k if not t.strip() else None for t in texts]  # as the HF engine
        todo = sorted((i for i in range(len(texts)) if out[i] is None), key=lambda i: (limits[i], i))
        if c.num_beams == 1 and not self.group_greedy_by_cap:
            calls = [todo[s:s + 4096] for s in range(0, len(todo), 4096)]  # progress in steps; CT2 batches inside
        else:
            groups: dict[int, list[int]] = {}
            for i in todo:
                groups.setdefault(limits[i], []).append(i)
            calls = [g[s:s + 4096] for g in groups.values() for s in range(0, len(g), 4096)]
        bar = None
        if progress:
            bar = tqdm(total=len(todo), unit="sent", desc=f"translate {chain_name([self.name])} (ctranslate2)")
        budget = batch_token_budget(c.batch_tokens, self.device, "ctranslate2")
        batching = dict(max_batch_size=budget, batch_type="tokens") if budget else \
            dict(max_batch_size=c.batch_size, batch_type="examples")
        for part in calls:
            results = self.translator.translate_batch(
                [tokens[i] for i in part], target_prefix=[self.target_prefix] * len(part) if self.target_prefix
                else None, beam_size=c.num_beams, num_hypotheses=k, max_decoding_length=max(limits[i] for i in part),
                min_decoding_length=0, **batching)
            for i, r in zip(part, results):
                # a hypothesis starts with the forced language token, which max_decoding_length (and HF's
                # max_new_tokens) counts: cutting at the row's cap counts it too, as decoding to that cap would
                out[i] = [self._text(h[:limits[i]]) for h in r.hypotheses]
            if bar is not None:
                bar.update(len(part))
        if bar is not None:
            bar.close()
        return out  # type: ignore[return-value]  # every row translated by now

    def _text(self, hypothesis: list[str]) -> str:
        if self.target_prefix and hypothesis[:1] == self.target_prefix:
            hypothesis = hypothesis[1:]  # a language token is not text
        ids = self.tokenizer.convert_tokens_to_ids(hypothesis)
        return " ".join(self.tokenizer.decode(ids, skip_special_tokens=True).split())


def load_engine(name: str, path: str | Path, cfg: BacktranslateCfg, device: str, compute_type: str) -> CT2Translator:
    """The CTranslate2 engine for model `name` (resolved to `path`) on `device` at `compute_type`, as the run's plan
    says (pipeline/models/translate/chains.py decides; nothing is decided here)."""
    folder = convert(name, path, compute_type)
    kind, _, index = device.partition(":")
    if kind == "cuda":  # CUDA 12's cuBLAS, from the pip package where the machine has CUDA 13 only (cublas.py)
        load_cublas()
    # CPU: as many workers as torch has threads, each decoding its own batches on one thread (module doc: OpenMP)
    torch_threads = torch.get_num_threads()
    threads = dict(inter_threads=torch_threads, intra_threads=1) if kind == "cpu" else {}
    translator = ctranslate2.Translator(str(folder), device=kind, device_index=int(index or 0),
                                        compute_type=compute_type, **threads)
    torch.set_num_threads(torch_threads)  # the shared libgomp took intra_threads as this thread's count: torch's again
    return CT2Translator(name, AutoTokenizer.from_pretrained(path), translator, cfg, compute_type, kind)
