"""Stage `ipw`: DebCSE's inverse-propensity-weighted sampling (Eqs. 1–6, METHODS §5).

Over the n candidates j of anchor i (one pool per kind):
    S_sur(i,j) = 1 − softmax_j(edit(i,j))                                     (Eq. 1)
    S_sem(i,j) = softmax_j(cos(i,j))                                          (Eq. 2)
    negatives: P̃ = (1 − λ_n)·S_sur + λ_n·(1 − S_sem),   P = softmax_j(P̃ / T)  (Eqs. 3, 4)
    positives: P̃ = (1 − λ_p)·(1 − S_sur) + λ_p·S_sem,   P = softmax_j(P̃ / T)  (Eqs. 5, 6)
`normalize = "none"` uses the raw scores instead (S_sur = 1 − edit, S_sem = cos). T = 1 is the paper; with
large pools the softmaxes make P nearly uniform, which the mining report shows. m candidates per anchor and
kind are drawn without replacement, seeded per (anchor, kind).

sentence-transformers' mining options, for the negatives (PEERS.md): `strategy = "top"` takes the m highest
cosines, `"random"` draws uniformly (IPW's columns are still computed, for the report); `absolute_margin` /
`relative_margin` exclude negatives too close to the anchor's lowest chosen positive (positives are drawn first).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from contramine.pipeline.engine.spec import Ctx, package_versions, stage
from contramine.pipeline.row_streams import RowStreams, matches_numpy
from contramine.pipeline.schema import SCHEMAS
from contramine.pipeline.seeding import row_rng


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def segment_sum(x: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """x[a:a+l].sum() for every segment, bit for bit: segments of one length are gathered into a matrix whose row
    sums take NumPy's pairwise summation exactly as a 1-D sum does (np.add.reduceat sums sequentially instead)."""
    out = np.empty(len(starts))
    for length in np.unique(lengths):
        sel = np.flatnonzero(lengths == length)
        out[sel] = x[starts[sel][:, None] + np.arange(length)].sum(axis=1)
    return out


