"""Train a sentence encoder on mined tables with one of the objectives of METHODS §7.

    python -m contramine.trainer.train --profile simcse-paper [--run R] [--objective O] [--set train.lr=1e-5 ...] [--no-resume]
    torchrun --nproc_per_node 4 -m contramine.trainer.train --profile debcse-paper          # DDP, gloo on CPU / nccl on GPU

One loop, top to bottom: rows of the mined Parquet tables (trainer/data.py) -> objective.collate in DataLoader
workers (tokenising, stacking every group the step encodes into one batch, the padding-free layout) ->
objective.forward (ONE encoder forward) -> fused AdamW with linear decay (optional warmup) and gradient clipping.
A step reads nothing back from the device (on one process; under DDP the ranks' row counts are exchanged and read
once per step, trainer/dist.py): the loss, the grad norm and the objective's numbers are summed there and read once
per metrics.jsonl row, every `log_every` steps (trainer/metrics_log.py MetricWindow). Every
`eval_every` steps (and at the last step) rank 0 scores STS-B dev (+ SICK trial), keeps the best encoder in
best/ and the full training state in last/ (trainer/checkpoint.py; both are snapshots written on a background
thread while the steps go on, trainer/save_last.py, joined before the run returns). A restart with the same configuration (the
settings, and by content the start weights, the mined tables and the dev files: trainer/keys.py) resumes from
last/ and ends at the same weights as an uninterrupted run (float32, same machine). Outputs, under
artifacts/<run>/train/<objective>/: best/, last/, metrics.jsonl and its TensorBoard curves (trainer/metrics_log.py).
What the run is set up with (the start encoder, its pooling, the configuration hash, the schedule):
trainer/train_setup.py.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from tqdm.auto import tqdm

from contramine.pipeline.config import OBJECTIVE_NAMES, Config, load_config
from contramine.pipeline.storage.atomic import atomic_write_json
from contramine.pipeline.storage.lock import run_lock
from contramine.pipeline.hints import command
from contramine.pipeline.storage.safe_paths import check_below
from contramine.pipeline.errors import ExpectedError
from contramine.pipeline.models.encode.encoder import Encoder
from contramine.pipeline.models.hub import pick_device, resolve_model
from contramine.trainer import checkpoint as ckpt
from contramine.trainer.model_card import write_card
from contramine.trainer import dist, metrics_log
from contramine.trainer.save_last import LastSaver, host_encoder
from contramine.trainer.data import MinedRows, batches_per_epoch, make_loader
from contramine.trainer.keys import fingerprint
from contramine.trainer.train_setup import config_hash, dev_score, eval_max_length, linear_schedule, load_encoder, run_pooling, \
    seed_all


# The RNG states in last/state.pt: tensors and plain numbers, so the state loads weights-only (trainer/checkpoint.py).
rng_state, set_rng_state = ckpt.rng_state, ckpt.set_rng_state


# ------------------------------------------------------------------------------------------------- training

class TooFewRows(ExpectedError, ValueError):
    """The mined table holds fewer rows than one batch (an empty or tiny corpus): one line, no traceback."""

def train(cfg: Config, resume: bool = True) -> dict:
    """Train (see the module docstring); the caller's float32 matmul settings are back on return, TF32 included."""
    from contramine.trainer.precision import restored_float32_settings

    # one training per output folder (rank 0 for all ranks): a second `make train` of this objective and run stops
    # here in one line, another objective trains beside it; no run folder (nothing to train on): no lock, no folder
    out, root = ckpt.output_dir(cfg)
    solo = int(os.environ.get("RANK", "0")) == 0 and cfg.run.dir.is_dir()
    with run_lock(out, command("train", run=cfg.run.name, objective=cfg.train.objective), root=root, hint="train into another --run") if solo \
            else nullcontext(), restored_float32_settings():
        saver = LastSaver()  # last/ written off the step, one save at a time (trainer/save_last.py)
        try:
            result = _train(cfg, resume, saver)
        except BaseException:
            saver.join_quietly()  # no save outlives the run (nor its lock); the run's own error is the one raised
            raise
        saver.join()
        return result


