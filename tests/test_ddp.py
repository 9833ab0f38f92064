"""Two CPU processes (gloo) under DistributedDataParallel, each with part of a global batch of 8, give the same
parameter gradients (DDP's average) and the same loss (mean over ranks) as one process on the whole batch —
for every objective (trainer/dist.py explains why).

The parts are deliberately uneven — 5 and 3 rows, and rank 1's rows have no mined negatives (DebCSE), no complete
triplets (OssCSE) and no embeddings at all (DCLR), so the collectives must line up regardless.
"""
from __future__ import annotations

import gc
import os
import sys
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from contramine.pipeline.config import TrainCfg
from tiny_bert import tiny_encoder
from contramine.trainer.objectives import OBJECTIVES, get_objective

NAMES = list(OBJECTIVES)
WORLD = 2
SPLIT = (0, 5, 8)  # rank 0 takes rows 0-4, rank 1 rows 5-7: uneven, so a per-rank mean would be caught
TEXTS = [
    "a man is playing the guitar", "two dogs run in the park", "the woman rides a horse on the road",
    "a child is eating food at school", "the old city has a river", "people walk down the street after the game",
    "a small bird sits on the big house", "the team played a great game last year",
]


def global_rows() -> list[dict]:
    rng = np.random.default_rng(1)
    rows = []
    for i, t in enumerate(TEXTS):
        e = rng.normal(size=8).astype(np.float32)
        first_half = i < SPLIT[1]
        rows.append({
            "sid": i, "text": t,
            "positives": [TEXTS[(i + 3) % 8] + " too"] if i % 2 else None,
            "negatives": [TEXTS[(i + k + 1) % 8] for k in range(1 + i % 2)] if first_half else None,
            "paraphrase": "in other words " + t if first_half else None,
            "negation": t.replace(" is ", " is not ") if first_half and i != 1 else None,
            "emb": e / np.linalg.norm(e) if first_half else None,
        })
    rows[2]["emb"] = rows[0]["emb"].copy()  # one pair weighted 0 by DCLR
    return rows


def make(name: str):
    """The objective on a tiny BERT in float64: DebCSE's 8-row BatchNorm and 1/τ = 20 amplify float32 round-off
    to ~1e-4 relative in some gradients whichever way the batch is split; in float64 the two ways agree to ~1e-13,
    so the comparison below can be tight and catches any real (scaling, statistics, ordering) difference."""
    cfg = TrainCfg(objective=name, whitenedcse={"groups": 8, "positives": 2}, debcse={"negatives": 2},
                   dclr={"noise_per_row": 1, "noise_step_size": 0.05},
                   osscse={"margin_weight": 0.5, "recall_weight": 0.1})
    enc = tiny_encoder("mask" if name == "osscse" else "cls_before_pooler", seed=0, dropout=0.0)
    torch.manual_seed(7)  # training heads start identical everywhere
    obj = get_objective(name)(enc, cfg).double().train()
    if name == "osscse":  # move off θ* so the recall term has a gradient
        with torch.no_grad():
            g = torch.Generator().manual_seed(3)
            for p in enc.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=g))
    return obj


def step(model, obj, rows, seed: int = 123):
    # Forward randomness (permutations, noise vectors) comes from the global generator. Ranks are seeded
    # differently (as a loop does for distinct dropout masks): shared draws must be rank 0's, broadcast.
    torch.manual_seed(seed)
    loss, _ = model(obj.collate(rows))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in obj.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def _worker(rank: int, init_file: str, out_dir: str):
    import torch.distributed as tdist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=120))
    try:
        rows = global_rows()[SPLIT[rank]:SPLIT[rank + 1]]
        for name in NAMES:
            obj = make(name)
            # BERT's own pooler layer is unused with the cls_before_pooler / mask poolers
            model = DDP(obj, find_unused_parameters=True)
            loss, grads = step(model, obj, rows, seed=123 + rank)
            tdist.all_reduce(loss)
            if rank == 0:
                torch.save({"loss": loss.item() / WORLD, "grads": grads}, os.path.join(out_dir, f"{name}.pt"))
            # free DDP while the group is registered, as trainer/train.py does (else a GIL deadlock at exit)
            del model
            gc.collect()
            tdist.barrier()
    finally:
        tdist.destroy_process_group()
    # Results are on disk: leave without the interpreter's teardown. A child forked from a pytest-xdist worker that
    # ran other test files first inherits their state, and its teardown exited 1 with no message there (an error
    # above still reaches the parent: torch.multiprocessing writes it to the error file before this line).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    # fork: the children inherit the imported torch/transformers (a fresh interpreter per rank costs ~10 s of
    # imports on a 2-core machine); each child sets 1 intra-op thread before any torch op
    mp.start_processes(_worker, args=(str(tmp / "init"), str(tmp)), nprocs=WORLD, join=True, start_method="fork")
    return {name: torch.load(tmp / f"{name}.pt") for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_ddp_matches_single_process(name, ddp_results):
    obj = make(name)
    loss, grads = step(obj, obj, global_rows())
    got = ddp_results[name]
    assert got["loss"] == pytest.approx(loss.item(), rel=1e-9, abs=1e-10)
    assert set(got["grads"]) == set(grads)
    worst = 0.0
    for n, g in grads.items():
        d = got["grads"][n]
        worst = max(worst, (d - g).abs().max().item())
        torch.testing.assert_close(d, g, rtol=1e-7, atol=1e-9, msg=f"{name}: gradient of {n}")
    assert worst < 1e-9
    assert sum(g.abs().sum().item() for g in grads.values()) > 0
