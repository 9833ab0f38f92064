"""trainer/st_losses: each objective as a sentence-transformers loss equals the lean trainer's objective on one batch
(same weights, dropout off, to a few float32 ulps), and a few SentenceTransformerTrainer steps on `make export`'s
output move the weights as the same number of lean steps do (AdamW, linear decay, no clipping on either side)."""
from __future__ import annotations

import json

import pytest
import torch

from contramine.pipeline.export import export_run
from contramine.pipeline.models.encode.encoder import Encoder
from tiny_bert import build_tiny_bert
from train_helpers import write_table
from contramine.trainer.objectives import get_objective
from contramine.trainer.st_losses import DCLRLoss, DebCSELoss, OssCSELoss, SimCSELoss, WhitenedCSELoss

datasets = pytest.importorskip("datasets")

TEXTS = ["a man is playing the guitar", "two dogs run in the park", "the woman rides a horse on the road",
         "a child is eating food at school", "the old city has a river",
         "people walk down the street after the game while the children play music in the park and the old man "
         "looks at the river near the city"]  # past 32 tokens: both sides truncate it alike (OssCSE: in its template)
# objective -> (lean settings, export format, the loss given the model and the lean objective's head settings)
CASES = {
    "simcse": ({"mlp_train_only": False}, "sentences", lambda m: SimCSELoss(m)),
    "debcse": ({}, "debcse", lambda m: DebCSELoss(m)),
    "osscse": ({}, "osscse-prompt", lambda m: OssCSELoss(m)),
    "osscse-start-pooler": ({"form": "start-pooler"}, "osscse-triplet", lambda m: OssCSELoss(m, form="start-pooler")),
    # 2 channels per group: with 6 rows, wider groups whiten near-singular covariances (a loss of ~1e-5 whose steps
    # are round-off through Adam)
    "whitenedcse": ({"groups": 16}, "sentences", lambda m: WhitenedCSELoss(m, groups=16)),
    "dclr": ({"phi": 0.5}, "dclr", lambda m: DCLRLoss(m, phi=0.5)),
}


