"""OssCSE's loss (l_c + l_r + λ·l_m) against a direct computation, its mask pooler and its skipped margin term."""
from __future__ import annotations


import pytest
import torch

from objective_helpers import ATOL, RTOL, TEXTS, cfg_for, cos, enc_np, encoder_for, nll, rows_all
from tiny_bert import tiny_encoder
from contramine.trainer.objectives import get_objective
from contramine.trainer.objectives.osscse import OssCSE



def check_terms(metrics, loss, st, enc, start, l_c: float, l_m: float) -> None:
    """The objective's three terms and its loss against the direct computation (l_r from the weights here)."""
    l_r = st.recall_weight / 2 * sum(((p.detach().double().numpy() - start[n]) ** 2).sum()
                                     for n, p in enc.named_parameters())
    assert metrics["l_c"] == pytest.approx(l_c, rel=RTOL, abs=ATOL)
    assert metrics["l_m"] == pytest.approx(l_m, rel=RTOL, abs=ATOL)
    assert metrics["l_r"] == pytest.approx(l_r, rel=RTOL, abs=ATOL)
    assert loss.item() == pytest.approx(l_c + l_r + st.margin_weight * l_m, rel=RTOL, abs=ATOL)

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
    check_terms(metrics, loss, st, enc, start, l_c, l_m)


def test_osscse_needs_mask_pooler_and_skips_margin_without_triplets():
    with pytest.raises(ValueError, match="mask"):
        OssCSE(tiny_encoder("cls"), cfg_for("osscse"))
    enc = encoder_for("osscse")
    obj = OssCSE(enc, cfg_for("osscse"))
    assert not any(n.startswith("theta") for n, _ in obj.named_buffers())  # θ* is not a buffer
    assert "theta_star" not in "".join(obj.state_dict())
    b = obj.collate([{**r, "negation": None} for r in rows_all()])
    assert b["trip_index"].numel() == 0 and b["groups"][2:] == (0, 0)  # no paraphrase or negation rows
    loss, metrics = obj(b)
    assert metrics["l_m"] == 0.0 and metrics["l_r"] == 0.0 and torch.isfinite(loss)




def test_osscse_start_pooler_form_matches_direct():
    """form = "start-pooler" (ours): no template, the start's pooler, l_c over two dropout views (dropout 0 here, so
    both views are the same vector), l_m and l_r as in the paper."""
    cfg = cfg_for("osscse", margin_weight=0.5, recall_weight=0.3, form="start-pooler")
    assert OssCSE.train_pooler(cfg) is None and OssCSE.eval_prompt(cfg) is None  # the configured pooler, no prompt
    assert OssCSE.train_pooler(cfg_for("osscse")) == "mask"
    enc = tiny_encoder("cls_before_pooler", dropout=0.0)
    start = {n: p.detach().clone().double().numpy() for n, p in enc.named_parameters()}
    obj = get_objective("osscse")(enc, cfg).train()  # no 'mask' pooler needed in this form
    with torch.no_grad():
        g = torch.Generator().manual_seed(3)
        for p in enc.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g))
    rows = rows_all()
    batch = obj.collate(rows)
    ids, B = batch["enc.input_ids"], len(rows)
    assert batch["groups"][:2] == (B, B) and torch.equal(ids[:B], ids[B:2 * B])  # the anchors twice: two views
    assert not (ids == enc.tokenizer.mask_token_id).any()  # no template
    loss, metrics = obj(batch)

    st, tau, B = obj.settings, cfg.temperature, len(rows)
    h = enc_np(enc, TEXTS, cfg.max_length)
    l_c = sum(nll(cos(h[i], h[i]) / tau, [cos(h[i], h[j]) / tau for j in range(B)]) for i in range(B)) / B
    both = [i for i, r in enumerate(rows) if r["paraphrase"] and r["negation"]]
    hp = enc_np(enc, [rows[i]["paraphrase"] for i in both], cfg.max_length)
    hn = enc_np(enc, [rows[i]["negation"] for i in both], cfg.max_length)
    l_m = sum(max(cos(h[i], hn[k]) - cos(h[i], hp[k]) + st.alpha, 0.0)
              + max(cos(h[i], hp[k]) - cos(h[i], hn[k]) - st.beta, 0.0) for k, i in enumerate(both)) / len(both)
    check_terms(metrics, loss, st, enc, start, l_c, l_m)


def test_osscse_start_pooler_views_differ_by_dropout():
    cfg = cfg_for("osscse", form="start-pooler")
    obj = get_objective("osscse")(tiny_encoder("mean", dropout=0.1), cfg).train()
    torch.manual_seed(0)
    _, with_dropout = obj(obj.collate(rows_all()))
    obj.eval()  # dropout off: the two views coincide, so the positive is the closest candidate of every row
    _, without = obj(obj.collate(rows_all()))
    assert with_dropout["l_c"] > without["l_c"]


def test_paper_form_warns_about_a_start_trained_for_another_pooler(tmp_path):
    """A sentence-transformers start (1_Pooling/config.json) loses most of what it knows at the [MASK]: the paper's
    form says so at the start of training, naming the pooler it was trained for and the setting that keeps it."""
    from contramine.pipeline.config import load_config

    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(
        '{"word_embedding_dimension": 384, "pooling_mode_cls_token": false, "pooling_mode_mean_tokens": true}')
    paper = load_config("default", ["train.objective=osscse"]).train
    (note,) = OssCSE.start_notes(paper, tmp_path)
    assert "trained for mean pooling" in note and 'form = "start-pooler"' in note and str(tmp_path) in note
    ours = load_config("default", ["train.objective=osscse", "train.osscse.form=start-pooler"]).train
    assert OssCSE.start_notes(ours, tmp_path) == []
    assert OssCSE.start_notes(paper, tmp_path / "1_Pooling") == []  # no pooling config: nothing to say
    assert get_objective("simcse").start_notes(paper, tmp_path) == []
    # a checkpoint of this project says which pooler it trained with: one trained at the [MASK] needs no warning
    (tmp_path / "train_config.json").write_text('{"objective": "osscse", "pooler": "mask"}')
    assert OssCSE.start_notes(paper, tmp_path) == []
    (tmp_path / "train_config.json").write_text('{"objective": "simcse", "pooler": "mean"}')
    assert "trained for mean pooling (train_config.json)" in OssCSE.start_notes(paper, tmp_path)[0]
