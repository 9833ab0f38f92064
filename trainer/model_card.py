"""The model card (README.md) of a trained checkpoint, best/: what a person and the Hugging Face Hub read. It says
which objective trained it, on which mined data, under which settings, how it scores on STS (the dev score it was
kept for, and the final 7-task evaluation once `make train` has run it), how to load it, and the papers to cite.
sentence-transformers loads the folder with this card (`SentenceTransformer(best)`; the YAML header marks it as one).

    write_card(best_dir)                  # from best/train_config.json (+ best/results.json where present)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from contramine.pipeline.citations import MINED_BY, bibtex
from contramine.pipeline.storage.atomic import atomic_write_bytes

STS_TASKS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness")


def write_card(best_dir: Path | str) -> Path:
    """(Re)write best/README.md from the folder's train_config.json and, once the final evaluation has written it,
    results.json (+ start_results.json: the start model's scores beside). Atomic, like the folder itself."""
    best_dir = Path(best_dir)
    meta = json.loads((best_dir / "train_config.json").read_text(encoding="utf-8"))
    results = {name: json.loads((best_dir / f"{name}.json").read_text(encoding="utf-8"))
               for name in ("results", "start_results") if (best_dir / f"{name}.json").is_file()}
    atomic_write_bytes(best_dir / "README.md", card(meta, results).encode("utf-8"))
    return best_dir / "README.md"


def card(meta: dict, results: dict) -> str:
    """The card's text for a checkpoint's train_config.json (`meta`) and its evaluation results, if any."""
    from contramine.trainer.objectives import get_objective

    name = meta.get("objective", "simcse")
    cls = get_objective(name)
    config = meta.get("config") or {}
    train = dict(config.get("train") or {})
    own = train.pop(name, {}) or {}
    for other in [k for k, v in train.items() if isinstance(v, dict)]:  # other objectives' sections: not this run's
        train.pop(other)
    settings = {"train": train, f"train.{name}": cls.Settings.model_validate(own).model_dump(mode="json")}
    start, run = meta.get("model"), (config.get("run") or {}).get("name")
    papers = (name, *(p for t in cls.tables for p in MINED_BY.get(t, ())))
    base = [f"base_model: {start}"] if start and "/" in start and not Path(start).exists() else []
    return "\n".join([
        "---", "library_name: sentence-transformers", "pipeline_tag: sentence-similarity", "tags:",
        "- sentence-transformers", "- sentence-similarity", "- contramine", f"- {name}", *base, "---", "",
        f"# {cls.__name__} sentence encoder, trained with contramine", "",
        "## Objective", "", _summary(cls), "",
        "## Training data", "",
        f"The mined tables {', '.join(f'`{t}`' for t in cls.tables)} of run `{run}` (contramine's offline mining of "
        f"the corpus `{(config.get('data') or {}).get('corpus')}`), from the start model `{start}`; "
        f"step {meta.get('step')} of this training kept (best dev score).", "",
        "## Settings", "", "```json", json.dumps(settings, indent=1, sort_keys=True), "```", "",
        "## Results", "", *_results(meta, results), "",
        "## Use it", "", "```python", "from sentence_transformers import SentenceTransformer", "",
        'model = SentenceTransformer("<this folder>")', 'vectors = model.encode(["A man is playing a guitar."])',
        "```", "", f"Pooler `{meta.get('pooler')}`, max length {meta.get('max_length')}. "
        + (meta.get("st_note") or f"The sentence-transformers modules reproduce it exactly ({meta.get('st_pooling')}"
                                  " pooling, L2-normalised)."), "",
        "`train_config.json` holds the run's whole configuration.", "",
        *(["## Citation", "", "```bibtex", bibtex(*papers), "```", ""] if bibtex(*papers) else [])])


def _summary(cls) -> str:
    """The first paragraph of the objective's file docstring: the paper it implements."""
    return " ".join((sys.modules[cls.__module__].__doc__ or "").split("\n\n")[0].split()) or cls.__name__


def _results(meta: dict, results: dict) -> list[str]:
    dev = meta.get("dev")
    lines = [f"Dev (STS-B dev, Spearman × 100) at the kept step: {json.dumps(dev)}."]
    if "results" not in results:
        return lines + ["", "No final evaluation yet: it runs when training ends, unless train.final_eval = false."]
    named = [("this model", results["results"])] + ([("start", results["start_results"])]
                                                     if "start_results" in results else [])
    lines += ["", "STS test sets (Spearman × 100, SentEval's protocol):", "",
              "| model | " + " | ".join(STS_TASKS) + " | avg |", "|---" * (len(STS_TASKS) + 2) + "|"]
    for label, r in named:
        sts = r.get("sts") or {}
        lines.append(f"| {label} | " + " | ".join(_num(sts.get(t)) for t in (*STS_TASKS, "avg")) + " |")
    return lines


def _num(x) -> str:
    return "-" if x is None else f"{x:.2f}"
