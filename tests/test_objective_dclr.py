"""DCLR's noise negatives and instance weighting against a direct computation."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from objective_helpers import ATOL, RTOL, TEXTS, cfg_for, cos, enc_np, encoder_for, head_np, nll, rows_all
from contramine.trainer.objectives import get_objective


def test_dclr_matches_direct():
    cfg = cfg_for("dclr", phi=0.9, noise_per_row=2, noise_steps=4, noise_step_size=0.05, tau_u=0.2)
    enc = encoder_for("dclr")
    obj = get_objective("dclr")(enc, cfg).train()
    rows = rows_all()
    rows[3]["emb"] = rows[0]["emb"].copy()  # rows 0 and 3: cos 1 >= φ -> weight 0 for each other
    rows[2]["emb"] = -rows[1]["emb"]
    batch = obj.collate(rows)
    torch.manual_seed(5)
    loss, metrics = obj(batch)
    torch.manual_seed(5)
    st = obj.settings
    B, tau, tu = len(rows), cfg.temperature, st.tau_u
    noise = torch.randn(st.noise_per_row * B, enc.dim).double().numpy()

    h = head_np(obj.mlp.dense, enc_np(enc, TEXTS, cfg.max_length))
    hp = h.copy()
    # normalised gradient ascent on L_u = (1/B) Σ_i [log Σ_j e^{cos(h_i, n_j)/τu} − cos(h_i,h_i+)/τu]
    for _ in range(st.noise_steps):
        grad = np.zeros_like(noise)
        for i in range(B):
            s = np.array([cos(h[i], n) / tu for n in noise])
            p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
            for j, n in enumerate(noise):
                c = cos(h[i], n)
                dcos = h[i] / (np.linalg.norm(h[i]) * np.linalg.norm(n)) - c * n / np.linalg.norm(n) ** 2
                grad[j] += p[j] / tu * dcos / B
        noise = noise + st.noise_step_size * grad / np.linalg.norm(grad, axis=1, keepdims=True)

    emb = [r["emb"] for r in rows]
    total, removed = 0.0, 0
    for i in range(B):
        denom = [cos(h[i], hp[i]) / tau]
        for j in range(B):
            if j == i:
                continue
            w = 1.0
            if emb[i] is not None and emb[j] is not None and cos(emb[i], emb[j]) >= st.phi:
                w = 0.0
            if w:
                denom.append(cos(h[i], hp[j]) / tau)
            else:
                removed += 1
        denom += [cos(h[i], n) / tau for n in noise]
        total += nll(denom[0], denom)
    assert removed == 2
    assert metrics["removed"] == pytest.approx(removed / (B * (B - 1)))
    assert loss.item() == pytest.approx(total / B, rel=RTOL, abs=ATOL)


def test_dclr_without_embeddings_weights_one():
    cfg = cfg_for("dclr", noise_per_row=0)
    enc = encoder_for("dclr")
    obj = get_objective("dclr")(enc, cfg).train()
    b = obj.collate([{**r, "emb": None} for r in rows_all()])
    assert b["emb"].shape == (6, 0) and not b["emb_valid"].any()
    loss, metrics = obj(b)
    simcse = get_objective("simcse")(enc, cfg_for("simcse"))
    simcse.mlp.load_state_dict(obj.mlp.state_dict())
    ref, _ = simcse(simcse.collate(rows_all()))
    assert metrics["removed"] == 0.0
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)  # k = 0, all weights 1: plain SimCSE


