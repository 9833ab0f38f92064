"""One encoder forward per training step: every objective stacks the groups it encodes (two dropout views; DebCSE's
anchors, positives and negatives; OssCSE's two templates, paraphrases and negations) into one batch in collate and
splits the pooled vectors after one forward. Its loss and gradients equal the multi-pass form (one encoder call per
group, as the objectives ran before) in float64 with dropout off, padded and padding-free; the HF model runs once
per step; and a step (forward, backward, clipping, GradScaler, fused AdamW, the metrics window) reads nothing back
from the device until the logged row asks for its numbers."""
from __future__ import annotations

import pytest
import torch

from host_reads import HostReads
from objective_helpers import cfg_for, rows_all
from contramine.pipeline.models.encode.unpad import unpad_layout
from tiny_bert import tiny_encoder
from contramine.trainer.metrics_log import MetricWindow
from contramine.trainer.objectives import get_objective
from contramine.trainer.objectives.dclr import dclr_loss
from contramine.trainer.objectives.debcse import debcse_loss
from contramine.trainer.objectives.osscse import osscse_loss
from contramine.trainer.objectives.simcse import simcse_loss
from contramine.trainer.objectives.whitenedcse import whitenedcse_loss

# case -> (objective, pooler, its settings): poolers that read the mask (mean, avg_first_last) see the joint padding
CASES = {
    "simcse": ("simcse", "mean", {}),
    "debcse": ("debcse", "mean", {}),
    "debcse-avg_first_last": ("debcse", "avg_first_last", {}),
    "osscse": ("osscse", "mask", {"margin_weight": 0.5, "recall_weight": 0.1}),
    "osscse-start-pooler": ("osscse", "mean", {"margin_weight": 0.5, "recall_weight": 0.1, "form": "start-pooler"}),
    "whitenedcse": ("whitenedcse", "cls_before_pooler", {"positives": 2}),
    "dclr": ("dclr", "mean", {"phi": 0.5, "noise_step_size": 0.05}),
}


def make(case: str, unpad: bool, dtype=torch.float64):
    name, pooler, settings = CASES[case]
    enc = tiny_encoder(pooler, seed=0, dropout=0.0)
    enc.unpad = unpad
    torch.manual_seed(7)  # training heads
    obj = get_objective(name)(enc, cfg_for(name, **settings)).to(dtype).train()
    if name == "osscse":  # off θ*, so the recall term has a gradient too
        with torch.no_grad():
            g = torch.Generator().manual_seed(3)
            for p in enc.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=g))
    return name, obj


def multi_pass(name: str, obj, rows: list[dict]):
    """The objective as it ran before one forward per step: each group tokenised on its own (padded to its own
    longest row) and encoded by its own encoder call, then the objective's math function."""
    enc, cfg, st = obj.encoder, obj.cfg, obj.settings
    tau = cfg.temperature

    def encode(texts, template=None):
        return enc(enc.tokenize(texts, template=template, max_length=cfg.max_length))

    texts = [r["text"] for r in rows]
    if name in ("simcse", "dclr", "whitenedcse"):
        head = getattr(obj, "head", lambda h: h)
        h1, h2 = head(encode(texts)), head(encode(texts))
        if name == "simcse":
            return simcse_loss(h1, h2, tau)
        if name == "whitenedcse":
            return whitenedcse_loss(h1, h2, obj.view, obj.sgw.dim, st, tau)
        batch = obj.collate(rows)
        return dclr_loss(h1, h2, batch["emb"], batch["emb_valid"], st, tau)
    if name == "debcse":
        positives = [(r.get("positives") or [None])[0] or r["text"] for r in rows]
        negatives = [t for r in rows for t in [t for t in (r.get("negatives") or []) if t][:st.negatives]]
        return debcse_loss(encode(texts), encode(positives), encode(negatives), obj.collate(rows)["neg_index"], tau)
    t1, t2 = st.templates if st.form == "paper" else (None, None)
    both = [i for i, r in enumerate(rows) if r.get("paraphrase") and r.get("negation")]
    return osscse_loss(encode(texts, t1), encode(texts, t2), encode([rows[i]["paraphrase"] for i in both], t1),
                       encode([rows[i]["negation"] for i in both], t1), torch.tensor(both), obj.recall(), st, tau)