def segment_softmax(x: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """`softmax` over every segment at once, equal bit for bit to calling it per segment."""
    e = np.exp(x - np.repeat(np.maximum.reduceat(x, starts), lengths))
    return e / np.repeat(segment_sum(e, starts, lengths), lengths)


def ipw_probabilities(edit: np.ndarray, cos: np.ndarray, kind: str, lam: float, temperature: float,
                      normalize: str = "softmax") -> tuple[np.ndarray, ...]:
    """(s_sur, s_sem, p_tilde, p) for one pool (the reference the stage's vectorised `pool_probabilities` equals)."""
    edit, cos = np.asarray(edit, np.float64), np.asarray(cos, np.float64)
    if kind not in ("pos", "neg"):
        raise ValueError(f"kind {kind!r}: expected 'pos' or 'neg'")
    n = np.array([0]), np.array([len(edit)])
    return pool_probabilities(edit, cos, np.full(len(edit), kind == "neg"), np.full(len(edit), float(lam)),
                              temperature, normalize, *n)


def pool_probabilities(edit: np.ndarray, cos: np.ndarray, is_neg: np.ndarray, lam: np.ndarray, temperature: float,
                       normalize: str, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, ...]:
    """(s_sur, s_sem, p_tilde, p) of every pool at once; pools are the segments (starts, lengths), `lam` per row."""
    if normalize == "softmax":
        s_sur, s_sem = 1.0 - segment_softmax(edit, starts, lengths), segment_softmax(cos, starts, lengths)
    elif normalize == "none":
        s_sur, s_sem = 1.0 - edit, cos
    else:
        raise ValueError(f"ipw.normalize {normalize!r}: expected 'softmax' or 'none'")
    p_tilde = np.where(is_neg, (1 - lam) * s_sur + lam * (1 - s_sem), (1 - lam) * (1 - s_sur) + lam * s_sem)
    return s_sur, s_sem, p_tilde, segment_softmax(p_tilde / temperature, starts, lengths)


def ipw_sample(p: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of min(m, n) candidates drawn without replacement with probabilities p, in draw order."""
    m = min(m, len(p))
    return rng.choice(len(p), size=m, replace=False, p=p) if m else np.zeros(0, dtype=np.int64)


def within_margins(neg_cos: np.ndarray, positive: float | None, cfg) -> np.ndarray | None:
    """Negatives that pass sentence-transformers' margins against the anchor's lowest chosen positive cosine
    (`absolute_margin`: keep cos + margin <= pos; `relative_margin`: keep cos <= pos - |pos| * margin). None when
    no margin applies (none set, or the anchor has no chosen positive to compare with)."""
    if positive is None or (cfg.absolute_margin is None and cfg.relative_margin is None):
        return None
    keep: np.ndarray = np.ones(len(neg_cos), dtype=bool)
    if cfg.absolute_margin is not None:
        keep &= ~(neg_cos + cfg.absolute_margin > positive)
    if cfg.relative_margin is not None:
        keep &= ~(neg_cos > positive - abs(positive) * cfg.relative_margin)
    return keep


def draw_negatives(p: np.ndarray, cos: np.ndarray, m: int, rng: np.random.Generator, strategy: str,
                   eligible: np.ndarray | None = None) -> np.ndarray:
    """Indices of the chosen negatives of one pool, in pick order: `ipw` draws with the IPW probabilities p,
    `top` takes the highest cosines (ties: pool order), `random` draws uniformly; only `eligible` ones (margins)."""
    if eligible is not None:
        idx = np.flatnonzero(eligible)
        q = p[idx]
        q = q / q.sum() if q.sum() > 0 else np.full(len(idx), 1.0 / max(len(idx), 1))
        return idx[draw_negatives(q, cos[idx], m, rng, strategy)]
    if strategy == "ipw":
        return ipw_sample(p, m, rng)
    m = min(m, len(p))
    if strategy == "top":
        return np.lexsort((np.arange(len(cos)), -cos))[:m]
    if strategy == "random":
        return rng.choice(len(p), size=m, replace=False) if m else np.zeros(0, dtype=np.int64)
    raise ValueError(f"ipw.strategy {strategy!r}: expected 'ipw', 'top' or 'random'")


def sample_pools(p: np.ndarray, starts: np.ndarray, lengths: np.ndarray, m: np.ndarray,
                 streams: RowStreams) -> tuple[np.ndarray, np.ndarray]:
    """`ipw_sample` of every pool at once, pool i drawing from streams' row i: (pools x max m) positions in the
    pool in draw order (-1 past a pool's m), and the pools to draw with `ipw_sample` itself instead (a p that
    Generator.choice would refuse, or a draw RowStreams does not follow). Generator.choice(n, m, replace=False, p)
    is followed step by step: draw the missing count of uniform numbers, zero the p of the positions found, search
    the normalised cumulative sum, keep each new position's first draw; repeat until m are found."""
    picked: np.ndarray = np.full((len(starts), int(m.max()) if len(m) else 0), -1, np.int64)
    unsure: np.ndarray = np.zeros(len(starts), bool)
    for length, size in np.unique(np.stack([lengths, m], axis=1), axis=0).tolist():
        group = np.flatnonzero((lengths == length) & (m == size))
        if size == 0:
            continue
        weights = p[starts[group][:, None] + np.arange(length)]
        # what Generator.choice refuses (negative or too few positive p, a sum off 1) goes to ipw_sample to refuse
        unsure[group] = (weights < 0).any(axis=1) | ((weights > 0).sum(axis=1) < size) | \
            ~(np.abs(weights.sum(axis=1) - 1.0) <= 1e-9)  # NaN included
        found: np.ndarray = np.zeros(len(group), np.int64)
        todo = np.flatnonzero(~unsure[group])
        while len(todo):
            missing = size - found[todo]
            draws = np.full((len(todo), int(missing.max())), np.inf)
            for j in range(draws.shape[1]):
                now = np.flatnonzero(missing > j)
                draws[now, j] = streams.random(group[todo[now]])
            cdf = np.cumsum(weights[todo], axis=1)
            cdf /= cdf[:, -1:]
            new = (cdf[:, None, :] <= draws[:, :, None]).sum(axis=2)  # searchsorted(side="right")
            for j in range(draws.shape[1]):
                first = (missing > j) & ~(new[:, :j] == new[:, j:j + 1]).any(axis=1)
                rows = todo[first]
                picked[group[rows], found[rows]] = new[first, j]
                weights[rows, new[first, j]] = 0.0
                found[rows] += 1
            todo = todo[found[todo] < size]
    return picked, unsure


def ipw_table(scores: pa.Table, cfg, seed: int) -> pa.Table:
    """`scores` (sorted by sid, kind) → `candidates` with s_sur, s_sem, p_tilde, p, chosen and pick (draw order).
    Columnar: probabilities for all pools at once; only the draws loop over pools (one seeded stream each)."""
    order = pc.sort_indices(scores, sort_keys=[("sid", "ascending"), ("kind", "ascending"), ("source", "ascending"),
                                               ("text", "ascending")])
    # `scores` comes sorted so: then the copy of every column (most of this stage's time) is skipped
    in_order = np.array_equal(order.to_numpy(), np.arange(scores.num_rows))
    scores = scores.combine_chunks() if in_order else scores.take(order)
    n = scores.num_rows
    sid = scores.column("sid").to_numpy()
    is_neg = pc.equal(scores.column("kind"), "neg").to_numpy(zero_copy_only=False)
    bad = pc.invert(pc.is_in(scores.column("kind"), pa.array(["pos", "neg"])))
    if pc.any(bad).as_py():
        raise ValueError(f"scores: kind {pc.filter(scores.column('kind'), bad)[0].as_py()!r}: expected 'pos' or 'neg'")
    # pool boundaries: runs of equal (sid, kind) in the sorted table
    change = np.ones(n, dtype=bool)
    change[1:] = (sid[1:] != sid[:-1]) | (is_neg[1:] != is_neg[:-1])
    starts = np.flatnonzero(change)
    lengths: np.ndarray = np.diff(np.append(starts, n))
    lam = np.where(is_neg, float(cfg.lambda_neg), float(cfg.lambda_pos))
    cos = scores.column("cos").to_numpy().astype(np.float64)
    s_sur, s_sem, p_tilde, p = pool_probabilities(scores.column("edit").to_numpy().astype(np.float64), cos,
                                                  is_neg, lam, cfg.temperature, cfg.normalize, starts, lengths)
    chosen = np.zeros(n, dtype=bool)
    pick = np.zeros(n, dtype=np.int32)
    pools = np.arange(len(starts))
    if cfg.strategy == "ipw" and cfg.absolute_margin is None and cfg.relative_margin is None and matches_numpy():
        pools = np.zeros(0, np.int64)
        for neg, kind in ((False, "ipw-pos"), (True, "ipw-neg")):
            of_kind = np.flatnonzero(is_neg[starts] == neg)
            m = np.minimum(lengths[of_kind], cfg.m_neg if neg else cfg.m_pos)
            picked, unsure = sample_pools(p, starts[of_kind], lengths[of_kind], m,
                                          RowStreams(seed, kind, sid[starts[of_kind]].astype(np.uint64)))
            for k in range(picked.shape[1]):
                drawn = np.flatnonzero((picked[:, k] >= 0) & ~unsure)
                rows = starts[of_kind][drawn] + picked[drawn, k]
                chosen[rows], pick[rows] = True, k + 1
            pools = np.concatenate([pools, of_kind[unsure]])
    lowest_positive: dict[int, float] = {}
    # positives first (the margins compare negatives with them); every pool draws from its own stream, so the
    # order of the pools never changes a draw
    for pass_neg in (False, True):
        for a, length, neg in zip(starts[pools].tolist(), lengths[pools].tolist(), is_neg[starts[pools]].tolist()):
            if neg != pass_neg:
                continue
            rng = row_rng(seed, "ipw-neg" if neg else "ipw-pos", int(sid[a]))
            if neg:
                eligible = within_margins(cos[a:a + length], lowest_positive.get(int(sid[a])), cfg)
                picked = draw_negatives(p[a:a + length], cos[a:a + length], cfg.m_neg, rng, cfg.strategy, eligible)
            else:
                picked = ipw_sample(p[a:a + length], cfg.m_pos, rng)
                if len(picked):
                    lowest_positive[int(sid[a])] = float(cos[a + picked].min())
            chosen[a + picked] = True
            pick[a + picked] = np.arange(1, len(picked) + 1, dtype=np.int32)
    out = scores
    for name, v in zip(("s_sur", "s_sem", "p_tilde", "p"), (s_sur, s_sem, p_tilde, p)):
        out = out.append_column(name, pa.array(v, pa.float64()))
    out = out.append_column("chosen", pa.array(chosen)).append_column(
        "pick", pa.array(pick, pa.int32(), mask=pick == 0))
    return out.select(SCHEMAS["candidates"].names + ["pick"])


# numpy: its Generator draws the IPW samples (a numpy that changed its streams would change the draws)
@stage(reads=("scores",), writes=("candidates",), settings=("ipw",), facts=lambda cfg: package_versions("numpy"))
def ipw(ctx: Ctx) -> dict[str, pa.Table]:
    return {"candidates": ipw_table(ctx.shard("scores"), ctx.cfg.ipw, ctx.cfg.run.seed)}
