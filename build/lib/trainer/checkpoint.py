"""Checkpoints, each folder written whole or not at all.

    <run>/train/<objective>/best/    the exported encoder, usable as is:
        config.json, model.safetensors, tokenizer files   transformers.AutoModel / AutoTokenizer.from_pretrained(best)
        modules.json, sentence_bert_config.json,
        1_Pooling/config.json [, 2_Dense/], *_Normalize/  sentence_transformers.SentenceTransformer(best)
        config_sentence_transformers.json
        train_config.json                                 the whole Config, the pooler, step, dev scores, and whether
                                                          the sentence-transformers modules reproduce the pooler
        README.md                                         the same facts for a person
        results.json                                      the final evaluation (written after training)
    <run>/train/<objective>/last/    everything a restart needs:
        state.pt        objective state_dict (training-only heads included), optimiser, LR scheduler, grad scaler,
                        RNG states (python, numpy, torch, cuda; one set per rank), data position (epoch, batch),
                        global step, best dev score so far, config hash
        train_config.json

Atomicity: both folders are written by pipeline/engine/atomic.py's `atomic_dir` (a temporary folder, fsynced, then
swapped in with two renames): a kill at any instant leaves the old folder or the new one, never half of one.

The sentence-transformers modules match our poolers exactly for `mean` (mean pooling), `cls_before_pooler` (CLS
token) and `cls` (CLS token + a Dense/Tanh module carrying the BERT pooler's weights). `avg_first_last` (mean of the
first and last layers) and `mask` (the hidden state at a prompt's [MASK]) have no sentence-transformers module:
the folder then gets the closest stock pipeline (mean, resp. CLS) and says so in README.md and train_config.json;
use pipeline.models.encoder.Encoder with the recorded pooler to get the trained behaviour.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from pipeline.engine.atomic import atomic_dir, atomic_write_json, recover  # noqa: F401  (recover: re-exported)

# our pooler -> (sentence-transformers pooling mode, exact?)
ST_POOLING = {
    "mean": ("mean", True),
    "cls_before_pooler": ("cls", True),
    "cls": ("cls", True),  # + Dense(tanh) with the model's pooler weights, when the model has a pooler
    "avg_first_last": ("mean", False),
    "mask": ("cls", False),
}
ST_NOTES = {
    "avg_first_last": "pooler avg_first_last (masked mean of (first layer + last layer) / 2) has no "
                      "sentence-transformers module; the modules here use mean pooling of the last layer instead",
    "mask": "pooler mask (hidden state at [MASK] of the prompt template) has no sentence-transformers module; the "
            "modules here use the [CLS] token without the template instead",
}


# ------------------------------------------------------------------------------------------- best/: a model
def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, default=str) + "\n")


def write_st_modules(out: Path, encoder) -> dict:
    """The sentence-transformers module files for `encoder` (already saved with save_pretrained into `out`).
    Returns {"st_pooling": mode, "st_exact": bool, "st_note": str|None}."""
    mode, exact = ST_POOLING[encoder.pooler]
    dim = encoder.dim
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    # Legacy boolean keys: every sentence-transformers release from 2.x to 6.x reads them.
    _write_json(out / "1_Pooling" / "config.json", {
        "word_embedding_dimension": dim,
        "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    })
    bert_pooler = getattr(getattr(encoder.model, "pooler", None), "dense", None)
    if encoder.pooler == "cls":
        if isinstance(bert_pooler, torch.nn.Linear):
            # BERT's pooler is dense + tanh over the [CLS] state: exactly sentence-transformers' Dense module.
            from safetensors.torch import save_file

            dense_dir = out / "2_Dense"
            _write_json(dense_dir / "config.json", {"in_features": dim, "out_features": dim, "bias": True,
                                                   "activation_function": "torch.nn.modules.activation.Tanh"})
            save_file({"linear.weight": bert_pooler.weight.detach().float().cpu().contiguous(),
                       "linear.bias": bert_pooler.bias.detach().float().cpu().contiguous()},
                      str(dense_dir / "model.safetensors"))
            modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
        # without a pooling layer our `cls` falls back to the [CLS] state, which is what CLS pooling gives
    # Our embeddings are L2-normalised (METHODS §1): so are sentence-transformers' from this folder.
    norm = f"{len(modules)}_Normalize"
    (out / norm).mkdir()
    modules.append({"idx": len(modules), "name": str(len(modules)), "path": norm,
                    "type": "sentence_transformers.models.Normalize"})
    _write_json(out / "modules.json", modules)
    _write_json(out / "sentence_bert_config.json", {"max_seq_length": int(encoder.max_length), "do_lower_case": False})
    _write_json(out / "config_sentence_transformers.json",
                {"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"})
    return {"st_pooling": mode, "st_exact": exact, "st_note": ST_NOTES.get(encoder.pooler)}


def save_encoder(dst: Path | str, encoder, train_config: dict) -> Path:
    """best/: the exported encoder as a Hugging Face model + tokenizer + sentence-transformers modules."""
    dst = Path(dst)
    with atomic_dir(dst) as tmp:
        encoder.model.save_pretrained(tmp, safe_serialization=True)
        encoder.tokenizer.save_pretrained(tmp)
        st = write_st_modules(tmp, encoder)
        meta = {**train_config, "pooler": encoder.pooler, "max_length": int(encoder.max_length),
                "prompt": encoder.prompt if encoder.pooler == "mask" else None, **st}
        _write_json(tmp / "train_config.json", meta)
        note = st["st_note"] or (f"sentence-transformers modules reproduce pooler `{encoder.pooler}` exactly "
                                 f"({st['st_pooling']} pooling, L2-normalised).")
        (tmp / "README.md").write_text(
            f"# {train_config.get('objective', 'trained')} encoder\n\n"
            f"Trained by contramine (trainer/train.py); step {train_config.get('step')}, "
            f"dev {train_config.get('dev')}.\n\n"
            f"- pooler: `{encoder.pooler}`, max length {encoder.max_length}\n"
            f"- `transformers.AutoModel.from_pretrained(<this folder>)` loads the weights;\n"
            f"  `pipeline.models.encoder.Encoder.load(<this folder>, pooler=\"{encoder.pooler}\")` embeds as in training.\n"
            f"- `sentence_transformers.SentenceTransformer(<this folder>)`: {note}\n"
            f"- train_config.json: the full configuration of the run.\n")
    return dst


# ------------------------------------------------------------------------------------------- last/: a state
def save_state(dst: Path | str, state: dict, train_config: dict) -> Path:
    """last/: one torch file with everything a restart needs (see the module docstring)."""
    dst = Path(dst)
    with atomic_dir(dst) as tmp:
        torch.save(state, tmp / "state.pt")
        _write_json(tmp / "train_config.json", train_config)
    return dst


def load_state(dst: Path | str, map_location="cpu") -> dict | None:
    """The state saved in last/, or None when there is none."""
    path = recover(Path(dst)) / "state.pt"
    if not path.is_file():
        return None
    # weights_only=False: the state holds numpy/python RNG states (tuples, arrays), written by us.
    return torch.load(path, map_location=map_location, weights_only=False)
