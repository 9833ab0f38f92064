"""OssCSE's loss (l_c + l_r + λ·l_m) against a direct computation, its mask pooler and its skipped margin term."""
from __future__ import annotations


import pytest
import torch

from objective_helpers import ATOL, RTOL, TEXTS, cfg_for, cos, enc_np, encoder_for, nll, rows_all
from tiny_bert import tiny_encoder
from trainer.objectives import get_objective
from trainer.objectives.osscse import OssCSE


def test_osscse_matches_direct():
    cfg = cfg_for("osscse", margin_weight=0.5, recall_weight=0.3)  # large λ, γ so both terms are visible
    enc = encoder_for("osscse")
    start = {n: p.detach().clone().double().numpy() for n, p in enc.named_parameters()}
    obj = get_objective("osscse")(enc, cfg).train()
    with torch.no_grad():  # move away from θ* so that l_r > 0
        g = torch.Generator().manual_seed(3)
        for p in enc.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g))
    rows = rows_all()
    loss, metrics = obj(obj.collate(rows))

    st = obj.settings
    t1, t2 = st.templates
    tau, B = cfg.temperature, len(rows)
    h = enc_np(enc, TEXTS, cfg.max_length, t1)
    h2 = enc_np(enc, TEXTS, cfg.max_length, t2)
    l_c = sum(nll(cos(h[i], h2[i]) / tau, [cos(h[i], h2[j]) / tau for j in range(B)]) for i in range(B)) / B
    both = [i for i, r in enumerate(rows) if r["paraphrase"] and r["negation"]]
    assert both == [0, 2, 3, 5]
    hp = enc_np(enc, [rows[i]["paraphrase"] for i in both], cfg.max_length, t1)
    hn = enc_np(enc, [rows[i]["negation"] for i in both], cfg.max_length, t1)
    margins = []
    for k, i in enumerate(both):
        sp, sn = cos(h[i], hp[k]), cos(h[i], hn[k])
        margins.append(max(sn - sp + st.alpha, 0.0) + max(sp - sn - st.beta, 0.0))
    l_m = sum(margins) / len(margins)
    l_r = st.recall_weight / 2 * sum(((p.detach().double().numpy() - start[n]) ** 2).sum()
                                     for n, p in enc.named_parameters())
    assert metrics["l_c"] == pytest.approx(l_c, rel=RTOL, abs=ATOL)
    assert metrics["l_m"] == pytest.approx(l_m, rel=RTOL, abs=ATOL)
    assert metrics["l_r"] == pytest.approx(l_r, rel=RTOL, abs=ATOL)
    assert loss.item() == pytest.approx(l_c + l_r + st.margin_weight * l_m, rel=RTOL, abs=ATOL)


def test_osscse_needs_mask_pooler_and_skips_margin_without_triplets():
    with pytest.raises(ValueError, match="mask"):
        OssCSE(tiny_encoder("cls"), cfg_for("osscse"))
    enc = encoder_for("osscse")
    obj = OssCSE(enc, cfg_for("osscse"))
    assert not any(n.startswith("theta") for n, _ in obj.named_buffers())  # θ* is not a buffer
    assert "theta_star" not in "".join(obj.state_dict())
    b = obj.collate([{**r, "negation": None} for r in rows_all()])
    assert b["trip_index"].numel() == 0 and not any(k.startswith("par.") for k in b)
    loss, metrics = obj(b)
    assert metrics["l_m"] == 0.0 and metrics["l_r"] == 0.0 and torch.isfinite(loss)


