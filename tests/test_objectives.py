"""Each objective's loss against a direct re-computation of its formula (METHODS §7) on a tiny batch, a few
AdamW steps that lower it, and export without training heads.

The direct computations use float64 numpy and explicit loops over anchors and candidates; the encoder outputs
they start from come from the same tiny BERT with dropout 0 (so both sides see the same vectors).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pipeline.config import TrainCfg
from pipeline.encoder import Encoder
from tiny_bert import build_tiny_bert, tiny_encoder
from trainer import dist
from trainer.objectives import OBJECTIVES, get_objective
from trainer.objectives.debcse import DebCSE
from trainer.objectives.osscse import OssCSE
from trainer.objectives.whitenedcse import WhitenedCSE

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
    base = dict(objective=name, temperature=0.05, whitened_groups=8, whitened_positives=3, debcse_negatives=2)
    base.update(kw)
    return TrainCfg(**base)


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


# ----------------------------------------------------------------------------------------------- direct losses
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

    tau, m, B = cfg.temperature, cfg.debcse_negatives, len(rows)
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
    cfg = cfg_for("debcse", debcse_negatives=2)
    enc = encoder_for("debcse")
    obj = DebCSE(enc, cfg)
    rows = rows_all()
    b = obj.collate(rows)
    # rows 0 and 3 have no positive: their positive is the sentence itself (a dropout view)
    ids = lambda side, i: b[f"{side}.input_ids"][i][b[f"{side}.attention_mask"][i].bool()].tolist()  # noqa: E731
    assert ids("pos", 0) == ids("anc", 0) and ids("pos", 3) == ids("anc", 3)
    assert ids("pos", 1) != ids("anc", 1)
    assert b["neg_index"].tolist() == [[-1, -1], [0, -1], [1, 2], [-1, -1], [3, -1], [4, 5]]
    assert b["neg.input_ids"].shape[0] == 6
    # no negatives anywhere: no neg keys, the loss still runs
    b0 = obj.collate([{**r, "negatives": None} for r in rows])
    assert not any(k.startswith("neg.") for k in b0)
    loss, _ = obj(b0)
    assert torch.isfinite(loss)
    assert all(isinstance(v, torch.Tensor) for v in b.values())


def test_osscse_matches_direct():
    cfg = cfg_for("osscse", osscse_lambda=0.5, osscse_gamma=0.3)  # large λ, γ so both terms are visible
    enc = encoder_for("osscse")
    start = {n: p.detach().clone().double().numpy() for n, p in enc.named_parameters()}
    obj = get_objective("osscse")(enc, cfg).train()
    with torch.no_grad():  # move away from θ* so that l_r > 0
        g = torch.Generator().manual_seed(3)
        for p in enc.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g))
    rows = rows_all()
    loss, metrics = obj(obj.collate(rows))

    t1, t2 = cfg.osscse_templates
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
        margins.append(max(sn - sp + cfg.osscse_alpha, 0.0) + max(sp - sn - cfg.osscse_beta, 0.0))
    l_m = sum(margins) / len(margins)
    l_r = cfg.osscse_gamma / 2 * sum(((p.detach().double().numpy() - start[n]) ** 2).sum()
                                     for n, p in enc.named_parameters())
    assert metrics["l_c"] == pytest.approx(l_c, rel=RTOL, abs=ATOL)
    assert metrics["l_m"] == pytest.approx(l_m, rel=RTOL, abs=ATOL)
    assert metrics["l_r"] == pytest.approx(l_r, rel=RTOL, abs=ATOL)
    assert loss.item() == pytest.approx(l_c + l_r + cfg.osscse_lambda * l_m, rel=RTOL, abs=ATOL)


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
    cfg = cfg_for("whitenedcse", whitened_groups=8, whitened_positives=3, whitened_lambda=0.7)
    enc = encoder_for("whitenedcse")
    obj = get_objective("whitenedcse")(enc, cfg).train()
    batch = obj.collate(rows_all())
    torch.manual_seed(11)
    loss, _ = obj(batch)
    torch.manual_seed(11)  # dropout 0 draws nothing: the same permutations, in the same order
    perms = [torch.randperm(enc.dim).numpy() for _ in range(cfg.whitened_positives + 1)]

    h = enc_np(enc, TEXTS, cfg.max_length)
    G, eps, tau, B = cfg.whitened_groups, cfg.whitened_eps, cfg.temperature, len(TEXTS)
    anchors = head_np(obj.proj, sgw_np(h, perms[0], G, eps))
    views = [head_np(obj.proj, sgw_np(h, perms[p], G, eps)) for p in range(1, cfg.whitened_positives + 1)]
    total = 0.0
    for i in range(B):
        for v in views:
            total += nll(cos(anchors[i], v[i]) / tau, [cos(anchors[i], v[j]) / tau for j in range(B)])
    assert loss.item() == pytest.approx(cfg.whitened_lambda * total / B, rel=RTOL, abs=ATOL)

    # whitening really whitens: each group's covariance is ~identity
    w = sgw_np(h, perms[0], G, eps)
    with torch.no_grad():
        w_t = obj.sgw(torch.tensor(h, dtype=torch.float32), torch.tensor(perms[0])).double().numpy()
    np.testing.assert_allclose(w_t, w, rtol=1e-3, atol=1e-3)


def test_whitenedcse_groups_must_divide_dim():
    with pytest.raises(ValueError, match="must divide"):
        WhitenedCSE(tiny_encoder("cls_before_pooler"), cfg_for("whitenedcse", whitened_groups=5))


def test_dclr_matches_direct():
    cfg = cfg_for("dclr", dclr_phi=0.9, dclr_k=2, dclr_steps=4, dclr_step_size=0.05, dclr_tau_u=0.2)
    enc = encoder_for("dclr")
    obj = get_objective("dclr")(enc, cfg).train()
    rows = rows_all()
    rows[3]["emb"] = rows[0]["emb"].copy()  # rows 0 and 3: cos 1 >= φ -> weight 0 for each other
    rows[2]["emb"] = -rows[1]["emb"]
    batch = obj.collate(rows)
    torch.manual_seed(5)
    loss, metrics = obj(batch)
    torch.manual_seed(5)
    B, tau, tu = len(rows), cfg.temperature, cfg.dclr_tau_u
    noise = torch.randn(cfg.dclr_k * B, enc.dim).double().numpy()

    h = head_np(obj.mlp.dense, enc_np(enc, TEXTS, cfg.max_length))
    hp = h.copy()
    # normalised gradient ascent on L_u = (1/B) Σ_i [log Σ_j e^{cos(h_i, n_j)/τu} − cos(h_i,h_i+)/τu]
    for _ in range(cfg.dclr_steps):
        grad = np.zeros_like(noise)
        for i in range(B):
            s = np.array([cos(h[i], n) / tu for n in noise])
            p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
            for j, n in enumerate(noise):
                c = cos(h[i], n)
                dcos = h[i] / (np.linalg.norm(h[i]) * np.linalg.norm(n)) - c * n / np.linalg.norm(n) ** 2
                grad[j] += p[j] / tu * dcos / B
        noise = noise + cfg.dclr_step_size * grad / np.linalg.norm(grad, axis=1, keepdims=True)

    emb = [r["emb"] for r in rows]
    total, removed = 0.0, 0
    for i in range(B):
        denom = [cos(h[i], hp[i]) / tau]
        for j in range(B):
            if j == i:
                continue
            w = 1.0
            if emb[i] is not None and emb[j] is not None and cos(emb[i], emb[j]) >= cfg.dclr_phi:
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
    cfg = cfg_for("dclr", dclr_k=0)
    enc = encoder_for("dclr")
    obj = get_objective("dclr")(enc, cfg).train()
    b = obj.collate([{**r, "emb": None} for r in rows_all()])
    assert b["emb"].shape == (6, 0) and not b["emb_valid"].any()
    loss, metrics = obj(b)
    simcse = get_objective("simcse")(enc, cfg)
    simcse.mlp.load_state_dict(obj.mlp.state_dict())
    ref, _ = simcse(simcse.collate(rows_all()))
    assert metrics["removed"] == 0.0
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)  # k = 0, all weights 1: plain SimCSE


# ------------------------------------------------------------------------------------------- training, export
@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_loss_goes_down(name):
    # dropout 0: on a 6-row batch of a 32-d random model, dropout noise (amplified by DebCSE's 6-row BatchNorm)
    # swamps 10 steps of progress; the deterministic loss must fall
    torch.manual_seed(0)
    cfg = cfg_for(name, osscse_lambda=1.0, whitened_positives=2)
    enc = encoder_for(name, dropout=0.0)
    obj = get_objective(name)(enc, cfg).train()
    batch = obj.collate(rows_all())
    opt = torch.optim.AdamW(obj.parameters(), lr=1e-3)
    losses = []
    for _ in range(10):
        loss, _ = obj(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses)
    assert np.mean(losses[-3:]) < np.mean(losses[:3]), losses


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_export_has_no_training_heads(name, tmp_path):
    enc = encoder_for(name)
    obj = get_objective(name)(enc, cfg_for(name))
    out = obj.export_encoder()
    assert isinstance(out, Encoder)
    names = {n for n, _ in out.named_parameters()}
    assert names == {n for n, _ in enc.named_parameters()}
    assert all(n.startswith("model.") for n in names)
    heads = {n for n, _ in obj.named_parameters() if not n.startswith("encoder.")}
    if name in ("simcse", "dclr"):
        assert heads == {"mlp.dense.weight", "mlp.dense.bias"}
    elif name == "whitenedcse":
        assert heads == {"proj.weight", "proj.bias"}
    else:
        assert heads == set()
    # the exported encoder saves and reloads as a plain HF model
    out.model.save_pretrained(tmp_path)
    out.tokenizer.save_pretrained(tmp_path)
    again = Encoder.load(str(tmp_path), pooler=out.pooler, device="cpu")
    assert again.encode(["a dog runs"]).shape == (1, enc.dim)


def test_simcse_without_mlp_has_no_head():
    obj = get_objective("simcse")(encoder_for("simcse"), cfg_for("simcse", mlp_train_only=False))
    assert obj.mlp is None and not [n for n, _ in obj.named_parameters() if not n.startswith("encoder.")]


def test_registry_and_collate_types():
    with pytest.raises(ValueError, match="unknown objective"):
        get_objective("nope")
    for name, cls in OBJECTIVES.items():
        assert cls.name == name and get_objective(name) is cls
        obj = cls(encoder_for(name), cfg_for(name))
        b = obj.collate(rows_all())
        assert all(isinstance(v, torch.Tensor) for v in b.values()), name
    assert OBJECTIVES["debcse"].tables == ("pairs",)
    assert OBJECTIVES["osscse"].tables == ("sentences", "triplets")
    assert OBJECTIVES["dclr"].tables == ("sentences", "embeddings")


def test_dist_helpers_single_process():
    assert not dist.is_dist() and dist.rank() == 0 and dist.world_size() == 1
    x = torch.randn(3, 2, requires_grad=True)
    assert dist.gather_with_grad(x) is x
    per = torch.tensor([1.0, 2.0, 6.0])
    assert dist.global_mean(per).item() == pytest.approx(3.0)
    assert dist.global_mean(per[:0]).item() == 0.0
    assert dist.local_slice([3]) == slice(0, 3)


def test_build_tiny_bert_roundtrip(tmp_path):
    path = build_tiny_bert(tmp_path / "bert", seed=1)
    enc = Encoder.load(str(path), pooler="cls", device="cpu")
    assert enc.dim == 32 and enc.model.config.num_hidden_layers == 2
    ids = enc.tokenize(TEXTS)["input_ids"]
    assert (ids != enc.tokenizer.unk_token_id).all()
    m = Encoder.load(str(path), pooler="mask", device="cpu").tokenize(TEXTS)
    assert (m["input_ids"][torch.arange(len(TEXTS)), m["mask_positions"]] == enc.tokenizer.mask_token_id).all()
