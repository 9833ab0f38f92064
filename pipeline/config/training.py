"""The training sections: `train` (trainer/train.py), `compare` (trainer/compare.py) and `mine` (what a mine is
for: an objective's tables). The objective names are written here once; each objective's own settings are declared
by its file in trainer/objectives/."""
from __future__ import annotations

import sys
from typing import Literal, get_args

from pydantic import ConfigDict, Field, create_model, field_validator, model_validator

from contramine.pipeline.config.base import Section
from contramine.pipeline.config.mining import RUNS_ROOT, Pooler
from contramine.pipeline.config.names import name_problem

# THE registration of the training objectives: each name is a file, trainer/objectives/<name>.py, that declares the
# rest beside its class (its [train.<name>] Settings, its sentence-transformers loss, the export format that loss
# reads). Everything else is derived from this line: the `train.objective` type, TrainCfg's [train.<name>] sections,
# contramine.trainer.objectives.OBJECTIVES, contramine.trainer.st_losses.LOSSES. Adding an objective = its file + its name here.
Objective = Literal["simcse", "debcse", "osscse", "whitenedcse", "dclr"]  # the one list, spelt out: a type checker reads it
OBJECTIVE_NAMES: tuple[Objective, ...] = get_args(Objective)  # the same names, in that order
# Flat keys of the previous release -> [train.<objective>] key: still accepted, with a one-line deprecation note.
FLAT_OBJECTIVE_KEYS = {
    "debcse_negatives": ("debcse", "negatives"), "osscse_alpha": ("osscse", "alpha"), "osscse_beta": ("osscse", "beta"),
    "osscse_lambda": ("osscse", "margin_weight"), "osscse_gamma": ("osscse", "recall_weight"),
    "osscse_templates": ("osscse", "templates"), "whitened_groups": ("whitenedcse", "groups"),
    "whitened_positives": ("whitenedcse", "positives"), "whitened_eps": ("whitenedcse", "eps"),
    "whitened_lambda": ("whitenedcse", "loss_weight"), "dclr_phi": ("dclr", "phi"),
    "dclr_k": ("dclr", "noise_per_row"), "dclr_steps": ("dclr", "noise_steps"),
    "dclr_step_size": ("dclr", "noise_step_size"), "dclr_tau_u": ("dclr", "tau_u"),
    "mlp_train_only": (("simcse", "dclr"), "mlp_train_only"),
}
_warned: set[str] = set()