def loss_and_grads(obj, run):
    obj.zero_grad(set_to_none=True)
    torch.manual_seed(11)  # WhitenedCSE's permutations, DCLR's noise: the same draws both ways
    loss, _ = run()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in obj.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("unpad", [False, True], ids=["padded", "padding-free"])
@pytest.mark.parametrize("case", list(CASES))
def test_one_forward_equals_the_multi_pass_form(case, unpad):
    name, obj = make(case, unpad)
    rows = rows_all()
    batch = obj.collate(rows)
    assert len(batch["groups"]) == {"debcse": 3, "osscse": 4}.get(name, 2)
    assert ("enc.unpad_index" in batch) == unpad  # the layout is made in collate, only for the padding-free forward
    one, g_one = loss_and_grads(obj, lambda: obj(batch))
    many, g_many = loss_and_grads(obj, lambda: multi_pass(name, obj, rows))
    assert abs(one.item() - many.item()) <= 1e-6 * max(1.0, abs(many.item())), (one.item(), many.item())
    assert set(g_one) == set(g_many) and any(n.startswith("encoder.") for n in g_one)
    for n, g in g_many.items():
        torch.testing.assert_close(g_one[n], g, rtol=1e-6, atol=1e-9, msg=f"{case}: gradient of {n}")


@pytest.mark.parametrize("case", ["simcse", "debcse", "osscse", "osscse-start-pooler", "whitenedcse", "dclr"])
def test_a_training_step_runs_the_model_once(case):
    name, obj = make(case, unpad=True, dtype=torch.float32)
    calls = []
    obj.encoder.model.register_forward_pre_hook(lambda *_: calls.append(1))
    loss, _ = obj(obj.collate(rows_all()))
    loss.backward()
    assert len(calls) == 1


def test_the_collated_layout_is_the_one_the_forward_would_find():
    """unpad_layout made on the host in collate: the real tokens' flat positions and their position ids, of the joint
    batch (pads of the shorter groups included)."""
    _, obj = make("debcse", unpad=True, dtype=torch.float32)
    batch = obj.collate(rows_all())
    mask = batch["enc.attention_mask"]
    assert torch.equal(batch["enc.unpad_index"], mask.reshape(-1).nonzero().squeeze(1))
    columns = torch.arange(mask.shape[1]).expand_as(mask)
    assert torch.equal(batch["enc.unpad_positions"], columns[mask.bool()])
    # not BERT-family: no layout, the encoder runs the padded forward
    assert unpad_layout(obj.encoder.model, mask.flip(1)) is None


def test_a_step_reads_nothing_back_until_the_row_is_logged():
    """The loop's step body (trainer/train.py): forward, backward, GradScaler (enabled here: its unscale and inf
    check stay on the device with the fused AdamW), clipping, the scheduler and the metrics window. No host read
    per step; one per logged row."""
    for case in ("simcse", "debcse", "osscse", "dclr", "whitenedcse"):
        name, obj = make(case, unpad=True, dtype=torch.float32)
        batches = [obj.collate(rows_all()) for _ in range(3)]  # collate: host work in the DataLoader workers
        params = [p for p in obj.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        scaler = torch.amp.GradScaler("cpu", enabled=True)
        window = MetricWindow()
        with HostReads() as reads:
            for batch in batches:
                loss, metrics = obj(batch)
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
                scaler.step(opt)
                scaler.update()
                opt.zero_grad(set_to_none=True)
                sched.step()
                window.add({"loss": loss, "grad_norm": grad_norm, **metrics})
        # WhitenedCSE's eigh checks its result inside torch's C++ on a GPU: not seen here, and said in its docstring
        assert reads.count == 0, (case, reads.where)
        with HostReads() as reads:
            means, n = window.read()
        assert reads.count == 1 and n == 3 and set(means) >= {"loss", "grad_norm"}, (case, reads.where)
        assert all(isinstance(v, float) for v in means.values())
