"""The contract every objective keeps (trainer/objectives/base.py): a few AdamW steps lower its loss, export leaves
its training heads out, collate returns tensors, and its settings are its own [train.<name>] section. Each
objective's formula is tested against a direct computation in tests/test_objective_<name>.py."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from objective_helpers import TEXTS, cfg_for, encoder_for, rows_all
from contramine.pipeline.config import OBJECTIVE_NAMES, ConfigError, TrainCfg, load_config
from contramine.pipeline.models.encode.encoder import Encoder
from tiny_bert import build_tiny_bert
from contramine.trainer import dist
from contramine.trainer.objectives import OBJECTIVES, check_settings, get_objective


# ------------------------------------------------------------------------------------------- training, export
@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_loss_goes_down(name):
    # dropout 0: on a 6-row batch of a 32-d random model, dropout noise (amplified by DebCSE's 6-row BatchNorm)
    # swamps 10 steps of progress; the deterministic loss must fall
    torch.manual_seed(0)
    cfg = cfg_for(name, **{"osscse": {"margin_weight": 1.0}, "whitenedcse": {"positives": 2}}.get(name, {}))
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


def test_registry_and_collate_types():
    with pytest.raises(ValueError, match="unknown objective"):
        get_objective("nope")
    for name, cls in OBJECTIVES.items():
        assert cls.name == name and get_objective(name) is cls
        obj = cls(encoder_for(name), cfg_for(name))
        b = obj.collate(rows_all())
        # tensors, and the rows of each group of the one forward (plain numbers: split without a device read)
        assert all(isinstance(v, torch.Tensor) for k, v in b.items() if k != "groups"), name
        assert all(isinstance(n, int) for n in b["groups"]) and sum(b["groups"]) == len(b["enc.input_ids"]), name
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


def test_each_objective_owns_its_settings_section():
    assert tuple(OBJECTIVES) == OBJECTIVE_NAMES
    cfg = load_config("default", ["train.osscse.alpha=0.1", "train.dclr.phi=0.8"])
    obj = get_objective("osscse")(encoder_for("osscse"), cfg.train)
    assert obj.settings.alpha == 0.1 and obj.settings.beta == 0.2  # the rest keeps the paper's defaults
    assert get_objective("dclr").Settings.model_validate(cfg.train.dclr).phi == 0.8
    for profile, (name, key, value) in {"osscse-paper": ("osscse", "margin_weight", 1e-3),
                                        "whitenedcse-paper": ("whitenedcse", "groups", 128),
                                        "dclr-paper": ("dclr", "noise_per_row", 1),
                                        "debcse-paper": ("debcse", "negatives", 2)}.items():
        train = load_config(profile).train
        assert getattr(get_objective(name).Settings.model_validate(getattr(train, name)), key) == value, profile


def test_a_typo_in_an_objective_section_is_one_line_naming_the_key():
    cfg = load_config("default", ["train.osscse.alpa=0.1"])
    with pytest.raises(ConfigError) as e:
        check_settings(cfg.train)
    assert str(e.value) == "config error: train.osscse.alpa: unknown key"
    with pytest.raises(ConfigError, match="train.whitenedcse.groups"):
        check_settings(load_config("default", ["train.whitenedcse.groups=0"]).train)


def test_old_flat_keys_still_work_with_one_deprecation_line(capsys, monkeypatch):
    from contramine.pipeline.config import training as settings

    monkeypatch.setattr(settings, "_warned", set())
    train = TrainCfg(osscse_alpha=0.07, whitened_groups=16, mlp_train_only=False)
    err = capsys.readouterr().err
    assert "train.osscse_alpha is deprecated" in err and "[train.osscse] alpha" in err and err.count("\n") == 3
    assert train.osscse == {"alpha": 0.07} and train.whitenedcse == {"groups": 16}
    assert train.simcse == {"mlp_train_only": False} == train.dclr
    TrainCfg(osscse_alpha=0.08)
    assert "deprecated" not in capsys.readouterr().err  # once per key and process


def test_an_objective_is_registered_once_and_declares_its_loss_and_export_beside_it():
    """OBJECTIVE_NAMES is the one registration: each name is the file that declares the class, its [train.<name>]
    section exists, its sentence-transformers loss is found from its own `loss`, and the export format it names is one
    `make export` writes, whose card's recipe names that same loss (pipeline/export.py stays below the trainer)."""
    from contramine.pipeline import export
    from contramine.trainer.st_losses import LOSSES

    for name, cls in OBJECTIVES.items():
        assert cls.__module__ == f"contramine.trainer.objectives.{name}" and name in TrainCfg.model_fields
        if cls.loss:  # an objective may have no sentence-transformers loss (then it names no export format)
            assert LOSSES[name].__name__ == cls.loss and cls.export_format in export.FORMATS, name
    # every format only a contramine loss reads is the declared format of that loss's objective
    declared = {cls.export_format: cls.loss for cls in OBJECTIVES.values() if cls.loss}
    for fmt, call in export.LOSS_OF.items():
        assert call.split("(")[0] in {cls.loss for cls in OBJECTIVES.values() if cls.export_format == fmt}, fmt
    assert set(export.LOSS_OF) == set(declared)