def _train(cfg: Config, resume: bool, saver: "LastSaver") -> dict:
    t0 = time.perf_counter()
    tc = cfg.train

    # --- distributed: torchrun sets WORLD_SIZE / RANK / LOCAL_RANK; one process per device -------------------------
    device = pick_device(tc.device)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_dist():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if device.startswith("cuda"):
            device = f"cuda:{local_rank}"
            torch.cuda.set_device(device)
        torch.distributed.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    rank, world = dist.rank(), dist.world_size()
    master = rank == 0
    dev_type = torch.device(device).type
    if dev_type == "cuda":
        # TF32 for the training matmuls only: ~free speed, no effect on fp32 CPU runs. Dev and final evaluation run
        # in strict float32 (contramine.trainer.evaluate.strict_float32), so best/ is chosen on the numbers `make eval` gives.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    # --- precision: bf16/fp16 autocast on GPU, float32 on CPU (no bf16 speed-up on these CPUs, STACK.md) -----------
    precision = tc.precision
    if precision == "auto":
        precision = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if dev_type == "cuda" else "float32"
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    autocast = (lambda: torch.autocast(dev_type, dtype=amp_dtype)) if amp_dtype else nullcontext
    scaler = torch.amp.GradScaler(dev_type, enabled=amp_dtype is torch.float16)  # fp16 needs loss scaling

    # --- data first: a missing mined table should stop the run before a large model loads -------------------------
    from contramine.trainer.objectives import check_settings, get_objective

    check_settings(tc)  # a typo in any [train.<objective>] section stops here, before anything is written
    objective_cls = get_objective(tc.objective)
    data_key = fingerprint(cfg.run.dir, objective_cls.tables)  # hashed before reading: a damaged shard is refused
    rows = MinedRows(cfg.run.dir, objective_cls.tables)
    steps_per_epoch = batches_per_epoch(len(rows), tc.batch_size)
    if steps_per_epoch == 0:
        raise TooFewRows(f"table {objective_cls.tables[0]!r} under {cfg.run.dir} has {len(rows)} rows, fewer than one "
                         f"batch of {tc.batch_size}: mine a larger corpus, or set a smaller train.batch_size")
    total = tc.max_steps or max(1, int(tc.epochs * steps_per_epoch))

    # --- model and objective ------------------------------------------------------------------------------------------
    seed_all(tc.seed)  # same seed on every rank: training-only heads start identical (DDP also broadcasts them)
    model_name = tc.model or cfg.encoder.model
    pooler, prompt = run_pooling(cfg)
    # The encoder's own max_length is the inference one (evaluation, best/); objectives tokenise training rows with
    # tc.max_length themselves.
    eval_len = eval_max_length(model_name)
    encoder = load_encoder(model_name, pooler, eval_len, device, prompt, tc.dropout, tc.eval_precision)
    encoder.unpad = tc.unpad
    objective = objective_cls(encoder, tc).to(device)
    objective.train()
    model = objective
    if dist.is_dist():
        # find_unused_parameters: parameters like BERT's pooler get no gradient under most poolers.
        model = torch.nn.parallel.DistributedDataParallel(
            objective, device_ids=[torch.device(device).index] if dev_type == "cuda" else None,
            find_unused_parameters=True)

    # --- optimiser: weight decay on matrices only (not biases / LayerNorm); the fused kernel (CPU and GPU) updates
    # MiniLM's 22.7M parameters in 10 ms per step on 2 cores, the foreach one in 65 ms -----------------------------------
    params = [p for p in objective.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": tc.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=tc.lr, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, linear_schedule(tc.warmup_steps, total))

    # --- where things go; resume from last/ when it belongs to this configuration -------------------------------------
    out, run_root = ckpt.output_dir(cfg)
    best_dir, last_dir, log_path = out / "best", out / "last", out / "metrics.jsonl"
    # Run folders are shared: no folder below the run (train/, <objective>/, best/, last/) may be a symlink, or our
    # writes would land in its target. A train.output outside the runs is checked from itself down.
    for d in (best_dir, last_dir):
        check_below(run_root, d, final=True)
    chash = config_hash(cfg, model_name, pooler, prompt, eval_len, data_key)
    meta = {"objective": tc.objective, "model": model_name, "pooler": pooler, "prompt": prompt, "config_hash": chash,
            "world_size": world, "config": cfg.model_dump(mode="json")}
    step, epoch, batch_in_epoch, best, best_step = 0, 0, 0, float("-inf"), None
    state = ckpt.load_state(last_dir) if resume else None
    if state is not None and state["config_hash"] != chash:
        if master:
            print(f"[train] {last_dir} belongs to another configuration (hash {state['config_hash']} != {chash}): "
                  f"starting from scratch (it will be overwritten)", file=sys.stderr)
        state = None
    if state is not None:
        try:  # the state has save_state's form (checked on load); its tensors must also fit this model
            objective.load_state_dict(state["objective"])
            opt.load_state_dict(state["optimizer"])
            sched.load_state_dict(state["scheduler"])
            scaler.load_state_dict(state["scaler"])
            rngs = state["rng"]
            if len(rngs) == world:
                set_rng_state(rngs[rank])
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
            first = str(e).strip().split("\n")[0][:160]
            raise ckpt.bad_state(last_dir / "state.pt",
                                 f"it does not fit this model ({type(e).__name__}: {first})") from None
        step, epoch, batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        best, best_step = state["best"], state["best_step"]
        if len(rngs) != world:  # another world size: positions and weights carry over, dropout streams cannot
            seed_all(tc.seed + 7919 * step + rank)
    else:
        seed_all(tc.seed + rank)  # dropout streams differ between ranks
    if master:
        notes = [*objective_cls.data_notes(rows), *objective_cls.start_notes(tc, resolve_model(model_name, "encoder"))]
        for note in notes:  # loud, once: a silently idle loss term, or a pooler the start never learnt, wastes a run
            print(f"\n[train] WARNING: {note}\n", file=sys.stderr)
        out.mkdir(parents=True, exist_ok=True)  # every folder on the way was checked above
        metrics_log.restart(log_path, step if state is not None else None)
        print(f"[train] {tc.objective}: model {model_name} pooler {pooler}, {len(rows)} rows of "
              f"{'+'.join(objective.tables)}, batch {tc.batch_size} ({world} rank(s)), {steps_per_epoch} steps/epoch, "
              f"{total} steps, lr {tc.lr}, {device} {precision}"
              + (f"; resumed at step {step} (epoch {epoch}, batch {batch_in_epoch})" if state else ""))
    log = metrics_log.MetricsLog(run_root, log_path, curves=tc.tensorboard) if master else None
    window = metrics_log.MetricWindow()  # the steps' numbers since the last row, kept on the device
    bar = tqdm(total=total, initial=step, disable=not master, desc=tc.objective, unit="step", dynamic_ncols=True)

    # --- the loop ---------------------------------------------------------------------------------------------------
    while step < total:
        loader = make_loader(rows, objective.collate, tc.batch_size, tc.seed, epoch, batch_in_epoch, rank, world,
                             tc.num_workers, pin_memory=dev_type == "cuda")
        for batch in loader:
            batch = {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
            with autocast():
                loss, metrics = model(batch)
            scaler.scale(loss).backward()
            if tc.grad_clip > 0:
                scaler.unscale_(opt)  # clip the true gradients, not the fp16-scaled ones
                grad_norm = torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)  # a device tensor: not read here
            else:
                grad_norm = None
            scaler.step(opt)  # fused AdamW takes the fp16 scaler's inf check on the device (no host read)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            sched.step()
            step += 1
            batch_in_epoch += 1

            if master:
                window.add({"loss": loss, "grad_norm": grad_norm, **metrics})
                bar.update(1)
                # One host read per row, never one per step: step 1, every log_every steps, and every evaluation
                # (checkpoint) step and the last, so a resumed run's rows equal an uninterrupted run's.
                if step == 1 or step % tc.log_every == 0 or step % tc.eval_every == 0 or step == total:
                    means, n = window.read()  # the row holds the window's means (trainer/metrics_log.py)
                    assert log is not None  # the master opened it
                    loss_f, norm = means.pop("loss"), means.pop("grad_norm", None)
                    log.record({"step": step, "epoch": epoch, "loss": loss_f, "lr": sched.get_last_lr()[0],
                                "grad_norm": norm, **means, "steps_in_mean": n,
                                "t": round(time.perf_counter() - t0, 4)})
                    bar.set_postfix(loss=f"{loss_f:.4f}", best=f"{best:.2f}" if best_step else "-")

            if step % tc.eval_every == 0 or step == total:
                # Rank 0 evaluates and saves; the others wait at the barrier (their RNG states travel with it).
                rngs = [None] * world
                if dist.is_dist():
                    torch.distributed.all_gather_object(rngs, rng_state())
                if master:
                    dev = evaluate_dev_scores(objective, cfg)
                    score = dev_score(dev)
                    new_best = None
                    assert log is not None  # the master opened it
                    if score > best:
                        best, best_step = score, step
                        new_best = (best_dir, host_encoder(objective.export_encoder()),
                                    {**meta, "step": step, "dev": dev, "dev_score": score})
                    log.record({"step": step, "epoch": epoch, "dev": dev, "dev_score": score, "best": best,
                                "best_step": best_step, "t": round(time.perf_counter() - t0, 4)})
                    bar.write(f"[train] step {step}: dev {dev} (best {best:.2f} at step {best_step})")
                    saver.save(last_dir, {  # a snapshot now; written on a background thread
                        "objective": objective.state_dict(), "optimizer": opt.state_dict(),
                        "scheduler": sched.state_dict(), "scaler": scaler.state_dict(),
                        "step": step, "epoch": epoch, "batch_in_epoch": batch_in_epoch,
                        "best": best, "best_step": best_step, "config_hash": chash,
                        "rng": rngs if dist.is_dist() else [rng_state()],
                    }, {**meta, "step": step}, best=new_best)
                if dist.is_dist():
                    torch.distributed.barrier()
            if step >= total:
                break
        else:  # the epoch ran out (not the step budget): next epoch, from its first batch
            epoch, batch_in_epoch = epoch + 1, 0
    bar.close()
    saver.join()  # the last checkpoint is on disk before the final evaluation and the wall time

    # --- final evaluation of the best checkpoint against the starting model -------------------------------------------
    result = {"objective": tc.objective, "steps": step, "best_step": best_step, "best_dev": best,
              "best_dir": str(best_dir), "last_dir": str(last_dir), "metrics": str(log_path)}
    if master:
        if tc.final_eval:
            result["results"] = final_eval(cfg, model_name, pooler, prompt, eval_len, best_dir, device)
        assert log is not None  # the master opened it
        log.close()
        result["wall_s"] = round(time.perf_counter() - t0, 2)
        print(f"[train] done: {step} steps, best dev {best:.2f} at step {best_step} -> {best_dir}; "
              f"wall time {result['wall_s']:.1f} s")
    if dist.is_dist():
        # Free DDP while the group is still registered. Its C++ Reducer is freed with the GIL held; holding the
        # group's last reference, it would run gloo's destructor, which joins a worker thread that may still need
        # the GIL to free the last barrier's tensors: a deadlock at exit (pytorch/pytorch#56297; seen 1 run in 3).
        del model
        gc.collect()
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return result


def evaluate_dev_scores(objective, cfg: Config) -> dict:
    """STS-B dev (+ SICK trial) Spearman ×100 of the exported encoder, with dropout off, in strict float32 (TF32 off,
    matmul precision "highest", no autocast beyond eval_precision's): the training settings are back afterwards."""
    from contramine.trainer.evaluate import evaluate_dev, strict_float32

    was_training = objective.training
    objective.eval()
    try:
        with strict_float32():
            return evaluate_dev(objective.export_encoder(), cfg.data.senteval_dir, sick=cfg.train.eval_sick,
                                max_pairs=cfg.train.eval_max_pairs)
    finally:
        objective.train(was_training)


def final_eval(cfg: Config, model_name: str, pooler: str, prompt: str, eval_len: int, best_dir: Path,
               device: str) -> dict:
    """evaluate_all on best/ and on the starting model; print both; best/results.json (+ start_results.json)."""
    from contramine.trainer.evaluate import evaluate_all, format_results

    probe = cfg.data.probe if Path(cfg.data.probe).is_file() else None
    named = []
    for name, path in (("start", model_name), ("best", str(best_dir))):
        enc = Encoder.load(path, pooler=pooler, max_length=eval_len, device=device, prompt=prompt,
                           precision=cfg.train.eval_precision)
        named.append((name, evaluate_all(enc, cfg.data.senteval_dir, probe_path=probe, progress=False)))
        del enc
    print(format_results(named))
    results = dict(named)
    atomic_write_json(best_dir / "results.json", results["best"], indent=2)
    atomic_write_json(best_dir / "start_results.json", results["start"], indent=2)
    write_card(best_dir)  # the model card gains the STS results
    return results


# ------------------------------------------------------------------------------------------------------ CLI
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, prog="contramine train", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a sentence encoder on a run's mined tables with one objective (SimCSE, DebCSE, OssCSE,\n"
                    "WhitenedCSE, DCLR): best/ and last/ checkpoints, each with a model card.",
        epilog="example:\n  contramine train --run default --objective debcse --set train.max_steps=100")
    ap.add_argument("--profile", default="default", help="a profile's name or a path to a .toml")
    ap.add_argument("--run", help="run name (artifacts/<run>): the mined tables to train on")
    ap.add_argument("--objective", help=f"{' | '.join(OBJECTIVE_NAMES)} (default: the profile's)")
    ap.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                    help="config overrides, e.g. train.lr=1e-5 train.max_steps=100")
    ap.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                    help="continue from last/ when it has the same configuration (default: yes)")
    args = ap.parse_args(argv)
    overrides = list(args.set) + ([f"run.name={args.run}"] if args.run else []) \
        + ([f"train.objective={args.objective}"] if args.objective else [])
    try:
        cfg = load_config(args.profile, overrides)
        train(cfg, resume=args.resume)
    except ExpectedError as e:  # a bad setting, table, model, checkpoint or link in the run: one line, no traceback
        print("error: " + " ".join(str(e).splitlines()), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
