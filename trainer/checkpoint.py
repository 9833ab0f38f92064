"""Checkpoints, each folder written whole or not at all.

    <run>/train/<objective>/best/    the exported encoder, usable as is:
        config.json, model.safetensors, tokenizer files   transformers.AutoModel / AutoTokenizer.from_pretrained(best)
        modules.json, sentence_bert_config.json,
        1_Pooling/config.json [, 2_Dense/], *_Normalize/  sentence_transformers.SentenceTransformer(best)
        config_sentence_transformers.json
        train_config.json                                 the whole Config, the pooler, step, dev scores, and whether
                                                          the sentence-transformers modules reproduce the pooler
        README.md                                         the model card: objective, data, settings, STS results,
                                                          citations (trainer/model_card.py)
        results.json                                      the final evaluation (written after training)
    <run>/train/<objective>/last/    everything a restart needs:
        state.pt        objective state_dict (training-only heads included), optimiser, LR scheduler, grad scaler,
                        RNG states (python, numpy, torch, cuda; one set per rank), data position (epoch, batch),
                        global step, best dev score so far, config hash
        train_config.json

state.pt holds tensors, numbers, strings, lists and dicts only (the RNG states as tensors: `rng_state`), and is read
back with torch.load(weights_only=True): a run folder received from someone else may carry a state.pt that is a
pickle built to run code when loaded, and the weights-only unpickler refuses any such object before it is built. A
state that does not load or does not have the form `save_state` writes is a one-line CheckpointError naming the file
and what to do, never a traceback.

Atomicity: both folders are written by pipeline/storage/atomic.py's `atomic_dir` (a temporary folder, fsynced, then
swapped in with two renames): a kill at any instant leaves the old folder or the new one, never half of one.

The sentence-transformers modules match our poolers exactly for `mean` (mean pooling), `cls_before_pooler` (CLS
token) and `cls` (CLS token + a Dense/Tanh module carrying the BERT pooler's weights). `avg_first_last` (mean of the
first and last layers) and `mask` (the hidden state at a prompt's [MASK]) have no sentence-transformers module:
the folder then gets the closest stock pipeline (mean, resp. CLS) and says so in README.md and train_config.json;
use contramine.pipeline.models.encode.encoder.Encoder with the recorded pooler to get the trained behaviour.
"""
from __future__ import annotations

import json
import pickle
import random
import re
import warnings
from pathlib import Path

import numpy as np
import torch

from contramine.pipeline.storage.atomic import atomic_dir, atomic_write_bytes, recover
from contramine.pipeline.storage.safe_paths import check_below
from contramine.pipeline.errors import ExpectedError
from contramine.trainer.model_card import write_card


class CheckpointError(ExpectedError, RuntimeError):
    """last/state.pt cannot be resumed from (does not load weights-only, or has not the form save_state writes)."""


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


def output_dir(cfg) -> tuple[Path, Path]:
    """(the folder a training writes, the root below which no folder may be a link): train/<objective>/ of the run,
    or train.output; a train.output in another run folder (compare's rows on compare.mined_runs) is checked from that
    run folder, one elsewhere from itself."""
    out = Path(cfg.train.output) if cfg.train.output else cfg.run.dir / "train" / cfg.train.objective
    for root in (cfg.run.dir, cfg.run.root):
        if out.is_relative_to(root) and out != root:
            return out, root if root == cfg.run.dir else root / out.relative_to(root).parts[0]
    return out, out


# ------------------------------------------------------------------------------------------- best/: a model
def _write_json(path: Path, obj) -> None:
    # replaces the path (a symlink there is swapped out, its target never written)
    atomic_write_bytes(path, (json.dumps(obj, indent=2, default=str) + "\n").encode())


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
        write_card(tmp)  # README.md: objective, data, settings, dev score, citations (trainer/model_card.py)
    return dst


