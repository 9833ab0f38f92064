"""Shared fixtures of the per-objective tests (tests/test_objective_<name>.py): a tiny batch with every row key,
the tiny BERT with dropout 0, and the float64 numpy pieces the direct computations are written with."""
from __future__ import annotations

import math

import numpy as np
import torch

from contramine.pipeline.config import TrainCfg
from contramine.pipeline.models.encode.encoder import Encoder
from tiny_bert import tiny_encoder

TEXTS = [
    "a man is playing the guitar",
    "two dogs run in the park",
    "the woman rides a horse on the road",
    "a child is eating food at school",
    "the old city has a river",
    "people walk down the street after the game",
]

RTOL, ATOL = 1e-4, 1e-5


def rows_all() -> list[dict]:
    rng = np.random.default_rng(0)
    out = []
    for i, t in enumerate(TEXTS):
        e = rng.normal(size=8).astype(np.float32)
        out.append({
            "sid": i, "text": t,
            "positives": None if i % 3 == 0 else [TEXTS[(i + 1) % 6] + " again", "unused second positive"],
            "negatives": [TEXTS[(i + k + 2) % 6] for k in range(i % 3)],  # 0, 1 or 2 negatives
            "paraphrase": None if i == 1 else "in other words " + t,
            "negation": None if i == 4 else t.replace(" is ", " is not ").replace(" run ", " do not run "),
            "emb": None if i == 5 else e / np.linalg.norm(e),
        })
    return out


def cfg_for(name: str, **kw) -> TrainCfg:
    """TrainCfg for objective `name`: keyword arguments that are TrainCfg fields set those, the rest go to the
    objective's own section ([train.<name>])."""
    general = {k: kw.pop(k) for k in list(kw) if k in TrainCfg.model_fields}
    if name == "whitenedcse":
        kw = {"groups": 8, **kw}  # the tiny BERT is 32-d
    return TrainCfg(objective=name, temperature=0.05, **general, **{name: kw})


def encoder_for(name: str, dropout: float = 0.0, seed: int = 0) -> Encoder:
    return tiny_encoder("mask" if name == "osscse" else "cls_before_pooler", dropout=dropout, seed=seed)


def enc_np(enc: Encoder, texts: list[str], max_length: int, template: str | None = None) -> np.ndarray:
    with torch.no_grad():
        return enc(enc.tokenize(texts, template=template, max_length=max_length)).double().numpy()


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def nll(pos_logit: float, denom_logits: list[float]) -> float:
    """−log e^{pos} / Σ e^{denom} (denom includes pos where the formula does)."""
    m = max(denom_logits)
    return -(pos_logit - (m + math.log(sum(math.exp(x - m) for x in denom_logits))))


def head_np(lin: torch.nn.Linear, x: np.ndarray) -> np.ndarray:
    W = lin.weight.detach().double().numpy()
    b = lin.bias.detach().double().numpy()
    return np.tanh(x @ W.T + b)
