"""What trainer/train.py sets a run up with: the start encoder (with the config's dropout), the pooler and prompt
it trains and saves with, its inference length, the seeds, the hash of what decides the trajectory of the weights
(resume goes by it), the learning-rate schedule and the dev score best/ is chosen by.
"""
from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import torch

from contramine.pipeline.config import Config
from contramine.pipeline.models.encode.encoder import Encoder
from contramine.pipeline.models.hub import model_fingerprint, resolve_model
from contramine.trainer.keys import eval_data_hash


def load_encoder(name: str, pooler: str, max_length: int, device: str, prompt: str, dropout: float | None,
                 precision: str = "float32") -> Encoder:
    """Encoder.load with the dropout of the config where the model's config has BERT-style dropout keys (a key the
    config lacks would reach the model constructor and fail)."""
    from transformers import AutoConfig

    kwargs = {}
    if dropout is not None:
        conf = AutoConfig.from_pretrained(resolve_model(name, "encoder"))
        kwargs = {k: dropout for k in ("hidden_dropout_prob", "attention_probs_dropout_prob") if hasattr(conf, k)}
    return Encoder.load(name, pooler=pooler, max_length=max_length, device=device, prompt=prompt,
                        precision=precision, **kwargs)  # type: ignore[arg-type]  # dropout keys only


def run_pooling(cfg: Config) -> tuple[str, str]:
    """(pooler, prompt) a run trains and saves its encoder with: the objective's own where its settings fix one
    (OssCSE's paper form: "mask" and its first template), else train.pooler / encoder.pooler and encoder.prompt.
    trainer/compare.py evaluates each run's start under the same pair."""
    from contramine.trainer.objectives import get_objective

    cls = get_objective(cfg.train.objective)
    return (cls.train_pooler(cfg.train) or cfg.train.pooler or cfg.encoder.pooler,
            cls.eval_prompt(cfg.train) or cfg.encoder.prompt)


def eval_max_length(name: str) -> int:
    """The inference length of the encoder (dev evaluation, best/): what `make eval` uses for the starting model
    (sentence-transformers' max_seq_length where shipped, else the tokenizer limit capped at 512 — SimCSE's STS
    evaluation does not truncate at the training length), never past the model's position embeddings."""
    from transformers import AutoConfig

    from contramine.trainer.evaluate import default_max_length

    path = resolve_model(name, "encoder")
    positions = getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", None)
    return min(default_max_length(path), positions or 512)


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def config_hash(cfg: Config, model: str, pooler: str, prompt: str, eval_len: int, data: list) -> str:
    """What decides the trajectory of the weights. Settings that do not (final_eval, num_workers: collate is
    deterministic; log_every: how often the numbers are read back) are left out, so changing them does not throw
    away a half-done run. Data by content (trainer/keys.py): the mined tables' hashes (`data`), the start weights'
    fingerprint, the dev files that pick best/ — a shard rewritten in place or a model saved again into the same folder is another configuration."""
    train = cfg.train.model_dump(mode="json")
    for key in ("final_eval", "num_workers", "output", "tensorboard", "log_every"):
        train.pop(key, None)
    blob = {"train": train, "model": model, "weights": model_fingerprint(resolve_model(model, "encoder")),
            "pooler": pooler, "prompt": prompt, "eval_max_length": eval_len, "data": data,
            "dev_data": eval_data_hash(cfg.data.senteval_dir, dev_only=True, sick=cfg.train.eval_sick)}
    return hashlib.blake2b(json.dumps(blob, sort_keys=True).encode(), digest_size=12).hexdigest()


def linear_schedule(warmup: int, total: int):
    """LR multiplier: 0 -> 1 over `warmup` steps, then linearly down to 0 at `total` (HF's linear schedule)."""
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total - step) / max(1, total - warmup))
    return f


def dev_score(dev: dict) -> float:
    """Model selection: STS-B dev, or the mean of STS-B dev and SICK trial when both are scored."""
    vals = [v for v in dev.values() if v is not None]
    return sum(vals) / len(vals) if vals else float("-inf")