# ------------------------------------------------------------------------------------------- last/: a state
def rng_state() -> dict:
    """This process's RNG states in a weights-only-loadable form: tensors and plain numbers, no tuples of numpy
    arrays (python's and numpy's Mersenne Twister states as int64 tensors)."""
    version, mt, gauss = random.getstate()
    name, keys, pos, has_gauss, np_gauss = np.random.get_state()
    return {"python": {"version": int(version), "state": torch.tensor(mt, dtype=torch.int64), "gauss": gauss},
            "numpy": {"bit_generator": str(name),  # numpy's stub types get_state() as a dict: it is the legacy tuple
                      "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),  # type: ignore[attr-defined]
                      "has_gauss": int(has_gauss), "gauss": float(np_gauss)},
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def _rng_native(s) -> tuple:
    """(python state, numpy state, torch state, cuda states) from `rng_state`'s form; ValueError when it is not."""
    try:
        py, nps, cpu, cuda = s["python"], s["numpy"], s["torch"], s["cuda"]
        gauss = py["gauss"]
        py_state = (int(py["version"]), tuple(int(x) for x in py["state"].tolist()),
                    None if gauss is None else float(gauss))
        np_state = (str(nps["bit_generator"]), nps["keys"].numpy().astype(np.uint32), int(nps["pos"]),
                    int(nps["has_gauss"]), float(nps["gauss"]))
        tensors = [cpu, *(cuda or [])]
        if not isinstance(cuda, (list, type(None))) or not all(
                torch.is_tensor(t) and t.dtype == torch.uint8 and t.dim() == 1 for t in tensors):
            raise TypeError("torch / cuda states are not byte tensors")
        if not (py["state"].dim() == 1 and nps["keys"].dim() == 1):
            raise TypeError("Mersenne Twister states are not 1-d tensors")
    except (KeyError, TypeError, AttributeError, ValueError, RuntimeError) as e:
        raise ValueError(f"RNG states not in the form this trainer writes ({type(e).__name__}: {e})") from None
    return py_state, np_state, cpu, cuda


def set_rng_state(s: dict) -> None:
    """Restore what `rng_state` recorded."""
    py_state, np_state, cpu, cuda = _rng_native(s)
    random.setstate(py_state)
    np.random.set_state(np_state)
    torch.set_rng_state(cpu)
    if cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def save_state(dst: Path | str, state: dict, train_config: dict) -> Path:
    """last/: one torch file with everything a restart needs (see the module docstring)."""
    dst = Path(dst)
    with atomic_dir(dst) as tmp:
        torch.save(state, tmp / "state.pt")
        _write_json(tmp / "train_config.json", train_config)
    return dst


# key -> the types its value may have; what train.py's save_state call writes
STATE_FORM: dict[str, type | tuple[type, ...]] = {
    "objective": dict, "optimizer": dict, "scheduler": dict, "scaler": dict, "step": int, "epoch": int,
    "batch_in_epoch": int, "best": (int, float), "best_step": (int, type(None)), "config_hash": str, "rng": list}


def bad_state(path: Path, problem: str) -> CheckpointError:
    """The one-line error for a state.pt that cannot be resumed from: the file, what is wrong, what to do."""
    return CheckpointError(
        f"{path}: {problem}; not resuming from it. Remove {path.parent} (or train with --no-resume, which overwrites "
        f"it, or with another --run / --objective) to start over")


def _form_problem(state) -> str | None:
    if not isinstance(state, dict):
        return f"it holds a {type(state).__name__}, not a training state"
    missing = [k for k in STATE_FORM if k not in state]
    if missing:
        return f"it lacks {', '.join(missing)}: not a training state this trainer wrote"
    wrong = [k for k, t in STATE_FORM.items() if not isinstance(state[k], t)]
    if wrong:
        return f"{', '.join(wrong)} not of the type this trainer writes"
    if not all(isinstance(k, str) and torch.is_tensor(v) for k, v in state["objective"].items()):
        return "its objective weights are not all tensors"
    if not (isinstance(state["optimizer"].get("state"), dict) and isinstance(state["optimizer"].get("param_groups"),
                                                                             list)):
        return "its optimizer state is not an optimizer state_dict"
    if not state["rng"]:
        return "it has no RNG states"
    for s in state["rng"]:
        try:
            _rng_native(s)
        except ValueError as e:
            return str(e)
    return None


def _first_sentence(text: str) -> str:
    return text.strip().split("\n")[0].split(". ")[0].rstrip(".")[:140]


def load_state(dst: Path | str, map_location="cpu") -> dict | None:
    """The state saved in last/, or None when there is none. Loaded weights-only (no pickled object is ever built:
    no code of the file runs) and checked against the form save_state writes: CheckpointError when it is not."""
    dst = Path(dst)
    path = check_below(dst.parent, recover(dst) / "state.pt", final=True)  # last/ and state.pt: no links
    if not path.exists():
        return None
    if not path.is_file():
        raise bad_state(path, "it is not a file")
    try:
        with warnings.catch_warnings():  # torch's notes on a foreign pickle's protocol: the file is refused anyway
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"(Trying to load unsupported GLOBAL|Unsupported) [^\n]*", str(e))  # what it tried to build
        why = f" ({_first_sentence(found.group(0))})" if found else ""
        raise bad_state(path, f"weights-only loading refused it{why}: a state from an older contramine, a damaged "
                              f"file, or one built to run code") from None
    except Exception as e:  # noqa: BLE001 -- a truncated zip, an empty file...: whatever torch says, it is unusable
        first = _first_sentence(str(e))
        raise bad_state(path, f"it does not load as a torch file ({type(e).__name__}{': ' * bool(first)}{first})") \
            from None
    problem = _form_problem(state)
    if problem:
        raise bad_state(path, problem)
    return state
