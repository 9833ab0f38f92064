"""SimCSE's loss against a direct computation of its formula (trainer/objectives/simcse.py docstring)."""
from __future__ import annotations


import pytest

from objective_helpers import ATOL, RTOL, TEXTS, cfg_for, cos, enc_np, encoder_for, head_np, nll, rows_all
from contramine.trainer.objectives import get_objective


def test_simcse_matches_direct():
    for mlp in (True, False):
        cfg = cfg_for("simcse", mlp_train_only=mlp)
        enc = encoder_for("simcse")
        obj = get_objective("simcse")(enc, cfg).train()
        loss, _ = obj(obj.collate(rows_all()))
        h = enc_np(enc, TEXTS, cfg.max_length)
        if mlp:
            h = head_np(obj.mlp.dense, h)
        hp = h.copy()  # dropout 0: the second view is the same vector
        B, tau = len(h), cfg.temperature
        terms = [nll(cos(h[i], hp[i]) / tau, [cos(h[i], hp[j]) / tau for j in range(B)]) for i in range(B)]
        assert loss.item() == pytest.approx(sum(terms) / B, rel=RTOL, abs=ATOL)


def test_simcse_without_mlp_has_no_head():
    obj = get_objective("simcse")(encoder_for("simcse"), cfg_for("simcse", mlp_train_only=False))
    assert obj.mlp is None and not [n for n, _ in obj.named_parameters() if not n.startswith("encoder.")]


