"""WhitenedCSE's shuffled group whitening and multi-positive loss against a direct computation."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from objective_helpers import ATOL, RTOL, TEXTS, cfg_for, cos, enc_np, encoder_for, head_np, nll, rows_all
from tiny_bert import tiny_encoder
from contramine.trainer.objectives import get_objective
from contramine.trainer.objectives.whitenedcse import WhitenedCSE


def zca_np(x: np.ndarray, groups: int, eps: float) -> np.ndarray:
    """Group ZCA written out: per group, centre, covariance, eigh, U (Λ+ε)^{-1/2} Uᵀ."""
    B, d = x.shape
    c = d // groups
    out = np.zeros_like(x)
    for g in range(groups):
        xg = x[:, g * c:(g + 1) * c]
        xc = xg - xg.mean(0)
        cov = np.zeros((c, c))
        for i in range(B):
            cov += np.outer(xc[i], xc[i])
        cov /= B
        lam, U = np.linalg.eigh(cov)
        W = U @ np.diag(1.0 / np.sqrt(lam + eps)) @ U.T
        out[:, g * c:(g + 1) * c] = xc @ W
    return out


def sgw_np(x: np.ndarray, perm: np.ndarray, groups: int, eps: float) -> np.ndarray:
    shuffled = x[:, perm]
    w = zca_np(shuffled, groups, eps)
    back = np.zeros_like(w)
    for k, p in enumerate(perm):
        back[:, p] = w[:, k]  # channel perm[k] returns to its place
    return back


def test_whitenedcse_matches_direct():
    cfg = cfg_for("whitenedcse", groups=8, positives=3, loss_weight=0.7)
    enc = encoder_for("whitenedcse")
    obj = get_objective("whitenedcse")(enc, cfg).train()
    batch = obj.collate(rows_all())
    torch.manual_seed(11)
    loss, _ = obj(batch)
    torch.manual_seed(11)  # dropout 0 draws nothing: the same permutations, in the same order
    st = obj.settings
    perms = [torch.randperm(enc.dim).numpy() for _ in range(st.positives + 1)]

    h = enc_np(enc, TEXTS, cfg.max_length)
    G, eps, tau, B = st.groups, st.eps, cfg.temperature, len(TEXTS)
    anchors = head_np(obj.proj, sgw_np(h, perms[0], G, eps))
    views = [head_np(obj.proj, sgw_np(h, perms[p], G, eps)) for p in range(1, st.positives + 1)]
    total = 0.0
    for i in range(B):
        for v in views:
            total += nll(cos(anchors[i], v[i]) / tau, [cos(anchors[i], v[j]) / tau for j in range(B)])
    assert loss.item() == pytest.approx(st.loss_weight * total / B, rel=RTOL, abs=ATOL)

    # whitening really whitens: each group's covariance is ~identity
    w = sgw_np(h, perms[0], G, eps)
    with torch.no_grad():
        w_t = obj.sgw(torch.tensor(h, dtype=torch.float32), torch.tensor(perms[0])).double().numpy()
    np.testing.assert_allclose(w_t, w, rtol=1e-3, atol=1e-3)


def test_whitenedcse_groups_must_divide_dim():
    with pytest.raises(ValueError, match="must divide"):
        WhitenedCSE(tiny_encoder("cls_before_pooler"), cfg_for("whitenedcse", groups=5))


