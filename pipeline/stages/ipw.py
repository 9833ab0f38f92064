"""Stage `ipw`: DebCSE's inverse-propensity-weighted sampling (Eqs. 1–6, METHODS §5).

Over the n candidates j of anchor i (one pool per kind):
    S_sur(i,j) = 1 − softmax_j(edit(i,j))                                     (Eq. 1)
    S_sem(i,j) = softmax_j(cos(i,j))                                          (Eq. 2)
    negatives: P̃ = (1 − λ_n)·S_sur + λ_n·(1 − S_sem),   P = softmax_j(P̃ / T)  (Eqs. 3, 4)
    positives: P̃ = (1 − λ_p)·(1 − S_sur) + λ_p·S_sem,   P = softmax_j(P̃ / T)  (Eqs. 5, 6)
`normalize = "none"` uses the raw scores instead (S_sur = 1 − edit, S_sem = cos). T = 1 is the paper; with
large pools the softmaxes make P nearly uniform, which the mining report shows. m candidates per anchor and
kind are drawn without replacement, seeded per (anchor, kind).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.engine.spec import Ctx, stage
from pipeline.schema import SCHEMAS
from pipeline.seeding import row_rng


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def ipw_probabilities(edit: np.ndarray, cos: np.ndarray, kind: str, lam: float, temperature: float,
                      normalize: str = "softmax") -> tuple[np.ndarray, ...]:
    """(s_sur, s_sem, p_tilde, p) for one pool."""
    edit, cos = np.asarray(edit, np.float64), np.asarray(cos, np.float64)
    if normalize == "softmax":
        s_sur, s_sem = 1.0 - softmax(edit), softmax(cos)
    elif normalize == "none":
        s_sur, s_sem = 1.0 - edit, cos
    else:
        raise ValueError(f"ipw.normalize {normalize!r}: expected 'softmax' or 'none'")
    if kind == "neg":
        p_tilde = (1 - lam) * s_sur + lam * (1 - s_sem)
    elif kind == "pos":
        p_tilde = (1 - lam) * (1 - s_sur) + lam * s_sem
    else:
        raise ValueError(f"kind {kind!r}: expected 'pos' or 'neg'")
    return s_sur, s_sem, p_tilde, softmax(p_tilde / temperature)


def ipw_sample(p: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of min(m, n) candidates drawn without replacement with probabilities p, in draw order."""
    m = min(m, len(p))
    return rng.choice(len(p), size=m, replace=False, p=p) if m else np.zeros(0, dtype=np.int64)


def ipw_table(scores: pa.Table, cfg, seed: int) -> pa.Table:
    """`scores` (sorted by sid, kind) → `candidates` with s_sur, s_sem, p_tilde, p, chosen and pick (draw order)."""
    scores = scores.sort_by([("sid", "ascending"), ("kind", "ascending"), ("source", "ascending"),
                             ("text", "ascending")])
    n = scores.num_rows
    cols = {c: np.zeros(n) for c in ("s_sur", "s_sem", "p_tilde", "p")}
    chosen = np.zeros(n, dtype=bool)
    pick = np.full(n, -1, dtype=np.int32)
    sid = scores.column("sid").to_numpy()
    kind = np.asarray(scores.column("kind").to_pylist(), dtype=object)
    edit = scores.column("edit").to_numpy().astype(np.float64)
    cos = scores.column("cos").to_numpy().astype(np.float64)
    # pool boundaries: runs of equal (sid, kind) in the sorted table
    change = np.ones(n, dtype=bool)
    change[1:] = (sid[1:] != sid[:-1]) | (kind[1:] != kind[:-1])
    starts = np.flatnonzero(change)
    ends = np.append(starts[1:], n)
    for a, b in zip(starts, ends):
        k = kind[a]
        lam, m = (cfg.lambda_neg, cfg.m_neg) if k == "neg" else (cfg.lambda_pos, cfg.m_pos)
        s_sur, s_sem, p_tilde, p = ipw_probabilities(edit[a:b], cos[a:b], k, lam, cfg.temperature, cfg.normalize)
        for name, v in zip(("s_sur", "s_sem", "p_tilde", "p"), (s_sur, s_sem, p_tilde, p)):
            cols[name][a:b] = v
        picked = ipw_sample(p, m, row_rng(seed, "ipw-" + k, int(sid[a])))
        chosen[a + picked] = True
        pick[a + picked] = np.arange(1, len(picked) + 1, dtype=np.int32)
    out = scores
    for name in ("s_sur", "s_sem", "p_tilde", "p"):
        out = out.append_column(name, pa.array(cols[name], pa.float64()))
    out = out.append_column("chosen", pa.array(chosen)).append_column(
        "pick", pc.if_else(pa.array(pick > 0), pa.array(pick, pa.int32()), pa.nulls(n, pa.int32())))
    return out.select(SCHEMAS["candidates"].names + ["pick"])


@stage(reads=("scores",), writes=("candidates",), settings=("ipw",))
def ipw(ctx: Ctx) -> dict[str, pa.Table]:
    return {"candidates": ipw_table(ctx.shard("scores"), ctx.cfg.ipw, ctx.cfg.run.seed)}
