"""DebCSE's loss (Eq. 8, positive kept in the denominator) against a direct computation, and its collate."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from objective_helpers import ATOL, RTOL, TEXTS, cfg_for, cos, enc_np, encoder_for, nll, rows_all
from contramine.trainer.objectives import get_objective
from contramine.trainer.objectives.debcse import DebCSE


def bn_np(x: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mu = x.mean(0)
    var = ((x - mu) ** 2).mean(0)
    return (x - mu) / np.sqrt(var + eps)


def test_debcse_matches_direct():
    cfg = cfg_for("debcse")
    enc = encoder_for("debcse")
    obj = get_objective("debcse")(enc, cfg).train()
    rows = rows_all()
    batch = obj.collate(rows)
    loss, _ = obj(batch)

    tau, m, B = cfg.temperature, obj.settings.negatives, len(rows)
    pos_texts = [r["positives"][0] if r["positives"] else r["text"] for r in rows]  # None -> the sentence itself
    negs = [r["negatives"][:m] for r in rows]
    flat = [t for ns in negs for t in ns]
    h = enc_np(enc, TEXTS, cfg.max_length)
    hp = enc_np(enc, pos_texts, cfg.max_length)
    hn = enc_np(enc, flat, cfg.max_length)
    z, zp, zn = bn_np(h), bn_np(hp), bn_np(hn)
    # BatchNorm1d(affine=False) in training mode is the same normalisation
    ref = torch.nn.BatchNorm1d(h.shape[1], affine=False).double().train()(torch.tensor(h)).numpy()
    np.testing.assert_allclose(z, ref, rtol=1e-6, atol=1e-6)

    total, start = 0.0, 0
    for i in range(B):
        mine = list(range(start, start + len(negs[i])))
        start += len(negs[i])
        # L(z_i, h_i+): positive kept in the denominator, in-batch j != i use h_j+, negatives z_{i,k}-
        d1 = [cos(z[i], hp[i]) / tau] + [cos(z[i], zn[k]) / tau for k in mine] + \
             [cos(z[i], hp[j]) / tau for j in range(B) if j != i]
        d2 = [cos(zp[i], h[i]) / tau] + [cos(zp[i], zn[k]) / tau for k in mine] + \
             [cos(zp[i], h[j]) / tau for j in range(B) if j != i]
        total += nll(d1[0], d1) + nll(d2[0], d2)
    assert loss.item() == pytest.approx(total / B, rel=RTOL, abs=ATOL)


def test_debcse_collate_positive_fallback_and_negative_mask():
    cfg = cfg_for("debcse", negatives=2)
    enc = encoder_for("debcse")
    obj = DebCSE(enc, cfg)
    rows = rows_all()
    b = obj.collate(rows)
    # one batch for one forward: anchors, positives, negatives stacked in that order
    assert b["groups"] == (6, 6, 6) and b["enc.input_ids"].shape[0] == 18
    start = {"anc": 0, "pos": 6, "neg": 12}
    ids = lambda side, i: b["enc.input_ids"][start[side] + i][b["enc.attention_mask"][start[side] + i].bool()].tolist()  # noqa: E731
    # rows 0 and 3 have no positive: their positive is the sentence itself (a dropout view)
    assert ids("pos", 0) == ids("anc", 0) and ids("pos", 3) == ids("anc", 3)
    assert ids("pos", 1) != ids("anc", 1)
    assert b["neg_index"].tolist() == [[-1, -1], [0, -1], [1, 2], [-1, -1], [3, -1], [4, 5]]
    assert enc.tokenizer.decode(ids("neg", 1), skip_special_tokens=True) == rows[2]["negatives"][0]
    # no negatives anywhere: an empty third group, the loss still runs
    b0 = obj.collate([{**r, "negatives": None} for r in rows])
    assert b0["groups"] == (6, 6, 0) and b0["enc.input_ids"].shape[0] == 12
    loss, _ = obj(b0)
    assert torch.isfinite(loss)
    assert all(isinstance(v, torch.Tensor) for k, v in b.items() if k != "groups")


