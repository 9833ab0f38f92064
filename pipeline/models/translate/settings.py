"""What every back-translation engine shares: length caps, batch budgets, target-language settings, the model's type.

    row_limit(n_tokens, cfg)                              # a row's cap in generated tokens
    batch_token_budget(cfg.batch_tokens, device, engine)  # a batch's token budget there (0: batch_size rows)
    resolve_kv_cache(cfg.kv_cache, device)                # "dynamic" or "static" there
    language_settings(name, tokenizer, cfg, type)         # (input prefix, forced first decoder token)
    target_language_problem(name, path, cfg)              # why a model cannot run with these settings, or None

The engines (engines/hf.py: HF generate; engines/ct2.py: CTranslate2) import from here, and this module imports neither,
so either engine loads without the other. engines/hf.py re-exports these names for the code that imports them
from there.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from contramine.pipeline.config.backtranslation import BacktranslateCfg
from contramine.pipeline.models.standin import is_standin

# Model types that cannot translate without a target-language token (cfg.target_lang must name one).
NEEDS_TARGET = {"m2m_100", "nllb-moe"}


def model_type(path: str | Path) -> str | None:
    """config.json's model_type of the model folder at `path` ("marian", "m2m_100", "fsmt", ...)."""
    return json.loads((Path(path) / "config.json").read_text()).get("model_type")


def marian_language_codes(path: str | Path) -> list[str]:
    """The >>code<< target-language tokens of a multi-target Marian model's vocabulary ([] for one target)."""
    vocab = Path(path) / "vocab.json"
    if not vocab.is_file():
        return []
    return sorted(t for t in json.loads(vocab.read_text(encoding="utf-8")) if re.fullmatch(r">>[^<>\s]+<<", t))


def target_language_problem(name: str, path: str | Path, cfg: BacktranslateCfg) -> str | None:
    """Why model `name` (resolved to `path`) cannot translate with these settings — a target language it needs and
    has not got, or one given to a single-target Marian model — else None. Reads config.json and the vocabulary
    only, so the run can stop before any work."""
    if is_standin(name):
        return None
    tgt = cfg.target_lang.get(name)
    kind = model_type(path)
    if kind in NEEDS_TARGET and tgt is None:
        return (f"backtranslate.target_lang has no entry for multilingual model {name!r} ({kind}): set the "
                f"language it translates into, e.g. backtranslate.target_lang={{\"{name}\" = \"de\"}}")
    codes = marian_language_codes(path) if kind == "marian" else []
    if kind == "marian" and not codes and tgt is not None:
        return (f"backtranslate.target_lang gives {tgt!r} for {name!r}, a single-target Marian model: it translates "
                f"into one language and has no >>code<< tokens; remove its entry from backtranslate.target_lang")
    if codes and tgt is None:
        return (f"backtranslate.target_lang has no entry for multi-target Marian model {name!r}, which needs one of "
                f"its {len(codes)} target-language tokens ({', '.join(codes[:4])}{', ...' if len(codes) > 4 else ''}): "
                f"e.g. backtranslate.target_lang={{\"{name}\" = \"{codes[0]}\"}}")
    if codes and (tgt if tgt.startswith(">>") else f">>{tgt}<<") not in codes:  # type: ignore[union-attr, operator]  # set
        return f"backtranslate.target_lang {tgt!r} is not a target-language token of {name!r} (it has {', '.join(codes[:6])})"
    return None


def row_limit(n_tokens: int, cfg: BacktranslateCfg) -> int:
    """A row's length cap in generated tokens (a language token the decoder must start with counts)."""
    return min(cfg.max_length, max(cfg.max_new_tokens_min, math.ceil(cfg.max_new_tokens_factor * n_tokens)))


# backtranslate.batch_tokens = "auto": (engine, device kind) -> budget, each engine counting its own way
# (config/backtranslation.py). HF on a CPU: 8,192 measured best of 32 rows and budgets of 4,096-32,768 tokens on an
# opus-mt-shaped and a toy Marian (docs/backtranslation.md); CTranslate2 on a CPU keeps batch_size rows (0).
AUTO_BATCH_TOKENS = {("hf", "cuda"): 262_144, ("hf", "cpu"): 8_192, ("ctranslate2", "cuda"): 65_536,
                     ("ctranslate2", "cpu"): 0}


def batch_token_budget(setting: int | str, device: str, engine: str) -> int:
    """A batch's token budget on `engine` ("hf" or "ctranslate2") on `device`: the setting, or for "auto" the
    device's (thousands of rows on a GPU). 0: batch_size rows."""
    if setting != "auto":
        return int(setting)
    return AUTO_BATCH_TOKENS[engine, "cuda" if device.startswith("cuda") else "cpu"]


def resolve_kv_cache(setting: str, device: str) -> str:
    """HF generate's key/value cache on `device`: the setting, or for "auto" "dynamic" on every device (our decode
    loop where it knows the model). Until attention_kernels.py (2026-11-28) "auto" was "static" on a GPU, from an
    H200 run in which the loop and the dynamic cache built a cuDNN attention plan every decoding step: the loop's
    9.5 s for 197 steps at the 1M path's batches is what one ~49 ms plan a step costs, and mining no longer lets
    SDPA pick cuDNN (BENCHMARKS.md). Not yet measured on a GPU without it: `device` stays in the signature, so
    that a GPU that measures otherwise can be told apart here."""
    if setting != "auto":
        return setting
    return "dynamic"


def language_settings(name: str, tok, cfg: BacktranslateCfg, model_type: str | None) -> tuple[str, str | None]:
    """(text put before every input, token the decoder must start with) for model `name`: a multi-target Marian
    model reads a >>code<< prefix, M2M100 / NLLB start their output with the target language's token. Sets the
    tokenizer's source language where the model has one."""
    tgt, src = cfg.target_lang.get(name), cfg.source_lang.get(name)
    if src is not None and hasattr(tok, "src_lang"):
        tok.src_lang = src  # M2M100 / NLLB put the source code in front of the input
    if tgt is None:
        if model_type in NEEDS_TARGET or getattr(tok, "supported_language_codes", None):
            raise ValueError(f"backtranslate.target_lang has no entry for multilingual model {name!r}")
        return "", None
    if getattr(tok, "supported_language_codes", None):  # multi-target Marian: a >>code<< prefix token
        return (tgt if tgt.startswith(">>") else f">>{tgt}<<") + " ", None
    try:
        tid = tok.get_lang_id(tgt) if hasattr(tok, "get_lang_id") else tok.convert_tokens_to_ids(tgt)
    except KeyError:
        tid = None
    if tid is None or tid == tok.unk_token_id:
        raise ValueError(f"backtranslate.target_lang {tgt!r} is not a language token of {name!r}")
    return "", tok.convert_ids_to_tokens(tid)