def rows() -> list[dict]:
    """Every row has what every objective reads: distinct texts everywhere (NO_DUPLICATES keeps the batch whole)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i, t in enumerate(TEXTS):
        e = torch.randn(8, generator=g)
        out.append({"sid": i, "text": t, "positives": ["so " + t, "second " + t], "negatives": [f"no {t}", f"not {t}"],
                    "paraphrase": "in other words " + t, "negation": "it is not true that " + t,
                    "emb": (e / e.norm()).tolist() if i != 5 else None})
    out[2]["emb"] = out[1]["emb"]  # rows 1 and 2 are one sentence to the mined vectors: DCLR drops that negative
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("st")
    bert = build_tiny_bert(root / "bert", seed=0, dropout=0.0)
    run = root / "r"
    rs = rows()
    write_table(run, "sentences", [{"sid": r["sid"], "text": r["text"], "n_words": len(r["text"].split()),
                                    "line_no": r["sid"]} for r in rs])
    write_table(run, "pairs", [{"sid": r["sid"], "anchor": r["text"], "positives": r["positives"],
                                "negatives": r["negatives"]} for r in rs])
    write_table(run, "triplets", [{"sid": r["sid"], "anchor": r["text"], "paraphrase": r["paraphrase"],
                                   "negation": r["negation"], "para_mer": 0.3, "para_chain": "de"} for r in rs])
    write_table(run, "embeddings", [{"sid": r["sid"], "emb": r["emb"]} for r in rs if r["emb"] is not None])
    return run, bert


def objective_name(case: str) -> str:
    return case.split("-")[0]


def lean(case: str, bert, cfg_extra=None):
    from objective_helpers import cfg_for

    name = objective_name(case)
    paper_osscse = case == "osscse"
    enc = Encoder.load(str(bert), pooler="mask" if paper_osscse else "mean", max_length=64, device="cpu")
    cfg = cfg_for(name, max_length=32, **CASES[case][0], **(cfg_extra or {}))
    return get_objective(name)(enc, cfg).train()


def st_model(bert):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules

    dim = json.loads((bert / "config.json").read_text())["hidden_size"]
    return SentenceTransformer(modules=[modules.Transformer(str(bert), max_seq_length=32),
                                        modules.Pooling(dim, "mean")], device="cpu").train()


def share_heads(loss, objective) -> None:
    """The training-only heads start equal (the loss's and the lean objective's have the same names)."""
    for name in ("mlp", "proj"):
        if getattr(loss, name, None) is not None:
            getattr(loss, name).load_state_dict(getattr(objective, name).state_dict())


def both_sides(case: str, bert):
    """The lean objective, the SentenceTransformer and its loss (sharing the objective's heads), and the mined rows
    as the lean trainer reads them."""
    obj = lean(case, bert)
    model = st_model(bert)
    loss = CASES[case][2](model)
    share_heads(loss, obj)
    rs = rows()
    for r in rs:
        r["emb"] = None if r["emb"] is None else torch.tensor(r["emb"]).numpy()
    return obj, model, loss, rs


@pytest.mark.parametrize("case", list(CASES))
def test_the_loss_equals_the_lean_objective_on_a_batch(run, case):
    run_dir, bert = run
    obj, model, loss, rs = both_sides(case, bert)
    torch.manual_seed(3)  # WhitenedCSE's permutations and DCLR's noise: the same draws on both sides
    want, _ = obj(obj.collate(rs))
    ds = datasets.load_dataset(str(export_run(run_dir, CASES[case][1], run_dir.parent / case)), split="train")
    batch = ds.to_dict()
    labels = torch.tensor(batch.pop("label")) if "label" in batch else None
    features = [model.tokenize(texts) for texts in batch.values()]
    if case == "osscse":  # the long row lost its template's [MASK] to truncation: the loss puts the template back
        assert not (features[0]["input_ids"] == model.tokenizer.mask_token_id).any(1).all()
    torch.manual_seed(3)
    got = loss(features, labels)
    # the same float32 sums in another order (sentence-transformers' modules against ours, and the CPU's GEMM
    # kernels: an AMD EPYC box of this kind differed by one float32 ulp, 1.9e-6 at 26.4): equal to a few ulps
    ulps = 4 * torch.finfo(torch.float32).eps * abs(want.item())
    assert abs(got.item() - want.item()) <= ulps, (got.item(), want.item())
    got.backward()  # and it trains: every encoder matrix gets a gradient
    assert model[0].auto_model.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0


STEPS, LR = 3, 1e-3
# The gap between the two runs' weight changes, in L2 over every encoder weight, relative to the lean run's change.
# Measured 2026-11-26 on this 2-core box: dclr 1.6e-5, whitenedcse 1.4e-4, simcse 1.9e-4, debcse 2.0e-4, osscse 4.0e-4,
# osscse start-pooler 2.7e-3: float round-off (another padding, another summation order) that Adam's normalisation
# makes visible where a gradient is near zero. TOL is 1%.
TOL = 1e-2


@pytest.mark.parametrize("case", list(CASES))
def test_sentence_transformers_trainer_moves_the_weights_as_the_lean_trainer(run, case, tmp_path):
    """STEPS steps of SentenceTransformerTrainer on the export against STEPS lean steps (the lean trainer's AdamW
    (fused, its parameter groups), its linear schedule, on the same rows): the weight changes agree to TOL of the
    largest change. One batch holds every row (batch 6, NO_DUPLICATES keeps it whole); torch's generator is seeded
    alike before each step for WhitenedCSE's permutations and DCLR's noise. Clipping off on both sides (the library
    clips the model's gradients, not the loss's heads)."""
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.training_args import BatchSamplers
    from transformers import TrainerCallback

    from contramine.trainer.train_setup import linear_schedule

    run_dir, bert = run
    obj, model, loss, rs = both_sides(case, bert)
    start = {k: v.clone() for k, v in obj.encoder.model.state_dict().items()}

    # lean: the loop of trainer/train.py, step by step
    batch = obj.collate(rs)
    params = [p for p in obj.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.0},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], lr=LR, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, linear_schedule(0, STEPS))
    for step in range(STEPS):
        torch.manual_seed(1000 + step)
        obj(batch)[0].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()

    class SeedEachStep(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            torch.manual_seed(1000 + state.global_step)

    train = datasets.load_dataset(str(export_run(run_dir, CASES[case][1], tmp_path / "export")), split="train")
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "st"), max_steps=STEPS, per_device_train_batch_size=len(TEXTS), learning_rate=LR,
        weight_decay=0.0, warmup_steps=0, lr_scheduler_type="linear", max_grad_norm=0.0, report_to="none",
        save_strategy="no", use_cpu=True, seed=0, batch_sampler=BatchSamplers.NO_DUPLICATES)
    SentenceTransformerTrainer(model=model, args=args, train_dataset=train, loss=loss,
                               callbacks=[SeedEachStep()]).train()

    got = model[0].auto_model.state_dict()
    want = obj.encoder.model.state_dict()
    moved = sum((want[k] - start[k]).double().pow(2).sum() for k in start).sqrt().item()
    gap = sum((got[k] - want[k]).double().pow(2).sum() for k in start).sqrt().item()
    assert moved > 1e-3  # the lean steps moved the weights ...
    assert gap <= TOL * moved, (case, gap, moved)  # ... and the library's steps moved them the same way


def test_dclr_with_a_frozen_model_and_refusals(run):
    """Without the export's label column, DCLRLoss weights the negatives with a frozen model's vectors; a batch with
    the wrong columns is refused in one line naming the export that has the right ones."""
    _, bert = run
    model, frozen = st_model(bert), st_model(bert)
    features = [model.tokenize(TEXTS)]
    loss = DCLRLoss(model, frozen_model=frozen, phi=0.99)(features, None)
    assert torch.isfinite(loss) and not any(p.grad is not None for p in frozen.parameters())
    with pytest.raises(ValueError, match="label"):
        DCLRLoss(model)(features, None)
    with pytest.raises(ValueError, match="FORMAT=debcse"):
        DebCSELoss(model)(features, None)