class _TrainSettings(Section):
    """[train]: the settings every objective shares (TrainCfg adds one [train.<name>] section per objective)."""
    objective: Objective = "debcse"
    model: str | None = None  # start weights; None = encoder.model
    pooler: Pooler | None = None  # None = encoder.pooler
    max_length: int = Field(32, ge=4)
    batch_size: int = Field(64, ge=2)
    lr: float = Field(3e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    epochs: float = Field(1.0, gt=0)
    max_steps: int = Field(0, ge=0, description="0 = epochs decide")
    warmup_steps: int = Field(0, ge=0)
    grad_clip: float = Field(1.0, ge=0)
    temperature: float = Field(0.05, gt=0)
    dropout: float = Field(0.1, ge=0, le=1)
    eval_every: int = Field(125, ge=1)
    log_every: int = Field(20, ge=1, description="steps per metrics.jsonl row: its loss, grad_norm and metrics are "
                                                "the mean over those steps (also logged: step 1, every evaluation and "
                                                "the last step); the one host read of the numbers, so a GPU step never "
                                                "waits for it")
    eval_sick: bool = False
    eval_max_pairs: int = Field(0, ge=0, description="0 = all dev pairs")
    eval_precision: Literal["float32", "bf16", "fp16"] = Field(
        "float32", description="autocast of dev and final evaluation (float32: the exact numbers)")
    precision: Literal["auto", "float32", "bf16", "fp16"] = "auto"
    device: str = "auto"
    seed: int = Field(42, ge=0)
    final_eval: bool = True
    output: str = Field("", description="where best/, last/ and metrics.jsonl go (default: <run>/train/<objective>)")
    num_workers: int = Field(2, ge=0, description="DataLoader workers that run objective.collate (tokenisation)")
    unpad: bool = Field(True, description="padding-free encoder forward for BERT-family models "
                                          "(pipeline/models/encode/unpad.py): same outputs, no arithmetic on pad tokens")
    tensorboard: bool = Field(True, description="TensorBoard event files beside metrics.jsonl, the same numbers "
                                                "(make tensorboard RUN=<run>); on where the package is installed")

    @model_validator(mode="before")
    @classmethod
    def _flat_keys(cls, data):
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for flat, (objectives, key) in FLAT_OBJECTIVE_KEYS.items():
            if flat not in data:
                continue
            value = data.pop(flat)
            for name in (objectives if isinstance(objectives, tuple) else (objectives,)):
                data[name] = {key: value, **dict(data.get(name) or {})}
            if flat not in _warned:
                _warned.add(flat)
                where = " and ".join(f"[train.{o}] {key}" for o in (objectives if isinstance(objectives, tuple)
                                                                      else (objectives,)))
                print(f"note: train.{flat} is deprecated (accepted until the next release): use {where}",
                      file=sys.stderr)
        return data


# Each objective's own settings, [train.<objective>] (e.g. [train.osscse] alpha = 0.05): a section per registered
# name, declared with their defaults and bounds by the objective's file in trainer/objectives/ and validated by it
# (`settings_of`) when a run starts; this file stays free of torch.
_OWN = ("Each objective's own settings, [train.<objective>] (e.g. [train.osscse] alpha = 0.05): declared with their "
        "defaults and bounds by the objective's file in trainer/objectives/ and validated by it (`settings_of`) when "
        "a run starts; this file stays free of torch.")
TrainCfg = create_model("TrainCfg", __base__=_TrainSettings, __module__=__name__,
                        **{name: (dict, Field({}, description=_OWN if i == 0 else None))
                           for i, name in enumerate(OBJECTIVE_NAMES)})


class MineCfg(Section):
    """`mine` (flows/mine.py): which stages a mine runs."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)
    for_objective: list[Objective] | None = Field(
        None, alias="for", description="mine only the tables these objectives train on and export, and those they are "
        "computed from (`mine --for debcse`: no negations, paraphrases or triplets; `--for debcse osscse`: what either "
        "needs); one name or a list; unset = every stage")

    @field_validator("for_objective", mode="before")
    @classmethod
    def _known(cls, v):
        """One name or a list of names (repeats dropped, order kept); each known, or one line naming it."""
        if v is None:
            return v
        names = [v] if isinstance(v, str) else v
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise ValueError(f"mine.for {v!r}: an objective's name or a non-empty list of them; objectives: "
                             f"{', '.join(OBJECTIVE_NAMES)}")
        for name in names:  # the name given and the known ones, in one line
            if name not in OBJECTIVE_NAMES:
                raise ValueError(f"mine.for {name!r}: no such objective; objectives: {', '.join(OBJECTIVE_NAMES)}")
        return list(dict.fromkeys(names))


class CompareVariant(Section):
    """One more row of `make compare`: an objective under other settings of its own (`set`: train.* overrides)."""
    objective: Objective
    set: list[str] = Field([], description="train.<objective>.* overrides that make this variant")

    @field_validator("set")
    @classmethod
    def _only_train(cls, v):
        for item in v:
            if not item.startswith("train.") or "=" not in item:
                raise ValueError(f"variant override {item!r}: expected train.<key>=<value>")
        return v


class CompareCfg(Section):
    """`make compare` (trainer/compare.py): the objectives, seeds and shared step budget."""
    objectives: list[Objective] = list(OBJECTIVE_NAMES)
    seeds: int = Field(2, ge=1, description="seeds per objective: train.seed, train.seed + 1, ...")
    steps: int = Field(0, ge=0, description="steps per run; 0 = one epoch of the run's pairs at train.batch_size")
    baseline: Objective = "simcse"
    bootstrap: int = Field(1000, ge=10, description="paired bootstrap resamples of STS-B test pairs")
    # Rows beside an objective's own (only when that objective is compared), same start, budget and seeds. Default:
    # OssCSE under the start's own pooler (our deviation) beside the paper's [MASK]-template form.
    variants: dict[str, CompareVariant] = {
        "osscse-start-pooler": CompareVariant(objective="osscse", set=["train.osscse.form=start-pooler"])}
    mined_runs: list[str] = Field([], description="other mined runs of the same corpus (e.g. mined with your own "
                                                   "SimCSE checkpoint): each compared objective that reads `pairs` "
                                                   "also trains on each of them, a row '<objective>@<run>'")

    @field_validator("mined_runs", mode="before")
    @classmethod
    def _one_run(cls, v):
        return [v] if isinstance(v, str) else v

    @field_validator("variants")
    @classmethod
    def _variant_folders(cls, v):
        # a variant's name is its folder, <run>/compare/<name>/seed-<k>/ (best/, last/ inside)
        for name in v:
            if problem := name_problem("compare.variants key", name, "a variant name", "<run>/compare/"):
                raise ValueError(problem)
        return v

    @field_validator("mined_runs")
    @classmethod
    def _run_names(cls, v):
        for run in v:
            if problem := name_problem("compare.mined_runs", run, "a run name", RUNS_ROOT):
                raise ValueError(problem)
        return v
